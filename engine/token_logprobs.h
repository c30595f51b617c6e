// Log-probabilities of a sampled token as the API reports them: the log-softmax of the raw logits (in
// double, so every process that holds the same logits reports the same values), plus the n most likely
// alternatives. One definition for the local engine, the last prefill stage (first token) and decode.
#pragma once
#include <cstdint>
#include <utility>
#include <vector>

#include "common/protocol/messages.h"

namespace k3 {

struct RowLogprobs {
  float logprob = 0.f;                             // of the sampled id
  std::vector<std::pair<int32_t, float>> top;      // (id, logprob), most likely first, lowest id on ties
};

// log(sum(exp(row))), computed around the row's maximum.
double log_sum_exp(const float* row, int64_t n);
RowLogprobs row_logprobs(const float* row, int64_t vocab, int32_t id, int top_n);
// As TOKENS and COMPUTE_DONE carry them.
protocol::TokenLogprobs to_wire(const RowLogprobs& lp);

}  // namespace k3
