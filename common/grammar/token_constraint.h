// Grammar-constrained decoding at the token level: which vocabulary tokens may come next (a bitmask
// in the sampler's TokenMask layout: 32 ids per u32 word, id % 32 = bit), and advancing by the token
// the sampler picked. A token is allowed when all of its bytes advance the JsonMatcher from the current
// state; a stop id (EOS) only once the document is complete; special tokens never otherwise.
//
// Cost: each step walks every token's bytes from the current state (O(total vocabulary bytes)); the
// masks of states already seen are cached (a constrained document revisits few distinct states per
// position, e.g. the start of every string body), bounded by kMaskCacheStates.
#pragma once
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "common/core/status.h"
#include "common/grammar/json_matcher.h"

namespace k3 {
class Tokenizer;
}

namespace k3::grammar {

// Every token's bytes, built once per tokenizer and shared by all requests.
struct TokenVocab {
  std::vector<std::string> bytes;   // by id; empty for ids that are not text
  std::vector<uint8_t> special;     // by id
  static std::shared_ptr<const TokenVocab> from_tokenizer(const Tokenizer& tok);
};

class TokenConstraint {
 public:
  static constexpr size_t kMaskCacheStates = 256;

  TokenConstraint(std::shared_ptr<const JsonGrammar> grammar, std::shared_ptr<const TokenVocab> vocab,
                  std::vector<int32_t> stop_ids);
  // From an OutputFormat's wire form (what the sampling nodes receive): null for free text; an error
  // for a format that does not compile or when no vocabulary was loaded.
  static Result<std::unique_ptr<TokenConstraint>> for_format(const std::string& wire,
                                                             std::shared_ptr<const TokenVocab> vocab,
                                                             std::vector<int32_t> stop_ids);

  // Sets the bits of the allowed ids among [0, vocab) in `words` ((vocab + 31) / 32 words, zeroed by the
  // caller). Returns how many ids it allowed (0 only if the grammar has a dead end: a bug).
  int64_t fill_mask(uint32_t* words, int64_t vocab);
  // The sampler picked `id`: advance. An id the mask did not allow is an Internal error.
  Status accept(int32_t id);
  // The document is closed (nothing may follow but a stop id): generation can end here.
  bool closed() const { return matcher_.closed(); }
  bool complete() const { return matcher_.complete(); }

 private:
  bool is_stop(int32_t id) const;
  std::string state_key() const;

  std::shared_ptr<const JsonGrammar> grammar_;
  std::shared_ptr<const TokenVocab> vocab_;
  std::vector<int32_t> stop_ids_;
  JsonMatcher matcher_;
  std::map<std::string, std::vector<uint32_t>> cache_;
};

}  // namespace k3::grammar
