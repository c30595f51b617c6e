#include "engine/prefix_tree.h"

#include <algorithm>
#include <limits>
#include <string>

#include "common/core/status.h"
#include "engine/prefix_hash.h"

namespace k3 {

struct PrefixTree::Node {
  Node* parent = nullptr;
  int64_t start = 0;                  // position of the edge's first token
  std::vector<int32_t> tokens;        // the edge: whole blocks
  std::vector<int32_t> pages;         // MLA pages of the edge's tokens
  int slot = -1;                      // checkpoint of the prefix [0, end()), or -1
  std::map<std::vector<int32_t>, std::unique_ptr<Node>> children;   // by their first block
  int locks = 0;                      // running requests that depend on this node or a descendant
  uint64_t last_use = 0;
  int64_t end() const { return start + static_cast<int64_t>(tokens.size()); }
};

namespace {
std::vector<int32_t> block_at(std::span<const int32_t> t, int64_t at, int block) {
  return {t.begin() + at, t.begin() + at + block};
}
}  // namespace

PrefixTree::PrefixTree(PrefixTreeOptions opts) : opts_(std::move(opts)), root_(std::make_unique<Node>()) {
  K3_CHECK(opts_.block_tokens > 0 && opts_.page_size > 0 && opts_.block_tokens % opts_.page_size == 0,
           "PrefixTree: block_tokens (" + std::to_string(opts_.block_tokens) + ") must be a multiple of page_size (" +
               std::to_string(opts_.page_size) + ")");
  if (!opts_.prefill_cost) opts_.prefill_cost = [](int64_t n) { return static_cast<double>(n); };
}

PrefixTree::~PrefixTree() = default;

PrefixTree::Match PrefixTree::match(std::span<const int32_t> tokens, int64_t limit) {
  return find(tokens, limit, ++tick_);
}

PrefixTree::Match PrefixTree::peek(std::span<const int32_t> tokens, int64_t limit) const {
  return find(tokens, limit, 0);
}

// touch: the recency stamp to give the matched path (0: leave it).
PrefixTree::Match PrefixTree::find(std::span<const int32_t> tokens, int64_t limit, uint64_t touch) const {
  const int B = opts_.block_tokens;
  const int64_t n = static_cast<int64_t>(tokens.size());
  Match m;
  Node* node = root_.get();
  std::vector<Node*> path;
  int64_t pos = 0;
  while (pos + B <= n) {
    auto it = node->children.find(block_at(tokens, pos, B));
    if (it == node->children.end()) break;
    Node* child = it->second.get();
    int64_t j = 0;
    while (j < static_cast<int64_t>(child->tokens.size()) && pos + j + B <= n &&
           std::equal(child->tokens.begin() + j, child->tokens.begin() + j + B, tokens.begin() + pos + j))
      j += B;
    pos += j;
    if (touch) child->last_use = touch;
    if (j < static_cast<int64_t>(child->tokens.size())) break;   // diverges inside this edge
    path.push_back(child);
    node = child;
  }
  m.matched = pos;
  const Node* best = nullptr;
  for (Node* p : path)
    if (p->slot >= 0 && p->end() <= limit) best = p;
  if (best) {
    m.node = best;
    m.tokens = best->end();
    m.slot = best->slot;
    for (Node* p : path) {
      m.pages.insert(m.pages.end(), p->pages.begin(), p->pages.end());
      if (p == best) break;
    }
  }
  return m;
}

void PrefixTree::lock(const Node* node) {
  for (Node* p = const_cast<Node*>(node); p && p != root_.get(); p = p->parent) ++p->locks;
}

void PrefixTree::unlock(const Node* node) {
  for (Node* p = const_cast<Node*>(node); p && p != root_.get(); p = p->parent) {
    K3_CHECK(p->locks > 0, "PrefixTree::unlock of a node that is not locked");
    --p->locks;
  }
}

// Cuts `node`'s edge after keep_tokens: a new upper node takes the first part and sits between the
// parent and `node`, which keeps its end, checkpoint, children and identity (leases point at it).
PrefixTree::Node* PrefixTree::split(Node* node, int64_t keep_tokens) {
  K3_CHECK(keep_tokens > 0 && keep_tokens < static_cast<int64_t>(node->tokens.size()) &&
               keep_tokens % opts_.block_tokens == 0,
           "PrefixTree::split at " + std::to_string(keep_tokens) + " of an edge of " +
               std::to_string(node->tokens.size()));
  Node* parent = node->parent;
  const std::vector<int32_t> key(node->tokens.begin(), node->tokens.begin() + opts_.block_tokens);
  std::unique_ptr<Node> self = std::move(parent->children.at(key));
  auto upper = std::make_unique<Node>();
  upper->parent = parent;
  upper->start = node->start;
  upper->tokens.assign(node->tokens.begin(), node->tokens.begin() + keep_tokens);
  const int64_t keep_pages = keep_tokens / opts_.page_size;
  upper->pages.assign(node->pages.begin(), node->pages.begin() + keep_pages);
  upper->locks = node->locks;
  upper->last_use = node->last_use;
  node->tokens.erase(node->tokens.begin(), node->tokens.begin() + keep_tokens);
  node->pages.erase(node->pages.begin(), node->pages.begin() + keep_pages);
  node->start += keep_tokens;
  node->parent = upper.get();
  Node* up = upper.get();
  up->children[block_at(node->tokens, 0, opts_.block_tokens)] = std::move(self);
  parent->children[key] = std::move(upper);
  ++nodes_;
  return up;
}

PrefixTree::Adopted PrefixTree::insert(std::span<const int32_t> tokens, std::span<const int32_t> pages,
                                       const std::map<int64_t, int>& checkpoints) {
  const int B = opts_.block_tokens;
  const int64_t n = static_cast<int64_t>(tokens.size());
  K3_CHECK(n % B == 0, "PrefixTree::insert of " + std::to_string(n) + " tokens: not whole blocks of " + std::to_string(B));
  K3_CHECK(static_cast<int64_t>(pages.size()) == n / opts_.page_size,
           "PrefixTree::insert: " + std::to_string(pages.size()) + " pages for " + std::to_string(n) + " tokens");
  for (const auto& [pos, slot] : checkpoints)
    K3_CHECK(pos > 0 && pos <= n && pos % B == 0 && slot >= 0,
             "PrefixTree::insert: checkpoint at " + std::to_string(pos) + " is not a block end of the prefix");
  Adopted out;
  const uint64_t now = ++tick_;
  Node* node = root_.get();
  int64_t pos = 0;
  std::vector<Node*> path;
  while (pos < n) {
    auto key = block_at(tokens, pos, B);
    auto it = node->children.find(key);
    if (it == node->children.end()) {
      auto fresh = std::make_unique<Node>();
      fresh->parent = node;
      fresh->start = pos;
      fresh->tokens.assign(tokens.begin() + pos, tokens.end());
      fresh->pages.assign(pages.begin() + pos / opts_.page_size, pages.end());
      fresh->last_use = now;
      out.pages.insert(out.pages.end(), fresh->pages.begin(), fresh->pages.end());
      pages_ += static_cast<int>(fresh->pages.size());
      ++nodes_;
      Node* f = fresh.get();
      node->children[std::move(key)] = std::move(fresh);
      path.push_back(f);
      break;
    }
    Node* child = it->second.get();
    int64_t j = 0;
    while (j < static_cast<int64_t>(child->tokens.size()) && pos + j < n &&
           std::equal(child->tokens.begin() + j, child->tokens.begin() + j + B, tokens.begin() + pos + j))
      j += B;
    if (j < static_cast<int64_t>(child->tokens.size())) child = split(child, j);
    child->last_use = now;
    path.push_back(child);
    node = child;
    pos += j;
  }
  // Checkpoints land on node ends: split an edge where one falls inside it.
  for (const auto& [cpos, slot] : checkpoints) {
    auto it = std::find_if(path.begin(), path.end(), [&](Node* p) { return p->start < cpos && cpos <= p->end(); });
    K3_CHECK(it != path.end(), "PrefixTree::insert: no node covers checkpoint " + std::to_string(cpos));
    Node* target = *it;
    if (target->end() != cpos) {
      Node* upper = split(target, cpos - target->start);
      it = path.insert(it, upper);
      target = upper;
    }
    if (target->slot < 0) {
      target->slot = slot;
      ++checkpoints_;
      out.slots.push_back(slot);
    }
  }
  return out;
}

// Position of the nearest checkpoint strictly above `node` (0 = the empty prefix).
int64_t PrefixTree::checkpoint_above(const Node* node) const {
  for (const Node* p = node->parent; p && p != root_.get(); p = p->parent)
    if (p->slot >= 0) return p->end();
  return 0;
}

void PrefixTree::remove_leaf(Node* node, std::vector<Victim>* out) {
  Victim v;
  v.pages = node->pages;
  v.slot = node->slot;
  v.leaf = true;
  v.position = node->end();
  pages_ -= static_cast<int>(node->pages.size());
  if (node->slot >= 0) --checkpoints_;
  --nodes_;
  Node* parent = node->parent;
  parent->children.erase(block_at(node->tokens, 0, opts_.block_tokens));
  out->push_back(std::move(v));
  // A leaf without a checkpoint can never be resumed from: it goes too.
  if (parent != root_.get() && parent->children.empty() && parent->slot < 0 && parent->locks == 0)
    remove_leaf(parent, out);
}

std::optional<PrefixTree::Victim> PrefixTree::evict_one() {
  struct Candidate {
    Node* node;
    bool leaf;
    double recency, efficiency;
  };
  std::vector<Candidate> cands;
  std::vector<Node*> stack;
  for (auto& [k, c] : root_->children) stack.push_back(c.get());
  while (!stack.empty()) {
    Node* p = stack.back();
    stack.pop_back();
    for (auto& [k, c] : p->children) stack.push_back(c.get());
    // A pinned node stays (its pages back a running request), but an inner node's checkpoint may go:
    // a request copies its checkpoint when it starts and never reads the tree's copy again.
    const bool leaf = p->children.empty();
    if (leaf ? p->locks > 0 : p->slot < 0) continue;
    // Compute lost if it goes: a hit would fall back to the checkpoint above.
    const double saved = p->slot >= 0 ? opts_.prefill_cost(p->end()) - opts_.prefill_cost(checkpoint_above(p)) : 0.0;
    const uint64_t bytes = (p->slot >= 0 ? opts_.slot_bytes : 0) + (leaf ? p->pages.size() * opts_.page_bytes : 0);
    cands.push_back({p, leaf, static_cast<double>(p->last_use), bytes ? saved / static_cast<double>(bytes) : 0.0});
  }
  if (cands.empty()) return std::nullopt;
  double rmin = std::numeric_limits<double>::max(), rmax = 0, emax = 0;
  for (const Candidate& c : cands) {
    rmin = std::min(rmin, c.recency);
    rmax = std::max(rmax, c.recency);
    emax = std::max(emax, c.efficiency);
  }
  auto utility = [&](const Candidate& c) {
    const double r = rmax > rmin ? (c.recency - rmin) / (rmax - rmin) : 1.0;
    const double e = emax > 0 ? c.efficiency / emax : 0.0;
    return r + opts_.alpha * e + (c.node->children.size() >= 2 ? opts_.branch_bonus : 0.0);
  };
  // Least utility goes; ties: the deeper node first (it saves the least on its own), then lower tokens.
  const Candidate* worst = &cands[0];
  double wu = utility(*worst);
  for (const Candidate& c : cands) {
    const double u = utility(c);
    if (u < wu || (u == wu && (c.node->end() > worst->node->end() ||
                               (c.node->end() == worst->node->end() && c.node->tokens < worst->node->tokens)))) {
      worst = &c;
      wu = u;
    }
  }
  if (worst->leaf) {
    std::vector<Victim> out;
    remove_leaf(worst->node, &out);
    // Merge what a cascade freed into one victim.
    Victim v = std::move(out[0]);
    for (size_t i = 1; i < out.size(); ++i) {
      v.pages.insert(v.pages.end(), out[i].pages.begin(), out[i].pages.end());
      K3_CHECK(out[i].slot < 0, "PrefixTree: cascade removed a node with a checkpoint");
    }
    return v;
  }
  Victim v;
  v.slot = worst->node->slot;
  v.position = worst->node->end();
  worst->node->slot = -1;
  --checkpoints_;
  return v;
}

std::vector<uint64_t> PrefixTree::checkpoint_hashes() const {
  std::vector<uint64_t> out;
  // Depth first, carrying the path's tokens: a checkpoint's hash is the last of its path's block hashes.
  struct Frame {
    const Node* node;
    size_t path_len;
  };
  std::vector<int32_t> path;
  std::vector<Frame> stack;
  for (auto& [k, c] : root_->children) stack.push_back({c.get(), 0});
  while (!stack.empty()) {
    Frame f = stack.back();
    stack.pop_back();
    path.resize(f.path_len);
    path.insert(path.end(), f.node->tokens.begin(), f.node->tokens.end());
    if (f.node->slot >= 0) out.push_back(prefix_block_hashes(path, opts_.block_tokens).back());
    for (auto& [k, c] : f.node->children) stack.push_back({c.get(), path.size()});
  }
  return out;
}

std::vector<int64_t> PrefixTree::checkpoints_on(std::span<const int32_t> tokens) const {
  const int B = opts_.block_tokens;
  const int64_t n = static_cast<int64_t>(tokens.size());
  std::vector<int64_t> out;
  const Node* node = root_.get();
  int64_t pos = 0;
  while (pos + B <= n) {
    auto it = node->children.find(block_at(tokens, pos, B));
    if (it == node->children.end()) break;
    const Node* child = it->second.get();
    const int64_t len = static_cast<int64_t>(child->tokens.size());
    if (pos + len > n || !std::equal(child->tokens.begin(), child->tokens.end(), tokens.begin() + pos)) break;
    if (child->slot >= 0) out.push_back(child->end());
    pos += len;
    node = child;
  }
  return out;
}

std::vector<PrefixTree::Victim> PrefixTree::clear() {
  std::vector<Victim> out;
  std::vector<Node*> stack;
  for (auto& [k, c] : root_->children) stack.push_back(c.get());
  while (!stack.empty()) {
    Node* p = stack.back();
    stack.pop_back();
    K3_CHECK(p->locks == 0, "PrefixTree::clear while a request still pins a cached prefix");
    for (auto& [k, c] : p->children) stack.push_back(c.get());
    out.push_back({.pages = p->pages, .slot = p->slot, .leaf = true, .position = p->end()});
  }
  root_ = std::make_unique<Node>();
  nodes_ = checkpoints_ = pages_ = 0;
  return out;
}

}  // namespace k3
