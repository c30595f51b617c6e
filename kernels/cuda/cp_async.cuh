// cp.async (sm_80+): 16-byte global -> shared copies that stay in flight while the thread goes on,
// so a tile load costs one memory latency instead of one per loop iteration.
#pragma once
#include <cuda_runtime.h>

namespace k3::cuda {

__device__ __forceinline__ void cp_async16(void* smem, const void* gmem, bool valid = true) {
  const unsigned dst = static_cast<unsigned>(__cvta_generic_to_shared(smem));
  const int src_bytes = valid ? 16 : 0;  // 0: zero-fill the 16 bytes
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(gmem), "r"(src_bytes));
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }
template <int N>
__device__ __forceinline__ void cp_async_wait() { asm volatile("cp.async.wait_group %0;\n" ::"n"(N)); }

// Bulk prefetch of `bytes` (a multiple of 16, 16-byte aligned source) into L2 (sm_90,
// cp.async.bulk.prefetch.L2): a hint that completes on its own, tracked by nothing; later loads of
// the range find it in L2 instead of paying the DRAM latency with few requests in flight.
__device__ __forceinline__ void prefetch_l2_bulk(const void* gmem, unsigned bytes) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;\n" ::"l"(gmem), "r"(bytes) : "memory");
#endif
}

// rows x cols floats (cols % 4 == 0, rows*cols/4 chunks spread over the block), src row pitch = cols.
template <int kThreads>
__device__ __forceinline__ void cp_async_rows(float* dst, int ld, const float* src, int rows, int cols) {
  const int per_row = cols / 4;
  for (int idx = threadIdx.x; idx < rows * per_row; idx += kThreads) {
    const int r = idx / per_row, c4 = idx % per_row;
    cp_async16(dst + r * ld + c4 * 4, src + r * cols + c4 * 4);
  }
}

}  // namespace k3::cuda
