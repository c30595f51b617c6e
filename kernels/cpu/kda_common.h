// Shared pieces of the KDA ops (gate, token recurrence, chunked form, decode).
#pragma once
#include <cstdint>

#include "kernels/ops.h"

namespace k3::cpu {

struct KdaDims {
  int64_t T = 0, H = 0, K = 0, V = 0, N = 0, num_slots = 0;
  const int32_t* cu = nullptr;        // [N+1]
  const int32_t* seq_rows = nullptr;  // [N][2] or null (KdaParams::seq_rows)
  // Sequence n's rows in this call.
  int64_t begin(int64_t n) const { return seq_rows ? seq_rows[2 * n] : cu[n]; }
  int64_t end(int64_t n) const { return seq_rows ? seq_rows[2 * n + 1] : cu[n + 1]; }
};

// Validates KdaParams for `op` and returns the sizes.
KdaDims check_kda(const char* op, const ops::KdaParams& p);

// The optional checkpoint output of KdaParams, validated (interval, table shape, distinct slots in
// range). `write` copies one head's state when `done` tokens of sequence n end a checkpoint.
struct KdaCheckpoints {
  float* base = nullptr;  // null: none requested
  const int32_t* slots = nullptr;
  int64_t M = 0, interval = 0, H = 0, head_floats = 0;
  void write(int64_t n, int64_t h, int64_t done, const float* S) const;
};
// `multiple_of`: the interval must be a multiple of it (the chunk size for kda_chunk, 1 otherwise).
KdaCheckpoints check_kda_checkpoints(const char* op, const ops::KdaParams& p, const KdaDims& d, int64_t multiple_of);

// One token of the delta rule on one head's state S [V][K] (K contiguous), docs/MODEL.md §2.3:
// S <- Diag(exp(g)) S; u = beta (v - S^T k); S <- S + k u^T; o = S^T q.
void kda_token_step(float* S, const float* q, const float* k, const float* v, const float* g, float beta,
                    float* o, int64_t K, int64_t V);

}  // namespace k3::cpu
