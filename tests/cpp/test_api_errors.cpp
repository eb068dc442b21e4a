// Bad input returns a status and a message naming the argument; nothing aborts. Runs without a GPU: the
// reference path and the GPU path's argument checks both come before any device work.
#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <cstdint>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "flashcute/flashcute.h"

namespace {

struct HostProblem {
  std::vector<double> q, k, v, out, lse, dout, dq, dk, dv;
  flashcute_fwd_params fwd;
  flashcute_bwd_params bwd;

  HostProblem(int b = 1, int sq = 5, int sk = 7, int h = 4, int hkv = 2, int d = 8) {
    flashcute_fwd_params_init(&fwd);
    fwd.batch = b, fwd.seqlen_q = sq, fwd.seqlen_k = sk, fwd.nheads = h, fwd.nheads_kv = hkv;
    fwd.head_dim = d, fwd.head_dim_v = d;
    fwd.dtype = FLASHCUTE_FLOAT64;
    fwd.softmax_scale = 1.f / std::sqrt((float)d);
    flashcute_fwd_params_set_contiguous_strides(&fwd);
    q.assign((size_t)b * sq * h * d, 0.5), k.assign((size_t)b * sk * hkv * d, 0.25);
    v.assign(k.size(), 1.0), out.assign(q.size(), NAN), lse.assign((size_t)b * h * sq, NAN);
    dout.assign(q.size(), 1.0), dq.assign(q.size(), NAN), dk.assign(k.size(), NAN), dv.assign(k.size(), NAN);
    fwd.q = q.data(), fwd.k = k.data(), fwd.v = v.data(), fwd.out = out.data(), fwd.lse = lse.data();
    flashcute_bwd_params_init(&bwd);
    bwd.fwd = fwd;
    bwd.dout = dout.data(), bwd.dq = dq.data(), bwd.dk = dk.data(), bwd.dv = dv.data();
    bwd.dout_batch_stride = fwd.q_batch_stride, bwd.dout_row_stride = fwd.q_row_stride;
    bwd.dout_head_stride = fwd.q_head_stride;
    bwd.dq_batch_stride = fwd.q_batch_stride, bwd.dq_row_stride = fwd.q_row_stride;
    bwd.dq_head_stride = fwd.q_head_stride;
    bwd.dk_batch_stride = fwd.k_batch_stride, bwd.dk_row_stride = fwd.k_row_stride;
    bwd.dk_head_stride = fwd.k_head_stride;
    bwd.dv_batch_stride = fwd.v_batch_stride, bwd.dv_row_stride = fwd.v_row_stride;
    bwd.dv_head_stride = fwd.v_head_stride;
  }
};

void expect_error(flashcute_status_t got, flashcute_status_t want, char const* argument) {
  EXPECT_EQ(got, want) << flashcute_last_error();
  EXPECT_NE(std::string(flashcute_last_error()).find(argument), std::string::npos)
      << "message '" << flashcute_last_error() << "' does not name " << argument;
}

struct Case {
  char const* argument;
  std::function<void(flashcute_fwd_params&)> spoil;
};

}  // namespace

TEST(ApiErrors, ValidReferenceCallSucceeds) {
  HostProblem p;
  ASSERT_EQ(flashcute_reference_fwd(&p.fwd), FLASHCUTE_SUCCESS) << flashcute_last_error();
  EXPECT_FALSE(std::isnan(p.out[0]));
  p.bwd.fwd = p.fwd;
  ASSERT_EQ(flashcute_reference_bwd(&p.bwd), FLASHCUTE_SUCCESS) << flashcute_last_error();
  EXPECT_STREQ(flashcute_last_error(), "");
}

