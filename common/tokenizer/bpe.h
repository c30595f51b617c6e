// Byte-pair encoding over a tiktoken vocabulary: the rank of a byte string is its token id, and
// the pair whose concatenation has the lowest rank merges first (leftmost on ties), as in tiktoken.
#pragma once
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace k3 {

// Byte string <-> id for the mergeable tokens. Open addressing over one byte arena, so a
// 163,840-entry vocabulary loads without per-token allocations.
class TokenTable {
 public:
  // False when `bytes` is already present (the table is unchanged). Ids must be >= 0.
  bool insert(std::string_view bytes, int32_t id);
  std::optional<int32_t> find(std::string_view bytes) const;
  // Null when no token has this id.
  std::optional<std::string_view> bytes_of(int32_t id) const;
  size_t size() const { return count_; }

 private:
  struct Span {
    uint32_t offset = 0;
    uint32_t len = kAbsent;
  };
  static constexpr uint32_t kAbsent = ~uint32_t{0};
  std::string_view view(const Span& s) const { return {arena_.data() + s.offset, s.len}; }
  void rehash(size_t capacity);

  std::string arena_;            // every token's bytes, back to back
  std::vector<Span> by_id_;      // indexed by id; len == kAbsent for unused ids
  std::vector<int32_t> slots_;   // open-addressing table of ids; -1 = empty; size is a power of 2
  size_t count_ = 0;
};

// Reusable buffers for bpe_encode, so encoding many pieces does not allocate per piece.
struct BpeScratch {
  // Node i is the part that starts at byte i of the piece (parts only grow to the right).
  struct Node {
    uint32_t next;    // start of the following live part, or the piece size
    uint32_t prev;
    uint32_t version; // bumped whenever the part grows, which makes queued pairs stale
    bool alive;
  };
  struct Candidate {
    int32_t rank;
    uint32_t left, right;
    uint32_t left_version, right_version;
  };
  std::vector<Node> nodes;
  std::vector<Candidate> heap;
};

// Appends the ids of `piece` to `out`. Every single byte must be a token (Tokenizer::load checks).
// O(n log n) with a heap of candidate pairs, so one huge piece (a megabyte without spaces) is fine.
void bpe_encode(const TokenTable& table, std::string_view piece, std::vector<int32_t>& out,
                BpeScratch& scratch);
// The plain tiktoken loop (rescan every pair after each merge, O(n^2)); the reference for tests.
void bpe_encode_reference(const TokenTable& table, std::string_view piece, std::vector<int32_t>& out);

}  // namespace k3
