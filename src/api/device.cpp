#include "api/device.h"

#include <cstdlib>
#include <string>

#include <cuda_runtime_api.h>

#include "api/status.h"
#include "arch/registry.h"

namespace flashcute {

namespace {
std::string missing_caps(uint32_t caps) {
  std::string s;
  for (uint32_t bit = 1; bit; bit <<= 1)
    if (caps & bit) s += (s.empty() ? "" : ", ") + std::string(arch::capability_name(bit));
  return s;
}
}  // namespace

flashcute_status_t apply_forced_arch(arch::Profile const& device, char const* forced,
                                     arch::Profile const** profile) {
  *profile = &device;
  if (!forced || !*forced) return FLASHCUTE_SUCCESS;
  char* end = nullptr;
  long const sm = std::strtol(forced, &end, 10);
  arch::Profile const* p = (end && *end == '\0') ? arch::find_profile((int)sm) : nullptr;
  if (!p)
    return fail(FLASHCUTE_ERROR_ARCH_REFUSED, std::string("FLASHCUTE_ARCH=") + forced +
                                                  " names no known arch profile (use e.g. 80, 86, 89, 90, 120)");
  if (!arch::can_emulate(device, *p)) {
    uint32_t const lacking = p->caps & ~device.caps;
    std::string why = lacking ? "the device lacks " + missing_caps(lacking)
                              : "the device has less shared memory than the profile assumes";
    return fail(FLASHCUTE_ERROR_ARCH_REFUSED, std::string("FLASHCUTE_ARCH=") + forced + " refused on " +
                                                  device.name + ": " + why);
  }
  *profile = p;
  return FLASHCUTE_SUCCESS;
}

flashcute_status_t current_profile(arch::Profile const** profile, int* device_sm) {
  int dev = 0, major = 0, minor = 0, count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess || count == 0) {
    cudaGetLastError();
    return fail(FLASHCUTE_ERROR_NO_DEVICE, "no CUDA device found (the CPU reference runs host tensors)");
  }
  if (cudaGetDevice(&dev) != cudaSuccess ||
      cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev) != cudaSuccess ||
      cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, dev) != cudaSuccess) {
    return fail(FLASHCUTE_ERROR_CUDA, std::string("querying the device: ") + cudaGetErrorString(cudaGetLastError()));
  }
  *device_sm = major * 10 + minor;
  arch::Profile const* own = arch::find_profile(*device_sm);
  if (!own)
    return fail(FLASHCUTE_ERROR_UNSUPPORTED,
                "no arch profile for sm_" + std::to_string(*device_sm) + " (known: 80 ... 121)");
  return apply_forced_arch(*own, std::getenv("FLASHCUTE_ARCH"), profile);
}

int current_sm_count() {
  int dev = 0, sms = 0;
  if (cudaGetDevice(&dev) != cudaSuccess ||
      cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev) != cudaSuccess || sms <= 0) {
    cudaGetLastError();
    return 108;
  }
  return sms;
}

int64_t current_l2_bytes() {
  int dev = 0, bytes = 0;
  if (cudaGetDevice(&dev) != cudaSuccess ||
      cudaDeviceGetAttribute(&bytes, cudaDevAttrL2CacheSize, dev) != cudaSuccess || bytes < 0) {
    cudaGetLastError();
    return 0;
  }
  return bytes;
}

flashcute_status_t check_device_pointer(void const* ptr, char const* name) {
  cudaPointerAttributes attr{};
  if (cudaPointerGetAttributes(&attr, ptr) != cudaSuccess) {
    cudaGetLastError();
    return fail(FLASHCUTE_ERROR_INVALID_ARGUMENT, std::string(name) + " is not a CUDA pointer");
  }
  if (attr.type != cudaMemoryTypeDevice && attr.type != cudaMemoryTypeManaged)
    return fail(FLASHCUTE_ERROR_INVALID_ARGUMENT,
                std::string(name) + " is host memory; the GPU path needs device memory");
  int dev = 0;
  cudaGetDevice(&dev);
  if (attr.type == cudaMemoryTypeDevice && attr.device != dev)
    return fail(FLASHCUTE_ERROR_INVALID_ARGUMENT, std::string(name) + " is on device " +
                                                      std::to_string(attr.device) + ", not the current device " +
                                                      std::to_string(dev));
  return FLASHCUTE_SUCCESS;
}

flashcute_status_t launch_status(int cuda_error, char const* kernel, int device_sm) {
  auto const err = static_cast<cudaError_t>(cuda_error);
  if (err == cudaSuccess) return FLASHCUTE_SUCCESS;
  if (err == cudaErrorNoKernelImageForDevice || err == cudaErrorInvalidDeviceFunction ||
      err == cudaErrorUnsupportedPtxVersion)
    return fail(FLASHCUTE_ERROR_NOT_BUILT, std::string("this flashcute binary holds no code for sm_") +
                                               std::to_string(device_sm) + " (kernel " + kernel +
                                               ", built for CUDA targets " + compiled_targets() +
                                               "): rebuild with -DFLASHCUTE_CUDA_ARCHS=" +
                                               std::to_string(device_sm) + (device_sm == 90 ? "a" : ""));
  return fail(FLASHCUTE_ERROR_CUDA, std::string("kernel ") + kernel + ": " + cudaGetErrorString(err));
}

flashcute_status_t zero_device_floats(void* ptr, int64_t count, void* stream, char const* name) {
  if (!ptr || count <= 0) return FLASHCUTE_SUCCESS;
  if (auto s = check_device_pointer(ptr, name)) return s;
  cudaError_t const err =
      cudaMemsetAsync(ptr, 0, size_t(count) * sizeof(float), static_cast<cudaStream_t>(stream));
  if (err == cudaSuccess) return FLASHCUTE_SUCCESS;
  return fail(FLASHCUTE_ERROR_CUDA, std::string("zeroing ") + name + ": " + cudaGetErrorString(err));
}

}  // namespace flashcute