TEST(ApiErrors, EveryBadForwardArgumentIsNamed) {
  std::vector<Case> const cases = {
      {"q", [](auto& f) { f.q = nullptr; }},
      {"k", [](auto& f) { f.k = nullptr; }},
      {"v", [](auto& f) { f.v = nullptr; }},
      {"out", [](auto& f) { f.out = nullptr; }},
      {"batch", [](auto& f) { f.batch = -1; }},
      {"seqlen_q", [](auto& f) { f.seqlen_q = -3; }},
      {"seqlen_k", [](auto& f) { f.seqlen_k = -2; }},
      {"nheads", [](auto& f) { f.nheads = 3; }},  // not a multiple of nheads_kv = 2
      {"nheads_kv", [](auto& f) { f.nheads_kv = 0; }},
      {"head_dim", [](auto& f) { f.head_dim = 0; }},
      {"head_dim_v", [](auto& f) { f.head_dim_v = -1; }},
      {"seqlen_q", [](auto& f) { f.seqlen_q = 1ll << 40; }},
      {"dtype", [](auto& f) { f.dtype = FLASHCUTE_BFLOAT16; }},
      {"dtype", [](auto& f) { f.dtype = (flashcute_dtype_t)42; }},
      {"softmax_scale", [](auto& f) { f.softmax_scale = 0.f; }},
      {"softmax_scale", [](auto& f) { f.softmax_scale = NAN; }},
      {"softcap", [](auto& f) { f.softcap = -1.f; }},
      {"causal", [](auto& f) { f.causal = 7; }},
      {"q strides", [](auto& f) { f.q_row_stride = -8; }},
      {"v strides", [](auto& f) { f.v_head_stride = -1; }},
      {"cu_seqlens", [](auto& f) { f.cu_seqlens_q = reinterpret_cast<int32_t const*>(&f); }},
      {"seqused_k", [](auto& f) { f.seqused_k = reinterpret_cast<int32_t const*>(&f); }},
  };
  for (auto const& c : cases) {
    HostProblem p;
    c.spoil(p.fwd);
    expect_error(flashcute_reference_fwd(&p.fwd), FLASHCUTE_ERROR_INVALID_ARGUMENT, c.argument);
    // The GPU path rejects the same input (in a GPU dtype) before it looks for a device.
    if (std::string(c.argument) == "dtype") continue;
    HostProblem g;
    g.fwd.dtype = FLASHCUTE_FLOAT16;
    c.spoil(g.fwd);
    expect_error(flashcute_fwd(&g.fwd, nullptr), FLASHCUTE_ERROR_INVALID_ARGUMENT, c.argument);
  }
}

TEST(ApiErrors, GpuOnlyRulesAreNamed) {
  std::vector<Case> const cases = {
      {"dtype", [](auto& f) { f.dtype = FLASHCUTE_FLOAT64; }},
      {"head_dim", [](auto& f) { f.head_dim = 12; }},       // not a multiple of 8
      {"head_dim", [](auto& f) { f.head_dim = 264; }},      // beyond 256
      {"head_dim_v", [](auto& f) { f.head_dim_v = 20; }},
      {"q must be 16-byte aligned", [](auto& f) { f.q = static_cast<char const*>(f.q) + 2; }},
      {"k strides must be multiples", [](auto& f) { f.k_row_stride = 12; }},
      {"out strides must be multiples", [](auto& f) { f.out_row_stride = 36; }},
  };
  for (auto const& c : cases) {
    HostProblem p;
    p.fwd.dtype = FLASHCUTE_BFLOAT16;
    c.spoil(p.fwd);
    expect_error(flashcute_fwd(&p.fwd, nullptr), FLASHCUTE_ERROR_INVALID_ARGUMENT, c.argument);
    size_t bytes = 1;
    expect_error(flashcute_fwd_workspace_size(&p.fwd, &bytes), FLASHCUTE_ERROR_INVALID_ARGUMENT, c.argument);
  }
}

// Attention sinks: the host reference runs them; dsink needs a sink and must not overwrite it.
TEST(ApiErrors, LearnableSinkArguments) {
  std::vector<double> sink(4, 0.5), dsink(4, NAN);
  HostProblem p;
  p.fwd.learnable_sink = sink.data();
  p.bwd.fwd = p.fwd;
  p.bwd.dsink = dsink.data();
  ASSERT_EQ(flashcute_reference_fwd(&p.fwd), FLASHCUTE_SUCCESS) << flashcute_last_error();
  ASSERT_EQ(flashcute_reference_bwd(&p.bwd), FLASHCUTE_SUCCESS) << flashcute_last_error();
  for (double x : dsink) EXPECT_TRUE(std::isfinite(x));
  HostProblem d;
  d.bwd.dsink = dsink.data();
  expect_error(flashcute_reference_bwd(&d.bwd), FLASHCUTE_ERROR_INVALID_ARGUMENT, "dsink");
  HostProblem a;
  a.bwd.fwd.learnable_sink = sink.data();
  a.bwd.dsink = sink.data();
  expect_error(flashcute_reference_bwd(&a.bwd), FLASHCUTE_ERROR_INVALID_ARGUMENT, "dsink");
}

