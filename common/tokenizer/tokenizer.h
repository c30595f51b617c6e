// Byte-level BPE over the tiktoken file format ("<base64 token> <rank>" per line) plus special
// tokens, so a real Kimi tokenizer (tiktoken.model + tokenizer_config.json) loads unchanged.
#pragma once
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "common/core/status.h"

namespace k3 {

class ChatFormat;  // common/tokenizer/chat_format.h

class Tokenizer {
 public:
  // Reads <dir>/tiktoken.model and <dir>/tokenizer_config.json (special tokens, chat template).
  static Result<Tokenizer> load(const std::string& model_dir);

  // allow_special: special-token text (e.g. "<|im_end|>") maps to its id; otherwise it is plain text.
  // Invalid UTF-8 input is encoded byte-wise (byte-level BPE never fails).
  std::vector<int32_t> encode(std::string_view text, bool allow_special = false) const;
  // Concatenated bytes of the tokens (may end inside a UTF-8 sequence); an id out of range is an error.
  Result<std::string> decode_bytes(std::span<const int32_t> ids) const;
  // Decoded text with invalid UTF-8 replaced by U+FFFD.
  Result<std::string> decode(std::span<const int32_t> ids) const;

  int vocab_size() const;                                   // max id + 1, specials included
  // Whether `id` is one of this tokenizer's tokens (bytes or a special). A model's vocabulary may run
  // past its tokenizer's (padding rows, or a generated test model's 163840 rows over a small tokenizer):
  // such ids can be sampled but have no text.
  bool assigns(int32_t id) const;
  std::optional<int32_t> special_id(std::string_view text) const;
  bool is_special(int32_t id) const;
  std::vector<int32_t> eos_ids() const;                     // [EOS], <|im_end|> when present
  std::optional<int32_t> bos_id() const;
  // How chat messages become prompt text for this model (its chat_template, or the built-in one).
  const ChatFormat& chat_format() const;

  struct Impl;
  Tokenizer();
  ~Tokenizer();
  Tokenizer(Tokenizer&&) noexcept;
  Tokenizer& operator=(Tokenizer&&) noexcept;

 private:
  std::unique_ptr<Impl> impl_;
};

// Replaces invalid UTF-8 sequences with U+FFFD; returns the number of replacements via `bad`.
std::string sanitize_utf8(std::string_view s, int* bad = nullptr);
bool is_valid_utf8(std::string_view s);

}  // namespace k3
