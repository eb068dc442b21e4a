// The dispatch walk: every arch profile x dtype x head dim x direction either gets a config whose needs the
// profile meets and whose shared memory fits, or a clear "unsupported". Causal, window, softcap, GQA and varlen
// are runtime arguments of every kernel, so they do not enter dispatch.
#include <gtest/gtest.h>

#include <set>
#include <string>

#include "api/device.h"
#include "api/workspace.h"
#include "arch/dispatch.h"
#include "arch/profiles.h"
#include "arch/registry.h"

using namespace flashcute;

namespace {

std::set<std::string> instantiation_list() {
  int n = 0;
  KernelConfig const* table = all_configs(&n);
  std::set<std::string> names;
  for (int i = 0; i < n; ++i) names.insert(table[i].name);
  return names;
}

}  // namespace

TEST(Dispatch, WalkEveryProfileDtypeHeadDimDirection) {
  auto const names = instantiation_list();
  ASSERT_FALSE(names.empty());
  int chosen = 0, unsupported = 0;
  for (auto const& profile : arch::kProfiles) {
    for (auto dtype : {FLASHCUTE_FLOAT16, FLASHCUTE_BFLOAT16}) {
      for (auto dir : {FLASHCUTE_FORWARD, FLASHCUTE_BACKWARD}) {
        for (int hd = 8; hd <= 256; hd += 8) {
          std::string why;
          KernelConfig const* c = select_config(Problem{dir, dtype, hd}, profile, &why);
          SCOPED_TRACE(std::string(profile.name) + " hd " + std::to_string(hd) + " dir " + std::to_string(dir));
          if (!c) {
            ++unsupported;
            EXPECT_EQ(why.rfind("unsupported: ", 0), 0u) << why;
            continue;
          }
          ++chosen;
          EXPECT_EQ(c->needs & ~profile.caps, 0u) << c->name << " needs a capability " << profile.name << " lacks";
          EXPECT_LE(c->smem_bytes, profile.smem_per_block_optin) << c->name;
          EXPECT_TRUE(config_fits(*c, profile)) << c->name;
          EXPECT_GE(c->head_dim, hd);
          EXPECT_GT(c->priority, 0) << c->name << ": a tuning candidate runs only where FLASHCUTE_CONFIG names it";
          EXPECT_EQ(c->dtype, dtype);
          EXPECT_EQ(c->direction, dir);
          EXPECT_TRUE(names.count(c->name)) << c->name << " is not in the instantiation list";
          // Forward tiles are sized per profile: the chosen one must leave the occupancy it was sized for.
          EXPECT_LE((c->smem_bytes + 1024) * c->ctas_per_sm, profile.smem_per_sm) << c->name;
        }
      }
    }
  }
  EXPECT_GT(chosen, 0);
  std::printf("dispatch walk: %d chosen, %d unsupported\n", chosen, unsupported);
}

TEST(Dispatch, ForwardCoversEveryHeadDimOnEveryProfile) {
  for (auto const& profile : arch::kProfiles)
    for (auto dtype : {FLASHCUTE_FLOAT16, FLASHCUTE_BFLOAT16})
      for (int hd = 8; hd <= 256; hd += 8) {
        std::string why;
        EXPECT_NE(select_config(Problem{FLASHCUTE_FORWARD, dtype, hd}, profile, &why), nullptr)
            << profile.name << " hd " << hd << ": " << why;
      }
}

