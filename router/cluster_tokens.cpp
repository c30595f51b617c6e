#include "router/cluster_tokens.h"

#include <algorithm>

namespace k3::router {

TokenLogprob token_logprob(int32_t id, const protocol::TokenLogprobs& lp) {
  TokenLogprob out{.id = id, .logprob = lp.logprob, .top = {}};
  for (const protocol::TopLogprob& t : lp.top) out.top.emplace_back(t.id, t.logprob);
  return out;
}

Result<std::string> absorb_tokens(const protocol::Tokens& t, const GenerationParams& params, TextStream& text,
                                  int64_t& generated, GenerationEvent& ev) {
  const bool want_logprobs = params.logprobs >= 0;
  if (want_logprobs && t.logprobs.size() != t.token_ids.size())
    return internal_error("TOKENS carries " + std::to_string(t.logprobs.size()) + " logprobs for " +
                          std::to_string(t.token_ids.size()) + " tokens");
  for (size_t i = 0; i < t.token_ids.size(); ++i) {
    const int32_t id = t.token_ids[i];
    ++generated;
    ev.token_ids.push_back(id);
    if (want_logprobs) ev.logprobs.push_back(token_logprob(id, t.logprobs[i]));
    auto piece = text.push(id);
    if (!piece.is_ok()) return piece.status();
    ev.text += *piece;
    const auto& stops = params.stop_ids;
    if (std::find(stops.begin(), stops.end(), id) != stops.end() || text.stopped()) return std::string("stop");
    if (generated >= params.max_tokens) return std::string("length");
  }
  return std::string();
}

}  // namespace k3::router
