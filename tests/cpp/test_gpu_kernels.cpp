// GPU kernels through the C API against the float64 reference, on a few odd shapes. Small on purpose: this is the
// binary compute-sanitizer (memcheck, racecheck) runs; the full correctness grid is tests/python/test_gpu_grid.py.
// Skips without a CUDA device.
#include <gtest/gtest.h>

#include <cuda_bf16.h>
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cmath>
#include <ostream>
#include <random>
#include <climits>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "flashcute/flashcute.h"

namespace {

bool have_gpu() {
  int n = 0;
  return cudaGetDeviceCount(&n) == cudaSuccess && n > 0;
}

constexpr long long U = FLASHCUTE_WINDOW_UNBOUNDED;

struct Case {
  int b, sq, sk, h, hkv, d;
  bool causal;
  long long left, right;
  float softcap;
  bool varlen = false;  // b sequences of decreasing lengths (max sq, sk), packed, with seqused_k
  bool sink = false;    // a learnable sink per query head, and its gradient
};

void PrintTo(Case const& c, std::ostream* os) {
  *os << "b" << c.b << " sq" << c.sq << " sk" << c.sk << " h" << c.h << "/" << c.hkv << " d" << c.d;
}

struct DeviceBuffer {
  void* ptr = nullptr;
  explicit DeviceBuffer(size_t bytes, int poison = 0xFF) {
    EXPECT_EQ(cudaMalloc(&ptr, bytes), cudaSuccess);
    cudaMemset(ptr, poison, bytes);  // 0xFFFF is NaN in bf16: an unwritten element shows up
  }
  ~DeviceBuffer() { cudaFree(ptr); }
};

std::vector<__nv_bfloat16> to_bf16(std::vector<double>& x) {
  std::vector<__nv_bfloat16> out(x.size());
  for (size_t i = 0; i < x.size(); ++i) {
    out[i] = __float2bfloat16((float)x[i]);
    x[i] = (double)__bfloat162float(out[i]);  // the reference sees exactly what the GPU sees
  }
  return out;
}

template <class T>
void upload(DeviceBuffer& d, std::vector<T> const& h) {
  ASSERT_EQ(cudaMemcpy(d.ptr, h.data(), h.size() * sizeof(T), cudaMemcpyHostToDevice), cudaSuccess);
}

double max_abs(std::vector<double> const& v) {
  double m = 0;
  for (double x : v)
    if (std::isfinite(x)) m = std::fmax(m, std::fabs(x));
  return m;
}

// Relative to the largest magnitude: bf16 outputs carry ~4e-3 relative rounding; 3e-2 catches wrong indexing.
void expect_close(std::vector<__nv_bfloat16> const& got, std::vector<double> const& want, char const* what) {
  double const scale = std::fmax(max_abs(want), 1e-3);
  double worst = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    double const g = __bfloat162float(got[i]);
    ASSERT_FALSE(std::isnan(g)) << what << "[" << i << "] is NaN (unwritten?)";
    worst = std::fmax(worst, std::fabs(g - want[i]) / scale);
  }
  EXPECT_LT(worst, 3e-2) << what;
}

