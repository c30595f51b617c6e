// Programmatic dependent launch (Hopper). A decode step is thousands of small dependent kernels, and
// between two of them the GPU would otherwise drain the first grid, then launch and place the second:
// a gap of about a microsecond or more per kernel, a large part of a batch-1 step. Launched with
// launch_pdl, a kernel may be placed while the one before it in the stream still runs; its blocks then
// wait in pdl_enter until that kernel has finished and its writes are visible.
//
// The rule that keeps this exact: every kernel calls pdl_enter() before it reads or writes any global
// memory, on every path (a block that returned early without waiting could let the grid after it start
// before the one before it ended): as its first statement, or after L2 prefetches only (hints that
// give the kernel no data: the fixed-order GEMM brings its weight tiles into L2 while the kernel
// before it still runs). Then each kernel still sees all of the
// work before it, as with ordinary stream order; only the launch overhead overlaps. After waiting,
// pdl_enter lets the next kernel be placed (it is placed once every block of this grid has started).
// Without the launch attribute (another launcher, a graph captured without it) both instructions do
// nothing. K3_CUDA_PDL=0 (CMake -DK3_CUDA_PDL=OFF) launches without the attribute, to measure the
// difference.
#pragma once
#include <cuda_runtime.h>

#include <utility>

#include "kernels/cuda/cuda_check.h"

#ifndef K3_CUDA_PDL
#define K3_CUDA_PDL 1
#endif

namespace k3::cuda {

__device__ __forceinline__ void pdl_enter() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}

// Whether launches carry the programmatic-serialization attribute (K3_CUDA_PDL).
constexpr bool kPdlLaunches = K3_CUDA_PDL != 0;

// The launch attribute that lets the kernel start before the previous kernel in its stream ends.
inline cudaLaunchAttribute pdl_attribute() {
  cudaLaunchAttribute a{};
  a.id = cudaLaunchAttributeProgrammaticStreamSerialization;
  a.val.programmaticStreamSerializationAllowed = 1;
  return a;
}

// kernel<<<grid, block, smem, s>>>(args...), with the attribute when kPdlLaunches. The kernel must
// start with pdl_enter(). Throws on a bad configuration.
template <class... Params, class... Args>
void launch_pdl(const char* name, void (*kernel)(Params...), dim3 grid, dim3 block, size_t smem, cudaStream_t s,
                Args&&... args) {
  cudaLaunchConfig_t cfg{};
  cfg.gridDim = grid;
  cfg.blockDim = block;
  cfg.dynamicSmemBytes = smem;
  cfg.stream = s;
  cudaLaunchAttribute attr = pdl_attribute();
  cfg.attrs = &attr;
  cfg.numAttrs = kPdlLaunches ? 1 : 0;
  check_cuda(cudaLaunchKernelEx(&cfg, kernel, std::forward<Args>(args)...), name);
}

}  // namespace k3::cuda
