// Bad input returns a status and a message naming the argument; nothing aborts. Runs without a GPU: the
// reference path and the GPU path's argument checks both come before any device work.
#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <string>
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
  EXPECT_NE(std::string(flashcute_version()), "");
  EXPECT_NE(std::string(flashcute_build_info()).find("CUDA targets"), std::string::npos);
  EXPECT_STREQ(flashcute_status_string(FLASHCUTE_ERROR_NOT_BUILT), "kernel not built");
}