void run(Case const& c) {
  std::mt19937 rng(c.sq * 131 + c.sk * 7 + c.d);
  std::normal_distribution<double> nd;
  auto randv = [&](size_t n) {
    std::vector<double> v(n);
    for (auto& x : v) x = nd(rng);
    return v;
  };
  // Varlen: sequence i has max(1, sq - 37 i) queries and max(1, sk - 23 i) keys, of which seqused_k uses all but
  // 3 i; the fixed-length batch is the same packing with equal lengths.
  std::vector<int32_t> cu_q{0}, cu_k{0}, used_k;
  for (int i = 0; i < c.b; ++i) {
    int const lq = c.varlen ? std::max(1, c.sq - 37 * i) : c.sq, lk = c.varlen ? std::max(1, c.sk - 23 * i) : c.sk;
    cu_q.push_back(cu_q.back() + lq), cu_k.push_back(cu_k.back() + lk), used_k.push_back(std::max(1, lk - 3 * i));
  }
  size_t const nq = (size_t)cu_q.back() * c.h * c.d, nk = (size_t)cu_k.back() * c.hkv * c.d;
  size_t const nl = (size_t)cu_q.back() * c.h;
  std::vector<double> q = randv(nq), k = randv(nk), v = randv(nk), dout = randv(nq), dlse = randv(nl);
  std::vector<double> sink = randv(c.h), dsink_ref(c.h, NAN);
  std::vector<float> sinkf(sink.begin(), sink.end());
  for (size_t i = 0; i < sink.size(); ++i) sink[i] = sinkf[i];  // the reference sees the GPU's float32 logits
  auto qh = to_bf16(q), kh = to_bf16(k), vh = to_bf16(v), douth = to_bf16(dout);
  std::vector<float> dlsef(dlse.begin(), dlse.end());

  flashcute_fwd_params p;
  flashcute_fwd_params_init(&p);
  p.batch = c.b, p.seqlen_q = c.sq, p.seqlen_k = c.sk, p.nheads = c.h, p.nheads_kv = c.hkv;
  p.head_dim = p.head_dim_v = c.d;
  p.softmax_scale = 1.f / std::sqrt((float)c.d);
  p.softcap = c.softcap, p.causal = c.causal, p.window_left = c.left, p.window_right = c.right;
  if (c.varlen) p.total_q = cu_q.back(), p.total_k = cu_k.back();
  flashcute_fwd_params_set_contiguous_strides(&p);
  if (c.varlen) p.lse_head_stride = cu_q.back();  // lse is (H, total_q)

  // Reference on the rounded inputs.
  std::vector<double> out_ref(nq), lse_ref(nl), dq_ref(nq), dk_ref(nk), dv_ref(nk);
  flashcute_fwd_params r = p;
  r.dtype = FLASHCUTE_FLOAT64, r.q = q.data(), r.k = k.data(), r.v = v.data(), r.out = out_ref.data();
  r.lse = lse_ref.data();
  if (c.varlen) r.cu_seqlens_q = cu_q.data(), r.cu_seqlens_k = cu_k.data(), r.seqused_k = used_k.data();
  if (c.sink) r.learnable_sink = sink.data();
  ASSERT_EQ(flashcute_reference_fwd(&r), FLASHCUTE_SUCCESS) << flashcute_last_error();

  DeviceBuffer dq_(nq * 2), dk_(nk * 2), dv_(nk * 2), dout_(nq * 2), out(nq * 2), lse(nl * 4), dlse_(nl * 4);
  DeviceBuffer qd(nq * 2), kd(nk * 2), vd(nk * 2), sink_(c.h * 4), dsink_(c.h * 4);
  upload(qd, qh), upload(kd, kh), upload(vd, vh), upload(dout_, douth), upload(dlse_, dlsef), upload(sink_, sinkf);
  if (c.sink) p.learnable_sink = sink_.ptr;
  p.dtype = FLASHCUTE_BFLOAT16, p.q = qd.ptr, p.k = kd.ptr, p.v = vd.ptr, p.out = out.ptr, p.lse = lse.ptr;
  DeviceBuffer cu_qd(cu_q.size() * 4, 0), cu_kd(cu_k.size() * 4, 0), used_kd(used_k.size() * 4, 0);
  DeviceBuffer status(4);
  if (c.varlen) {
    upload(cu_qd, cu_q), upload(cu_kd, cu_k), upload(used_kd, used_k);
    p.cu_seqlens_q = static_cast<int32_t const*>(cu_qd.ptr), p.cu_seqlens_k = static_cast<int32_t const*>(cu_kd.ptr);
    p.seqused_k = static_cast<int32_t const*>(used_kd.ptr);
    p.varlen_status = static_cast<int32_t*>(status.ptr);
  }
  size_t fwd_ws = 0;
  ASSERT_EQ(flashcute_fwd_workspace_size(&p, &fwd_ws), FLASHCUTE_SUCCESS) << flashcute_last_error();
  DeviceBuffer fwd_work(fwd_ws ? fwd_ws : 1);
  p.workspace = fwd_work.ptr, p.workspace_size = fwd_ws;
  flashcute_status_t const st = flashcute_fwd(&p, nullptr);
  if (st == FLASHCUTE_ERROR_NOT_BUILT) GTEST_SKIP() << flashcute_last_error();
  ASSERT_EQ(st, FLASHCUTE_SUCCESS) << flashcute_last_error();
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  if (c.varlen) {
    int32_t flags = -1;
    cudaMemcpy(&flags, status.ptr, 4, cudaMemcpyDeviceToHost);
    EXPECT_EQ(flags, 0) << "consistent offsets reported as inconsistent";
  }
  std::vector<__nv_bfloat16> out_h(nq);
  std::vector<float> lse_h(nl);
  cudaMemcpy(out_h.data(), out.ptr, nq * 2, cudaMemcpyDeviceToHost);
  cudaMemcpy(lse_h.data(), lse.ptr, nl * 4, cudaMemcpyDeviceToHost);
  expect_close(out_h, out_ref, "out");
  for (size_t i = 0; i < nl; ++i) {
    if (std::isinf(lse_ref[i])) {
      EXPECT_TRUE(std::isinf(lse_h[i]) && lse_h[i] < 0) << "lse[" << i << "] = " << lse_h[i];
    } else {
      EXPECT_NEAR(lse_h[i], lse_ref[i], 2e-2) << "lse[" << i << "]";
    }
  }

  // Backward from the GPU's own out and lse (what autograd does), compared with the reference's backward.
  std::vector<double> out_gpu(nq), lse_gpu(nl);
  for (size_t i = 0; i < nq; ++i) out_gpu[i] = __bfloat162float(out_h[i]);
  for (size_t i = 0; i < nl; ++i) lse_gpu[i] = lse_h[i];
  flashcute_bwd_params rb;
  flashcute_bwd_params_init(&rb);
  rb.fwd = r, rb.fwd.out = out_gpu.data(), rb.fwd.lse = lse_gpu.data();
  rb.dout = dout.data(), rb.dlse = dlse.data(), rb.dq = dq_ref.data(), rb.dk = dk_ref.data(), rb.dv = dv_ref.data();
  if (c.sink) rb.dsink = dsink_ref.data();
  rb.dout_batch_stride = p.q_batch_stride, rb.dout_row_stride = p.q_row_stride, rb.dout_head_stride = p.q_head_stride;
  rb.dq_batch_stride = p.q_batch_stride, rb.dq_row_stride = p.q_row_stride, rb.dq_head_stride = p.q_head_stride;
  rb.dk_batch_stride = p.k_batch_stride, rb.dk_row_stride = p.k_row_stride, rb.dk_head_stride = p.k_head_stride;
  rb.dv_batch_stride = p.v_batch_stride, rb.dv_row_stride = p.v_row_stride, rb.dv_head_stride = p.v_head_stride;
  ASSERT_EQ(flashcute_reference_bwd(&rb), FLASHCUTE_SUCCESS) << flashcute_last_error();

  for (int deterministic : {0, 1}) {
    flashcute_bwd_params g = rb;
    g.fwd = p, g.fwd.workspace = nullptr, g.fwd.workspace_size = 0, g.dout = dout_.ptr, g.dlse = dlse_.ptr, g.dq = dq_.ptr, g.dk = dk_.ptr, g.dv = dv_.ptr;
    g.deterministic = deterministic;
    g.dsink = c.sink ? dsink_.ptr : nullptr;
    size_t ws = 0;
    ASSERT_EQ(flashcute_bwd_workspace_size(&g, &ws), FLASHCUTE_SUCCESS) << flashcute_last_error();
    DeviceBuffer work(ws ? ws : 1);
    g.workspace = work.ptr, g.workspace_size = ws;
    cudaMemset(dq_.ptr, 0xFF, nq * 2), cudaMemset(dk_.ptr, 0xFF, nk * 2), cudaMemset(dv_.ptr, 0xFF, nk * 2);
    ASSERT_EQ(flashcute_bwd(&g, nullptr), FLASHCUTE_SUCCESS) << flashcute_last_error();
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    std::vector<__nv_bfloat16> dq_h(nq), dk_h(nk), dv_h(nk);
    cudaMemcpy(dq_h.data(), dq_.ptr, nq * 2, cudaMemcpyDeviceToHost);
    cudaMemcpy(dk_h.data(), dk_.ptr, nk * 2, cudaMemcpyDeviceToHost);
    cudaMemcpy(dv_h.data(), dv_.ptr, nk * 2, cudaMemcpyDeviceToHost);
    expect_close(dq_h, dq_ref, "dq");
    expect_close(dk_h, dk_ref, "dk");
    expect_close(dv_h, dv_ref, "dv");
    if (c.sink) {
      std::vector<float> dsink_h(c.h);
      cudaMemcpy(dsink_h.data(), dsink_.ptr, c.h * 4, cudaMemcpyDeviceToHost);
      double const scale = std::fmax(max_abs(dsink_ref), 1e-3);
      for (int i = 0; i < c.h; ++i) EXPECT_NEAR(dsink_h[i], dsink_ref[i], 2e-2 * scale) << "dsink[" << i << "]";
    }
  }
}

}  // namespace

