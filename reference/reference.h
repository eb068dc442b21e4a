// The float64 host reference: the oracle every kernel is tested against.
// Same semantics and same params structs as the GPU path (flashcute.h), host pointers, dtype FLASHCUTE_FLOAT64,
// lse/dlse as double. Callers validate the params first (src/api/validate); these functions trust them.
#pragma once

#include "flashcute/flashcute.h"

namespace flashcute::reference {

void forward(flashcute_fwd_params const& params);
void backward(flashcute_bwd_params const& params);

}  // namespace flashcute::reference
