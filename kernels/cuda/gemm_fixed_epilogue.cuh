// The last step of every fixed-order GEMM form (gemm_fixed.h): y[o] = alpha sum (+ beta y[o]). Written
// once so that a CTA adding its parts and the split form's second kernel write the same bits.
#pragma once
#include <cstdint>

#include "kernels/cuda/any_ptr.h"

namespace k3::cuda {

__device__ __forceinline__ void store_fixed_gemm(FOut y, int64_t o, float sum, float alpha, float beta) {
  // Rounded intrinsics: no caller may contract these into a different FMA.
  float v = __fmul_rn(alpha, sum);
  if (beta != 0.f) v = __fadd_rn(v, __fmul_rn(beta, y.get(o)));
  y.set(o, v);
}

}  // namespace k3::cuda