class GpuKernels : public ::testing::TestWithParam<Case> {};

TEST_P(GpuKernels, MatchReference) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device";
  run(GetParam());
}

INSTANTIATE_TEST_SUITE_P(
    Shapes, GpuKernels,
    ::testing::Values(Case{1, 17, 113, 2, 2, 64, true, U, U, 0.f},    // causal, Sq < Sk
                      Case{2, 113, 17, 4, 1, 128, true, U, U, 0.f},   // MQA, causal Sq > Sk: empty rows
                      Case{1, 130, 130, 4, 2, 96, false, 20, 5, 0.f},   // GQA, sliding window
                      Case{1, 130, 150, 2, 2, 128, false, 40, -7, 0.f},  // window past the diagonal (negative right)
                      Case{1, 65, 70, 2, 2, 256, false, U, U, 10.f},  // softcap, odd sizes
                      Case{1, 1, 1, 2, 2, 192, false, U, U, 0.f},     // seqlen 1
                      Case{3, 150, 97, 4, 2, 64, true, U, U, 0.f, true},     // varlen + seqused_k, GQA, causal
                      Case{4, 120, 200, 2, 2, 128, false, 30, U, 0.f, true},  // varlen + seqused_k, window
                      Case{2, 113, 17, 4, 1, 128, true, U, U, 0.f, false, true},  // sink; empty rows give lse = sink
                      Case{3, 150, 97, 4, 2, 256, true, U, U, 5.f, true, true}),  // sink, varlen, GQA, softcap
    [](::testing::TestParamInfo<Case> const& info) {
      Case const& c = info.param;
      return "sq" + std::to_string(c.sq) + "_sk" + std::to_string(c.sk) + "_h" + std::to_string(c.h) + "_kv" +
             std::to_string(c.hkv) + "_d" + std::to_string(c.d) + (c.causal ? "_causal" : "") +
             (c.left != U || c.right != U ? (c.right != U && c.right < 0 ? "_window_neg" : "_window") : "") +
             (c.softcap > 0 ? "_softcap" : "") +
             (c.varlen ? "_varlen" : "") + (c.sink ? "_sink" : "");
    });

// ---------------------------------------------------------------------------------------------------------------
// Offsets the caller got wrong: whatever cu_seqlens and seqused_k hold, no kernel touches memory outside the
// tensors and the workspace (this binary runs under compute-sanitizer memcheck, with every buffer allocated at its
// exact size), every call succeeds, and varlen_status names what was wrong.

