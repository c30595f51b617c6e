// A decode rank's batch with preemption: the requests it decodes together in the Engine's caches, and
// the ones waiting for room there (new arrivals, and requests it paused).
//
// Each step first resumes waiting requests in arrival order (oldest first, stopping at the first that
// does not fit: no overtaking) while the cache keeps a page of headroom per running request, then makes
// sure every running request can grow by one token: when the cache's free pages do not cover that, the
// newest running request is preempted: its caches are copied out to host memory (cache_io.h's packed
// image) and freed, and it waits like a new arrival. Resuming imports the image back, so a preempted
// request continues from exactly the state it left and produces the tokens it would have produced
// without the pause. A request that cannot grow even alone in an empty cache fails (the router refuses
// such requests up front; this is the last guard).
//
// The image of a waiting request lives in host memory; the engine holds only the running ones.
#pragma once
#include <cstdint>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "common/grammar/token_constraint.h"
#include "engine/engine.h"
#include "engine/token_logprobs.h"

namespace k3::decode {

class DecodeBatch {
 public:
  DecodeBatch(Engine& engine, Backend& backend) : engine_(engine), backend_(backend) {}
  ~DecodeBatch();
  DecodeBatch(const DecodeBatch&) = delete;
  DecodeBatch& operator=(const DecodeBatch&) = delete;

  // A request whose caches are `image` (`num_tokens` tokens of every layer, packed) and whose next input
  // is `last_token`, its first generated token; `step` is its sampling step for the next token (tokens
  // generated so far: 1, which the sampling penalties count with every token drawn here). It joins
  // the running batch when there is room. logprobs >= 0: each step also reports the sampled token's
  // logprob and this many alternatives (its logits row is then copied off the backend).
  // constraint (structured output, may be null): each step masks the request's row with it and
  // advances it by the sampled token; the caller owns it and removes the request before dropping it.
  void add(uint64_t id, std::vector<uint8_t> image, int64_t num_tokens, int32_t last_token, ops::SamplingRow sampling,
           uint64_t step, int logprobs = -1, grammar::TokenConstraint* constraint = nullptr);
  // A request whose caches are already in the engine's pools (`cache`, e.g. adopted where the transfer
  // wrote them: CachePools::adopt): it runs from the next step, nothing is copied. Same other arguments.
  void add_resident(uint64_t id, SeqCache cache, int32_t last_token, ops::SamplingRow sampling, uint64_t step,
                    int logprobs = -1, grammar::TokenConstraint* constraint = nullptr);
  // Forgets the request (running or waiting), freeing its caches. No-op for unknown ids.
  void remove(uint64_t id);

  struct StepResult {
    std::vector<std::pair<uint64_t, int32_t>> tokens;   // one sampled token per running request
    std::vector<std::pair<uint64_t, std::string>> failed;  // requests dropped here, with why
    std::map<uint64_t, RowLogprobs> logprobs;           // of the sampled tokens, for requests that asked
  };
  // Resume/preempt as above, then one batched forward and sampling. Each sampled token becomes its
  // request's next input. Failed requests are already forgotten.
  StepResult step();

  size_t size() const { return seqs_.size(); }
  size_t num_running() const;
  size_t num_paused() const { return size() - num_running(); }
  uint64_t preemptions() const { return preemptions_; }
  bool contains(uint64_t id) const { return seqs_.count(id) != 0; }

 private:
  struct Seq {
    uint64_t order = 0;            // arrival order (older first)
    bool running = false;
    SeqCache cache;                // running: its place in the engine's caches
    std::vector<uint8_t> image;    // waiting: its caches in host memory
    int64_t num_tokens = 0;        // tokens in its caches
    int32_t last_token = 0;        // next input
    ops::SamplingRow sampling;
    uint64_t step = 0;
    std::vector<int32_t> generated;  // its tokens so far: the first (last_token at add) and each drawn here
    std::vector<ops::LogitBias> logit_bias;  // the sampling row's, owned here (the row's span is set per draw)
    int logprobs = -1;
    grammar::TokenConstraint* constraint = nullptr;  // not owned (see add)
  };
  int64_t growth_pages() const;    // pages the running requests need to grow by one token each
  int64_t pages_for(int64_t tokens) const;
  // Fails and removes request `id` when its next token cannot fit even the whole cache (no wait helps);
  // true when it did.
  bool fail_if_never_fits(uint64_t id, StepResult& out);
  Status resume(Seq& s);
  void preempt(Seq& s);
  std::vector<uint64_t> by_order(bool running) const;

  Engine& engine_;
  Backend& backend_;
  std::map<uint64_t, Seq> seqs_;
  uint64_t next_order_ = 0;
  uint64_t preemptions_ = 0;
};

}  // namespace k3::decode