TEST(ApiErrors, BackwardArgumentsAreNamed) {
  std::vector<std::pair<char const*, std::function<void(flashcute_bwd_params&)>>> const cases = {
      {"lse", [](auto& b) { b.fwd.lse = nullptr; }},
      {"dout", [](auto& b) { b.dout = nullptr; }},
      {"dq", [](auto& b) { b.dq = nullptr; }},
      {"dk", [](auto& b) { b.dk = nullptr; }},
      {"dv", [](auto& b) { b.dv = nullptr; }},
      {"dv strides", [](auto& b) { b.dv_row_stride = -2; }},
      {"deterministic", [](auto& b) { b.deterministic = 2; }},
      {"nheads", [](auto& b) { b.fwd.nheads = 5; }},
  };
  for (auto const& c : cases) {
    HostProblem p;
    c.second(p.bwd);
    expect_error(flashcute_reference_bwd(&p.bwd), FLASHCUTE_ERROR_INVALID_ARGUMENT, c.first);
    HostProblem g;
    g.bwd.fwd.dtype = FLASHCUTE_FLOAT16;
    c.second(g.bwd);
    expect_error(flashcute_bwd(&g.bwd, nullptr), FLASHCUTE_ERROR_INVALID_ARGUMENT, c.first);
  }
  expect_error(flashcute_reference_bwd(nullptr), FLASHCUTE_ERROR_INVALID_ARGUMENT, "params");
  expect_error(flashcute_reference_fwd(nullptr), FLASHCUTE_ERROR_INVALID_ARGUMENT, "params");
}

TEST(ApiErrors, HostPointersOnTheGpuPathAreRefusedOrNoDevice) {
  HostProblem p;
  p.fwd.dtype = FLASHCUTE_FLOAT16;
  p.fwd.head_dim = p.fwd.head_dim_v = 8;
  flashcute_status_t s = flashcute_fwd(&p.fwd, nullptr);
  // With a GPU: q is host memory. Without one: no device. Either way a status, not a crash.
  EXPECT_TRUE(s == FLASHCUTE_ERROR_INVALID_ARGUMENT || s == FLASHCUTE_ERROR_NO_DEVICE) << flashcute_last_error();
  if (s == FLASHCUTE_ERROR_INVALID_ARGUMENT)
    EXPECT_NE(std::string(flashcute_last_error()).find("q is"), std::string::npos) << flashcute_last_error();
}