namespace {

struct Exact {  // a device allocation of exactly the tensor's bytes, so that any access past it is caught
  void* ptr = nullptr;
  explicit Exact(size_t bytes) {
    EXPECT_EQ(cudaMalloc(&ptr, bytes ? bytes : 1), cudaSuccess);
    cudaMemset(ptr, 0x3C, bytes ? bytes : 1);  // ~1.0 in bf16: finite inputs
  }
  ~Exact() { cudaFree(ptr); }
};

struct Offsets {
  char const* what;
  std::vector<int32_t> cu_q, cu_k, used;
  int32_t expect;  // varlen_status bits
  std::vector<int32_t> used_q = {};
};

void run_adversarial(Offsets const& o, int head_dim, int deterministic) {
  int const batch = 4, h = 4, hkv = 2, total_q = 100, total_k = 150, max_q = 64, max_k = 80;
  flashcute_fwd_params p;
  flashcute_fwd_params_init(&p);
  p.batch = batch, p.seqlen_q = max_q, p.seqlen_k = max_k, p.nheads = h, p.nheads_kv = hkv;
  p.head_dim = p.head_dim_v = head_dim, p.softmax_scale = 0.125f, p.causal = 1;
  p.total_q = total_q, p.total_k = total_k;
  flashcute_fwd_params_set_contiguous_strides(&p);
  p.lse_head_stride = total_q;  // lse is (H, total_q)
  size_t const nq = (size_t)total_q * h * head_dim, nk = (size_t)total_k * hkv * head_dim, nl = (size_t)total_q * h;
  Exact q(nq * 2), k(nk * 2), v(nk * 2), out(nq * 2), lse(nl * 4), dout(nq * 2), dlse(nl * 4);
  Exact dq(nq * 2), dk(nk * 2), dv(nk * 2), cu_q(o.cu_q.size() * 4), cu_k(o.cu_k.size() * 4), status(4);
  Exact used(o.used.size() * 4), used_q(o.used_q.size() * 4);
  cudaMemcpy(used_q.ptr, o.used_q.data(), o.used_q.size() * 4, cudaMemcpyHostToDevice);
  cudaMemcpy(cu_q.ptr, o.cu_q.data(), o.cu_q.size() * 4, cudaMemcpyHostToDevice);
  cudaMemcpy(cu_k.ptr, o.cu_k.data(), o.cu_k.size() * 4, cudaMemcpyHostToDevice);
  cudaMemcpy(used.ptr, o.used.data(), o.used.size() * 4, cudaMemcpyHostToDevice);
  p.q = q.ptr, p.k = k.ptr, p.v = v.ptr, p.out = out.ptr, p.lse = lse.ptr;
  p.cu_seqlens_q = static_cast<int32_t const*>(cu_q.ptr), p.cu_seqlens_k = static_cast<int32_t const*>(cu_k.ptr);
  p.seqused_k = o.used.empty() ? nullptr : static_cast<int32_t const*>(used.ptr);
  p.seqused_q = o.used_q.empty() ? nullptr : static_cast<int32_t const*>(used_q.ptr);
  p.varlen_status = static_cast<int32_t*>(status.ptr);
  size_t fwd_ws = 0;
  ASSERT_EQ(flashcute_fwd_workspace_size(&p, &fwd_ws), FLASHCUTE_SUCCESS) << flashcute_last_error();
  EXPECT_GT(fwd_ws, 0u) << "varlen calls need a workspace for the sequence table";
  Exact fwd_work(fwd_ws);
  p.workspace = fwd_work.ptr, p.workspace_size = fwd_ws;
  flashcute_status_t const st = flashcute_fwd(&p, nullptr);
  if (st == FLASHCUTE_ERROR_NOT_BUILT) GTEST_SKIP() << flashcute_last_error();
  ASSERT_EQ(st, FLASHCUTE_SUCCESS) << o.what << ": " << flashcute_last_error();
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess) << o.what;
  int32_t flags = -1;
  cudaMemcpy(&flags, status.ptr, 4, cudaMemcpyDeviceToHost);
  EXPECT_EQ(flags, o.expect) << o.what << " (forward)";

  flashcute_bwd_params b;
  flashcute_bwd_params_init(&b);
  b.fwd = p, b.fwd.workspace = nullptr, b.fwd.workspace_size = 0, b.dout = dout.ptr, b.dlse = dlse.ptr, b.dq = dq.ptr, b.dk = dk.ptr, b.dv = dv.ptr;
  b.dout_row_stride = b.dq_row_stride = p.q_row_stride, b.dout_head_stride = b.dq_head_stride = p.q_head_stride;
  b.dk_row_stride = b.dv_row_stride = p.k_row_stride, b.dk_head_stride = b.dv_head_stride = p.k_head_stride;
  b.deterministic = deterministic;
  size_t ws = 0;
  ASSERT_EQ(flashcute_bwd_workspace_size(&b, &ws), FLASHCUTE_SUCCESS) << flashcute_last_error();
  Exact work(ws);
  b.workspace = work.ptr, b.workspace_size = ws;
  cudaMemset(status.ptr, 0x7F, 4);
  ASSERT_EQ(flashcute_bwd(&b, nullptr), FLASHCUTE_SUCCESS) << o.what << ": " << flashcute_last_error();
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess) << o.what;
  cudaMemcpy(&flags, status.ptr, 4, cudaMemcpyDeviceToHost);
  EXPECT_EQ(flags, o.expect) << o.what << " (backward)";
}

}  // namespace

