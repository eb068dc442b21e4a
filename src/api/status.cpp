#include "api/status.h"

namespace flashcute {

namespace {
thread_local std::string last_error;
}

flashcute_status_t fail(flashcute_status_t status, std::string const& message) {
  last_error = message;
  return status;
}

void clear_error() { last_error.clear(); }

}  // namespace flashcute

extern "C" char const* flashcute_last_error(void) { return flashcute::last_error.c_str(); }

extern "C" char const* flashcute_status_string(flashcute_status_t status) {
  switch (status) {
    case FLASHCUTE_SUCCESS: return "success";
    case FLASHCUTE_ERROR_INVALID_ARGUMENT: return "invalid argument";
    case FLASHCUTE_ERROR_UNSUPPORTED: return "unsupported";
    case FLASHCUTE_ERROR_NOT_BUILT: return "kernel not built";
    case FLASHCUTE_ERROR_NO_DEVICE: return "no CUDA device";
    case FLASHCUTE_ERROR_ARCH_REFUSED: return "arch profile refused";
    case FLASHCUTE_ERROR_WORKSPACE: return "workspace too small or misaligned";
    case FLASHCUTE_ERROR_CUDA: return "CUDA error";
  }
  return "unknown status";
}