// Row ranges (kernels.py ROW_RANGES) narrow some configs; every row count still finds a config, and on Hopper the
// narrowed ones win where they apply: 64-row tiles for decode-sized rows, 192-row tiles at hd64 from 4k rows, the
// wider key tiles at hd192 and hd256 from 2k rows.
TEST(Dispatch, EveryRowCountFindsAConfigAndRangesApply) {
  for (auto const& profile : arch::kProfiles)
    for (auto dir : {FLASHCUTE_FORWARD, FLASHCUTE_BACKWARD})
      for (int hd : {64, 128, 192, 256})
        for (int rows : {0, 1, 64, 65, 2047, 2048, 4095, 4096, 1 << 20}) {
          std::string why;
          KernelConfig const* c = select_config(Problem{dir, FLASHCUTE_BFLOAT16, hd, rows}, profile, &why);
          if (!c) continue;  // e.g. a profile without the backward's shared memory at this head dim
          EXPECT_TRUE((!c->min_rows || rows >= c->min_rows) && (!c->max_rows || rows <= c->max_rows))
              << profile.name << " " << c->name << " rows " << rows;
          std::string why_any;
          EXPECT_EQ(select_config(Problem{dir, FLASHCUTE_BFLOAT16, hd}, profile, &why_any) != nullptr, true)
              << profile.name;
        }
  arch::Profile const& hopper = *arch::find_profile(90);
  auto name = [&](int hd, int rows) {
    KernelConfig const* c = select_config(Problem{FLASHCUTE_FORWARD, FLASHCUTE_BFLOAT16, hd, rows}, hopper, nullptr);
    return std::string(c ? c->name : "none");
  };
  EXPECT_EQ(name(128, 4), "sm90_fwd_bf16_hd128_m64n128w4");
  EXPECT_EQ(name(128, 64), "sm90_fwd_bf16_hd128_m64n128w4");
  EXPECT_EQ(name(128, 65), "sm90_fwd_bf16_hd128_m128n128w8");
  EXPECT_EQ(name(64, 4095), "sm90_fwd_bf16_hd64_m128n128w8");
  EXPECT_EQ(name(64, 4096), "sm90_fwd_bf16_hd64_m192n128w12");
  EXPECT_EQ(name(192, 2047), "sm90_fwd_bf16_hd192_m128n96w8");
  EXPECT_EQ(name(192, 2048), "sm90_fwd_bf16_hd192_m128n112w8");
  EXPECT_EQ(name(256, 2047), "sm90_fwd_bf16_hd256_m128n64w8");
  EXPECT_EQ(name(256, 2048), "sm90_fwd_bf16_hd256_m128n80w8");
  // The portable 64-row decode tiles: 64x128 where two 80 KB CTAs fit an SM, 64x64 on the 99 KB parts.
  auto portable = [&](int sm, int rows) {
    KernelConfig const* c = select_config(Problem{FLASHCUTE_FORWARD, FLASHCUTE_BFLOAT16, 128, rows},
                                          *arch::find_profile(sm), nullptr);
    return std::string(c ? c->name : "none");
  };
  EXPECT_EQ(portable(80, 4), "sm80_fwd_bf16_hd128_m64n128w4");
  EXPECT_EQ(portable(80, 65), "sm80_fwd_bf16_hd128_m128n64w4");
  EXPECT_EQ(portable(120, 64), "sm80_fwd_bf16_hd128_m64n64w4");
  EXPECT_EQ(portable(86, 65), "sm80_fwd_bf16_hd128_m128n32w4");
  // Ranges are dispatch's preference: a forced config runs at any rows.
  std::string why;
  KernelConfig const* forced = select_config(Problem{FLASHCUTE_FORWARD, FLASHCUTE_BFLOAT16, 128, 4096}, hopper, &why,
                                             "sm90_fwd_bf16_hd128_m64n128w4");
  ASSERT_NE(forced, nullptr) << why;
  EXPECT_STREQ(forced->name, "sm90_fwd_bf16_hd128_m64n128w4");
}

