// Grammar-constrained decoding at the token level: which vocabulary tokens may come next (a bitmask
// in the sampler's TokenMask layout: 32 ids per u32 word, id % 32 = bit), and advancing by the token
// the sampler picked.
//
// A JSON document (response_format): a token is allowed when all of its bytes advance the JsonMatcher
// from the current state; a stop id (EOS) only once the document is complete; special tokens never
// otherwise.
// Tool calls (tool_call_grammar.h): the tool-call section's special tokens where the section allows
// them, the call's name ("functions.NAME:INDEX") byte by byte, its arguments as a JSON document of the
// function's grammar, and free text (every token but the tool-call tokens) where the mode allows it.
//
// Cost: a step walks every token's bytes from the current state (O(total vocabulary bytes)); the
// masks of states already seen are cached (a constrained document revisits few distinct states per
// position, e.g. the start of every string body), bounded by kMaskCacheStates.
#pragma once
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "common/core/status.h"
#include "common/grammar/json_matcher.h"
#include "common/grammar/output_format.h"

namespace k3 {
class Tokenizer;
}

namespace k3::grammar {

// The ids of the tool-call section's special tokens (-1: the tokenizer has none).
struct ToolTokens {
  int32_t section_begin = -1, section_end = -1, call_begin = -1, arguments = -1, call_end = -1;
  bool present() const { return section_begin >= 0 && section_end >= 0 && call_begin >= 0 && arguments >= 0 && call_end >= 0; }
  bool contains(int32_t id) const {
    return id == section_begin || id == section_end || id == call_begin || id == arguments || id == call_end;
  }
};

// Every token's bytes, built once per tokenizer and shared by all requests.
struct TokenVocab {
  std::vector<std::string> bytes;   // by id; empty for ids that are not text
  std::vector<uint8_t> special;     // by id
  ToolTokens tools;
  static std::shared_ptr<const TokenVocab> from_tokenizer(const Tokenizer& tok);
};

class TokenConstraint {
 public:
  static constexpr size_t kMaskCacheStates = 256;

  // A JSON document.
  TokenConstraint(std::shared_ptr<const JsonGrammar> grammar, std::shared_ptr<const TokenVocab> vocab,
                  std::vector<int32_t> stop_ids);
  // Tool calls (the vocabulary must have the tool-call tokens: create() checks).
  TokenConstraint(std::shared_ptr<const ToolCallGrammar> grammar, std::shared_ptr<const TokenVocab> vocab,
                  std::vector<int32_t> stop_ids);
  // Null for free text; an error when no vocabulary was loaded or it lacks the tool-call tokens.
  static Result<std::unique_ptr<TokenConstraint>> create(const CompiledFormat& format,
                                                         std::shared_ptr<const TokenVocab> vocab,
                                                         std::vector<int32_t> stop_ids);
  // From an OutputFormat's wire form (what the sampling nodes receive): create() of its compiled form;
  // also an error for a format that does not compile.
  static Result<std::unique_ptr<TokenConstraint>> for_format(const std::string& wire,
                                                             std::shared_ptr<const TokenVocab> vocab,
                                                             std::vector<int32_t> stop_ids);

  // Sets the bits of the allowed ids among [0, vocab) in `words` ((vocab + 31) / 32 words, zeroed by the
  // caller). Returns how many ids it allowed (0 only if the grammar has a dead end: a bug).
  int64_t fill_mask(uint32_t* words, int64_t vocab);
  // The sampler picked `id`: advance. An id the mask did not allow is an Internal error.
  Status accept(int32_t id);
  // Nothing may follow but a stop id: generation can end here.
  bool closed() const;
  // A stop id may come now.
  bool complete() const;

 private:
  // Where a tool-call output is: free text, then the section's parts in order.
  enum class Phase : uint8_t { Document, Free, SectionBegin, CallBegin, Name, ArgumentsBegin, Arguments, AfterCall, End };

  bool is_stop(int32_t id) const;
  std::string state_key() const;
  void fill_text(uint32_t* words, int64_t vocab) const;   // the cached part: tokens by their bytes
  void fill_tool_tokens(uint32_t* words, int64_t vocab) const;
  const std::string& token_bytes(int32_t id) const;     // "" for specials and ids outside the vocabulary
  bool name_prefix(const std::string& name) const;      // some call name starts with it
  int full_name() const;                                // the function whose whole call name name_ is; -1
  Status accept_tool(int32_t id);

  std::shared_ptr<const JsonGrammar> document_;
  std::shared_ptr<const ToolCallGrammar> tools_;
  std::shared_ptr<const TokenVocab> vocab_;
  std::vector<int32_t> stop_ids_;
  Phase phase_ = Phase::Document;
  std::optional<JsonMatcher> matcher_;  // the document, or the current call's arguments
  std::string name_;                    // the current call's name bytes so far
  int function_ = -1;                   // Arguments: whose arguments they are
  int calls_ = 0;                       // calls finished so far
  std::map<std::string, std::vector<uint32_t>> cache_;
};

}  // namespace k3::grammar
