// Where CuTe's make_tma_copy asks the driver for a TMA descriptor. CuTe calls the encoder through the macro
// CUTLASS_CUDA_DRIVER_WRAPPER_CALL, and on a refusal prints the arguments and asserts: a crash, or with NDEBUG a
// zero descriptor that faults on the device. This header points the macro at tma_driver::cuTensorMapEncodeTiled,
// which tells CuTe that every call succeeded and keeps the driver's verdict for the launcher instead (TmaEncodeCheck):
// a launcher whose descriptors were refused loads by cp.async, or reports an error, and never launches with them.
// The entry point is looked up once per process, and a thread with no current CUDA context (autograd's worker, say)
// is given the runtime's before its descriptors are encoded again.
//
// The macro is expanded where CuTe's header is read, so this header comes before any CUTLASS or CuTe header: the
// Hopper launchers (sm90/*_launch.cuh) include it first, and sm90/tma.cuh refuses to compile without it.
#pragma once

#ifdef CUTLASS_CUDA_DRIVER_WRAPPER_CALL
#error "sm90/tma_driver.h must be included before any CUTLASS or CuTe header"
#endif

#include <cuda.h>
#include <cuda_runtime.h>
#include <cudaTypedefs.h>

#include <atomic>

#include <cutlass/cuda_host_adapter.hpp>

#define FLASHCUTE_SM90_TMA_DRIVER 1
#undef CUTLASS_CUDA_DRIVER_WRAPPER_CALL
#define CUTLASS_CUDA_DRIVER_WRAPPER_CALL(func) ::flashcute::sm90::tma_driver::func

namespace flashcute::sm90 {

// The driver's first refusal among the descriptors made on this thread since the last TmaEncodeCheck began.
inline CUresult& tma_encode_verdict() {
  thread_local CUresult verdict = CUDA_SUCCESS;
  return verdict;
}

// Collects the verdict on the descriptors made after it: ok() while they are all usable. One at a time per thread
// (a launcher's; they do not nest).
struct TmaEncodeCheck {
  TmaEncodeCheck() { tma_encode_verdict() = CUDA_SUCCESS; }
  bool ok() const { return tma_encode_verdict() == CUDA_SUCCESS; }
  CUresult verdict() const { return tma_encode_verdict(); }
};

namespace tma_driver {

using EncodeTiled = PFN_cuTensorMapEncodeTiled_v12000;

// The driver's encoder, or null where the lookup fails (no driver, one older than CUDA 12); a failure is not kept, so
// a later call retries.
inline EncodeTiled encoder() {
  static std::atomic<EncodeTiled> cached{nullptr};
  EncodeTiled fn = cached.load(std::memory_order_acquire);
  if (fn) return fn;
  void* entry = nullptr;
  cudaDriverEntryPointQueryResult found = cudaDriverEntryPointSymbolNotFound;
#if CUDART_VERSION >= 12050
  cudaError_t const err =
      cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &entry, 12000, cudaEnableDefault, &found);
#else
  cudaError_t const err = cudaGetDriverEntryPoint("cuTensorMapEncodeTiled", &entry, cudaEnableDefault, &found);
#endif
  if (err != cudaSuccess || found != cudaDriverEntryPointSuccess || !entry) {
    (void)cudaGetLastError();  // the failed lookup must not surface as a later launch's error
    return nullptr;
  }
  fn = reinterpret_cast<EncodeTiled>(entry);
  cached.store(fn, std::memory_order_release);
  return fn;
}

inline CUresult cuTensorMapEncodeTiled(CUtensorMap* map, CUtensorMapDataType type, cuuint32_t rank, void* address,
                                       cuuint64_t const* dims, cuuint64_t const* strides, cuuint32_t const* box,
                                       cuuint32_t const* element_strides, CUtensorMapInterleave interleave,
                                       CUtensorMapSwizzle swizzle, CUtensorMapL2promotion l2,
                                       CUtensorMapFloatOOBfill fill) {
  EncodeTiled const fn = encoder();
  auto encode = [&] {
    return fn ? fn(map, type, rank, address, dims, strides, box, element_strides, interleave, swizzle, l2, fill)
              : CUDA_ERROR_NOT_FOUND;
  };
  CUresult r = encode();
  if (r == CUDA_ERROR_INVALID_CONTEXT) {
    // The encoder needs a current context, and a thread whose first CUDA work this is has none (autograd's worker
    // thread, at the first step of a backward pass). cudaSetDevice makes the primary context of the runtime's
    // device current: the one the kernels are about to launch on.
    int device = 0;
    if (cudaGetDevice(&device) == cudaSuccess && cudaSetDevice(device) == cudaSuccess) r = encode();
    else (void)cudaGetLastError();
  }
  if (r != CUDA_SUCCESS && tma_encode_verdict() == CUDA_SUCCESS) tma_encode_verdict() = r;
  return CUDA_SUCCESS;
}

// CuTe's im2col descriptors name the macro too; flashcute makes none, so they go to CUTLASS's wrapper unchanged.
template <class... Args>
CUresult cuTensorMapEncodeIm2col(Args... args) {
  return cutlass::call_cuTensorMapEncodeIm2col(args...);
}

}  // namespace tma_driver
}  // namespace flashcute::sm90