TEST(Dispatch, ConfigsWithTheirOwnVHeadDimServeOnlyTheDimsTheyCover) {
  // head_dim is max(head_dim, head_dim_v), as problem_of builds it; head_dim_v 0 means the same.
  auto name = [](int sm, flashcute_direction_t dir, int hd, int hd_v) {
    Problem problem{dir, FLASHCUTE_BFLOAT16, hd};
    problem.head_dim_v = hd_v;
    KernelConfig const* c = select_config(problem, *arch::find_profile(sm), nullptr);
    return std::string(c ? c->name : "none");
  };
  EXPECT_EQ(name(90, FLASHCUTE_FORWARD, 192, 128), "sm90_fwd_bf16_hd192v128_m128n128w8");
  for (int hd_v : {0, 64, 128})  // nor do the tuning candidates, whatever they cover
    for (int hd : {64, 128, 192})
      EXPECT_EQ(name(90, FLASHCUTE_FORWARD, hd, hd_v).find("n176"), std::string::npos) << hd << " " << hd_v;
  EXPECT_EQ(name(90, FLASHCUTE_FORWARD, 160, 128), "sm90_fwd_bf16_hd192v128_m128n128w8");
  EXPECT_EQ(name(90, FLASHCUTE_FORWARD, 192, 192), "sm90_fwd_bf16_hd192_m128n112w8");
  EXPECT_EQ(name(90, FLASHCUTE_FORWARD, 192, 0), "sm90_fwd_bf16_hd192_m128n112w8");
  EXPECT_EQ(name(90, FLASHCUTE_FORWARD, 192, 136), "sm90_fwd_bf16_hd192_m128n112w8");
  EXPECT_EQ(name(90, FLASHCUTE_FORWARD, 128, 128), "sm90_fwd_bf16_hd128_m128n128w8");
  EXPECT_EQ(name(90, FLASHCUTE_BACKWARD, 192, 128), "sm90_bwd_bf16_hd192v128_m64n96w8");
  EXPECT_EQ(name(90, FLASHCUTE_BACKWARD, 192, 192), "sm90_bwd_bf16_hd192_m64n96w8");
  // The portable family has no such configs: it pads V to the larger head dim.
  int count = 0;
  KernelConfig const* table = all_configs(&count);
  for (int i = 0; i < count; ++i)
    if (table[i].head_dim_v != table[i].head_dim)
      EXPECT_EQ(table[i].family, Family::kSm90) << table[i].name;
  EXPECT_EQ(name(80, FLASHCUTE_FORWARD, 192, 128).find("sm80_fwd_bf16_hd192_"), 0u);
}

TEST(Dispatch, HeadDimAbove256IsUnsupportedWithReason) {
  std::string why;
  EXPECT_EQ(select_config(Problem{FLASHCUTE_FORWARD, FLASHCUTE_BFLOAT16, 264}, *arch::find_profile(90), &why),
            nullptr);
  EXPECT_NE(why.find("head_dim 264"), std::string::npos) << why;
}

TEST(Dispatch, SmallSmemProfilesGetTilesForTwoCtasAtHeadDim128) {
  for (int sm : {86, 89, 120, 121}) {
    KernelConfig const* c =
        select_config(Problem{FLASHCUTE_FORWARD, FLASHCUTE_BFLOAT16, 128}, *arch::find_profile(sm), nullptr);
    ASSERT_NE(c, nullptr);
    EXPECT_LE(c->smem_bytes, 48 * 1024) << sm << " " << c->name;
  }
}

TEST(Dispatch, NoFamilyRunsWithoutItsInstructions) {
  // A profile without mma.sync (hypothetical) gets nothing from the portable family.
  arch::Profile bare = *arch::find_profile(80);
  bare.caps = arch::kCpAsync | arch::kLdmatrix;
  std::string why;
  EXPECT_EQ(select_config(Problem{FLASHCUTE_FORWARD, FLASHCUTE_FLOAT16, 64}, bare, &why), nullptr);
}

TEST(Dispatch, HopperKernelsNeedTmaAndSetmaxnreg) {
  // A Hopper profile without TMA or without setmaxnreg (hypothetical) runs no Hopper kernel: they load by TMA and
  // the forward moves registers between warpgroups.
  for (uint32_t lacking : {arch::kTma, arch::kSetmaxnreg}) {
    arch::Profile hopper = *arch::find_profile(90);
    hopper.caps &= ~lacking;
    for (auto dir : {FLASHCUTE_FORWARD, FLASHCUTE_BACKWARD}) {
      KernelConfig const* c = select_config(Problem{dir, FLASHCUTE_BFLOAT16, 128}, hopper, nullptr);
      if (c) EXPECT_NE(c->family, Family::kSm90) << c->name << " without " << arch::capability_name(lacking);
    }
  }
}

TEST(ForcedArch, AcceptedWhereTheDeviceHasEverything) {
  arch::Profile const& h200 = *arch::find_profile(90);
  for (char const* sm : {"80", "86", "89", "90", "120", "121"}) {
    arch::Profile const* p = nullptr;
    EXPECT_EQ(apply_forced_arch(h200, sm, &p), FLASHCUTE_SUCCESS) << sm;
    ASSERT_NE(p, nullptr);
    EXPECT_EQ(std::to_string(p->sm), sm);
  }
}

