// The sampler's hook for constrained decoding (structured output, forced tool calls): a bitmask of
// allowed token ids for some rows of a logits batch. apply_token_mask sets every disallowed logit of
// those rows to -inf just before ops::sample, so the sampler's one rule (greedy argmax, or temperature ->
// top_k -> top_p -> draw) picks among the allowed tokens only, and a masked draw equals the draw over
// the allowed subset alone (tests/kernels/test_token_mask.cpp checks this against that reference).
// Rows without a mask are not touched and a batch without masks costs nothing: the caller simply does
// not call it. The bit layout (32 ids per u32 word, id % 32 = bit) is the one grammar engines such as
// xgrammar fill, so a mask can come from one without conversion.
//
// Logprobs are computed from the logits before the mask (they describe the model, not the grammar).
#pragma once
#include <cstdint>
#include <vector>

#include "common/core/tensor.h"

namespace k3 {

class TokenMask {
 public:
  explicit TokenMask(int64_t vocab) : vocab_(vocab), words_((vocab + 31) / 32) {}
  int64_t vocab() const { return vocab_; }
  int64_t words() const { return words_; }

  // Constrains logits row `row` (rows are added in ascending order); returns its index k here, with
  // no token allowed yet.
  size_t add_row(int64_t row);
  void allow(size_t k, int32_t id) { bits_[k * words_ + id / 32] |= 1u << (id % 32); }
  bool allowed(size_t k, int32_t id) const { return (bits_[k * words_ + id / 32] >> (id % 32)) & 1u; }
  // The mask of row k as words (a grammar engine may fill them directly).
  uint32_t* row_bits(size_t k) { return bits_.data() + k * words_; }

  const std::vector<int64_t>& rows() const { return rows_; }
  const std::vector<uint32_t>& bits() const { return bits_; }
  bool empty() const { return rows_.empty(); }

 private:
  int64_t vocab_, words_;
  std::vector<int64_t> rows_;
  std::vector<uint32_t> bits_;
};

// logits: [B, V] F32, host or (CUDA build) device memory; V must equal mask.vocab() and every masked
// row index be < B. Throws k3::Error naming the problem, also for a row that allows no token (nothing
// could be sampled) -- checked before any logit changes.
void apply_token_mask(const Tensor& logits, const TokenMask& mask);

}  // namespace k3
