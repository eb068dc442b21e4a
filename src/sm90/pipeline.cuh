// Warp-specialised kernels on Hopper: a ring of shared-memory tile stages that producer threads fill and consumer
// warpgroups read, synchronised by mbarriers; named barriers for subsets of the CTA; register reconfiguration.
#pragma once

#include <cute/tensor.hpp>
#include <cutlass/arch/barrier.h>

namespace flashcute::sm90 {

// Tile i lives in stage i % kStages. full[s] completes once a tile's copies into stage s have landed: either every
// producer thread's cp.async completions (one arrival per thread) or, with one producer arrival, one TMA copy (an
// arrival that also expects the copy's bytes) or copies the producers waited for themselves; empty[s] once every
// consumer warp has finished reading it (one arrival per warp). Both flip phase on each use, so the use count picks
// the parity.
template <int kStages>
struct TileRing {
  uint64_t full[kStages];
  uint64_t empty[kStages];

  // One thread; the CTA synchronises before any other call.
  CUTE_DEVICE void init(int producer_threads, int consumer_warps) {
    CUTE_UNROLL
    for (int s = 0; s < kStages; ++s) {
      cutlass::arch::ClusterBarrier::init(&full[s], producer_threads);
      cutlass::arch::ClusterBarrier::init(&empty[s], consumer_warps);
    }
  }

  // Producer: wait until tile i's stage is free (its previous tile released), fill it, then commit.
  CUTE_DEVICE void producer_acquire(int i) {
    if (i >= kStages) cutlass::arch::ClusterBarrier::wait(&empty[i % kStages], ((i / kStages) & 1) ^ 1);
  }
  // cp.async: the stage counts as full once every cp.async this thread issued so far has landed.
  CUTE_DEVICE void producer_commit(int i) { cutlass::arch::cpasync_barrier_arrive_noinc(&full[i % kStages]); }
  // One producer thread, once every producer's copies into tile i's stage have landed and are visible.
  CUTE_DEVICE void producer_arrive(int i) { cutlass::arch::ClusterBarrier::arrive(&full[i % kStages]); }
  // TMA: the barrier a copy into tile i's stage completes (copies beside the one producer_expect counted).
  CUTE_DEVICE uint64_t& producer_barrier(int i) { return full[i % kStages]; }
  // TMA (one producer thread): the barrier a copy of `bytes` into tile i's stage completes.
  CUTE_DEVICE uint64_t& producer_expect(int i, uint32_t bytes) {
    cutlass::arch::ClusterTransactionBarrier::arrive_and_expect_tx(&full[i % kStages], bytes);
    return full[i % kStages];
  }

  // Consumer: wait for tile i. No proxy fence between the cp.async writes and the wgmma reads, as CUTLASS's own
  // cp.async + wgmma mainloop (sm90_mma_multistage_gmma_ss_warpspecialized.hpp) has none: the fence per tile cost
  // 1-6% (bench/RESULTS.md, eighth session, run 4) and the forward grid passes without it.
  CUTE_DEVICE void consumer_wait(int i) { cutlass::arch::ClusterBarrier::wait(&full[i % kStages], (i / kStages) & 1); }
  // Once this warp's MMAs reading tile i have completed (warpgroup_wait).
  CUTE_DEVICE void consumer_release(int i) {
    __syncwarp();
    if (cute::elect_one_sync()) cutlass::arch::ClusterBarrier::arrive(&empty[i % kStages]);
  }
  // A ring whose empty barriers count consumer threads (init): this thread has read what it needs from stage i.
  CUTE_DEVICE void consumer_arrive(int i) { cutlass::arch::ClusterBarrier::arrive(&empty[i % kStages]); }
};

// Named barriers 1..15 (0 is __syncthreads): sync waits until `threads` threads have arrived, arrive does not wait.
CUTE_DEVICE void named_sync(int id, int threads) {
  asm volatile("bar.sync %0, %1;" ::"r"(id), "r"(threads) : "memory");
}
CUTE_DEVICE void named_arrive(int id, int threads) {
  asm volatile("bar.arrive %0, %1;" ::"r"(id), "r"(threads) : "memory");
}

// Bulk (non-tensor) reduction of `bytes` of floats from shared to global memory (both 16-byte aligned, bytes a
// multiple of 16) in this thread's current bulk group; the group's commit; and the waits for this thread's groups:
// until their shared-memory sources have been read, or until their additions are done.
CUTE_DEVICE void bulk_reduce_add(float* gmem, float const* smem, uint32_t bytes) {
  asm volatile("cp.reduce.async.bulk.global.shared::cta.bulk_group.add.f32 [%0], [%1], %2;" ::"l"(gmem),
               "r"(cute::cast_smem_ptr_to_uint(smem)), "r"(bytes)
               : "memory");
}
CUTE_DEVICE void bulk_commit() { asm volatile("cp.async.bulk.commit_group;" ::: "memory"); }
CUTE_DEVICE void bulk_wait_read() { asm volatile("cp.async.bulk.wait_group.read 0;" ::: "memory"); }
CUTE_DEVICE void bulk_wait_done() { asm volatile("cp.async.bulk.wait_group 0;" ::: "memory"); }
// Orders this thread's global-memory accesses through the generic proxy with those of its bulk copies (async proxy).
CUTE_DEVICE void bulk_fence_global() { asm volatile("fence.proxy.async.global;" ::: "memory"); }

}  // namespace flashcute::sm90
