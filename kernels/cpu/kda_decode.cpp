// Fused KDA decode step on the CPU, composed from the other ops' pieces in the order the device
// kernel fuses them (docs/MODEL.md §8.1 K2–K6 for one token per request):
// conv update + SiLU on q|k|v -> per-head L2 norm (q also * D^-1/2, eps 1e-6 inside the sqrt)
// -> decay gate (either form) -> beta = sigmoid(b) -> one delta-rule step on the request's state.
#include <cmath>
#include <numeric>
#include <vector>

#include "kernels/cpu/check.h"
#include "kernels/cpu/cpu_ops.h"
#include "kernels/cpu/kda_common.h"

namespace k3::cpu {

void kda_decode(ThreadPool& pool, const ops::KdaDecodeParams& p) {
  const char* op = "kda_decode";
  check_arg(p.heads >= 1, op, "heads must be >= 1, got " + std::to_string(p.heads));
  check_tensor(op, "qkv", p.qkv, DType::F32, {kAny, kAny});
  const int64_t B = p.qkv.dim(0), C = p.qkv.dim(1), H = p.heads;
  check_arg(C % (3 * H) == 0, op,
            "qkv: width " + std::to_string(C) + " is not 3 * heads * D (heads = " + std::to_string(H) + ")");
  const int64_t D = C / (3 * H), P = H * D;
  check_tensor(op, "conv_w", p.conv_w, DType::F32, {C, kAny});
  const int64_t W = p.conv_w.dim(1);
  check_tensor(op, "conv_cache", p.conv_cache, DType::F32, {kAny, W - 1, C});
  check_tensor(op, "f", p.f, DType::F32, {B, P});
  check_tensor(op, "b", p.b, DType::F32, {B, H});
  const bool own_conv_rows = p.conv_slots.defined();
  check_tensor(op, "state", p.state, DType::F32, {own_conv_rows ? kAny : p.conv_cache.dim(0), H, D, D});
  check_tensor(op, "slots", p.slots, DType::I32, {B});
  if (own_conv_rows) {
    check_tensor(op, "conv_slots", p.conv_slots, DType::I32, {B});
    for (int64_t b = 0; b < B; ++b)   // short_conv checks the conv rows; the state rows are checked here
      check_arg(p.slots.i32()[b] >= 0 && p.slots.i32()[b] < p.state.dim(0), op,
                "slots[" + std::to_string(b) + "] = " + std::to_string(p.slots.i32()[b]) + " is outside the state's " +
                    std::to_string(p.state.dim(0)) + " rows");
  }
  check_tensor(op, "o", p.o, DType::F32, {B, H, D});

  // K2: conv update, one token per request (cu_seqlens = 0, 1, ..., B).
  std::vector<int32_t> cu(B + 1);
  std::iota(cu.begin(), cu.end(), 0);
  Tensor cu_t = Tensor::view(cu.data(), {B + 1}, DType::I32);
  Tensor conv_out = Tensor::zeros({B, C});
  short_conv(pool, {.x = p.qkv, .w = p.conv_w, .cache = p.conv_cache, .slots = own_conv_rows ? p.conv_slots : p.slots,
                    .cu_seqlens = cu_t,
                    .y = conv_out});

  // K4: gate (validates a_log and dt_bias).
  Tensor g = Tensor::zeros({B, H, D});
  kda_gate(pool, {.f = p.f, .a_log = p.a_log, .dt_bias = p.dt_bias, .g = g, .heads = p.heads, .g_min = p.g_min,
                  .form = p.form});

  // K3, K5, K6 per (request, head).
  const float* x = conv_out.f32();
  const float* gp = g.f32();
  const float* bl = p.b.f32();
  float* state = p.state.f32();
  float* o = p.o.f32();
  const int32_t* slots = p.slots.i32();
  const float q_scale = 1.f / std::sqrt(static_cast<float>(D));
  pool.parallel_for(B * H, [&](int64_t i0, int64_t i1) {
    std::vector<float> q(D), k(D);
    for (int64_t item = i0; item < i1; ++item) {
      const int64_t b = item / H, h = item % H;
      const float* row = x + b * C;
      auto normalise = [&](const float* src, float* dst, float scale) {
        double ss = 0;
        for (int64_t i = 0; i < D; ++i) ss += static_cast<double>(src[i]) * src[i];
        const float r = static_cast<float>(scale / std::sqrt(ss + 1e-6f));
        for (int64_t i = 0; i < D; ++i) dst[i] = src[i] * r;
      };
      normalise(row + h * D, q.data(), q_scale);
      normalise(row + P + h * D, k.data(), 1.f);
      const float* v = row + 2 * P + h * D;
      const float beta = sigmoidf(bl[b * H + h]);
      float* S = state + (static_cast<int64_t>(slots[b]) * H + h) * D * D;
      kda_token_step(S, q.data(), k.data(), v, gp + (b * H + h) * D, beta, o + (b * H + h) * D, D, D);
    }
  });
}

}  // namespace k3::cpu
