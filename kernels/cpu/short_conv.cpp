// Depthwise causal short convolution + SiLU over a varlen batch, with per-slot conv caches.
// Sequence n sees the virtual rows xbar = [cache (W-1 rows) ; its T new rows]; output row t is
// SiLU(sum_j w[c, j] * xbar[t + j][c]) and the new cache is the last W-1 rows of xbar (for T < W-1
// that is the tail of the old cache followed by all new rows).
#include <algorithm>

#include "kernels/cpu/check.h"
#include "kernels/cpu/cpu_ops.h"

namespace k3::cpu {

void short_conv(ThreadPool& pool, const ops::ShortConvParams& p) {
  check_tensor("short_conv", "x", p.x, DType::F32, {kAny, kAny});
  const int64_t T = p.x.dim(0), C = p.x.dim(1);
  check_tensor("short_conv", "w", p.w, DType::F32, {C, kAny});
  const int64_t W = p.w.dim(1);
  check_arg(W >= 1, "short_conv", "w: kernel width must be >= 1");
  check_tensor("short_conv", "cache", p.cache, DType::F32, {kAny, W - 1, C});
  check_tensor("short_conv", "y", p.y, DType::F32, {T, C});
  check_arg(p.y.data() != p.x.data(), "short_conv", "y must not alias x");
  const int64_t N = check_varlen("short_conv", p.cu_seqlens, p.slots, T, p.cache.dim(0));

  const float* x = p.x.f32();
  const float* w = p.w.f32();
  float* cache = p.cache.f32();
  float* y = p.y.f32();
  const int32_t* cu = p.cu_seqlens.i32();
  const int32_t* slots = p.slots.i32();
  const int64_t H = W - 1;  // cache rows
  constexpr int64_t kChannelBlock = 32;
  const int64_t blocks = (C + kChannelBlock - 1) / kChannelBlock;

  // Work item = (sequence, channel block): disjoint outputs and disjoint cache columns.
  pool.parallel_for(N * blocks, [&](int64_t i0, int64_t i1) {
    for (int64_t item = i0; item < i1; ++item) {
      const int64_t n = item / blocks;
      const int64_t c0 = (item % blocks) * kChannelBlock, c1 = std::min(C, c0 + kChannelBlock);
      const int64_t start = cu[n], len = cu[n + 1] - cu[n];
      float* cs = cache + static_cast<int64_t>(slots[n]) * H * C;
      auto row = [&](int64_t r) -> const float* {  // virtual row r of xbar
        return r < H ? cs + r * C : x + (start + r - H) * C;
      };
      for (int64_t t = 0; t < len; ++t) {
        float* yr = y + (start + t) * C;
        for (int64_t c = c0; c < c1; ++c) {
          float acc = 0.f;
          for (int64_t j = 0; j < W; ++j) acc += w[c * W + j] * row(t + j)[c];
          yr[c] = siluf(acc);
        }
      }
      // New cache row i = xbar row len + i; when that is an old cache row it lies ahead of i, so the
      // in-place forward copy never reads a row it already overwrote.
      for (int64_t i = 0; i < H; ++i) {
        const float* src = row(len + i);
        float* dst = cs + i * C;
        if (src != dst)
          for (int64_t c = c0; c < c1; ++c) dst[c] = src[c];
      }
    }
  });
}

}  // namespace k3::cpu
