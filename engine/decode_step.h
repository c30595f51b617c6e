// One decode step of a running batch (every request brings one new token after its cached prefix),
// run as a recorded graph where the backend can record one.
//
// Per step the host packs the step's indices (tokens, slots, new cache rows, block table, lengths)
// into one array and copies it to the backend once; the forward then reads them from there
// (DecodeIndex) and takes its activations from a caller-owned StepWorkspace, so it allocates nothing,
// plans nothing and never waits for the host. A step is keyed by its bucket: the batch size and the
// block-table width rounded up to a power of two (which fixes the MLA split plan). The first step of
// a bucket runs eagerly (sizing every workspace), the second records a graph of embed + all layers +
// logits, and every later one replays it. Only sampling (Backend::sample) reads anything back.
#pragma once
#include <cstdint>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <utility>

#include "engine/model.h"
#include "engine/step_workspace.h"

namespace k3 {

struct DecodeGraphOptions {
  bool enabled = true;   // record and replay graphs where the backend can (CUDA)
  bool strict = false;   // record in the process-wide checking mode (a test's proof; other threads' allocations also fail it)
  int max_graphs = 64;   // recorded buckets kept; past this all are dropped and recorded again on demand
};

struct DecodeStepStats {
  int64_t eager = 0, replays = 0, captures = 0, capture_failures = 0;
  int64_t last_nodes = 0;    // work items (kernels, copies, memsets) in the last step's graph, 0 if eager
  std::string last_failure;  // why the last recording failed
};

class DecodeStep {
 public:
  DecodeStep(Model& model, CachePools& caches, const DecodeGraphOptions& opts);

  // True when `batch` is a decode batch (one new token each, a non-empty cached prefix).
  static bool applies(std::span<const BatchItem> batch);
  // Runs the step; returns [B, vocab] F32 logits on the backend, valid until the next step. Does not
  // advance num_tokens. The caches must have room for the new token (CachePools::reserve).
  Tensor run(std::span<const BatchItem> batch, std::span<const int32_t> tokens);

  const DecodeStepStats& stats() const { return stats_; }
  // Off: every step runs eagerly (recorded graphs are kept, and replayed again once back on).
  void set_graphs(bool on) { opts_.enabled = on; }
  bool graphs() const { return opts_.enabled; }
  // The width bucket of a step whose longest request holds `pages` pages.
  static int width_bucket(int64_t pages);

 private:
  static constexpr int kMaxFailures = 2;
  struct Recorded {
    bool warm = false;                // ran eagerly once: the backend's workspaces are sized for it
    int failures = 0;                 // failed recordings (kMaxFailures: eager from now on)
    std::unique_ptr<StepGraph> graph;
    uint64_t arena_epoch = 0;
    size_t arena_used = 0;
    Tensor logits;
  };
  Tensor forward(std::span<const BatchItem> batch, std::span<const int32_t> tokens);

  Model& model_;
  CachePools& caches_;
  DecodeGraphOptions opts_;
  StepWorkspace ws_;
  DecodeIndex index_;
  std::map<std::pair<int, int>, Recorded> buckets_;
  uint64_t arena_epoch_ = 0;  // ws_.epoch() the recordings were made over
  DecodeStepStats stats_;
};

}  // namespace k3