TEST(GpuKernelsVarlen, AdversarialOffsetsStayInBounds) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device";
  int32_t const lo = INT32_MIN, hi = INT32_MAX;
  std::vector<Offsets> const cases = {
      {"consistent", {0, 30, 60, 60, 100}, {0, 40, 100, 120, 150}, {40, 10, 20, 30}, 0},
      {"past the rows", {0, 50, 90, 130, 200}, {0, 60, 120, 180, 240}, {}, 1 | 2 | 4},
      {"decreasing", {0, 60, 20, 80, 40}, {150, 100, 50, 10, 0}, {}, 1 | 2},
      {"negative", {-50, -10, 0, 10, 20}, {-1, 0, -7, 3, 5}, {}, 1 | 2},
      {"too long for the maxima", {0, 100, 100, 100, 100}, {0, 150, 150, 150, 150}, {}, 4 | 8},
      {"seqused_k outside its sequence", {0, 25, 50, 75, 100}, {0, 30, 60, 90, 150}, {1000, -3, lo, 60}, 16},
      {"int32 extremes", {lo, hi, lo, hi, lo}, {hi, lo, hi, lo, hi}, {hi, lo, hi, lo}, 1 | 2 | 4 | 8 | 16},
      {"seqused_q outside its sequence", {0, 25, 50, 75, 100}, {0, 30, 60, 90, 150}, {}, 32, {1000, -1, 5, 25}},
      {"seqused_q consistent", {0, 25, 50, 75, 100}, {0, 30, 60, 90, 150}, {30, 0, 30, 7}, 0, {25, 0, 3, 24}},
  };
  for (int head_dim : {64, 128})
    for (int deterministic : {0, 1})
      for (auto const& o : cases) {
        run_adversarial(o, head_dim, deterministic);
        if (HasFatalFailure() || IsSkipped()) return;
      }
}

// Empty problems: nothing launched where there is nothing to do (NULL pointers accepted for tensors without
// elements), rows that see no key when there are no keys, zero dk/dv when there are no queries.
TEST(GpuKernelsEmpty, EmptyBatchesAndSequences) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device";
  for (auto [batch, sq, sk] : {std::tuple{0, 16, 16}, {2, 0, 0}, {2, 0, 33}, {2, 17, 0}}) {
    int const h = 2, d = 64;
    flashcute_fwd_params p;
    flashcute_fwd_params_init(&p);
    p.batch = batch, p.seqlen_q = sq, p.seqlen_k = sk, p.nheads = p.nheads_kv = h, p.head_dim = p.head_dim_v = d;
    p.softmax_scale = 0.125f;
    flashcute_fwd_params_set_contiguous_strides(&p);
    size_t const nq = (size_t)batch * sq * h * d, nk = (size_t)batch * sk * h * d, nl = (size_t)batch * h * sq;
    auto dev = [](size_t bytes) -> void* {
      void* ptr = nullptr;
      if (bytes) EXPECT_EQ(cudaMalloc(&ptr, bytes), cudaSuccess);
      if (bytes) cudaMemset(ptr, 0xFF, bytes);
      return ptr;
    };
    void *q = dev(nq * 2), *k = dev(nk * 2), *v = dev(nk * 2), *out = dev(nq * 2), *lse = dev(nl * 4);
    void *dq = dev(nq * 2), *dk = dev(nk * 2), *dv = dev(nk * 2), *dout = dev(nq * 2);
    if (dout) cudaMemset(dout, 0x3C, nq * 2);
    p.q = q, p.k = k, p.v = v, p.out = out, p.lse = lse;
    flashcute_status_t const st = flashcute_fwd(&p, nullptr);
    if (st == FLASHCUTE_ERROR_NOT_BUILT) GTEST_SKIP() << flashcute_last_error();
    ASSERT_EQ(st, FLASHCUTE_SUCCESS) << flashcute_last_error();
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    std::vector<__nv_bfloat16> out_h(nq);
    std::vector<float> lse_h(nl);
    if (nq) cudaMemcpy(out_h.data(), out, nq * 2, cudaMemcpyDeviceToHost);
    if (nl) cudaMemcpy(lse_h.data(), lse, nl * 4, cudaMemcpyDeviceToHost);
    for (auto x : out_h) ASSERT_EQ(__bfloat162float(x), 0.f) << "no keys: out must be 0";
    for (float x : lse_h) ASSERT_TRUE(std::isinf(x) && x < 0) << "no keys: lse must be -inf";

    flashcute_bwd_params b;
    flashcute_bwd_params_init(&b);
    b.fwd = p, b.dout = dout, b.dq = dq, b.dk = dk, b.dv = dv;
    b.dout_batch_stride = b.dq_batch_stride = p.q_batch_stride, b.dout_row_stride = b.dq_row_stride = p.q_row_stride;
    b.dout_head_stride = b.dq_head_stride = p.q_head_stride;
    b.dk_batch_stride = b.dv_batch_stride = p.k_batch_stride, b.dk_row_stride = b.dv_row_stride = p.k_row_stride;
    b.dk_head_stride = b.dv_head_stride = p.k_head_stride;
    size_t ws = 0;
    ASSERT_EQ(flashcute_bwd_workspace_size(&b, &ws), FLASHCUTE_SUCCESS) << flashcute_last_error();
    void* work = dev(ws);
    b.workspace = work, b.workspace_size = ws;
    ASSERT_EQ(flashcute_bwd(&b, nullptr), FLASHCUTE_SUCCESS) << flashcute_last_error();
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    for (auto [ptr, n] : {std::pair{dq, nq}, {dk, nk}, {dv, nk}}) {
      std::vector<__nv_bfloat16> g(n);
      if (n) cudaMemcpy(g.data(), ptr, n * 2, cudaMemcpyDeviceToHost);
      for (auto x : g) ASSERT_EQ(__bfloat162float(x), 0.f) << "batch " << batch << " sq " << sq << " sk " << sk;
    }
    for (void* ptr : {q, k, v, out, lse, dq, dk, dv, dout, work}) cudaFree(ptr);
  }
}