TEST(ForcedArch, RefusedWhereTheDeviceLacksACapabilityOrMemory) {
  arch::Profile const* p = nullptr;
  // tcgen05 is missing on Hopper.
  EXPECT_EQ(apply_forced_arch(*arch::find_profile(90), "100", &p), FLASHCUTE_ERROR_ARCH_REFUSED);
  EXPECT_NE(std::string(flashcute_last_error()).find("tcgen05"), std::string::npos) << flashcute_last_error();
  // An RTX 30 has neither the fp8 mma.sync of sm_89 nor the 163 KB of sm_80.
  EXPECT_EQ(apply_forced_arch(*arch::find_profile(86), "89", &p), FLASHCUTE_ERROR_ARCH_REFUSED);
  EXPECT_EQ(apply_forced_arch(*arch::find_profile(86), "80", &p), FLASHCUTE_ERROR_ARCH_REFUSED);
  EXPECT_NE(std::string(flashcute_last_error()).find("shared memory"), std::string::npos);
  // An RTX 50 has no wgmma.
  EXPECT_EQ(apply_forced_arch(*arch::find_profile(120), "90", &p), FLASHCUTE_ERROR_ARCH_REFUSED);
  EXPECT_NE(std::string(flashcute_last_error()).find("wgmma"), std::string::npos);
  EXPECT_EQ(apply_forced_arch(*arch::find_profile(90), "75", &p), FLASHCUTE_ERROR_ARCH_REFUSED);
  EXPECT_EQ(apply_forced_arch(*arch::find_profile(90), "sm90", &p), FLASHCUTE_ERROR_ARCH_REFUSED);
}

TEST(ForcedArch, EmptyMeansTheDeviceProfile) {
  arch::Profile const* p = nullptr;
  EXPECT_EQ(apply_forced_arch(*arch::find_profile(89), "", &p), FLASHCUTE_SUCCESS);
  EXPECT_EQ(p->sm, 89);
  EXPECT_EQ(apply_forced_arch(*arch::find_profile(89), nullptr, &p), FLASHCUTE_SUCCESS);
  EXPECT_EQ(p->sm, 89);
}

TEST(Profiles, EveryDeclaredArchIsPresentAndSane) {
  for (int sm : {80, 86, 87, 89, 90, 100, 103, 110, 120, 121}) {
    arch::Profile const* p = arch::find_profile(sm);
    ASSERT_NE(p, nullptr) << sm;
    EXPECT_TRUE(p->caps & arch::kMmaSync);
    EXPECT_LE(p->smem_per_block_optin, p->smem_per_sm);
  }
  EXPECT_FALSE(arch::find_profile(120)->caps & arch::kWgmma);
  EXPECT_FALSE(arch::find_profile(120)->caps & arch::kTcgen05);
  EXPECT_FALSE(arch::find_profile(120)->caps & arch::kTmaMulticast);
  EXPECT_TRUE(arch::find_profile(120)->caps & arch::kTma);
  EXPECT_EQ(arch::find_profile(120)->smem_per_block_optin, 101376);
}

// FLASHCUTE_ARCH emulation pads the mainloop's shared memory so the H200 holds as many CTAs per SM as the emulated
// part: every config that dispatch picks under a smaller profile, run on sm_90, gets the emulated CTA count.
TEST(Occupancy, EmulationPadsSharedMemoryToTheEmulatedCtaCount) {
  arch::Profile const& h200 = *arch::find_profile(90);
  arch::Profile const& rtx50 = *arch::find_profile(120);
  // The portable hd128 forward tile: 48 KB, 4 warps. Two CTAs fit a 100 KB part, four an H200.
  EXPECT_EQ(arch::ctas_per_sm(rtx50, 49152, 128), 2);
  EXPECT_EQ(arch::ctas_per_sm(h200, 49152, 128), 4);
  int const padded = arch::emulated_smem_request(rtx50, h200, 49152, 128);
  EXPECT_EQ(arch::ctas_per_sm(h200, padded, 128), 2);
  EXPECT_LE(padded, h200.smem_per_block_optin);
  // Warps limit too: 48 per SM on sm_120 against 64 (16-warp CTAs: 3 against 4).
  EXPECT_EQ(arch::ctas_per_sm(arch::find_profile(120)[0], 1024, 512), 3);
  EXPECT_EQ(arch::ctas_per_sm(h200, arch::emulated_smem_request(rtx50, h200, 1024, 512), 512), 3);
  // The device's own profile, or a tile already as large on both: nothing changes.
  EXPECT_EQ(arch::emulated_smem_request(h200, h200, 49152, 128), 49152);
  EXPECT_EQ(arch::emulated_smem_request(*arch::find_profile(80), h200, 160000, 256), 160000);

  int n = 0;
  KernelConfig const* table = all_configs(&n);
  for (int sm : {80, 86, 89, 120}) {
    arch::Profile const& emulated = *arch::find_profile(sm);
    for (int i = 0; i < n; ++i) {
      KernelConfig const& c = table[i];
      if (c.family != Family::kSm80 || c.smem_bytes > emulated.smem_per_block_optin) continue;
      int const threads = c.warps * 32;
      int const want = arch::ctas_per_sm(emulated, c.smem_bytes, threads);
      int const got = arch::ctas_per_sm(h200, arch::emulated_smem_request(emulated, h200, c.smem_bytes, threads),
                                        threads);
      EXPECT_EQ(got, want) << c.name << " under sm_" << sm;
    }
  }
}

