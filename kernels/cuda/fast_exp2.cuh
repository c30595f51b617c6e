// Base-2 exponentials for kernels that keep their exponents in log2 units (softmax scores, KDA gate
// sums): one ex2.approx instead of the multiply by log2 e and the ex2 that __expf issues.
#pragma once
#include <cuda_runtime.h>

namespace k3::cuda {

constexpr float kLog2e = 1.4426950408889634f, kLn2 = 0.6931471805599453f;

// 2^x; ex2.approx(-inf) = +0, so masked scores and gates that underflow vanish.
__device__ __forceinline__ float fast_exp2(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
  return y;
}

}  // namespace k3::cuda