TEST(ApiErrors, InfoCallsWork) {
  char buf[4096];
  EXPECT_EQ(flashcute_arch_profiles(0, buf, sizeof buf), FLASHCUTE_SUCCESS);
  EXPECT_NE(std::string(buf).find("sm_120"), std::string::npos);
  EXPECT_EQ(flashcute_arch_profiles(77, buf, sizeof buf), FLASHCUTE_ERROR_INVALID_ARGUMENT);
  HostProblem p;
  p.fwd.dtype = FLASHCUTE_BFLOAT16;
  p.fwd.head_dim = p.fwd.head_dim_v = 128;
  ASSERT_EQ(flashcute_explain(FLASHCUTE_FORWARD, &p.fwd, 120, buf, sizeof buf), FLASHCUTE_SUCCESS);
  EXPECT_NE(std::string(buf).find("sm80_fwd_bf16_hd128"), std::string::npos) << buf;
  EXPECT_EQ(flashcute_explain(FLASHCUTE_FORWARD, &p.fwd, 120, buf, 4), FLASHCUTE_ERROR_INVALID_ARGUMENT);
  // explain poses the call's own problem, query rows included: few rows take the 64-row Hopper tile (ROW_RANGES)
  p.fwd.seqlen_q = 32;
  ASSERT_EQ(flashcute_explain(FLASHCUTE_FORWARD, &p.fwd, 90, buf, sizeof buf), FLASHCUTE_SUCCESS);
  EXPECT_NE(std::string(buf).find("sm90_fwd_bf16_hd128_m64n128w4"), std::string::npos) << buf;
  p.fwd.seqlen_q = 4096;
  ASSERT_EQ(flashcute_explain(FLASHCUTE_FORWARD, &p.fwd, 90, buf, sizeof buf), FLASHCUTE_SUCCESS);
  EXPECT_NE(std::string(buf).find("sm90_fwd_bf16_hd128_m128n128w8"), std::string::npos) << buf;
  // fwd_occupancy: the CTAs per SM of the same choice (a requested profile has no multiprocessor count).
  int ctas = -1, sms = -1;
  p.fwd.seqlen_q = 4;
  ASSERT_EQ(flashcute_fwd_occupancy(&p.fwd, 90, &ctas, &sms), FLASHCUTE_SUCCESS);
  EXPECT_EQ(ctas, 1);  // the 161 KB Hopper decode tile
  EXPECT_EQ(sms, 0);
  ASSERT_EQ(flashcute_fwd_occupancy(&p.fwd, 80, &ctas, &sms), FLASHCUTE_SUCCESS);
  EXPECT_EQ(ctas, 2);  // the portable 64-row tiles
  ASSERT_EQ(flashcute_fwd_occupancy(&p.fwd, 120, &ctas, &sms), FLASHCUTE_SUCCESS);
  EXPECT_EQ(ctas, 2);
  expect_error(flashcute_fwd_occupancy(&p.fwd, 80, nullptr, &sms), FLASHCUTE_ERROR_INVALID_ARGUMENT, "ctas_per_sm");
  expect_error(flashcute_fwd_occupancy(nullptr, 80, &ctas, &sms), FLASHCUTE_ERROR_INVALID_ARGUMENT, "params");
  EXPECT_NE(std::string(flashcute_version()), "");
  EXPECT_NE(std::string(flashcute_build_info()).find("CUDA targets"), std::string::npos);
  EXPECT_STREQ(flashcute_status_string(FLASHCUTE_ERROR_NOT_BUILT), "kernel not built");
}

// ---------------------------------------------------------------------------------------------------------------
// The no-crash contract: NULL params, offsets that point outside the tensors, sizes that overflow allocations,
// outputs that alias, all give a named status and nothing else.

TEST(ApiErrors, NullParamsAreIgnoredOrRefused) {
  flashcute_fwd_params_init(nullptr);
  flashcute_bwd_params_init(nullptr);
  flashcute_fwd_params_set_contiguous_strides(nullptr);
  size_t bytes = 7;
  expect_error(flashcute_fwd_workspace_size(nullptr, &bytes), FLASHCUTE_ERROR_INVALID_ARGUMENT, "params");
  EXPECT_EQ(bytes, 0u);
  expect_error(flashcute_bwd_workspace_size(nullptr, &bytes), FLASHCUTE_ERROR_INVALID_ARGUMENT, "params");
  expect_error(flashcute_fwd_workspace_size(nullptr, nullptr), FLASHCUTE_ERROR_INVALID_ARGUMENT, "bytes");
  expect_error(flashcute_fwd(nullptr, nullptr), FLASHCUTE_ERROR_INVALID_ARGUMENT, "params");
  expect_error(flashcute_bwd(nullptr, nullptr), FLASHCUTE_ERROR_INVALID_ARGUMENT, "params");
  char buf[256];
  expect_error(flashcute_explain(FLASHCUTE_FORWARD, nullptr, 80, buf, sizeof buf), FLASHCUTE_ERROR_INVALID_ARGUMENT,
               "params");
  expect_error(flashcute_arch_profiles(0, nullptr, 0), FLASHCUTE_ERROR_INVALID_ARGUMENT, "buffer");
}

// A varlen problem for the reference: three sequences packed in total_q / total_k rows.
struct VarlenHost : HostProblem {
  std::vector<int32_t> cu_q{0, 2, 5, 9}, cu_k{0, 4, 4, 11}, used{3, 0, 7}, used_q{1, 3, 5};
  VarlenHost() : HostProblem(1, 9, 11, 4, 2, 8) {
    fwd.batch = 3, fwd.seqlen_q = 4, fwd.seqlen_k = 7;
    fwd.cu_seqlens_q = cu_q.data(), fwd.cu_seqlens_k = cu_k.data(), fwd.seqused_k = used.data();
    fwd.total_q = 9, fwd.total_k = 11;
    fwd.lse_head_stride = 9;  // lse is (H, total_q)
    bwd.fwd = fwd;
  }
};

