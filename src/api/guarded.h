// The C API's boundary: every entry point runs its body through guarded(), so nothing thrown inside (a failed
// allocation, say) crosses extern "C"; it becomes a status with a message instead.
#pragma once

#include <exception>
#include <new>
#include <string>

#include "api/status.h"

namespace flashcute {

template <class F>
flashcute_status_t guarded(F&& body) noexcept {
  try {
    return body();
  } catch (std::bad_alloc const&) {
    return fail(FLASHCUTE_ERROR_INVALID_ARGUMENT, "out of host memory: the sizes are too large for this call");
  } catch (std::exception const& e) {
    return fail(FLASHCUTE_ERROR_INVALID_ARGUMENT, std::string("refused: ") + e.what());
  } catch (...) {
    return fail(FLASHCUTE_ERROR_INVALID_ARGUMENT, "refused: unknown error");
  }
}

}  // namespace flashcute
