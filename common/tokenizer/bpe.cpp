#include "common/tokenizer/bpe.h"

#include <algorithm>
#include <limits>

#include "common/core/status.h"

namespace k3 {
namespace {

uint64_t hash_bytes(std::string_view s) {
  uint64_t h = 0xcbf29ce484222325ull;  // FNV-1a, then a final mix so low bits are usable
  for (unsigned char c : s) h = (h ^ c) * 0x100000001b3ull;
  h ^= h >> 33;
  h *= 0xff51afd7ed558ccdull;
  h ^= h >> 33;
  return h;
}

int32_t token_of(const TokenTable& table, std::string_view bytes) {
  const std::optional<int32_t> id = table.find(bytes);
  K3_CHECK(id.has_value(), "BPE part is not a token; the vocabulary lacks a single byte");
  return *id;
}

}  // namespace

bool TokenTable::insert(std::string_view bytes, int32_t id) {
  K3_CHECK(id >= 0, "token ids are non-negative");
  if (find(bytes)) return false;
  if ((count_ + 1) * 2 > slots_.size()) rehash(std::max<size_t>(64, slots_.size() * 2));
  if (size_t(id) >= by_id_.size()) by_id_.resize(size_t(id) + 1);
  K3_CHECK(by_id_[id].len == kAbsent, "token id inserted twice");
  by_id_[id] = {uint32_t(arena_.size()), uint32_t(bytes.size())};
  arena_.append(bytes);
  const size_t mask = slots_.size() - 1;
  for (size_t s = hash_bytes(bytes) & mask;; s = (s + 1) & mask) {
    if (slots_[s] < 0) {
      slots_[s] = id;
      break;
    }
  }
  ++count_;
  return true;
}

void TokenTable::rehash(size_t capacity) {
  std::vector<int32_t> old = std::move(slots_);
  slots_.assign(capacity, -1);
  const size_t mask = capacity - 1;
  for (int32_t id : old) {
    if (id < 0) continue;
    for (size_t s = hash_bytes(view(by_id_[id])) & mask;; s = (s + 1) & mask) {
      if (slots_[s] < 0) {
        slots_[s] = id;
        break;
      }
    }
  }
}

std::optional<int32_t> TokenTable::find(std::string_view bytes) const {
  if (slots_.empty()) return std::nullopt;
  const size_t mask = slots_.size() - 1;
  for (size_t s = hash_bytes(bytes) & mask;; s = (s + 1) & mask) {
    const int32_t id = slots_[s];
    if (id < 0) return std::nullopt;
    if (view(by_id_[id]) == bytes) return id;
  }
}

std::optional<std::string_view> TokenTable::bytes_of(int32_t id) const {
  if (id < 0 || size_t(id) >= by_id_.size() || by_id_[id].len == kAbsent) return std::nullopt;
  return view(by_id_[id]);
}

void bpe_encode(const TokenTable& table, std::string_view piece, std::vector<int32_t>& out,
                BpeScratch& scratch) {
  if (piece.empty()) return;
  // tiktoken emits a piece that is itself a token directly, even where merging would split it.
  if (const std::optional<int32_t> whole = table.find(piece)) {
    out.push_back(*whole);
    return;
  }
  K3_CHECK(piece.size() < UINT32_MAX, "BPE piece must be under 4 GiB (offsets are 32-bit)");
  const uint32_t n = uint32_t(piece.size());
  auto& nodes = scratch.nodes;
  auto& heap = scratch.heap;
  nodes.resize(n + 1);
  for (uint32_t i = 0; i <= n; ++i) nodes[i] = {i + 1, i - 1, 0, i < n};  // nodes[n]: end sentinel
  heap.clear();

  // Min-heap on (rank, left start): the lowest rank merges first, the leftmost among equals.
  const auto later = [](const BpeScratch::Candidate& a, const BpeScratch::Candidate& b) {
    return a.rank != b.rank ? a.rank > b.rank : a.left > b.left;
  };
  const auto push_pair = [&](uint32_t left) {
    const uint32_t right = nodes[left].next;
    if (right >= n) return;
    const uint32_t end = nodes[right].next;  // == start of the part after `right`, or n
    if (const std::optional<int32_t> rank = table.find(piece.substr(left, end - left))) {
      heap.push_back({*rank, left, right, nodes[left].version, nodes[right].version});
      std::push_heap(heap.begin(), heap.end(), later);
    }
  };
  for (uint32_t i = 0; i + 1 < n; ++i) push_pair(i);

  while (!heap.empty()) {
    std::pop_heap(heap.begin(), heap.end(), later);
    const BpeScratch::Candidate c = heap.back();
    heap.pop_back();
    BpeScratch::Node& left = nodes[c.left];
    if (!left.alive || left.next != c.right || left.version != c.left_version ||
        nodes[c.right].version != c.right_version) {
      continue;  // one of the parts changed since this pair was queued
    }
    BpeScratch::Node& right = nodes[c.right];
    right.alive = false;
    left.next = right.next;
    nodes[right.next].prev = c.left;
    ++left.version;
    if (c.left > 0) push_pair(left.prev);  // node 0 is never absorbed, so left.prev is live
    push_pair(c.left);
  }
  for (uint32_t i = 0; i < n; i = nodes[i].next) {
    out.push_back(token_of(table, piece.substr(i, nodes[i].next - i)));
  }
}

void bpe_encode_reference(const TokenTable& table, std::string_view piece,
                          std::vector<int32_t>& out) {
  if (piece.empty()) return;
  if (const std::optional<int32_t> whole = table.find(piece)) {
    out.push_back(*whole);
    return;
  }
  std::vector<size_t> starts(piece.size() + 1);  // part k is [starts[k], starts[k+1])
  for (size_t i = 0; i <= piece.size(); ++i) starts[i] = i;
  while (starts.size() > 2) {
    int32_t best_rank = std::numeric_limits<int32_t>::max();
    size_t best = 0;
    bool found = false;
    for (size_t k = 0; k + 2 < starts.size(); ++k) {
      const std::optional<int32_t> rank = table.find(piece.substr(starts[k], starts[k + 2] - starts[k]));
      if (rank && *rank < best_rank) best_rank = *rank, best = k, found = true;
    }
    if (!found) break;
    starts.erase(starts.begin() + std::ptrdiff_t(best) + 1);
  }
  for (size_t k = 0; k + 1 < starts.size(); ++k) {
    out.push_back(token_of(table, piece.substr(starts[k], starts[k + 1] - starts[k])));
  }
}

}  // namespace k3
