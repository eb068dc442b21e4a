// The forward's tile order (common/tile_scheduler.cuh): for any section width the order visits every (query tile,
// head, grid slot) exactly once, the largest tiles of each section first; one row per section is the head-by-head
// order; the host's section width fits L2.
#include <gtest/gtest.h>

#include <set>
#include <tuple>
#include <vector>

#include "common/tile_scheduler.cuh"

using namespace flashcute;

namespace {

FwdKernelParams problem(int batch, int nheads, int nheads_kv, int seqlen_q, int seqlen_k, bool causal) {
  FwdKernelParams p{};
  p.batch = batch, p.nheads = nheads, p.nheads_kv = nheads_kv, p.kv_group = nheads / nheads_kv;
  p.seqlen_q = seqlen_q, p.seqlen_k = seqlen_k, p.head_dim = 128, p.head_dim_v = 128;
  p.causal = causal;
  return p;
}

}  // namespace

TEST(TileOrder, EveryTileOnceForAnySectionWidth) {
  using S = FwdTileScheduler<128>;
  for (auto [batch, nheads, splits, seqlen] : std::vector<std::tuple<int, int, int, int>>{
           {1, 1, 1, 1}, {3, 5, 1, 1013}, {2, 16, 1, 8192}, {1, 7, 4, 300}, {5, 3, 1, 129}}) {
    FwdKernelParams p = problem(batch, nheads, 1, seqlen, seqlen, true);
    p.num_splits = splits;
    int const m = S::m_blocks(p);
    int const rows = nheads * batch * splits;
    for (int width : {0, 1, 2, 3, 4, 7, rows - 1, rows, rows + 5}) {
      p.section_heads = width;
      SCOPED_TRACE("rows " + std::to_string(rows) + " m " + std::to_string(m) + " width " + std::to_string(width));
      std::set<std::tuple<int, int, int>> seen;
      int last_row_start = -1;
      for (int i = 0; i < int(S::count(p)); ++i) {
        FwdTile const t = S::tile(p, i);
        ASSERT_GE(t.m_block, 0);
        ASSERT_LT(t.m_block, m);
        ASSERT_GE(t.h, 0);
        ASSERT_LT(t.h, nheads);
        ASSERT_GE(t.b, 0);
        ASSERT_LT(t.b, batch * splits);
        ASSERT_TRUE(seen.insert({t.m_block, t.h, t.b}).second) << "tile " << i << " visited twice";
        if (t.m_block == m - 1) {  // sections start their rows in order
          ASSERT_GT(t.b * nheads + t.h, last_row_start);
          last_row_start = t.b * nheads + t.h;
        }
        if (width <= 1) {  // head by head, the largest tile of each first
          ASSERT_EQ(t.m_block, m - 1 - i % m);
          ASSERT_EQ(t.b * nheads + t.h, i / m);
        }
      }
      ASSERT_EQ(int64_t(seen.size()), int64_t(m) * rows);
    }
  }
}

TEST(TileOrder, SectionsFitHalfOfL2AndTheCap) {
  int64_t const l2 = 50 << 20;
  // Non-causal: one row per section.
  EXPECT_EQ(fwd_section_heads(problem(2, 16, 16, 8192, 8192, false), l2, 2), 1);
  // hd128, 8k keys: 4 MB of K/V per head, 6 rows fit 25 MB.
  EXPECT_EQ(fwd_section_heads(problem(2, 16, 16, 8192, 8192, true), l2, 2), 6);
  // GQA: two query heads per K/V head count once.
  EXPECT_EQ(fwd_section_heads(problem(2, 16, 8, 8192, 8192, true), l2, 2), 12);
  // 1k keys: 512 KB a head, 50 rows fit; at most kMaxSectionRows.
  EXPECT_EQ(fwd_section_heads(problem(16, 16, 16, 1024, 1024, true), l2, 2), kMaxSectionRows);
  // Every row in one section where they all fit.
  EXPECT_EQ(fwd_section_heads(problem(2, 8, 8, 1024, 1024, true), l2, 2), 16);
  // A head larger than half of L2, or no L2 size: one row per section.
  EXPECT_EQ(fwd_section_heads(problem(1, 16, 16, 131072, 131072, true), l2, 2), 1);
  EXPECT_EQ(fwd_section_heads(problem(2, 16, 16, 8192, 8192, true), 0, 2), 1);
  // One query tile per row (decode): the order is the grid's.
  EXPECT_EQ(fwd_section_heads(problem(64, 32, 8, 1, 8192, true), l2, 2), 1);
}