// Host memory where the GPU path reads or writes device memory is refused, naming the argument.
TEST(GpuKernelsVarlen, HostPointersAreRefused) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device";
  std::vector<Offsets> const one = {{"consistent", {0, 30, 60, 60, 100}, {0, 40, 100, 120, 150}, {40, 10, 20, 30}, 0}};
  int const h = 4, hkv = 2, d = 64;
  Exact q(100 * h * d * 2), k(150 * hkv * d * 2), v(150 * hkv * d * 2), out(100 * h * d * 2), lse(100 * h * 4);
  Exact cu_q(5 * 4), cu_k(5 * 4), status(4);
  cudaMemcpy(cu_q.ptr, one[0].cu_q.data(), 20, cudaMemcpyHostToDevice);
  cudaMemcpy(cu_k.ptr, one[0].cu_k.data(), 20, cudaMemcpyHostToDevice);
  std::vector<int32_t> host_offsets = one[0].cu_q, host_used = one[0].used;
  int32_t host_status = 0;
  auto params = [&] {
    flashcute_fwd_params p;
    flashcute_fwd_params_init(&p);
    p.batch = 4, p.seqlen_q = 64, p.seqlen_k = 80, p.nheads = h, p.nheads_kv = hkv, p.head_dim = p.head_dim_v = d;
    p.softmax_scale = 0.125f, p.total_q = 100, p.total_k = 150;
    flashcute_fwd_params_set_contiguous_strides(&p);
    p.lse_head_stride = 100;  // lse is (H, total_q)
    p.q = q.ptr, p.k = k.ptr, p.v = v.ptr, p.out = out.ptr, p.lse = lse.ptr;
    p.cu_seqlens_q = static_cast<int32_t const*>(cu_q.ptr), p.cu_seqlens_k = static_cast<int32_t const*>(cu_k.ptr);
    return p;
  };
  flashcute_fwd_params p = params();
  p.cu_seqlens_q = host_offsets.data();
  EXPECT_EQ(flashcute_fwd(&p, nullptr), FLASHCUTE_ERROR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(flashcute_last_error()).find("cu_seqlens_q is"), std::string::npos) << flashcute_last_error();
  p = params(), p.seqused_k = host_used.data();
  EXPECT_EQ(flashcute_fwd(&p, nullptr), FLASHCUTE_ERROR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(flashcute_last_error()).find("seqused_k is"), std::string::npos) << flashcute_last_error();
  p = params(), p.varlen_status = &host_status;
  EXPECT_EQ(flashcute_fwd(&p, nullptr), FLASHCUTE_ERROR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(flashcute_last_error()).find("varlen_status is"), std::string::npos) << flashcute_last_error();
  p = params(), p.workspace = host_offsets.data();
  EXPECT_EQ(flashcute_fwd(&p, nullptr), FLASHCUTE_ERROR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(flashcute_last_error()).find("workspace is"), std::string::npos) << flashcute_last_error();
  p = params();
  EXPECT_EQ(flashcute_fwd(&p, nullptr), FLASHCUTE_ERROR_WORKSPACE) << "varlen needs the sequence table's workspace";
  size_t bytes = 0;
  ASSERT_EQ(flashcute_fwd_workspace_size(&p, &bytes), FLASHCUTE_SUCCESS) << flashcute_last_error();
  Exact work(bytes);
  p.workspace = work.ptr, p.workspace_size = bytes;
  EXPECT_EQ(flashcute_fwd(&p, nullptr), FLASHCUTE_SUCCESS) << flashcute_last_error();
  EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  Exact roomy(bytes + 16);
  p.workspace = static_cast<char*>(roomy.ptr) + 4, p.workspace_size = bytes + 12;
  EXPECT_EQ(flashcute_fwd(&p, nullptr), FLASHCUTE_ERROR_WORKSPACE) << "a workspace off 16-byte alignment";
  EXPECT_NE(std::string(flashcute_last_error()).find("16-byte aligned"), std::string::npos) << flashcute_last_error();
}

// ---------------------------------------------------------------------------------------------------------------
// Paged K/V read in place: the same keys in shuffled pages give the bits of the contiguous cache run as varlen
// sequences with the same seqused_k, and match the float64 reference; table entries past the used keys are never
// read, and a bad entry among them, clamped by the kernels, stays inside the pages (exact-size allocations, for
// compute-sanitizer memcheck).