TEST(Dispatch, ForcedConfigIsUsedOnlyWhereItServesAndFits) {
  arch::Profile const& h200 = *arch::find_profile(90);
  Problem const fwd128{FLASHCUTE_FORWARD, FLASHCUTE_BFLOAT16, 128};
  std::string why;
  KernelConfig const* c = select_config(fwd128, h200, &why, "sm80_fwd_bf16_hd128_m128n32w4");
  ASSERT_NE(c, nullptr) << why;
  EXPECT_STREQ(c->name, "sm80_fwd_bf16_hd128_m128n32w4");
  // Wrong dtype, too small a head dim: refused with the name in the reason.
  EXPECT_EQ(select_config(fwd128, h200, &why, "sm80_fwd_fp16_hd128_m128n32w4"), nullptr);
  EXPECT_NE(why.find("FLASHCUTE_CONFIG"), std::string::npos);
  EXPECT_EQ(select_config(fwd128, h200, &why, "sm80_fwd_bf16_hd64_m128n128w4"), nullptr);
  // Does not fit a 99 KB part.
  EXPECT_EQ(select_config(Problem{FLASHCUTE_FORWARD, FLASHCUTE_BFLOAT16, 256}, *arch::find_profile(120), &why,
                          "sm80_fwd_bf16_hd256_m128n64w8"),
            nullptr);
  // A forward name leaves the backward's choice alone; an unknown name is refused, not silently ignored.
  Problem const bwd128{FLASHCUTE_BACKWARD, FLASHCUTE_BFLOAT16, 128};
  EXPECT_EQ(select_config(bwd128, h200, &why, "sm80_fwd_bf16_hd128_m128n32w4"),
            select_config(bwd128, h200, &why));
  EXPECT_EQ(select_config(fwd128, h200, &why, "no_such_kernel"), nullptr);
  EXPECT_NE(why.find("names no kernel config"), std::string::npos);
}

