// The thread-local last error and the one way to fail: return a status with a message naming the argument.
#pragma once

#include <string>

#include "flashcute/flashcute.h"

namespace flashcute {

flashcute_status_t fail(flashcute_status_t status, std::string const& message);
void clear_error();

}  // namespace flashcute
