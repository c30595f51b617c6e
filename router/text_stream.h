// Incremental detokenization with stop strings: turns generated token ids into text deltas that are
// safe to send. Text that could still become a stop string (a suffix that is a prefix of one) and an
// unfinished UTF-8 sequence at the end are held back until the next token decides them; a stop string
// ends the stream and is never returned. Every delta is valid UTF-8.
#pragma once
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "common/core/status.h"
#include "common/tokenizer/tokenizer.h"

namespace k3::router {

class TextStream {
 public:
  // decode_bytes: the tokenizer's byte decoding of one id. Hidden ids (EOS, stop ids, specials)
  // add no text.
  using DecodeBytes = std::function<Result<std::string>(int32_t)>;
  TextStream(DecodeBytes decode, std::vector<std::string> stop_strings, std::function<bool(int32_t)> hidden);

  // Appends one token; returns the text that became safe to emit (maybe empty).
  Result<std::string> push(int32_t id);
  // Generation ended without a stop string: the held-back rest (invalid bytes replaced by U+FFFD).
  std::string flush();
  bool stopped() const { return stopped_; }

 private:
  std::string take(size_t end);  // emits bytes_[emitted_, end)

  DecodeBytes decode_;
  std::vector<std::string> stops_;
  std::function<bool(int32_t)> hidden_;
  std::string bytes_;     // all visible bytes so far
  size_t emitted_ = 0;    // bytes_[0, emitted_) already returned
  bool stopped_ = false;
};

// The text stream of `tok`'s tokens that every generation path uses: specials, the request's stop ids
// and ids the tokenizer does not assign (Tokenizer::assigns: padding rows of a larger model vocabulary)
// add no text; their ids are still the request's tokens.
TextStream tokenizer_text_stream(std::shared_ptr<const Tokenizer> tok, std::vector<std::string> stop_strings,
                                 std::vector<int32_t> stop_ids);

// Length of the longest suffix of `text` that is a proper prefix of one of `stops`.
size_t held_stop_prefix(const std::string& text, const std::vector<std::string>& stops);
// Bytes at the end of `s` that start an unfinished UTF-8 sequence (0..3).
size_t incomplete_utf8_tail(const std::string& s);

}  // namespace k3::router
