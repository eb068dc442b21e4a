// Config selection: the best registered config whose needs the profile meets and whose shared memory fits.
#pragma once

#include <string>

#include "arch/profiles.h"
#include "arch/registry.h"

namespace flashcute {

struct Problem {
  flashcute_direction_t direction;
  flashcute_dtype_t dtype;
  int head_dim;    // max(head_dim, head_dim_v): the kernel tile must cover both
  int rows = 1 << 30;  // query rows per head: seqlen_q (varlen: its maximum; packed GQA: the packed rows)
  int head_dim_v = 0;  // V's and O's head dim (0: head_dim), for the configs with V's own (KernelConfig)
  int v_dim() const { return head_dim_v ? head_dim_v : head_dim; }
};

// The problem a forward or backward call poses to dispatch (the call's entry points and flashcute_explain alike).
inline Problem problem_of(flashcute_direction_t dir, flashcute_fwd_params const& p) {
  return Problem{dir, p.dtype, (int)(p.head_dim > p.head_dim_v ? p.head_dim : p.head_dim_v), (int)p.seqlen_q,
                 (int)p.head_dim_v};
}

// Whether cfg's tile covers the problem's head dims (Q/K's and V's).
inline bool covers(KernelConfig const& cfg, Problem const& problem) {
  return cfg.head_dim >= problem.head_dim && cfg.head_dim_v >= problem.v_dim();
}

// Whether cfg may run under profile p: capabilities, shared memory per block and the occupancy it was sized for.
// (Its row range is dispatch's preference, not a limit: a forced config runs at any rows.)
bool config_fits(KernelConfig const& cfg, arch::Profile const& p);

// The chosen config, or null with a reason ("unsupported: ...") in *why. forced (FLASHCUTE_CONFIG, for tuning)
// names one config of the table to use instead of the best; it is ignored for the other direction, and refused
// when it does not serve the problem or fit the profile. built, when given, says which configs this build
// compiled: the best of those wins (a build without sm_90a runs the portable kernels on Hopper), and only when
// none fits is the best unbuilt one returned, for the caller to report.
KernelConfig const* select_config(Problem const& problem, arch::Profile const& p, std::string* why,
                                  char const* forced = nullptr, bool (*built)(KernelConfig const&) = nullptr);

}  // namespace flashcute
