// MLA attention on the CPU: materialised causal prefill and absorbed paged decode (docs/MODEL.md §8.2).
// Softmax statistics: lse = m + log(sum_j exp(s_j - m)), natural log, m the running max.
#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "kernels/cpu/check.h"
#include "kernels/cpu/cpu_ops.h"

namespace k3::cpu {
namespace {
constexpr float kNegInf = -std::numeric_limits<float>::infinity();
}

void mla_prefill(ThreadPool& pool, const ops::MlaPrefillParams& p) {
  const char* op = "mla_prefill";
  check_tensor(op, "q", p.q, DType::F32, {kAny, kAny, kAny});
  const int64_t T = p.q.dim(0), H = p.q.dim(1), Dqk = p.q.dim(2);
  check_arg(p.past >= 0, op, "past must be >= 0, got " + std::to_string(p.past));
  const int64_t S = p.past + T;
  check_tensor(op, "k", p.k, DType::F32, {S, H, Dqk});
  check_tensor(op, "v", p.v, DType::F32, {S, H, kAny});
  const int64_t Dv = p.v.dim(2);
  check_tensor(op, "o", p.o, DType::F32, {T, H, Dv});
  const bool has_lse = check_optional(op, "lse", p.lse, DType::F32, {T, H});
  check_arg(p.scale > 0.f, op, "scale must be > 0");
  const float *q = p.q.f32(), *k = p.k.f32(), *v = p.v.f32();
  float* o = p.o.f32();
  float* lse = has_lse ? p.lse.f32() : nullptr;
  pool.parallel_for(T * H, [&](int64_t i0, int64_t i1) {
    std::vector<float> s(S);
    for (int64_t item = i0; item < i1; ++item) {
      const int64_t t = item / H, h = item % H;
      const int64_t keys = p.past + t + 1;
      const float* qr = q + (t * H + h) * Dqk;
      float m = kNegInf;
      for (int64_t j = 0; j < keys; ++j) {
        const float* kr = k + (j * H + h) * Dqk;
        float acc = 0.f;
        for (int64_t i = 0; i < Dqk; ++i) acc += qr[i] * kr[i];
        s[j] = acc * p.scale;
        m = std::max(m, s[j]);
      }
      float* orow = o + (t * H + h) * Dv;
      std::fill(orow, orow + Dv, 0.f);
      float d = 0.f;
      for (int64_t j = 0; j < keys; ++j) {
        const float e = std::exp(s[j] - m);
        d += e;
        const float* vr = v + (j * H + h) * Dv;
        for (int64_t c = 0; c < Dv; ++c) orow[c] += e * vr[c];
      }
      for (int64_t c = 0; c < Dv; ++c) orow[c] /= d;
      if (lse) lse[t * H + h] = m + std::log(d);
    }
  });
}

void mla_decode(ThreadPool& pool, const ops::MlaDecodeParams& p) {
  const char* op = "mla_decode";
  check_tensor(op, "q_lat", p.q_lat, DType::F32, {kAny, kAny, kAny});
  const int64_t B = p.q_lat.dim(0), H = p.q_lat.dim(1), R = p.q_lat.dim(2);
  check_tensor(op, "q_rope", p.q_rope, DType::F32, {B, H, kAny});
  const int64_t Dr = p.q_rope.dim(2);
  check_tensor(op, "kv_cache", p.kv_cache, DType::F32, {kAny, kAny, R + Dr});
  const int64_t num_pages = p.kv_cache.dim(0), page_size = p.kv_cache.dim(1);
  check_arg(page_size >= 1, op, "kv_cache: page_size must be >= 1");
  check_tensor(op, "block_table", p.block_table, DType::I32, {B, kAny});
  const int64_t max_pages = p.block_table.dim(1);
  check_tensor(op, "seq_lens", p.seq_lens, DType::I32, {B});
  check_tensor(op, "o", p.o, DType::F32, {B, H, R});
  check_tensor(op, "lse", p.lse, DType::F32, {B, H});
  check_arg(p.scale > 0.f, op, "scale must be > 0");
  const int32_t* lens = p.seq_lens.i32();
  const int32_t* table = p.block_table.i32();
  for (int64_t b = 0; b < B; ++b) {
    check_arg(lens[b] >= 0 && lens[b] <= max_pages * page_size, op,
              "seq_lens[" + std::to_string(b) + "] = " + std::to_string(lens[b]) + " is outside [0, max_pages * page_size = " +
                  std::to_string(max_pages * page_size) + "]");
    for (int64_t pg = 0; pg < (lens[b] + page_size - 1) / page_size; ++pg) {
      const int32_t id = table[b * max_pages + pg];
      check_arg(id >= 0 && id < num_pages, op,
                "block_table[" + std::to_string(b) + ", " + std::to_string(pg) + "] = " + std::to_string(id) +
                    " is outside [0, num_pages = " + std::to_string(num_pages) + ")");
    }
  }
  const float *ql = p.q_lat.f32(), *qr = p.q_rope.f32(), *cache = p.kv_cache.f32();
  float* o = p.o.f32();
  float* lse = p.lse.f32();
  const int64_t row_w = R + Dr;
  pool.parallel_for(B * H, [&](int64_t i0, int64_t i1) {
    std::vector<float> s;
    for (int64_t item = i0; item < i1; ++item) {
      const int64_t b = item / H, h = item % H;
      const int64_t len = lens[b];
      float* orow = o + (b * H + h) * R;
      std::fill(orow, orow + R, 0.f);
      if (len == 0) {  // no keys: empty partition, contributes nothing to a merge
        lse[b * H + h] = kNegInf;
        continue;
      }
      s.resize(len);
      const float* qlat = ql + (b * H + h) * R;
      const float* qrope = qr + (b * H + h) * Dr;
      auto row = [&](int64_t tok) {
        return cache + (static_cast<int64_t>(table[b * max_pages + tok / page_size]) * page_size + tok % page_size) * row_w;
      };
      float m = kNegInf;
      for (int64_t tok = 0; tok < len; ++tok) {
        const float* c = row(tok);
        float acc = 0.f;
        for (int64_t i = 0; i < R; ++i) acc += qlat[i] * c[i];
        for (int64_t i = 0; i < Dr; ++i) acc += qrope[i] * c[R + i];
        s[tok] = acc * p.scale;
        m = std::max(m, s[tok]);
      }
      float d = 0.f;
      for (int64_t tok = 0; tok < len; ++tok) {
        const float e = std::exp(s[tok] - m);
        d += e;
        const float* c = row(tok);
        for (int64_t i = 0; i < R; ++i) orow[i] += e * c[i];
      }
      for (int64_t i = 0; i < R; ++i) orow[i] /= d;
      lse[b * H + h] = m + std::log(d);
    }
  });
}

}  // namespace k3::cpu
