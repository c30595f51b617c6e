// The generation side of the router, as an interface: the HTTP layer submits token-level requests and
// receives tokens/text through a callback. LocalEngineService runs the monolithic engine in-process;
// a ClusterService (ZeroMQ to prefill/decode nodes) implements the same contract later.
//
// Contract (every implementation keeps it):
//  - submit() never blocks on generation; it fails fast with ResourceExhausted (queue full) or
//    Unavailable (not ready / shutting down) and then never calls the sink.
//  - The sink is called from the service's own thread, never concurrently for one request, and must
//    not block. Each event names its choice (0..n-1). Per choice: zero or more Tokens events, then one
//    Finished event; a Failed event (choice 0) ends the whole request and nothing follows it. So a
//    request ends after n Finished events or one Failed event, unless cancelled.
//  - n > 1 shares one prefill: the choices fork from the prompt's caches (CachePools::fork) and choice
//    i samples with ops::choice_seed(seed, i); a service whose running batch cannot hold n sequences
//    refuses the request at submit() naming `n`.
//  - cancel(h) is idempotent and safe for finished handles; once it returns, the sink of h is never
//    called again; the request's engine/node resources are freed before the next generation step.
//  - shutdown() fails every queued and running request with a Failed event and refuses new ones.
#pragma once
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "common/core/status.h"
#include "common/grammar/output_format.h"
#include "kernels/ops.h"

namespace k3::router {

using RequestHandle = uint64_t;

struct GenerationParams {
  std::vector<int32_t> prompt;           // token ids, non-empty
  int max_tokens = 16;                   // >= 1, per choice
  int n = 1;                             // choices: samples of the one prompt (>= 1)
  ops::SamplingRow sampling;             // step and the spans are filled in by the service per token
  std::vector<ops::LogitBias> logit_bias;  // OpenAI's, each token at most once
  std::vector<int32_t> stop_ids;         // generation ends after one of these (EOS ids included by the caller)
  std::vector<std::string> stop_strings; // on detokenized text; the stop string itself is not returned
  int logprobs = -1;                     // -1: none; else the sampled token's logprob plus this many alternatives
  std::string trace_id;                  // the request id of the HTTP layer: log lines and protocol messages carry it
  // Structured output / tool calls: what the text must be (travels to the nodes in cluster mode) and
  // its compiled grammar (nothing: free text); a service that cannot constrain refuses it at submit().
  grammar::OutputFormat output_format;
  grammar::CompiledFormat grammar;
};

struct TokenLogprob {
  int32_t id = 0;
  float logprob = 0;                                  // log-softmax of the raw logits
  std::vector<std::pair<int32_t, float>> top;         // alternatives, most likely first
};

struct GenerationEvent {
  enum class Kind { Tokens, Finished, Failed };
  Kind kind = Kind::Tokens;
  int choice = 0;                          // which of the request's n choices (Failed: 0, it ends them all)
  std::vector<int32_t> token_ids;          // Tokens: ids sampled in this step (may be 0 or 1 here)
  std::string text;                        // Tokens/Finished: new text safe to show (valid UTF-8)
  std::vector<TokenLogprob> logprobs;      // Tokens: one per token id when requested
  std::string finish_reason;               // Finished: "stop" | "length"
  int64_t prompt_tokens = 0;               // Finished
  int64_t completion_tokens = 0;           // Finished: this choice's
  Status error;                            // Failed: Unavailable (shutdown/node lost) or Internal
};

using EventSink = std::function<void(GenerationEvent&&)>;

struct ServiceStats {
  int64_t waiting = 0;      // submitted, not yet admitted
  int64_t running = 0;      // holding engine state (prefilling or decoding)
  int64_t free_slots = 0;   // sequences that could still be admitted
  int64_t free_pages = 0;   // KV pages free (-1 when not applicable)
  // Prefix cache (the monolithic engine's, or the sum of the prefill instances'; all 0 without one): cumulative prompt tokens looked up and
  // restored from the cache, checkpoints stored and evicted, and the cache's current bytes.
  uint64_t prefix_lookup_tokens = 0, prefix_hit_tokens = 0;
  uint64_t prefix_checkpoints_stored = 0, prefix_checkpoints_evicted = 0;
  uint64_t prefix_cache_bytes = 0;
  // Prompts prefilled (a request for n choices counts once: its choices share the prefill). Cluster mode:
  // the sum over prefill instances, as their heartbeats last reported it.
  uint64_t prompts_prefilled = 0;
  // The engine's unified cache region (all 0 where the engine has none, as in cluster mode): its free
  // bytes, the largest run of adjacent free bytes and the number of runs, and the KDA slots compaction
  // moved so far (each a copy of a whole slot, paid by the page allocation that needed the bytes).
  uint64_t cache_free_bytes = 0, cache_largest_free_extent_bytes = 0, cache_free_extents = 0;
  uint64_t cache_slot_moves = 0;
};

// The checks every service makes at submit(), in this order, each error naming its field: a non-empty
// prompt, max_tokens >= 1, logprobs only where supported (`logprobs_unsupported` non-null: why not),
// prompt ids inside the vocabulary, prompt + max_tokens within the context, and a sink.
Status check_generation_params(const GenerationParams& params, bool has_sink, int64_t vocab_size,
                               int64_t context_limit, const char* logprobs_unsupported = nullptr);

class GenerationService {
 public:
  virtual ~GenerationService() = default;
  virtual Result<RequestHandle> submit(GenerationParams params, EventSink sink) = 0;
  virtual void cancel(RequestHandle handle) = 0;
  virtual bool ready() const = 0;
  virtual ServiceStats stats() const = 0;
  virtual void shutdown() = 0;
};

}  // namespace k3::router