TEST(ApiErrors, ReferenceRefusesOffsetsOutsideTheTensors) {
  {
    VarlenHost ok;
    ASSERT_EQ(flashcute_reference_fwd(&ok.fwd), FLASHCUTE_SUCCESS) << flashcute_last_error();
    ASSERT_EQ(flashcute_reference_bwd(&ok.bwd), FLASHCUTE_SUCCESS) << flashcute_last_error();
  }
  struct OffsetCase {
    char const* argument;
    std::function<void(VarlenHost&)> spoil;
  };
  std::vector<OffsetCase> const cases = {
      {"cu_seqlens_q[3]", [](auto& v) { v.cu_q[3] = 50; }},          // beyond the rows
      {"cu_seqlens_q[0]", [](auto& v) { v.cu_q[0] = -1; }},          // a negative first offset
      {"cu_seqlens_k must never decrease", [](auto& v) { v.cu_k = {0, 6, 4, 11}; }},
      {"cu_seqlens_q: sequence 2", [](auto& v) { v.fwd.seqlen_q = 3; }},  // longer than the declared maximum
      {"seqused_k[0]", [](auto& v) { v.used[0] = 5; }},              // longer than the sequence
      {"seqused_k[1]", [](auto& v) { v.used[1] = -2; }},
      {"seqused_q[2]", [](auto& v) { v.fwd.seqused_q = v.used_q.data(); }},  // 5 of the sequence's 4 rows
      {"total_q must be set", [](auto& v) { v.fwd.total_q = -1; }},
      {"total_k", [](auto& v) { v.fwd.total_k = 1ll << 40; }},
  };
  for (auto const& c : cases) {
    VarlenHost v;
    c.spoil(v);
    v.bwd.fwd = v.fwd;
    expect_error(flashcute_reference_fwd(&v.fwd), FLASHCUTE_ERROR_INVALID_ARGUMENT, c.argument);
    expect_error(flashcute_reference_bwd(&v.bwd), FLASHCUTE_ERROR_INVALID_ARGUMENT, c.argument);
  }
}

TEST(ApiErrors, HugeSizesGiveAStatusNotAnAbort) {
  HostProblem p;
  p.bwd.fwd.head_dim_v = 2147483647;  // the reference's per-key buffers cannot be allocated
  flashcute_status_t const s = flashcute_reference_bwd(&p.bwd);
  EXPECT_NE(s, FLASHCUTE_SUCCESS);
  EXPECT_NE(std::string(flashcute_last_error()), "");
}

TEST(ApiErrors, OutputsThatAliasAreRefused) {
  using Spoil = std::function<void(HostProblem&)>;
  std::vector<std::pair<char const*, Spoil>> const fwd_cases = {
      {"out overlaps the input k", [](auto& p) { p.fwd.out = p.k.data(); }},
      {"out overlaps the input q", [](auto& p) { p.fwd.out = p.q.data(); }},
      {"out strides", [](auto& p) { p.fwd.out_row_stride = 0; }},              // rows on top of each other
      {"lse strides", [](auto& p) { p.fwd.lse_head_stride = 2; }},             // shorter than seqlen_q = 5
      {"lse overlaps out", [](auto& p) { p.fwd.lse = p.fwd.out; }},
  };
  for (auto const& [argument, spoil] : fwd_cases) {
    HostProblem p;
    spoil(p);
    expect_error(flashcute_reference_fwd(&p.fwd), FLASHCUTE_ERROR_INVALID_ARGUMENT, argument);
  }
  std::vector<std::pair<char const*, Spoil>> const bwd_cases = {
      {"dk overlaps dq", [](auto& p) { p.bwd.dk = p.bwd.dq; }},
      {"dq overlaps the input dout", [](auto& p) { p.bwd.dq = p.dout.data(); }},
      {"dv overlaps the input v", [](auto& p) { p.bwd.dv = p.v.data(); }},
      {"dk strides", [](auto& p) { p.bwd.dk_head_stride = 0; }},
  };
  for (auto const& [argument, spoil] : bwd_cases) {
    HostProblem p;
    spoil(p);
    expect_error(flashcute_reference_bwd(&p.bwd), FLASHCUTE_ERROR_INVALID_ARGUMENT, argument);
  }
}

