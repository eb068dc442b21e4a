// The optional report on varlen offsets (flashcute_fwd_params::varlen_status): one small kernel that compares
// cu_seqlens_q/k and seqused_k with the declared totals and maxima on the device, so no host copy is needed.
#pragma once

#include <cstdint>

#include "common/kernel_params.h"

namespace flashcute {

// Writes the OR of flashcute_varlen_flag bits (0 when consistent) to *status on stream; returns a cudaError_t.
int launch_varlen_check(FwdKernelParams const& p, int32_t* status, void* stream);

}  // namespace flashcute
