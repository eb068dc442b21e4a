// Hopper probe: one TMA load + one wgmma, checked against a host reference. It keeps the sm_90a pass of the
// build honest (TMA descriptors, mbarriers, GMMA descriptors) until the Hopper attention kernels land.
#pragma once

namespace flashcute::sm90 {

// Runs a 64x64x16 bf16 GEMM (C = A * B^T, fp32 out) on the current device with random inputs and stores the
// largest |C - reference| in *max_abs_err. Returns a cudaError_t as int: cudaSuccess, the first CUDA error,
// or cudaErrorNoKernelImageForDevice (nothing launched) when the current device is not sm_90.
int run_probe(double* max_abs_err);

// Makes the probe's TMA descriptor for an address 2 bytes past 16-byte alignment, which the driver refuses (as every
// descriptor is refused where no driver is loaded), and returns the refusal as a CUresult (0: accepted). Host only:
// it checks that a refused descriptor comes back as a verdict (sm90/tma_driver.h), never as CuTe's abort.
int probe_tma_refusal();

}  // namespace flashcute::sm90
