// Introspection for the info CLI and tests: profiles, build contents, and what dispatch would pick.
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

#include "api/device.h"
#include "api/guarded.h"
#include "api/status.h"
#include "api/validate.h"
#include "arch/dispatch.h"
#include "flashcute/flashcute.h"

using namespace flashcute;

namespace {

flashcute_status_t copy_out(std::string const& text, char* buffer, size_t size) {
  if (!buffer || size == 0) return fail(FLASHCUTE_ERROR_INVALID_ARGUMENT, "buffer is NULL or empty");
  std::snprintf(buffer, size, "%s", text.c_str());
  if (text.size() >= size)
    return fail(FLASHCUTE_ERROR_INVALID_ARGUMENT,
                "buffer_size too small: need " + std::to_string(text.size() + 1) + " bytes");
  return FLASHCUTE_SUCCESS;
}

std::string describe(arch::Profile const& p) {
  std::string caps;
  for (uint32_t bit = 1; bit <= arch::kMmaSyncFp8; bit <<= 1)
    if (p.caps & bit) caps += (caps.empty() ? "" : ",") + std::string(arch::capability_name(bit));
  return std::string(p.name) + ": smem/block " + std::to_string(p.smem_per_block_optin / 1024) + " KB, smem/SM " +
         std::to_string(p.smem_per_sm / 1024) + " KB, " + std::to_string(p.max_warps_per_sm) + " warps/SM, [" +
         caps + "]";
}

// What dispatch picks for `params` on the profile of sm (> 0) or of the current device (0, honouring FLASHCUTE_ARCH
// and FLASHCUTE_CONFIG): *config (null, with *why, where nothing serves the problem), its profile and where that
// profile came from.
flashcute_status_t selected(flashcute_direction_t direction, flashcute_fwd_params const* params, int sm,
                            KernelConfig const** config, arch::Profile const** profile, std::string* origin,
                            std::string* why) {
  if (!params) return fail(FLASHCUTE_ERROR_INVALID_ARGUMENT, "params is NULL");
  if (direction != FLASHCUTE_FORWARD && direction != FLASHCUTE_BACKWARD)
    return fail(FLASHCUTE_ERROR_INVALID_ARGUMENT, "direction must be FLASHCUTE_FORWARD or FLASHCUTE_BACKWARD");
  if (auto s = validate_problem(*params, Target::kDevice)) return s;
  if (sm > 0) {
    *profile = arch::find_profile(sm);
    if (!*profile) return fail(FLASHCUTE_ERROR_INVALID_ARGUMENT, "sm " + std::to_string(sm) + " has no profile");
    *origin = "requested";
  } else {
    int device_sm = 0;
    if (auto s = current_profile(profile, &device_sm)) return s;
    *origin = (*profile)->sm == device_sm ? "device" : "forced by FLASHCUTE_ARCH on sm_" + std::to_string(device_sm);
  }
  *config = select_config(problem_of(direction, *params), **profile, why,
                          sm > 0 ? nullptr : std::getenv("FLASHCUTE_CONFIG"), config_built);
  return FLASHCUTE_SUCCESS;
}

flashcute_status_t explain(flashcute_direction_t direction, flashcute_fwd_params const* params, int sm, char* buffer,
                           size_t buffer_size) {
  clear_error();
  KernelConfig const* c = nullptr;
  arch::Profile const* profile = nullptr;
  std::string origin, why;
  if (auto s = selected(direction, params, sm, &c, &profile, &origin, &why)) return s;
  std::string text = std::string(profile->name) + " (" + origin + "), " +
                     (direction == FLASHCUTE_FORWARD ? "forward" : "backward") + ", head_dim " +
                     std::to_string(problem_of(direction, *params).head_dim) + ": ";
  if (!c) return copy_out(text + why, buffer, buffer_size);
  bool const built = config_built(*c);
  text += std::string(c->name) + " (tile " + std::to_string(c->block_m) + "x" + std::to_string(c->block_n) + ", " +
          std::to_string(c->warps) + " warps, " + std::to_string(c->smem_bytes / 1024) + " KB smem, sized for " +
          std::to_string(c->ctas_per_sm) + " CTA/SM), " + (built ? "built" : "NOT built in this binary");
  return copy_out(text, buffer, buffer_size);
}

}  // namespace

extern "C" {

flashcute_status_t flashcute_arch_profiles(int sm, char* buffer, size_t buffer_size) {
  return guarded([&] {
    clear_error();
    std::string text;
    for (auto const& p : arch::kProfiles)
      if (sm <= 0 || p.sm == sm) text += describe(p) + "\n";
    if (text.empty()) return fail(FLASHCUTE_ERROR_INVALID_ARGUMENT, "sm " + std::to_string(sm) + " has no profile");
    return copy_out(text, buffer, buffer_size);
  });
}

flashcute_status_t flashcute_explain(flashcute_direction_t direction, flashcute_fwd_params const* params, int sm,
                                     char* buffer, size_t buffer_size) {
  return guarded([&] { return explain(direction, params, sm, buffer, buffer_size); });
}

flashcute_status_t flashcute_fwd_occupancy(flashcute_fwd_params const* params, int sm, int* ctas_per_sm,
                                           int* multiprocessors) {
  return guarded([&] {
    clear_error();
    if (!ctas_per_sm || !multiprocessors)
      return fail(FLASHCUTE_ERROR_INVALID_ARGUMENT, "ctas_per_sm and multiprocessors must not be NULL");
    KernelConfig const* c = nullptr;
    arch::Profile const* profile = nullptr;
    std::string origin, why;
    if (auto s = selected(FLASHCUTE_FORWARD, params, sm, &c, &profile, &origin, &why)) return s;
    if (!c) return fail(FLASHCUTE_ERROR_UNSUPPORTED, why);
    *ctas_per_sm = c->ctas_per_sm;
    *multiprocessors = sm > 0 ? 0 : current_sm_count();
    return FLASHCUTE_SUCCESS;
  });
}

char const* flashcute_build_info(void) {
  static std::string const info = std::string("flashcute ") + flashcute_version() + "; CUDA targets " +
                                  compiled_targets() + "; kernels '" + kernel_subset() + "'";
  return info.c_str();
}

}  // extern "C"
