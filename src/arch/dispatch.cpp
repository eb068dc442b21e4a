#include "arch/dispatch.h"

#include <cstring>

namespace flashcute {

bool config_fits(KernelConfig const& cfg, arch::Profile const& p) {
  if ((cfg.needs & ~p.caps) != 0) return false;
  if (cfg.smem_bytes > p.smem_per_block_optin) return false;
  // The driver reserves 1 KB of shared memory per CTA; counting it keeps "two CTAs per SM" honest on 100 KB parts.
  constexpr int kReservedPerCta = 1024;
  return (long)(cfg.smem_bytes + kReservedPerCta) * cfg.ctas_per_sm <= p.smem_per_sm;
}

KernelConfig const* select_config(Problem const& problem, arch::Profile const& p, std::string* why,
                                  char const* forced, bool (*built)(KernelConfig const&)) {
  int count = 0;
  KernelConfig const* table = all_configs(&count);
  if (forced && *forced) {
    KernelConfig const* named = nullptr;
    for (int i = 0; i < count && !named; ++i)
      if (std::strcmp(table[i].name, forced) == 0) named = &table[i];
    if (!named) {
      if (why) *why = std::string("unsupported: FLASHCUTE_CONFIG=") + forced + " names no kernel config";
      return nullptr;
    }
    if (named->direction == problem.direction) {  // a forward config says nothing about the backward
      if (named->dtype == problem.dtype && covers(*named, problem) && config_fits(*named, p))
        return named;
      if (why)
        *why = std::string("unsupported: FLASHCUTE_CONFIG=") + forced + " does not serve this dtype/head_dim or fit " +
               p.name;
      return nullptr;
    }
  }
  // Smallest covering head dims first (less padding: Q/K's, then V's), then the config's declared priority.
  auto better = [](KernelConfig const& c, KernelConfig const* than) {
    if (!than) return true;
    if (c.head_dim != than->head_dim) return c.head_dim < than->head_dim;
    if (c.head_dim_v != than->head_dim_v) return c.head_dim_v < than->head_dim_v;
    return c.priority > than->priority;
  };
  KernelConfig const* best = nullptr;
  KernelConfig const* best_built = nullptr;
  bool any_head_dim = false;
  for (int i = 0; i < count; ++i) {
    KernelConfig const& c = table[i];
    if (c.direction != problem.direction || c.dtype != problem.dtype) continue;
    if (c.priority <= 0) continue;  // tuning candidates run only where FLASHCUTE_CONFIG names them
    if (!covers(c, problem)) continue;
    any_head_dim = true;
    if ((c.min_rows && problem.rows < c.min_rows) || (c.max_rows && problem.rows > c.max_rows)) continue;
    if (!config_fits(c, p)) continue;
    if (better(c, best)) best = &c;
    if ((!built || built(c)) && better(c, best_built)) best_built = &c;
  }
  if (!best && why) {
    *why = std::string("unsupported: no ") + (problem.direction == FLASHCUTE_FORWARD ? "forward" : "backward") +
           " kernel config for head_dim " + std::to_string(problem.head_dim) +
           (any_head_dim ? " fits the " + std::string(p.name) + " profile (capabilities or shared memory)"
                         : " exists (supported head dims are multiples of 8 up to 256)");
  }
  return best_built ? best_built : best;
}

}  // namespace flashcute
