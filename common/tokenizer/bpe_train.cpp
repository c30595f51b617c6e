#include "common/tokenizer/bpe_train.h"

#include <cstdint>
#include <map>
#include <unordered_map>

#include "common/tokenizer/pretokenize.h"

namespace k3 {
namespace {

struct Word {
  std::vector<int32_t> symbols;  // token ids
  int64_t count;                 // occurrences of this piece in the corpus
};

uint64_t pair_key(int32_t a, int32_t b) { return uint64_t(uint32_t(a)) << 32 | uint32_t(b); }

}  // namespace

std::vector<std::string> learn_bpe_merges(std::string_view corpus, int max_new_tokens) {
  std::map<std::string_view, int64_t> piece_counts;  // ordered: the word list is deterministic
  for (std::string_view piece : kimi_pretokenize(corpus)) ++piece_counts[piece];
  std::vector<Word> words;
  for (const auto& [piece, count] : piece_counts) {
    Word w{{}, count};
    for (unsigned char c : piece) w.symbols.push_back(c);
    words.push_back(std::move(w));
  }
  std::vector<std::string> token_bytes;
  std::unordered_map<std::string, int32_t> id_of_bytes;
  for (int b = 0; b < 256; ++b) {
    token_bytes.emplace_back(1, char(b));
    id_of_bytes.emplace(token_bytes.back(), b);
  }

  std::vector<std::string> learned;
  std::unordered_map<uint64_t, int64_t> pair_counts;
  while (int(learned.size()) < max_new_tokens) {
    pair_counts.clear();
    for (const Word& w : words) {
      for (size_t k = 0; k + 1 < w.symbols.size(); ++k) pair_counts[pair_key(w.symbols[k], w.symbols[k + 1])] += w.count;
    }
    if (pair_counts.empty()) break;
    uint64_t best = 0;
    int64_t best_count = 0;
    for (const auto& [key, count] : pair_counts) {  // hash order varies; the choice does not
      if (count > best_count || (count == best_count && key < best)) best = key, best_count = count;
    }
    const int32_t a = int32_t(best >> 32), b = int32_t(best & 0xffffffffu);
    std::string bytes = token_bytes[a] + token_bytes[b];
    int32_t merged;
    if (const auto it = id_of_bytes.find(bytes); it != id_of_bytes.end()) {
      merged = it->second;
    } else {
      merged = int32_t(token_bytes.size());
      token_bytes.push_back(bytes);
      id_of_bytes.emplace(bytes, merged);
      learned.push_back(std::move(bytes));
    }
    for (Word& w : words) {
      size_t out = 0;
      for (size_t k = 0; k < w.symbols.size(); ++k) {
        if (k + 1 < w.symbols.size() && w.symbols[k] == a && w.symbols[k + 1] == b) {
          w.symbols[out++] = merged;
          ++k;
        } else {
          w.symbols[out++] = w.symbols[k];
        }
      }
      w.symbols.resize(out);
    }
  }
  return learned;
}

}  // namespace k3
