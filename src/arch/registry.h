// The config table: every kernel in src/instantiations/kernels.py as data, and the launch functions of those this
// build compiled. Dispatch is a lookup in this table against an arch profile.
#pragma once

#include <cstdint>

#include "flashcute/flashcute.h"
#include "arch/profiles.h"

namespace flashcute {

struct FwdKernelParams;
struct BwdKernelParams;

enum class Family { kSm80, kSm90 };

struct KernelConfig {
  char const* name;
  Family family;
  flashcute_direction_t direction;
  flashcute_dtype_t dtype;
  int head_dim;    // Q's and K's
  int head_dim_v;  // V's and O's: head_dim, or less where the kernel has V's own (DeepSeek's 192 / 128)
  int block_m;
  int block_n;
  int warps;
  int ctas_per_sm;  // occupancy the tile is sized for
  int smem_bytes;   // dynamic shared memory per CTA
  uint32_t needs;   // arch::Capability bits the kernel's instructions require
  int priority;     // higher wins among configs that fit
  int min_rows;     // query rows per head (Problem::rows) the config competes at: [min_rows, max_rows], 0 unbounded
  int max_rows;
};

// Whether a backward config's deterministic mode orders the dQ additions of its CTAs by turns (one accumulator,
// common/bwd_dq_order.cuh) rather than giving CTAs slots of their own (src/api/workspace.h): every Hopper tile and
// the portable hd256 tiles. Each config's BwdTraits::kDqTurns says the same, and common/bwd_passes.cuh refuses a
// launch where the two disagree.
inline bool orders_dq_by_turns(KernelConfig const& c) { return c.family == Family::kSm90 || c.head_dim == 256; }

// All configs of the instantiation list, built or not.
KernelConfig const* all_configs(int* count);

// The launch function of a config, or null when this build did not compile it (kernel subset).
using FwdLaunchFn = int (*)(FwdKernelParams const&, void* stream);
using BwdLaunchFn = int (*)(BwdKernelParams const&, void* stream);
FwdLaunchFn find_fwd_launcher(char const* name);
BwdLaunchFn find_bwd_launcher(char const* name);
bool config_built(KernelConfig const& cfg);  // whether this build has cfg's launch function

char const* kernel_subset();     // the FLASHCUTE_KERNELS value this build used
char const* compiled_targets();  // the CUDA targets this build compiled for, e.g. "80;90a;120"

}  // namespace flashcute
