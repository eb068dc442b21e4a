// Declared capability profiles of every supported NVIDIA architecture. Dispatch reads only these facts (never
// "major == 8" tests), so a kernel can run only where the instructions it declares exist.
#pragma once

#include <cstdint>

namespace flashcute::arch {

enum Capability : uint32_t {
  kMmaSync = 1u << 0,      // mma.sync m16n8k16 f16/bf16 -> f32
  kCpAsync = 1u << 1,      // cp.async 16-byte global -> shared
  kLdmatrix = 1u << 2,     // ldmatrix (and .trans)
  kStmatrix = 1u << 3,     // stmatrix
  kTma = 1u << 4,          // cp.async.bulk.tensor + mbarrier transaction counts
  kTmaMulticast = 1u << 5, // TMA multicast across a cluster
  kWgmma = 1u << 6,        // wgmma.mma_async (sm_90a)
  kTcgen05 = 1u << 7,      // tcgen05 / tensor memory (sm_100a family)
  kSetmaxnreg = 1u << 8,   // setmaxnreg (arch-specific 'a' targets)
  kMmaSyncFp8 = 1u << 9,   // mma.sync with e4m3/e5m2 operands
};

struct Profile {
  int sm;                     // 80, 86, ..., 121
  char const* name;
  uint32_t caps;              // Capability bits
  int smem_per_block_optin;   // bytes a single CTA may opt into
  int smem_per_sm;            // bytes per multiprocessor (occupancy)
  int max_warps_per_sm;
  int max_regs_per_sm;        // 32-bit registers per multiprocessor
};

constexpr uint32_t kAmpereCaps = kMmaSync | kCpAsync | kLdmatrix;
constexpr uint32_t kAdaCaps = kAmpereCaps | kMmaSyncFp8;
constexpr uint32_t kHopperCaps = kAdaCaps | kStmatrix | kTma | kTmaMulticast | kWgmma | kSetmaxnreg;
constexpr uint32_t kBlackwellCaps = kAdaCaps | kStmatrix | kTma | kTmaMulticast | kTcgen05 | kSetmaxnreg;
// Consumer Blackwell: TMA without multicast; no wgmma, no tcgen05; setmaxnreg only under sm_120a, which the
// portable path does not target, so it is not declared.
constexpr uint32_t kGeforceBlackwellCaps = kAdaCaps | kStmatrix | kTma;

inline constexpr Profile kProfiles[] = {
    {80, "sm_80 (A100)", kAmpereCaps, 166912, 167936, 64, 65536},
    {86, "sm_86 (RTX 30, A40)", kAmpereCaps, 101376, 102400, 48, 65536},
    {87, "sm_87 (Jetson Orin)", kAmpereCaps, 166912, 167936, 48, 65536},
    {89, "sm_89 (RTX 40, L40S)", kAdaCaps, 101376, 102400, 48, 65536},
    {90, "sm_90 (H100, H200)", kHopperCaps, 232448, 233472, 64, 65536},
    {100, "sm_100 (B200)", kBlackwellCaps, 232448, 233472, 64, 65536},
    {103, "sm_103 (B300)", kBlackwellCaps, 232448, 233472, 64, 65536},
    {110, "sm_110 (Thor)", kBlackwellCaps, 232448, 233472, 64, 65536},
    {120, "sm_120 (RTX 50, RTX PRO 6000)", kGeforceBlackwellCaps, 101376, 102400, 48, 65536},
    {121, "sm_121 (DGX Spark)", kGeforceBlackwellCaps, 101376, 102400, 48, 65536},
};

inline constexpr int kNumProfiles = sizeof(kProfiles) / sizeof(kProfiles[0]);

// Occupancy: how many CTAs of `smem` bytes of dynamic shared memory and `threads` threads one multiprocessor of the
// profile holds (registers aside: every profile has the same 64K per SM). The CUDA runtime reserves 1 KB of shared
// memory per CTA on every profile here.
constexpr int kReservedSmemPerCta = 1024;
constexpr int kMaxCtasPerSm = 32;

constexpr int ctas_per_sm(Profile const& p, int smem, int threads) {
  int const warps = (threads + 31) / 32;
  int const by_smem = p.smem_per_sm / (smem + kReservedSmemPerCta);
  int const by_warps = warps > 0 ? p.max_warps_per_sm / warps : kMaxCtasPerSm;
  int const n = by_smem < by_warps ? by_smem : by_warps;
  return n < kMaxCtasPerSm ? n : kMaxCtasPerSm;
}

// Under FLASHCUTE_ARCH, a kernel sized for `emulated` runs on `device`, whose multiprocessors may hold more of its
// CTAs. The dynamic shared memory to request so that they hold as many as on the emulated part: at least `smem`,
// padded until the device's count drops to the emulated one (at most the device's per-CTA limit).
constexpr int emulated_smem_request(Profile const& emulated, Profile const& device, int smem, int threads) {
  int const want = ctas_per_sm(emulated, smem, threads);
  if (want <= 0 || ctas_per_sm(device, smem, threads) <= want) return smem;
  int const padded = device.smem_per_sm / want - kReservedSmemPerCta;
  int const request = padded > smem ? padded : smem;
  return request < device.smem_per_block_optin ? request : device.smem_per_block_optin;
}

constexpr Profile const* find_profile(int sm) {
  for (Profile const& p : kProfiles)
    if (p.sm == sm) return &p;
  return nullptr;
}

// A forced profile (FLASHCUTE_ARCH) may run on a device only if the device has every capability it declares
// and at least its shared memory: then any config chosen for it is runnable here.
constexpr bool can_emulate(Profile const& device, Profile const& forced) {
  return (forced.caps & ~device.caps) == 0 && forced.smem_per_block_optin <= device.smem_per_block_optin &&
         forced.smem_per_sm <= device.smem_per_sm;
}

// Names of the capability bits, for messages.
char const* capability_name(uint32_t bit);

}  // namespace flashcute::arch
