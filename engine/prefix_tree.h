// The radix tree of the prefix cache (docs/PREFIX_CACHE.md): cached prompt prefixes over token ids.
// An edge holds whole blocks of tokens (block = the checkpoint alignment) and owns the MLA pages of
// those tokens; a node may own a KDA checkpoint (one KDA slot: state + conv window of every KDA layer)
// of the prefix that ends there. KDA state can only be resumed where a checkpoint exists, so a match
// answers the deepest checkpoint on the longest cached prefix.
//
// Pure bookkeeping: ids of pages and slots, never memory. The owner (PrefixCache) takes references
// on what insert() adopts and releases what evict_one()/clear() give back.
#pragma once
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <span>
#include <vector>

namespace k3 {

struct PrefixTreeOptions {
  int block_tokens = 64;           // edges and checkpoints are whole blocks
  int page_size = 16;              // tokens per MLA page (divides block_tokens)
  uint64_t slot_bytes = 1;         // bytes of one checkpoint (eviction weighs compute per byte)
  uint64_t page_bytes = 1;         // bytes of one MLA page
  double alpha = 1.0;              // weight of compute-saved-per-byte against recency
  double branch_bonus = 1.0;       // added utility of a branch point's checkpoint (kept longer)
  std::function<double(int64_t)> prefill_cost;   // compute of prefilling n tokens from scratch
};

class PrefixTree {
 public:
  struct Node;

  struct Match {
    const Node* node = nullptr;      // node of the deepest usable checkpoint (null: none)
    int64_t tokens = 0;              // its position: resume there
    int slot = -1;                   // its checkpoint slot
    std::vector<int32_t> pages;      // MLA pages of [0, tokens)
    int64_t matched = 0;             // whole blocks of the query present in the tree (>= tokens)
  };
  struct Adopted {                   // what insert() made the tree own
    std::vector<int32_t> pages;
    std::vector<int> slots;
  };
  struct Victim {                    // what an eviction gives back
    std::vector<int32_t> pages;
    int slot = -1;
    bool leaf = false;               // the node went (else only its checkpoint)
    int64_t position = 0;            // where the node ended
  };

  explicit PrefixTree(PrefixTreeOptions opts);
  ~PrefixTree();
  PrefixTree(const PrefixTree&) = delete;
  PrefixTree& operator=(const PrefixTree&) = delete;

  // The deepest checkpoint at a position <= limit on the longest cached prefix of `tokens`; marks the
  // matched path as used now.
  Match match(std::span<const int32_t> tokens, int64_t limit);
  // The same without marking anything used.
  Match peek(std::span<const int32_t> tokens, int64_t limit) const;
  // Pins a matched node and its ancestors against removal (one count per call); unlock undoes one.
  // Checkpoints of pinned inner nodes may still be evicted (a request copied its own on start).
  void lock(const Node* node);
  void unlock(const Node* node);

  // Inserts the prefix `tokens` (whole blocks) whose pages are `pages` (one per page_size tokens), with
  // checkpoints {position -> slot} at block multiples in (0, tokens.size()]. Returns the pages and slots
  // the tree adopted: a part already cached keeps the tree's pages and checkpoint, and the caller keeps
  // (and releases) what was not adopted.
  Adopted insert(std::span<const int32_t> tokens, std::span<const int32_t> pages,
                 const std::map<int64_t, int>& checkpoints);

  // Evicts the unpinned candidate of least utility: a leaf (its pages and checkpoint) or the checkpoint
  // of an inner node. Utility = recency + alpha * compute-saved-per-byte (both scaled to [0, 1] over the
  // candidates) + branch_bonus for branch points. Nothing evictable: nullopt.
  std::optional<Victim> evict_one();
  // Drops every node; all must be unpinned.
  std::vector<Victim> clear();
  // prefix_block_hashes of every cached prefix that ends at a checkpoint (what a hit can resume from):
  // the set a prefill instance reports for KV-aware placement.
  std::vector<uint64_t> checkpoint_hashes() const;
  // Positions of the checkpoints on the longest cached prefix of `tokens` (ascending, <= its length).
  std::vector<int64_t> checkpoints_on(std::span<const int32_t> tokens) const;

  int num_nodes() const { return nodes_; }
  int num_checkpoints() const { return checkpoints_; }
  int num_pages() const { return pages_; }
  uint64_t bytes() const { return uint64_t(checkpoints_) * opts_.slot_bytes + uint64_t(pages_) * opts_.page_bytes; }
  const PrefixTreeOptions& options() const { return opts_; }

 private:
  Match find(std::span<const int32_t> tokens, int64_t limit, uint64_t touch) const;
  Node* split(Node* node, int64_t keep_tokens);
  void remove_leaf(Node* node, std::vector<Victim>* out);
  int64_t checkpoint_above(const Node* node) const;

  PrefixTreeOptions opts_;
  std::unique_ptr<Node> root_;
  uint64_t tick_ = 0;
  int nodes_ = 0, checkpoints_ = 0, pages_ = 0;
};

}  // namespace k3