TEST(ApiErrors, InterleavedViewsOfOnePackedBufferAreNotAliases) {
  // q, k, v and dq, dk, dv as the three slices of (batch, seqlen, 3, heads, dim) buffers, as FlashAttention's packed
  // qkv functions lay them out: they share bytes' ranges but no element.
  int const b = 2, s = 6, h = 2, d = 8;
  std::vector<double> qkv((size_t)b * s * 3 * h * d, 0.5), dqkv(qkv.size(), NAN), out((size_t)b * s * h * d, NAN);
  std::vector<double> lse((size_t)b * h * s), dout(out.size(), 1.0);
  for (size_t i = 0; i < qkv.size(); ++i) qkv[i] = std::sin(0.37 * (double)i);
  flashcute_bwd_params p;
  flashcute_bwd_params_init(&p);
  auto& f = p.fwd;
  f.batch = b, f.seqlen_q = f.seqlen_k = s, f.nheads = f.nheads_kv = h, f.head_dim = f.head_dim_v = d;
  f.dtype = FLASHCUTE_FLOAT64, f.softmax_scale = 0.3f, f.causal = 1;
  flashcute_fwd_params_set_contiguous_strides(&f);
  int64_t const row = 3 * h * d, batch = s * row;
  f.q = qkv.data(), f.k = qkv.data() + h * d, f.v = qkv.data() + 2 * h * d;
  f.q_row_stride = f.k_row_stride = f.v_row_stride = row;
  f.q_batch_stride = f.k_batch_stride = f.v_batch_stride = batch;
  f.out = out.data(), f.lse = lse.data();
  ASSERT_EQ(flashcute_reference_fwd(&f), FLASHCUTE_SUCCESS) << flashcute_last_error();
  p.dout = dout.data(), p.dout_row_stride = h * d, p.dout_head_stride = d, p.dout_batch_stride = s * h * d;
  p.dq = dqkv.data(), p.dk = dqkv.data() + h * d, p.dv = dqkv.data() + 2 * h * d;
  p.dq_row_stride = p.dk_row_stride = p.dv_row_stride = row;
  p.dq_batch_stride = p.dk_batch_stride = p.dv_batch_stride = batch;
  p.dq_head_stride = p.dk_head_stride = p.dv_head_stride = d;
  ASSERT_EQ(flashcute_reference_bwd(&p), FLASHCUTE_SUCCESS) << flashcute_last_error();
  for (double x : dqkv) EXPECT_FALSE(std::isnan(x));
  p.dk = dqkv.data() + 4;  // now dk straddles dq's elements
  expect_error(flashcute_reference_bwd(&p), FLASHCUTE_ERROR_INVALID_ARGUMENT, "dk overlaps dq");
}

TEST(ApiErrors, SizeOneDimensionsIgnoreTheirStrides) {
  // A decode-like call: one query row, one K/V head; PyTorch gives size-1 dimensions arbitrary strides.
  HostProblem p(1, 1, 9, 2, 1, 8);
  p.fwd.q_row_stride = 1, p.fwd.q_batch_stride = -5;  // size-1 dims: batch and query rows
  p.fwd.k_head_stride = 3, p.fwd.v_head_stride = 7;   // nheads_kv = 1
  p.fwd.out_row_stride = 3, p.fwd.lse_batch_stride = 0;
  ASSERT_EQ(flashcute_reference_fwd(&p.fwd), FLASHCUTE_SUCCESS) << flashcute_last_error();
  p.bwd.fwd = p.fwd;
  p.bwd.dout_row_stride = 1, p.bwd.dq_row_stride = 5, p.bwd.dk_head_stride = 1, p.bwd.dv_head_stride = 1;
  ASSERT_EQ(flashcute_reference_bwd(&p.bwd), FLASHCUTE_SUCCESS) << flashcute_last_error();
  // The GPU path's alignment rules ignore them too: it gets as far as the pointers.
  HostProblem g(1, 1, 9, 2, 1, 8);
  g.fwd.dtype = FLASHCUTE_BFLOAT16;
  g.fwd.q_row_stride = 1, g.fwd.k_head_stride = 3;
  flashcute_status_t const s = flashcute_fwd(&g.fwd, nullptr);
  EXPECT_TRUE(s == FLASHCUTE_ERROR_NO_DEVICE || std::string(flashcute_last_error()).find("q is") == 0)
      << flashcute_last_error();
}

