// Hopper probe: one warpgroup TMA-loads a 64x16 A tile and a 64x16 B tile (bf16, K-major) into GMMA-swizzled
// shared memory and runs one wgmma 64x64x16, C = A * B^T in fp32. Compiled for sm_90a only (CMakeLists.txt), so
// it exercises the same TMA / mbarrier / GMMA-descriptor path the Hopper attention kernels will use.
#include "sm90/tma_driver.h"  // first: it redirects CuTe's TMA descriptor calls

#include "sm90/probe.h"

#include <cmath>
#include <random>
#include <vector>

#include <cuda_runtime_api.h>

#include <cute/arch/copy_sm90_desc.hpp>
#include <cute/tensor.hpp>
#include <cutlass/arch/barrier.h>
#include <cutlass/numeric_types.h>

namespace flashcute::sm90 {
namespace {

using namespace cute;
using Elem = cutlass::bfloat16_t;
constexpr int kM = 64, kN = 64, kK = 16;
constexpr int kThreads = 128;  // one warpgroup: wgmma is issued by all four warps together

// K = 16 bf16 is 32 bytes per row: exactly one SW32 swizzle row. SW64/SW128 atoms need K of 32/64 elements, so
// SW32 is the widest swizzle this tile fills; TMA and GMMA both understand it.
using SmemLayout = decltype(tile_to_shape(GMMA::Layout_K_SW32_Atom<Elem>{}, Shape<Int<kM>, Int<kK>>{}));
using MmaOp = SM90_64x64x16_F32BF16BF16_SS<GMMA::Major::K, GMMA::Major::K>;

struct SharedStorage {
  // TMA swizzles on absolute smem address bits and GMMA descriptors assume base_offset 0, so each tile sits on
  // a boundary past the swizzle repeat (256 B for SW32; 1024 B covers every mode).
  alignas(1024) Elem a[kM * kK];
  alignas(1024) Elem b[kN * kK];
  alignas(8) uint64_t tma_bar;
};
static_assert(cosize_v<SmemLayout> == kM * kK);

template <class TmaA, class TmaB>
__global__ void __launch_bounds__(kThreads) probe_kernel(__grid_constant__ TmaA const tma_a,
                                                         __grid_constant__ TmaB const tma_b, float* c) {
  __shared__ SharedStorage smem;
  Tensor sA = make_tensor(make_smem_ptr(smem.a), SmemLayout{});  // (M, K)
  Tensor sB = make_tensor(make_smem_ptr(smem.b), SmemLayout{});  // (N, K)

  if (threadIdx.x == 0) {
    initialize_barrier(smem.tma_bar, 1);  // one arrival: the expect_tx below; the TMA bytes complete the phase
    cutlass::arch::fence_barrier_init();  // the init must be visible to the async proxy before TMA signals it
  }
  __syncthreads();

  if (threadIdx.x == 0) {
    // The tensor maps hold the global addresses; in the kernel global memory is only a coordinate tensor.
    Tensor mA = tma_a.get_tma_tensor(Shape<Int<kM>, Int<kK>>{});
    Tensor mB = tma_b.get_tma_tensor(Shape<Int<kN>, Int<kK>>{});
    auto [tAgA, tAsA] = tma_partition(tma_a, Int<0>{}, Layout<_1>{}, group_modes<0, 2>(sA), group_modes<0, 2>(mA));
    auto [tBgB, tBsB] = tma_partition(tma_b, Int<0>{}, Layout<_1>{}, group_modes<0, 2>(sB), group_modes<0, 2>(mB));
    // Arm the barrier with the byte count of both loads; it flips phase 0 -> 1 once all bytes have landed.
    set_barrier_transaction_bytes(smem.tma_bar, uint32_t(sizeof(smem.a) + sizeof(smem.b)));
    copy(tma_a.with(smem.tma_bar), tAgA, tAsA);
    copy(tma_b.with(smem.tma_bar), tBgB, tBsB);
  }
  wait_barrier(smem.tma_bar, 0);  // every thread waits: all of them feed the wgmma below

  TiledMMA mma = make_tiled_mma(MmaOp{});
  ThrMMA thr = mma.get_thread_slice(threadIdx.x);
  Tensor tCrA = thr.make_fragment_A(thr.partition_A(sA));  // GMMA smem descriptors, not register data
  Tensor tCrB = thr.make_fragment_B(thr.partition_B(sB));
  Tensor gC = make_tensor(make_gmem_ptr(c), make_layout(make_shape(Int<kM>{}, Int<kN>{}), LayoutRight{}));
  Tensor tCgC = thr.partition_C(gC);
  Tensor tCrC = thr.make_fragment_C(tCgC);  // 32 fp32 accumulators per thread
  clear(tCrC);

  // The fences pin the accumulator registers around the async MMA so the compiler neither reads nor moves
  // them while wgmma owns them; arrive (wgmma.fence) orders the clear above before the MMA reads them.
  warpgroup_fence_operand(tCrC);
  warpgroup_arrive();
  gemm(mma, tCrA, tCrB, tCrC);
  warpgroup_commit_batch();
  warpgroup_wait<0>();
  warpgroup_fence_operand(tCrC);

  copy(tCrC, tCgC);
}

#define PROBE_TRY(expr)                          \
  do {                                           \
    cudaError_t const e_ = (expr);               \
    if (e_ != cudaSuccess) return e_;            \
  } while (0)

}  // namespace

int run_probe(double* max_abs_err) {
  *max_abs_err = INFINITY;  // stays so unless the comparison ran
  int dev = 0, major = 0, minor = 0;
  PROBE_TRY(cudaGetDevice(&dev));
  PROBE_TRY(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev));
  PROBE_TRY(cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, dev));
  if (major != 9 || minor != 0) return cudaErrorNoKernelImageForDevice;  // sm_90a code runs on sm_90 alone

  std::vector<Elem> a(kM * kK), b(kN * kK);
  std::vector<float> out(kM * kN);
  std::mt19937 rng(90);
  std::uniform_real_distribution<float> dist(-1.f, 1.f);
  for (auto& x : a) x = Elem(dist(rng));
  for (auto& x : b) x = Elem(dist(rng));

  Elem *d_a = nullptr, *d_b = nullptr;
  float* d_c = nullptr;
  auto run = [&]() -> cudaError_t {
    PROBE_TRY(cudaMalloc(&d_a, a.size() * sizeof(Elem)));
    PROBE_TRY(cudaMalloc(&d_b, b.size() * sizeof(Elem)));
    PROBE_TRY(cudaMalloc(&d_c, out.size() * sizeof(float)));
    PROBE_TRY(cudaMemcpy(d_a, a.data(), a.size() * sizeof(Elem), cudaMemcpyHostToDevice));
    PROBE_TRY(cudaMemcpy(d_b, b.data(), b.size() * sizeof(Elem), cudaMemcpyHostToDevice));
    // Row-major (rows, K) global tensors, i.e. K-major; the tensor map's box is the whole smem tile.
    auto k_major = make_layout(make_shape(kM, kK), LayoutRight{});
    TmaEncodeCheck encoded;
    auto tma_a = make_tma_copy(SM90_TMA_LOAD{}, make_tensor(make_gmem_ptr(d_a), k_major), SmemLayout{});
    auto tma_b = make_tma_copy(SM90_TMA_LOAD{}, make_tensor(make_gmem_ptr(d_b), k_major), SmemLayout{});
    if (!encoded.ok()) return cudaErrorInvalidValue;
    probe_kernel<<<1, kThreads>>>(tma_a, tma_b, d_c);
    PROBE_TRY(cudaGetLastError());
    PROBE_TRY(cudaMemcpy(out.data(), d_c, out.size() * sizeof(float), cudaMemcpyDeviceToHost));
    return cudaSuccess;
  };
  cudaError_t const err = run();
  cudaFree(d_a);
  cudaFree(d_b);
  cudaFree(d_c);
  if (err != cudaSuccess) return err;

  double worst = 0;
  for (int m = 0; m < kM; ++m)
    for (int n = 0; n < kN; ++n) {
      float ref = 0;
      for (int k = 0; k < kK; ++k) ref += float(a[m * kK + k]) * float(b[n * kK + k]);
      worst = std::fmax(worst, std::fabs(double(out[m * kN + n]) - ref));
    }
  *max_abs_err = worst;
  return cudaSuccess;
}

int probe_tma_refusal() {
  alignas(16) static Elem host[kM * kK + 8];
  auto k_major = make_layout(make_shape(kM, kK), LayoutRight{});
  TmaEncodeCheck encoded;
  auto tma = make_tma_copy(SM90_TMA_LOAD{}, make_tensor(make_gmem_ptr(host + 1), k_major), SmemLayout{});
  (void)tma;
  return int(encoded.verdict());
}

}  // namespace flashcute::sm90
