// Argument checks shared by the GPU entry points and the host reference. Each failure names the argument.
#pragma once

#include "flashcute/flashcute.h"

namespace flashcute {

enum class Target { kDevice, kHostReference };

flashcute_status_t validate_fwd(flashcute_fwd_params const* p, Target target);
flashcute_status_t validate_bwd(flashcute_bwd_params const* p, Target target);

}  // namespace flashcute
