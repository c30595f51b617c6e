#include "engine/token_logprobs.h"

#include <algorithm>
#include <cmath>

#include "engine/engine.h"

namespace k3 {

double log_sum_exp(const float* row, int64_t n) {
  double m = -INFINITY;
  for (int64_t i = 0; i < n; ++i) m = std::max(m, static_cast<double>(row[i]));
  if (!std::isfinite(m)) return m;
  double s = 0;
  for (int64_t i = 0; i < n; ++i) s += std::exp(static_cast<double>(row[i]) - m);
  return m + std::log(s);
}

RowLogprobs row_logprobs(const float* row, int64_t vocab, int32_t id, int top_n) {
  const double lse = log_sum_exp(row, vocab);
  RowLogprobs out{.logprob = static_cast<float>(row[id] - lse), .top = {}};
  if (top_n > 0)
    for (auto [alt, logit] : top_logits(row, vocab, top_n)) out.top.emplace_back(alt, static_cast<float>(logit - lse));
  return out;
}

protocol::TokenLogprobs to_wire(const RowLogprobs& lp) {
  protocol::TokenLogprobs out{.logprob = lp.logprob, .top = {}};
  for (auto [id, v] : lp.top) out.top.push_back({.id = id, .logprob = v});
  return out;
}

}  // namespace k3
