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
#include <string>
#include <vector>

#include "flashcute/flashcute.h"

namespace {

bool have_gpu() {
  int n = 0;
  return cudaGetDeviceCount(&n) == cudaSuccess && n > 0;
}

struct Case {
  int b, sq, sk, h, hkv, d;
  bool causal;
  long long left, right;
  float softcap;
  bool varlen = false;  // b sequences of decreasing lengths (max sq, sk), packed, with seqused_k
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
  auto qh = to_bf16(q), kh = to_bf16(k), vh = to_bf16(v), douth = to_bf16(dout);
  std::vector<float> dlsef(dlse.begin(), dlse.end());

  flashcute_fwd_params p;
  flashcute_fwd_params_init(&p);
  p.batch = c.b, p.seqlen_q = c.sq, p.seqlen_k = c.sk, p.nheads = c.h, p.nheads_kv = c.hkv;
  p.head_dim = p.head_dim_v = c.d;
  p.softmax_scale = 1.f / std::sqrt((float)c.d);
  p.softcap = c.softcap, p.causal = c.causal, p.window_left = c.left, p.window_right = c.right;
  flashcute_fwd_params_set_contiguous_strides(&p);
  if (c.varlen) p.lse_head_stride = cu_q.back();  // lse is (H, total_q)

  // Reference on the rounded inputs.
  std::vector<double> out_ref(nq), lse_ref(nl), dq_ref(nq), dk_ref(nk), dv_ref(nk);
  flashcute_fwd_params r = p;
  r.dtype = FLASHCUTE_FLOAT64, r.q = q.data(), r.k = k.data(), r.v = v.data(), r.out = out_ref.data();
  r.lse = lse_ref.data();
  if (c.varlen) r.cu_seqlens_q = cu_q.data(), r.cu_seqlens_k = cu_k.data(), r.seqused_k = used_k.data();
  ASSERT_EQ(flashcute_reference_fwd(&r), FLASHCUTE_SUCCESS) << flashcute_last_error();

  DeviceBuffer dq_(nq * 2), dk_(nk * 2), dv_(nk * 2), dout_(nq * 2), out(nq * 2), lse(nl * 4), dlse_(nl * 4);
  DeviceBuffer qd(nq * 2), kd(nk * 2), vd(nk * 2);
  upload(qd, qh), upload(kd, kh), upload(vd, vh), upload(dout_, douth), upload(dlse_, dlsef);
  p.dtype = FLASHCUTE_BFLOAT16, p.q = qd.ptr, p.k = kd.ptr, p.v = vd.ptr, p.out = out.ptr, p.lse = lse.ptr;
  DeviceBuffer cu_qd(cu_q.size() * 4, 0), cu_kd(cu_k.size() * 4, 0), used_kd(used_k.size() * 4, 0);
  if (c.varlen) {
    upload(cu_qd, cu_q), upload(cu_kd, cu_k), upload(used_kd, used_k);
    p.cu_seqlens_q = static_cast<int32_t const*>(cu_qd.ptr), p.cu_seqlens_k = static_cast<int32_t const*>(cu_kd.ptr);
    p.seqused_k = static_cast<int32_t const*>(used_kd.ptr);
  }
  flashcute_status_t const st = flashcute_fwd(&p, nullptr);
  if (st == FLASHCUTE_ERROR_NOT_BUILT) GTEST_SKIP() << flashcute_last_error();
  ASSERT_EQ(st, FLASHCUTE_SUCCESS) << flashcute_last_error();
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
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
  rb.dout_batch_stride = p.q_batch_stride, rb.dout_row_stride = p.q_row_stride, rb.dout_head_stride = p.q_head_stride;
  rb.dq_batch_stride = p.q_batch_stride, rb.dq_row_stride = p.q_row_stride, rb.dq_head_stride = p.q_head_stride;
  rb.dk_batch_stride = p.k_batch_stride, rb.dk_row_stride = p.k_row_stride, rb.dk_head_stride = p.k_head_stride;
  rb.dv_batch_stride = p.v_batch_stride, rb.dv_row_stride = p.v_row_stride, rb.dv_head_stride = p.v_head_stride;
  ASSERT_EQ(flashcute_reference_bwd(&rb), FLASHCUTE_SUCCESS) << flashcute_last_error();

  for (int deterministic : {0, 1}) {
    flashcute_bwd_params g = rb;
    g.fwd = p, g.dout = dout_.ptr, g.dlse = dlse_.ptr, g.dq = dq_.ptr, g.dk = dk_.ptr, g.dv = dv_.ptr;
    g.deterministic = deterministic;
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
    ::testing::Values(Case{1, 17, 113, 2, 2, 64, true, -1, -1, 0.f},    // causal, Sq < Sk
                      Case{2, 113, 17, 4, 1, 128, true, -1, -1, 0.f},   // MQA, causal Sq > Sk: empty rows
                      Case{1, 130, 130, 4, 2, 96, false, 20, 5, 0.f},   // GQA, sliding window
                      Case{1, 65, 70, 2, 2, 256, false, -1, -1, 10.f},  // softcap, odd sizes
                      Case{1, 1, 1, 2, 2, 192, false, -1, -1, 0.f},     // seqlen 1
                      Case{3, 150, 97, 4, 2, 64, true, -1, -1, 0.f, true},     // varlen + seqused_k, GQA, causal
                      Case{4, 120, 200, 2, 2, 128, false, 30, -1, 0.f, true}), // varlen + seqused_k, window
    [](::testing::TestParamInfo<Case> const& info) {
      Case const& c = info.param;
      return "sq" + std::to_string(c.sq) + "_sk" + std::to_string(c.sk) + "_h" + std::to_string(c.h) + "_kv" +
             std::to_string(c.hkv) + "_d" + std::to_string(c.d) + (c.causal ? "_causal" : "") +
             (c.left >= 0 || c.right >= 0 ? "_window" : "") + (c.softcap > 0 ? "_softcap" : "") +
             (c.varlen ? "_varlen" : "");
    });
