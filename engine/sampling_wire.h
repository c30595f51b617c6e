// A request's sampling as the wire carries it (protocol::SamplingParams: router -> prefill, decode) and
// as the sampler takes it (ops::SamplingRow), converted here once for every node.
#pragma once
#include <span>
#include <vector>

#include "common/protocol/messages.h"
#include "kernels/ops.h"

namespace k3 {

// The row of `sp` for its step 0: temperature, top_k, top_p, seed and the penalties. The spans (the
// generated tokens, the logit biases) are the caller's to set from storage it owns for the draw.
inline ops::SamplingRow sampling_row(const protocol::SamplingParams& sp) {
  return {.temperature = sp.temperature, .top_k = sp.top_k, .top_p = sp.top_p, .seed = sp.seed,
          .presence_penalty = sp.presence_penalty, .frequency_penalty = sp.frequency_penalty};
}

inline std::vector<ops::LogitBias> logit_biases(const protocol::SamplingParams& sp) {
  std::vector<ops::LogitBias> out;
  for (const protocol::LogitBias& b : sp.logit_bias) out.push_back({.token = b.token, .bias = b.bias});
  return out;
}

inline std::vector<protocol::LogitBias> to_wire(std::span<const ops::LogitBias> biases) {
  std::vector<protocol::LogitBias> out;
  for (const ops::LogitBias& b : biases) out.push_back({.token = b.token, .bias = b.bias});
  return out;
}

}  // namespace k3