namespace {

void run_paged(int page_size, int head_dim, int seqlen_q, bool causal) {
  int const B = 3, SK = 300, H = 4, HKV = 2, D = head_dim;
  std::vector<int32_t> used{123, 0, 300};  // the last row of the table full, so a read past it leaves the allocation
  std::mt19937 rng(page_size * 31 + head_dim + seqlen_q);
  std::normal_distribution<double> nd;
  auto randv = [&](size_t n) {
    std::vector<double> x(n);
    for (auto& e : x) e = nd(rng);
    return x;
  };
  size_t const nq = (size_t)B * seqlen_q * H * D, nk = (size_t)B * SK * HKV * D, nl = (size_t)B * H * seqlen_q;
  std::vector<double> q = randv(nq), k = randv(nk), v = randv(nk);
  auto qh = to_bf16(q), kh = to_bf16(k), vh = to_bf16(v);
  int const per = (SK + page_size - 1) / page_size, pages = B * per + 1;
  std::vector<int32_t> perm(pages);
  for (int i = 0; i < pages; ++i) perm[i] = i;
  std::shuffle(perm.begin(), perm.end(), rng);
  int const cols = per + 2;  // spare columns, never read: garbage there
  std::vector<int32_t> table((size_t)B * cols, INT_MAX);
  std::vector<__nv_bfloat16> kp((size_t)pages * page_size * HKV * D), vp(kp.size());
  for (int b = 0; b < B; ++b)
    for (int j = 0; j < SK; ++j) {
      int const page = perm[b * per + j / page_size];
      table[(size_t)b * cols + j / page_size] = page;
      for (int e = 0; e < HKV * D; ++e) {
        size_t const dst = ((size_t)page * page_size + j % page_size) * HKV * D + e;
        kp[dst] = kh[((size_t)b * SK + j) * HKV * D + e];
        vp[dst] = vh[((size_t)b * SK + j) * HKV * D + e];
      }
    }
  for (int i = (used[1] + page_size - 1) / page_size; i < per; ++i) table[(size_t)cols + i] = -7;  // unused pages

  flashcute_fwd_params p;
  flashcute_fwd_params_init(&p);
  p.dtype = FLASHCUTE_BFLOAT16, p.batch = B, p.seqlen_q = seqlen_q, p.seqlen_k = SK, p.nheads = H;
  p.nheads_kv = HKV, p.head_dim = p.head_dim_v = D, p.softmax_scale = 1.f / std::sqrt((float)D), p.causal = causal;
  flashcute_fwd_params_set_contiguous_strides(&p);

  // The float64 reference, each sequence's used keys contiguous.
  std::vector<double> out_ref(nq), lse_ref(nl);
  std::vector<int32_t> cu_k{0, SK, 2 * SK, 3 * SK}, cu_q{0, seqlen_q, 2 * seqlen_q, 3 * seqlen_q};
  flashcute_fwd_params r = p;
  r.dtype = FLASHCUTE_FLOAT64, r.q = q.data(), r.k = k.data(), r.v = v.data(), r.out = out_ref.data();
  r.lse = lse_ref.data(), r.seqused_k = used.data(), r.cu_seqlens_q = cu_q.data(), r.cu_seqlens_k = cu_k.data();
  r.total_q = B * seqlen_q, r.total_k = B * SK;
  r.lse_batch_stride = seqlen_q, r.lse_head_stride = B * seqlen_q;  // varlen lse is (H, total_q)
  ASSERT_EQ(flashcute_reference_fwd(&r), FLASHCUTE_SUCCESS) << flashcute_last_error();

  // The GPU on the contiguous cache (varlen), then on the pages.
  Exact qd(nq * 2), kd(nk * 2), vd(nk * 2), kpd(kp.size() * 2), vpd(vp.size() * 2), tabled(table.size() * 4);
  Exact usedd(used.size() * 4), cu_qd(16), cu_kd(16), out_c(nq * 2), lse_c(nl * 4), out_p(nq * 2), lse_p(nl * 4);
  cudaMemcpy(qd.ptr, qh.data(), nq * 2, cudaMemcpyHostToDevice);
  cudaMemcpy(kd.ptr, kh.data(), nk * 2, cudaMemcpyHostToDevice);
  cudaMemcpy(vd.ptr, vh.data(), nk * 2, cudaMemcpyHostToDevice);
  cudaMemcpy(kpd.ptr, kp.data(), kp.size() * 2, cudaMemcpyHostToDevice);
  cudaMemcpy(vpd.ptr, vp.data(), vp.size() * 2, cudaMemcpyHostToDevice);
  cudaMemcpy(tabled.ptr, table.data(), table.size() * 4, cudaMemcpyHostToDevice);
  cudaMemcpy(usedd.ptr, used.data(), used.size() * 4, cudaMemcpyHostToDevice);
  cudaMemcpy(cu_qd.ptr, cu_q.data(), 16, cudaMemcpyHostToDevice);
  cudaMemcpy(cu_kd.ptr, cu_k.data(), 16, cudaMemcpyHostToDevice);
  flashcute_fwd_params c = p;
  c.q = qd.ptr, c.k = kd.ptr, c.v = vd.ptr, c.out = out_c.ptr, c.lse = lse_c.ptr;
  c.cu_seqlens_q = static_cast<int32_t const*>(cu_qd.ptr), c.cu_seqlens_k = static_cast<int32_t const*>(cu_kd.ptr);
  c.seqused_k = static_cast<int32_t const*>(usedd.ptr), c.total_q = B * seqlen_q, c.total_k = B * SK;
  c.lse_batch_stride = seqlen_q, c.lse_head_stride = B * seqlen_q;
  size_t ws = 0;
  ASSERT_EQ(flashcute_fwd_workspace_size(&c, &ws), FLASHCUTE_SUCCESS) << flashcute_last_error();
  Exact work(ws);
  c.workspace = work.ptr, c.workspace_size = ws;
  flashcute_status_t const st = flashcute_fwd(&c, nullptr);
  if (st == FLASHCUTE_ERROR_NOT_BUILT) GTEST_SKIP() << flashcute_last_error();
  ASSERT_EQ(st, FLASHCUTE_SUCCESS) << flashcute_last_error();

  flashcute_fwd_params g = p;
  g.q = qd.ptr, g.k = kpd.ptr, g.v = vpd.ptr, g.out = out_p.ptr, g.lse = lse_p.ptr;
  g.k_batch_stride = g.v_batch_stride = (int64_t)page_size * HKV * D;  // page stride
  g.page_table = static_cast<int32_t const*>(tabled.ptr), g.page_table_batch_stride = cols;
  g.page_size = page_size, g.num_pages = pages, g.seqused_k = static_cast<int32_t const*>(usedd.ptr);
  ASSERT_EQ(flashcute_fwd(&g, nullptr), FLASHCUTE_SUCCESS) << flashcute_last_error();
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);

