#include "arch/registry.h"

#include <cstring>

#include <cutlass/numeric_types.h>

#include "launchers.inc"

namespace flashcute {

namespace {
using namespace arch;
KernelConfig const kConfigs[] = {
#include "configs.inc"
};

template <class Fn>
struct Launcher {
  char const* name;
  Fn fn;
};
Launcher<FwdLaunchFn> const kFwd[] = {FLASHCUTE_FWD_LAUNCHERS};
Launcher<BwdLaunchFn> const kBwd[] = {FLASHCUTE_BWD_LAUNCHERS};

template <class Fn, int N>
Fn find(Launcher<Fn> const (&table)[N], char const* name) {
  for (auto const& l : table)
    if (l.name && std::strcmp(l.name, name) == 0) return l.fn;
  return nullptr;
}
}  // namespace

KernelConfig const* all_configs(int* count) {
  *count = sizeof(kConfigs) / sizeof(kConfigs[0]);
  return kConfigs;
}

FwdLaunchFn find_fwd_launcher(char const* name) { return find(kFwd, name); }
BwdLaunchFn find_bwd_launcher(char const* name) { return find(kBwd, name); }
bool config_built(KernelConfig const& cfg) {
  return cfg.direction == FLASHCUTE_FORWARD ? find(kFwd, cfg.name) != nullptr : find(kBwd, cfg.name) != nullptr;
}

char const* kernel_subset() { return FLASHCUTE_KERNEL_SUBSET; }
char const* compiled_targets() { return FLASHCUTE_CUDA_TARGETS; }

}  // namespace flashcute
