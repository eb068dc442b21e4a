// Argument checks shared by the GPU entry points and the host reference. Each failure names the argument.
#pragma once

#include "flashcute/flashcute.h"

namespace flashcute {

enum class Target { kDevice, kHostReference };

// Sizes, dtype, scalars and flags: everything but the pointers and strides (what flashcute_explain needs).
flashcute_status_t validate_problem(flashcute_fwd_params const& p, Target target);
// The whole call: the problem, then every tensor (NULL, strides, alignment, outputs aliasing anything) and, for the
// host reference, the varlen offsets themselves. Expects normalized() params.
flashcute_status_t validate_fwd(flashcute_fwd_params const* p, Target target);
flashcute_status_t validate_bwd(flashcute_bwd_params const* p, Target target);

// The strides of dimensions of size 1 (and varlen's batch strides) set to 0: they address nothing, and PyTorch
// gives such dimensions arbitrary strides, which must not fail the alignment checks or reach the kernels.
flashcute_fwd_params normalized(flashcute_fwd_params const& p);
flashcute_bwd_params normalized(flashcute_bwd_params const& p);

// Whether a call has anything to compute: the forward needs query rows; the backward query or key rows (with no
// queries, dk and dv are zeros).
bool fwd_has_work(flashcute_fwd_params const& p);
bool bwd_has_work(flashcute_fwd_params const& p);

}  // namespace flashcute