  std::vector<__nv_bfloat16> oc(nq), op(nq);
  std::vector<float> lc(nl), lp(nl);
  cudaMemcpy(oc.data(), out_c.ptr, nq * 2, cudaMemcpyDeviceToHost);
  cudaMemcpy(op.data(), out_p.ptr, nq * 2, cudaMemcpyDeviceToHost);
  cudaMemcpy(lc.data(), lse_c.ptr, nl * 4, cudaMemcpyDeviceToHost);
  cudaMemcpy(lp.data(), lse_p.ptr, nl * 4, cudaMemcpyDeviceToHost);
  // Paged lse is (B, H, Sq), varlen's (H, B * Sq).
  for (int b = 0; b < B; ++b)
    for (int h = 0; h < H; ++h)
      for (int i = 0; i < seqlen_q; ++i) {
        float const a = lp[((size_t)b * H + h) * seqlen_q + i], e = lc[(size_t)h * B * seqlen_q + b * seqlen_q + i];
        ASSERT_TRUE(a == e || (std::isnan(a) && std::isnan(e))) << "lse b" << b << " h" << h << " i" << i;
        double const want = lse_ref[(size_t)h * B * seqlen_q + b * seqlen_q + i];
        if (std::isinf(want)) {
          EXPECT_TRUE(std::isinf(a) && a < 0) << "lse b" << b << " h" << h << " i" << i << " = " << a;
        } else {
          EXPECT_NEAR(a, want, 2e-2) << "lse b" << b << " h" << h << " i" << i;
        }
      }
  for (size_t i = 0; i < nq; ++i)
    ASSERT_EQ(__bfloat16_as_ushort(op[i]), __bfloat16_as_ushort(oc[i])) << "out[" << i << "]: paged != contiguous";
  expect_close(op, out_ref, "paged out");

  // Split-KV with a learnable sink (the combine kernel adds it), on the pages and on the contiguous varlen cache,
  // against the reference; 13 splits leave some chunks without a key (out 0, lse -inf for those, skipped).
  std::vector<double> sink = randv(H), out_sr(nq), lse_sr(nl);
  std::vector<float> sinkf(sink.begin(), sink.end());
  for (int i = 0; i < H; ++i) sink[i] = sinkf[i];
  flashcute_fwd_params rs = r;
  rs.out = out_sr.data(), rs.lse = lse_sr.data(), rs.learnable_sink = sink.data();
  ASSERT_EQ(flashcute_reference_fwd(&rs), FLASHCUTE_SUCCESS) << flashcute_last_error();
  Exact sinkd(H * 4);
  cudaMemcpy(sinkd.ptr, sinkf.data(), H * 4, cudaMemcpyHostToDevice);
  for (int splits : {4, 13})
    for (bool paged : {true, false}) {
      flashcute_fwd_params x = paged ? g : c;
      x.num_splits = splits, x.learnable_sink = sinkd.ptr;
      size_t bytes = 0;
      ASSERT_EQ(flashcute_fwd_workspace_size(&x, &bytes), FLASHCUTE_SUCCESS) << flashcute_last_error();
      Exact split_work(bytes);
      x.workspace = split_work.ptr, x.workspace_size = bytes;
      cudaMemset(x.out, 0xFF, nq * 2);
      ASSERT_EQ(flashcute_fwd(&x, nullptr), FLASHCUTE_SUCCESS) << flashcute_last_error();
      ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
      std::vector<__nv_bfloat16> os(nq);
      std::vector<float> ls(nl);
      cudaMemcpy(os.data(), x.out, nq * 2, cudaMemcpyDeviceToHost);
      cudaMemcpy(ls.data(), x.lse, nl * 4, cudaMemcpyDeviceToHost);
      SCOPED_TRACE(std::string(paged ? "paged" : "varlen") + ", " + std::to_string(splits) + " splits");
      expect_close(os, out_sr, "split out");
      for (int b = 0; b < B; ++b)
        for (int h = 0; h < H; ++h)
          for (int i = 0; i < seqlen_q; ++i) {
            size_t const at = paged ? ((size_t)b * H + h) * seqlen_q + i : (size_t)h * B * seqlen_q + b * seqlen_q + i;
            EXPECT_NEAR(ls[at], lse_sr[(size_t)h * B * seqlen_q + b * seqlen_q + i], 2e-2) << "lse b" << b << " h" << h;
          }
    }

  // A bad entry among the used pages: clamped into the pages (some wrong page, no fault, no read outside).
  std::vector<int32_t> bad = table;
  bad[0] = -1000, bad[(size_t)2 * cols] = INT_MAX;
  cudaMemcpy(tabled.ptr, bad.data(), bad.size() * 4, cudaMemcpyHostToDevice);
  ASSERT_EQ(flashcute_fwd(&g, nullptr), FLASHCUTE_SUCCESS) << flashcute_last_error();
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
}

}  // namespace

TEST(GpuKernelsPaged, MatchContiguousBitsAndStayInBounds) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device";
  for (int page_size : {1, 7, 16, 64, 256})
    for (int head_dim : {64, 128})
      for (int seqlen_q : {1, 5}) {
        SCOPED_TRACE("page " + std::to_string(page_size) + " d" + std::to_string(head_dim) + " sq" +
                     std::to_string(seqlen_q));
        run_paged(page_size, head_dim, seqlen_q, seqlen_q > 1);
        if (HasFatalFailure() || IsSkipped()) return;
      }
}
