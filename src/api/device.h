// The CUDA side of dispatch: which device we are on, which profile applies (FLASHCUTE_ARCH), and whether the
// caller's pointers are device memory.
#pragma once

#include "arch/profiles.h"
#include "flashcute/flashcute.h"

namespace flashcute {

// The profile dispatch uses for the current device: its own, or the one FLASHCUTE_ARCH forces where the device
// can run it. *device_sm receives the real arch.
flashcute_status_t current_profile(arch::Profile const** profile, int* device_sm);

// A forced arch (FLASHCUTE_ARCH) checked against a device profile; pure, so tests can walk it without a GPU.
flashcute_status_t apply_forced_arch(arch::Profile const& device, char const* forced,
                                     arch::Profile const** profile);

flashcute_status_t check_device_pointer(void const* ptr, char const* name);

// Multiprocessors of the current device (108 when it cannot be queried); sizes the deterministic backward's grid.
int current_sm_count();

// L2 bytes of the current device (0 when it cannot be queried); sizes the forward's tile-order sections.
int64_t current_l2_bytes();

// Maps a launch's cudaError_t (as int) to a status, naming the arch and the rebuild flag for missing code.
flashcute_status_t launch_status(int cuda_error, char const* kernel, int device_sm);

// Zeroes `count` floats of device memory on the stream (an output that no kernel writes for an empty problem).
flashcute_status_t zero_device_floats(void* ptr, int64_t count, void* stream, char const* name);

}  // namespace flashcute
