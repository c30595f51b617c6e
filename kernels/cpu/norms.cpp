// Row norms. Sums of squares accumulate in double in index order (cheap, and keeps the CPU
// reference a notch more accurate than the fp32 device kernels it checks).
#include <cmath>

#include "kernels/cpu/check.h"
#include "kernels/cpu/cpu_ops.h"

namespace k3::cpu {

void rmsnorm(ThreadPool& pool, const ops::RmsNormParams& p) {
  check_tensor("rmsnorm", "x", p.x, DType::F32, {kAny, kAny});
  const int64_t M = p.x.dim(0), D = p.x.dim(1);
  const bool has_w = check_optional("rmsnorm", "w", p.w, DType::F32, {D});
  check_tensor("rmsnorm", "y", p.y, DType::F32, {M, D});
  check_arg(p.eps >= 0.f, "rmsnorm", "eps must be >= 0");
  const float* x = p.x.f32();
  const float* w = has_w ? p.w.f32() : nullptr;
  float* y = p.y.f32();
  pool.parallel_for(M, [&](int64_t m0, int64_t m1) {
    for (int64_t m = m0; m < m1; ++m) {
      const float* xr = x + m * D;
      float* yr = y + m * D;
      double ss = 0;
      for (int64_t i = 0; i < D; ++i) ss += static_cast<double>(xr[i]) * xr[i];
      const float r = static_cast<float>(1.0 / std::sqrt(ss / static_cast<double>(D) + p.eps));
      for (int64_t i = 0; i < D; ++i) yr[i] = w ? w[i] * (xr[i] * r) : xr[i] * r;
    }
  }, 8);
}

void l2norm(ThreadPool& pool, const ops::L2NormParams& p) {
  check_tensor("l2norm", "x", p.x, DType::F32, {kAny, kAny});
  const int64_t M = p.x.dim(0), D = p.x.dim(1);
  check_tensor("l2norm", "y", p.y, DType::F32, {M, D});
  check_arg(p.eps >= 0.f, "l2norm", "eps must be >= 0");
  const float* x = p.x.f32();
  float* y = p.y.f32();
  pool.parallel_for(M, [&](int64_t m0, int64_t m1) {
    for (int64_t m = m0; m < m1; ++m) {
      const float* xr = x + m * D;
      float* yr = y + m * D;
      double ss = 0;
      for (int64_t i = 0; i < D; ++i) ss += static_cast<double>(xr[i]) * xr[i];
      const float r = static_cast<float>(p.scale / std::sqrt(ss + p.eps));
      for (int64_t i = 0; i < D; ++i) yr[i] = xr[i] * r;
    }
  }, 8);
}

}  // namespace k3::cpu
