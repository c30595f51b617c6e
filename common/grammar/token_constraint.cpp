#include "common/grammar/token_constraint.h"

#include <algorithm>
#include <cstring>

#include "common/grammar/output_format.h"
#include "common/tokenizer/tokenizer.h"

namespace k3::grammar {

std::shared_ptr<const TokenVocab> TokenVocab::from_tokenizer(const Tokenizer& tok) {
  auto v = std::make_shared<TokenVocab>();
  const int n = tok.vocab_size();
  v->bytes.resize(static_cast<size_t>(n));
  v->special.resize(static_cast<size_t>(n), 0);
  for (int32_t id = 0; id < n; ++id) {
    v->special[static_cast<size_t>(id)] = tok.is_special(id) ? 1 : 0;
    if (tok.is_special(id)) continue;
    auto b = tok.decode_bytes(std::span<const int32_t>(&id, 1));
    if (b.is_ok()) v->bytes[static_cast<size_t>(id)] = std::move(b).value();
  }
  return v;
}

TokenConstraint::TokenConstraint(std::shared_ptr<const JsonGrammar> grammar, std::shared_ptr<const TokenVocab> vocab,
                                 std::vector<int32_t> stop_ids)
    : grammar_(std::move(grammar)), vocab_(std::move(vocab)), stop_ids_(std::move(stop_ids)), matcher_(*grammar_) {}

Result<std::unique_ptr<TokenConstraint>> TokenConstraint::for_format(const std::string& wire,
                                                                     std::shared_ptr<const TokenVocab> vocab,
                                                                     std::vector<int32_t> stop_ids) {
  K3_ASSIGN_OR_RETURN(OutputFormat format, OutputFormat::parse(wire));
  if (!format.constrained()) return std::unique_ptr<TokenConstraint>();
  if (!vocab) return invalid_argument("structured output needs the tokenizer's vocabulary, which this node did not load");
  K3_ASSIGN_OR_RETURN(std::shared_ptr<const JsonGrammar> g, format.compile());
  return std::make_unique<TokenConstraint>(std::move(g), std::move(vocab), std::move(stop_ids));
}

bool TokenConstraint::is_stop(int32_t id) const {
  return std::find(stop_ids_.begin(), stop_ids_.end(), id) != stop_ids_.end();
}

// The matcher's whole state as bytes: two states with equal keys allow the same tokens.
std::string TokenConstraint::state_key() const {
  std::string key(1, matcher_.closed() ? '\1' : '\0');
  auto put = [&key](auto v) { key.append(reinterpret_cast<const char*>(&v), sizeof v); };
  for (const JsonMatcher::Frame& f : matcher_.frames()) {
    put(f.node), put(f.kind), put(f.phase), put(f.lo), put(f.hi), put(f.count), put(f.pos), put(f.cand);
  }
  return key;
}

int64_t TokenConstraint::fill_mask(uint32_t* words, int64_t vocab) {
  const int64_t n_words = (vocab + 31) / 32;
  const std::string key = state_key();
  if (auto it = cache_.find(key); it != cache_.end() && static_cast<int64_t>(it->second.size()) == n_words) {
    std::memcpy(words, it->second.data(), it->second.size() * sizeof(uint32_t));
  } else {
    const int64_t n = std::min<int64_t>(vocab, static_cast<int64_t>(vocab_->bytes.size()));
    JsonMatcher scratch = matcher_;
    for (int64_t id = 0; id < n; ++id) {
      const std::string& bytes = vocab_->bytes[static_cast<size_t>(id)];
      if (vocab_->special[static_cast<size_t>(id)] || bytes.empty()) continue;
      scratch = matcher_;
      if (scratch.try_feed(bytes)) words[id / 32] |= 1u << (id % 32);
    }
    if (cache_.size() >= kMaskCacheStates) cache_.clear();
    cache_[key].assign(words, words + n_words);
  }
  // Stop ids depend on completeness only, which the key fixes too, but they are set outside the cache
  // so a cached mask never carries another request's stop ids.
  for (int32_t id : stop_ids_)
    if (id >= 0 && id < vocab) {
      if (complete()) words[id / 32] |= 1u << (id % 32);
      else words[id / 32] &= ~(1u << (id % 32));
    }
  int64_t allowed = 0;
  for (int64_t w = 0; w < n_words; ++w) allowed += __builtin_popcount(words[w]);
  return allowed;
}

Status TokenConstraint::accept(int32_t id) {
  if (is_stop(id)) {
    if (!complete()) return internal_error("constrained decoding: stop id " + std::to_string(id) + " before the JSON document is complete");
    return Status::ok();
  }
  if (id < 0 || static_cast<size_t>(id) >= vocab_->bytes.size() || vocab_->special[static_cast<size_t>(id)] ||
      vocab_->bytes[static_cast<size_t>(id)].empty() || !matcher_.advance(vocab_->bytes[static_cast<size_t>(id)]))
    return internal_error("constrained decoding: token " + std::to_string(id) + " does not fit the JSON grammar here");
  return Status::ok();
}

}  // namespace k3::grammar