TEST(ApiErrors, EmptyProblemsSucceed) {
  for (auto [b, sq, sk] : {std::tuple{0, 5, 7}, {2, 0, 7}, {2, 5, 0}, {2, 0, 0}}) {
    HostProblem p(b, sq, sk);
    if (!b || !sq) p.fwd.q = p.fwd.out = p.fwd.lse = nullptr;  // tensors without elements may be NULL
    ASSERT_EQ(flashcute_reference_fwd(&p.fwd), FLASHCUTE_SUCCESS) << flashcute_last_error();
    for (size_t i = 0; i < p.out.size() && p.fwd.out; ++i) EXPECT_EQ(p.out[i], 0.0);  // no keys: out 0
    for (size_t i = 0; i < p.lse.size() && p.fwd.lse; ++i) EXPECT_TRUE(std::isinf(p.lse[i]) && p.lse[i] < 0);
    p.bwd.fwd = p.fwd;
    ASSERT_EQ(flashcute_reference_bwd(&p.bwd), FLASHCUTE_SUCCESS) << flashcute_last_error();
    for (double x : p.dk) EXPECT_EQ(x, 0.0);  // no queries, or no keys: zero gradients
    // The GPU path accepts it too (no device here is fine).
    HostProblem g(b, sq, sk);
    g.fwd.dtype = FLASHCUTE_BFLOAT16;
    flashcute_status_t const s = flashcute_fwd(&g.fwd, nullptr);
    EXPECT_TRUE(s == FLASHCUTE_SUCCESS || s == FLASHCUTE_ERROR_NO_DEVICE ||
                std::string(flashcute_last_error()).find("is host memory") != std::string::npos)
        << flashcute_last_error();
  }
}

TEST(ApiErrors, ExplainValidatesItsParams) {
  char buf[512];
  HostProblem p;
  p.fwd.dtype = (flashcute_dtype_t)99;
  expect_error(flashcute_explain(FLASHCUTE_FORWARD, &p.fwd, 80, buf, sizeof buf), FLASHCUTE_ERROR_INVALID_ARGUMENT,
               "dtype");
  HostProblem h;
  h.fwd.dtype = FLASHCUTE_BFLOAT16, h.fwd.head_dim = -64;
  expect_error(flashcute_explain(FLASHCUTE_BACKWARD, &h.fwd, 80, buf, sizeof buf), FLASHCUTE_ERROR_INVALID_ARGUMENT,
               "head_dim");
  expect_error(flashcute_explain((flashcute_direction_t)5, &h.fwd, 80, buf, sizeof buf),
               FLASHCUTE_ERROR_INVALID_ARGUMENT, "direction");
}

TEST(ApiErrors, GridLimitsAreNamed) {
  HostProblem p;
  p.fwd.dtype = FLASHCUTE_BFLOAT16;
  p.fwd.batch = 70000;
  expect_error(flashcute_fwd(&p.fwd, nullptr), FLASHCUTE_ERROR_INVALID_ARGUMENT, "batch must be at most 65535");
  p.fwd.batch = 1, p.fwd.nheads = 70000, p.fwd.nheads_kv = 70000;
  expect_error(flashcute_fwd(&p.fwd, nullptr), FLASHCUTE_ERROR_INVALID_ARGUMENT, "nheads must be at most 65535");
}

TEST(ApiErrors, VarlenPointersMustBeDeviceMemory) {
  VarlenHost v;
  v.fwd.dtype = FLASHCUTE_BFLOAT16;
  flashcute_status_t const s = flashcute_fwd(&v.fwd, nullptr);
  // Without a GPU: no device. With one, q (host memory) is named first; the device test covers cu_seqlens.
  EXPECT_TRUE(s == FLASHCUTE_ERROR_NO_DEVICE || s == FLASHCUTE_ERROR_INVALID_ARGUMENT) << flashcute_last_error();
  v.fwd.cu_seqlens_k = nullptr;
  expect_error(flashcute_fwd(&v.fwd, nullptr), FLASHCUTE_ERROR_INVALID_ARGUMENT, "given together");
  VarlenHost w;
  w.fwd.cu_seqlens_q = w.fwd.cu_seqlens_k = nullptr, w.fwd.seqused_k = nullptr;
  w.fwd.varlen_status = reinterpret_cast<int32_t*>(&w);
  expect_error(flashcute_reference_fwd(&w.fwd), FLASHCUTE_ERROR_INVALID_ARGUMENT, "varlen_status");
}