// Deterministic backward: dq_slots CTAs per grid column. The count fills whole waves of the GPU, never exceeds the
// key tiles or the slot cap, and the default mode always gets one slot.
TEST(Workspace, DeterministicSlotsFillWholeWaves) {
  EXPECT_EQ(BwdWorkspace::choose_dq_slots(128, 32, 132), 4);   // 128 CTAs: one wave, 97% of the SMs
  EXPECT_EQ(BwdWorkspace::choose_dq_slots(128, 16, 132), 8);
  EXPECT_EQ(BwdWorkspace::choose_dq_slots(16, 256, 132), 1);   // enough columns already
  EXPECT_EQ(BwdWorkspace::choose_dq_slots(3, 1, 132), 3);      // no more slots than key tiles
  EXPECT_EQ(BwdWorkspace::choose_dq_slots(1000, 1, 132), BwdWorkspace::kMaxDqSlots);
  for (int64_t tiles : {1, 2, 7, 64, 129})
    for (int64_t columns : {1, 3, 32, 100, 1000}) {
      int const s = BwdWorkspace::choose_dq_slots(tiles, columns, 108);
      EXPECT_TRUE(s >= 1 && s <= tiles && s <= BwdWorkspace::kMaxDqSlots) << tiles << " tiles, " << columns;
    }
  using Dq = BwdWorkspace::Dq;
  BwdWorkspace const plain = BwdWorkspace::make(2, 1000, 1000, 8, 2, 128, 64, 128, Dq::kShared, 16, 132, 0);
  EXPECT_EQ(plain.dq_slots, 1);
  BwdWorkspace const det = BwdWorkspace::make(2, 1000, 1000, 8, 2, 128, 64, 128, Dq::kSlots, 4, 132, 0);
  EXPECT_EQ(det.dq_slots, 8);  // 8 key tiles, 4 columns
  EXPECT_GE(det.total - plain.total, size_t(7) * det.dq_slot_elems * sizeof(float));
  // Turns: one accumulator, and one int per kDqTurnRows query rows of every (batch, head).
  BwdWorkspace const turns = BwdWorkspace::make(2, 1000, 1000, 8, 2, 128, 64, 128, Dq::kTurns, 4, 132, 0);
  EXPECT_EQ(turns.dq_slots, 1);
  EXPECT_GE(turns.dsoftmax_sum - turns.dq_turns, size_t(2) * 8 * 1024 / kDqTurnRows * sizeof(int));
  EXPECT_EQ(plain.dsoftmax_sum, plain.dq_turns);
  // Turns in lanes: one lane while the key tiles are no more than the query tiles, else their ratio, at most
  // kMaxDqLanes; a dQ slot and a set of turn words per lane.
  BwdWorkspace const lanes = BwdWorkspace::make(2, 1000, 4000, 8, 2, 128, 64, 128, Dq::kTurns, 4, 132, 0);
  BwdWorkspace const many = BwdWorkspace::make(2, 1000, 64000, 8, 2, 128, 64, 128, Dq::kTurns, 4, 132, 0);
  BwdWorkspace const some = BwdWorkspace::make(2, 1000, 2100, 8, 2, 128, 64, 128, Dq::kTurns, 4, 132, 0);
  EXPECT_EQ(lanes.dq_slots, 2);  // 32 key tiles, 16 query tiles
  EXPECT_EQ(many.dq_slots, BwdWorkspace::kMaxDqLanes);
  EXPECT_EQ(some.dq_slots, 1);  // 17 key tiles
  EXPECT_EQ(BwdWorkspace::choose_dq_lanes(40, 10), 4);
  EXPECT_EQ(BwdWorkspace::choose_dq_lanes(5, 0), 1);
  EXPECT_GE(lanes.dq_turns - lanes.dq_accum, size_t(2) * lanes.dq_slot_elems * sizeof(float));
  EXPECT_GE(lanes.dsoftmax_sum - lanes.dq_turns, size_t(2) * 2 * 8 * 1024 / kDqTurnRows * sizeof(int));
}

// A build without sm_90a has no Hopper kernels: dispatch falls back to the best portable config it compiled, and
// returns an unbuilt config (for a NOT_BUILT message) only when nothing that fits was compiled.
TEST(Dispatch, PrefersTheBestConfigThisBuildCompiled) {
  arch::Profile const& h200 = *arch::find_profile(90);
  Problem const fwd128{FLASHCUTE_FORWARD, FLASHCUTE_BFLOAT16, 128};
  KernelConfig const* any = select_config(fwd128, h200, nullptr);
  ASSERT_NE(any, nullptr);
  EXPECT_EQ(any->family, Family::kSm90);
  auto portable_only = [](KernelConfig const& c) { return c.family == Family::kSm80; };
  KernelConfig const* portable = select_config(fwd128, h200, nullptr, nullptr, portable_only);
  ASSERT_NE(portable, nullptr);
  EXPECT_EQ(portable->family, Family::kSm80);
  EXPECT_EQ(portable->head_dim, 128);
  auto nothing = [](KernelConfig const&) { return false; };
  EXPECT_EQ(select_config(fwd128, h200, nullptr, nullptr, nothing), any);
  Problem const bwd128{FLASHCUTE_BACKWARD, FLASHCUTE_BFLOAT16, 128};
  EXPECT_EQ(select_config(bwd128, h200, nullptr)->family, Family::kSm90);
  // No profile without wgmma ever gets a Hopper config.
  for (int sm : {80, 86, 89, 100, 120}) {
    EXPECT_EQ(select_config(fwd128, *arch::find_profile(sm), nullptr)->family, Family::kSm80) << sm;
    EXPECT_EQ(select_config(bwd128, *arch::find_profile(sm), nullptr)->family, Family::kSm80) << sm;
  }
}
