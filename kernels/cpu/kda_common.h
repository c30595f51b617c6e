// Shared pieces of the KDA ops (gate, token recurrence, chunked form, decode).
#pragma once
#include <cstdint>

#include "kernels/ops.h"

namespace k3::cpu {

struct KdaDims {
  int64_t T = 0, H = 0, K = 0, V = 0, N = 0, num_slots = 0;
};

// Validates KdaParams for `op` and returns the sizes.
KdaDims check_kda(const char* op, const ops::KdaParams& p);

// One token of the delta rule on one head's state S [V][K] (K contiguous), docs/MODEL.md §2.3:
// S <- Diag(exp(g)) S; u = beta (v - S^T k); S <- S + k u^T; o = S^T q.
void kda_token_step(float* S, const float* q, const float* k, const float* v, const float* g, float beta,
                    float* o, int64_t K, int64_t V);

}  // namespace k3::cpu
