// Shared-memory mbarriers (sm_90) as completion counters for bulk copies: one arrival (the issuing
// thread's arrive.expect_tx, which also announces the bytes) plus the copies' complete_tx; a phase
// completes when both are in. Waiters name the phase parity they wait for (0, 1, 0, ... per use).
// PTX ISA: "mbarrier" and "cp.async.bulk.tensor".
#pragma once
#include <cuda.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/cuda/mma.cuh"  // smem_u32

namespace k3::cuda {

// Arrival count `count` (1 for a copy's barrier: the issuing thread's arrive.expect_tx); the fences
// make the initialised barrier visible to the async proxy (the copy engine) before any copy names it.
__device__ __forceinline__ void mbar_init(uint32_t bar, uint32_t count = 1) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(bar), "r"(count));
  asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
  asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
}
// One plain arrival (no bytes), as a consumer's "done with this buffer".
__device__ __forceinline__ void mbar_arrive(uint32_t bar) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(bar) : "memory");
}
__device__ __forceinline__ void mbar_expect_tx(uint32_t bar, uint32_t bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(bar), "r"(bytes) : "memory");
}
__device__ __forceinline__ void mbar_wait(uint32_t bar, uint32_t parity) {
  uint32_t done = 0;
  while (!done)
    asm volatile("{ .reg .pred p; mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2; selp.u32 %0, 1, 0, p; }\n"
                 : "=r"(done)
                 : "r"(bar), "r"(parity)
                 : "memory");
}

// Named barriers 1..15 (0 is __syncthreads): kThreads threads (a multiple of 32) meet at barrier id.
// bar_arrive counts the calling warp in and goes on (a producer handing something over), bar_sync
// waits until all kThreads have arrived or synced (a consumer, or every party of a group barrier).
template <int kThreads>
__device__ __forceinline__ void bar_arrive(int id) {
  asm volatile("bar.arrive %0, %1;\n" ::"r"(id), "n"(kThreads) : "memory");
}
template <int kThreads>
__device__ __forceinline__ void bar_sync(int id) {
  asm volatile("bar.sync %0, %1;\n" ::"r"(id), "n"(kThreads) : "memory");
}

// One TMA box of a 2-D tensor map (kernels/cuda/tensor_map.h) at element coordinates (x = column,
// y = row) into shared memory at `dst`, counted on `bar`.
__device__ __forceinline__ void tma_load_2d(uint32_t dst, const CUtensorMap* map, int x, int y, uint32_t bar) {
  asm volatile(
      "cp.async.bulk.tensor.2d.shared::cluster.global.tile.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3}], [%4];\n" ::"r"(dst),
      "l"(reinterpret_cast<uint64_t>(map)), "r"(x), "r"(y), "r"(bar)
      : "memory");
}

// One TMA box of a 3-D tensor map at element coordinates (c0 innermost, c1, c2).
__device__ __forceinline__ void tma_load_3d(uint32_t dst, const CUtensorMap* map, int c0, int c1, int c2, uint32_t bar) {
  asm volatile(
      "cp.async.bulk.tensor.3d.shared::cluster.global.tile.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3, %4}], [%5];\n" ::"r"(dst),
      "l"(reinterpret_cast<uint64_t>(map)), "r"(c0), "r"(c1), "r"(c2), "r"(bar)
      : "memory");
}

// The same box brought into L2 only: a hint that gives the kernel no data and waits for nothing, so
// it is safe at any time, also before pdl_enter (pdl.cuh) while the kernel before may still write it.
__device__ __forceinline__ void tma_prefetch_3d(const CUtensorMap* map, int c0, int c1, int c2) {
  asm volatile("cp.async.bulk.prefetch.tensor.3d.L2.global.tile [%0, {%1, %2, %3}];\n" ::"l"(
                   reinterpret_cast<uint64_t>(map)),
               "r"(c0), "r"(c1), "r"(c2)
               : "memory");
}

// `bytes` (a multiple of 16, both addresses 16-byte aligned) of contiguous global memory into shared
// memory at `dst`, counted on `bar` (cp.async.bulk, no tensor map).
__device__ __forceinline__ void bulk_load(uint32_t dst, const void* src, uint32_t bytes, uint32_t bar) {
  asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];\n" ::"r"(dst),
               "l"(src), "r"(bytes), "r"(bar)
               : "memory");
}

// Bulk stores go the other way and complete through bulk groups, not mbarriers: the issuing thread
// commits them as one group and waits until the copy engine has read their shared memory (the
// global writes are complete when the grid is).
// One TMA box of shared memory at `src` to the 2-D tensor map's box at (x = column, y = row).
__device__ __forceinline__ void tma_store_2d(const CUtensorMap* map, int x, int y, uint32_t src) {
  asm volatile("cp.async.bulk.tensor.2d.global.shared::cta.tile.bulk_group [%0, {%1, %2}], [%3];\n" ::"l"(
                   reinterpret_cast<uint64_t>(map)),
               "r"(x), "r"(y), "r"(src)
               : "memory");
}
__device__ __forceinline__ void bulk_commit() { asm volatile("cp.async.bulk.commit_group;\n" ::: "memory"); }
// Until every committed group has read its shared memory (the buffers may then be reused).
__device__ __forceinline__ void bulk_wait_read_all() { asm volatile("cp.async.bulk.wait_group.read 0;\n" ::: "memory"); }

}  // namespace k3::cuda
