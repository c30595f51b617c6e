// GenerationService over the monolithic engine (engine/engine.h) in this process. One worker
// thread owns the Engine; each step it (1) drops cancelled requests and closes their caches, (2) admits
// waiting requests while KV slots are free, (3) advances each prefilling request by one prefill chunk
// (sampling its first token when the prompt is done), (4) runs one batched decode step over every
// decoding request. Sampling is per request with (seed, step), so a request's tokens do not depend on
// what it is batched with. A request for n choices forks n-1 more sequences from its caches when its
// prefill ends (one prefill); each choice then decodes as a request of its own with its own seed stream.
#pragma once
#include <atomic>
#include <condition_variable>
#include <deque>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <thread>
#include <unordered_set>
#include <utility>
#include <vector>

#include "common/config/config.h"
#include "engine/engine.h"
#include "common/model/weights.h"
#include "common/grammar/token_constraint.h"
#include "common/tokenizer/tokenizer.h"
#include "kernels/backend_select.h"
#include "router/generation_service.h"

namespace k3::router {

struct LocalEngineOptions {
  int max_running = 8;       // concurrent sequences (KV slots)
  int max_queue = 64;        // waiting requests (beyond free slots) before submit() says ResourceExhausted
  int prefill_chunk = 256;   // tokens per prefill forward (0 = whole prompt)
  BackendChoice backend;      // cpu (threads) or cuda (device, invariant or fast kernels)
  UploadObserver on_upload;   // open(): told of the weights' upload as it goes (a progress display)
  int page_size = 16;
  // Prefix cache: on when checkpoint_slots > 0 (KDA slots for checkpoints beside max_running).
  int prefix_checkpoint_slots = 0;
  int prefix_block_tokens = 256;     // checkpoint alignment (a multiple of 64 and page_size)
  int prefix_checkpoint_every = 1;   // blocks between checkpoints of a new prompt
  int cache_pages = 0;               // MLA pages (0: enough for max_running full contexts)
  uint64_t prefix_budget_bytes = 0;  // 0: bounded by the pools
  // Bytes of the engine's unified cache region (KDA slots from one end, MLA pages from the other). 0: room
  // for every slot and page at once. Less: the kinds share the bytes and the boundary follows demand
  // (compaction moves slots). A request is admitted when its prompt and a generation reserve fit beside
  // what the running ones still take (else it waits); past the reserve, a request whose pages no longer
  // fit fails with "out of KV pages".
  uint64_t cache_region_bytes = 0;
};

class LocalEngineService final : public GenerationService {
 public:
  // Loads config.json, model.safetensors and the tokenizer from a generated model dir.
  static Result<std::unique_ptr<LocalEngineService>> open(const std::string& model_dir, const LocalEngineOptions& opts);
  // From parts already in memory (tests): the service keeps its own copies / ownership.
  static Result<std::unique_ptr<LocalEngineService>> create(const ModelConfig& cfg, WeightStore weights,
                                                            std::shared_ptr<const Tokenizer> tokenizer,
                                                            const LocalEngineOptions& opts);
  ~LocalEngineService() override;

  Result<RequestHandle> submit(GenerationParams params, EventSink sink) override;
  void cancel(RequestHandle handle) override;
  bool ready() const override { return !stopping_.load(); }
  ServiceStats stats() const override;
  void shutdown() override;

  const ModelConfig& config() const { return cfg_; }
  std::shared_ptr<const Tokenizer> tokenizer() const { return tokenizer_; }

  struct Running;  // a request holding engine state (local_engine_service.cpp)

 private:
  struct Waiting {
    RequestHandle id;
    GenerationParams params;
    EventSink sink;
  };
  LocalEngineService() = default;
  void worker_loop();
  // One scheduling step; runs on the worker thread only.
  void step(std::vector<std::unique_ptr<Running>>& running);
  void finish(Running& r, GenerationEvent&& ev);
  void emit_token(Running& r, const float* logits_row);
  void publish_stats(const std::vector<std::unique_ptr<Running>>& running);
  void publish_cache_region();       // the unified cache region's free bytes, fragmentation and slot moves
  void close_request(Running& r);   // prefix-cache lease and engine caches
  void start_output(Running& r);    // its grammar state and text stream, from its params
  // Choices 1..n-1 of a request whose prefill just ended, forked from its caches (all or none).
  Status fork_choices(Running& r, std::vector<std::unique_ptr<Running>>& forks);
  // Admits waiting requests while slots and pages allow (mu_ held; local_engine_admission.cpp); those
  // that can never run go to `refused`, told by the caller once the lock is released.
  void admit(std::vector<std::unique_ptr<Running>>& running,
             std::vector<std::pair<std::unique_ptr<Running>, Status>>& refused);
  // New pages `r` needs to hold `tokens` tokens.
  int64_t pages_for(const Running& r, int64_t tokens) const;
  // Pages a request of `p` still takes for its prompt, a generation reserve and `forks` pending forks,
  // holding `held_pages` already (its own or shared with the prefix cache).
  int64_t owed_by(const GenerationParams& p, int64_t held_pages, int forks) const;
  int64_t pages_owed(const Running& r) const;
  // Pages of `prompt` a prefix-cache hit would share now (0 without the cache).
  int64_t hit_pages(std::span<const int32_t> prompt) const;
  // Whether `pages` more can be taken now (the prefix cache evicting what it may for them).
  bool pages_fit(int64_t pages);

  ModelConfig cfg_;
  LocalEngineOptions opts_;
  std::shared_ptr<const Tokenizer> tokenizer_;
  std::shared_ptr<const grammar::TokenVocab> vocab_bytes_;  // every token's bytes, for structured output
  WeightStore weights_;
  std::unique_ptr<Backend> backend_;
  std::unique_ptr<Engine> engine_;

  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Waiting> waiting_;
  std::unordered_set<RequestHandle> cancelled_;   // running ids to drop at the next step
  std::unordered_set<RequestHandle> live_;        // waiting or running ids (cancel of others is a no-op)
  RequestHandle next_id_ = 1;
  // The worker holds this while it calls sinks, so cancel() can wait out an in-progress callback.
  std::mutex sink_mu_;
  std::atomic<bool> stopping_{false};
  std::atomic<uint64_t> prefix_lookup_{0}, prefix_hit_{0}, prefix_stored_{0}, prefix_evicted_{0}, prefix_bytes_{0};
  std::atomic<int64_t> running_count_{0}, free_slots_{0}, free_pages_{0};
  std::atomic<uint64_t> prompts_prefilled_{0};
  std::atomic<uint64_t> cache_free_bytes_{0}, cache_largest_free_{0}, cache_free_extents_{0}, cache_slot_moves_{0};
  // Worker thread only: running requests that ended so far, and that count when the queue's head was
  // found short of pages (it is tried again once another ended).
  uint64_t ended_ = 0;
  std::optional<uint64_t> pages_blocked_at_;
  std::thread worker_;
};

}  // namespace k3::router
