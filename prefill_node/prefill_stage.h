// One PP stage of a prefill instance: its Model over [begin, end), local caches, the stage links and the
// transfer PrefillDriver.
//
// Flow of a request (decisions documented here, see also main.cpp --help):
//  - The router sends the PREFILL to EVERY stage (each stage's driver has its own router connection and
//    its own lazy-alloc record); nothing is forwarded between stages but activations.
//  - Stage 0 embeds the prompt and runs its layers chunk by chunk; every other stage runs a chunk when
//    its activations arrive from stage s-1 (which may be before its PREFILL: chunks are computed at
//    once and the request waits for the PREFILL only to report the result). A computed chunk goes to
//    stage s+1 at once, so the stages overlap on consecutive chunks; several requests are in flight
//    (oldest first, one chunk per loop iteration, so heartbeats and new messages are served between).
//    A request takes a local cache slot at its first chunk; with every slot busy, new requests wait
//    (back-pressure, not failure) until one is freed.
//  - Streaming (the default): once a stage has the request's PREFILL and its
//    first chunk computed, it asks decode for addresses (PrefillDriver::stream_started) and, after every
//    chunk, copies that chunk's rows of its MLA layers into the request's image and hands them to the
//    driver (rows_computed), whose writer thread puts them into decode memory while the next chunk
//    computes. After the last chunk the KDA conv/state go the same way (stream_computed); TRANSFER_DONE
//    follows the last flush. Granularity is the chunk, not the layer: a chunk's rows of all the stage's
//    layers go as one batch after its forward. `max_inflight_chunks` bounds the batches in flight on the
//    stage: compute waits while that many are unflushed.
//    With the prefix cache, a hit's restored rows go with the first computed chunk, and a recompute
//    (below) sends only rows past those already sent: a resumed prefill is bitwise a cold one, so the
//    rows the first try sent are the new try's too.
//  - Without streaming (--no-stream), when a stage has all prompt tokens: export_caches of its own layers
//    (the packed StageSource layout) -> PrefillDriver::stage_computed, which plans, puts and flushes them
//    to decode itself (no funnel through another stage). The last stage samples the first token (step 0
//    of the request's sampling params and seed). The stage's local cache slot is freed right after the
//    export (the driver holds the packed copy until the request ends, then frees it: sources_held()).
//  - A request that ends (aborted / failed / expired) while still computing frees its caches and drops
//    its queued chunks; late chunks of an ended request are dropped.
//  - With the prefix cache, a later stage whose replica lacks the checkpoint stage 0 resumed a request
//    from (stage_prefix.h: the replica drifted) does not fail it: it drops the request's chunks and sends
//    a RecomputeRequest back (relayed to stage 0), and stage 0 computes the request again from token 0
//    with a forced miss as the next epoch. The stages in between drop their try and compute the new
//    epoch too; a stage that had already reported the request computes it only to feed the next stages
//    and the caches. A stage's driver may end its part of a request (transfer done) before a later stage
//    asks, so reported_ keeps the PREFILLs of the most recently reported requests, up to
//    kReportedTokens prompt tokens; a recompute asked for one older than that is dropped, and the
//    request ends by its deadline (the only way drift can still fail a request).
#pragma once
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "common/grammar/token_constraint.h"
#include "common/config/config.h"
#include "engine/kv_cache.h"
#include "engine/model.h"
#include "common/model/weights.h"
#include "prefill_node/source_arena_size.h"
#include "prefill_node/stage_link.h"
#include "prefill_node/stage_prefix.h"
#include "transfer/ucx_prefill_driver.h"

namespace k3::prefill {

// When one request's work ran on this stage (k3-prefill --timing, read by `k3-bench overlap`): its compute
// (first chunk start to the last chunk's end, before the cache export) and its writes to decode (each
// batch's puts and flush, and the whole transfer: TRANSFERRING to the request's end). Microseconds of the steady clock,
// which on Linux is CLOCK_MONOTONIC and so comparable between the processes of one host.
struct StageTiming {
  // Writes: one batch of puts and its flush (streaming: one per chunk, else one per request);
  // WritesDone: the driver's TRANSFERRING to the request's end (the last batch's flush).
  enum class Span { Compute, Writes, WritesDone };
  uint64_t request_id = 0;
  Span span = Span::Compute;
  int64_t begin_us = 0;
  int64_t end_us = 0;
  uint64_t bytes = 0;   // Writes: the batch's bytes
};
const char* span_name(StageTiming::Span s);
int64_t steady_us();

struct PrefillStageOptions {
  std::string instance_id = "p";
  // The last stage samples the first token: with the vocabulary it can honour structured output
  // (requests asking for it fail with a clear error on a stage without one).
  std::shared_ptr<const grammar::TokenVocab> vocab;
  int stage = 0;
  std::vector<int> partition;          // layers per stage (validated by parse_partition)
  int chunk_size = 256;                // prompt tokens per pipeline chunk
  bool stream = true;                  // write each chunk's rows while the next computes (off: at the end)
  int max_inflight_chunks = 4;         // streaming: write batches in flight before compute waits (>= 1)
  int cuda_device = 0;                 // the cuda backend's device: where the transfer's source images live
  // Bytes of the arena the transfer's source images are carved from (registered once); -1: the default,
  // kDefaultSourceArenaMiBDevice or ...Host MiB by the stage's backend; 0: none (every image allocated on its own).
  int64_t source_arena_bytes = -1;
  // Microseconds the transfer's waits poll before sleeping; -1: default_transfer_busy_poll_us of the
  // stage's backend (source_arena_size.h).
  int64_t transfer_busy_poll_us = -1;
  CacheOptions cache;                  // local caches of the stage's layers (max_seqs = requests in flight;
                                       // checkpoint_slots: the prefix cache's)
  PrefixCacheOptions prefix;           // the prefix cache (off unless enabled; the same on every stage)
  uint32_t transfer_page_size = 16;    // the decode pool's page size (part of the compat check)
  std::vector<transfer::DecodeTarget> decodes;  // every decode instance this stage may feed
  std::string router_endpoint;         // empty: no router (PREFILLs injected through the driver's side)
  std::string listen_endpoint;         // stages > 0: where activations from stage s-1 arrive
  std::string next_endpoint;           // stages < last: stage s+1's listen endpoint
  transfer::ProtocolTimeouts timeouts;
  transfer::HeartbeatConfig heartbeat;
  std::optional<transfer::ControlKeys> control_keys;  // CURVE control plane (nullopt: --insecure-control-plane)
  std::string ucx_net_devices;         // the data plane's network device (from --interface)
  std::function<void(const StageTiming&)> on_timing;  // may be empty (called from the stage's loop)
};

class PrefillStage {
 public:
  static Result<std::unique_ptr<PrefillStage>> create(const PrefillStageOptions& opts, Backend& backend,
                                                      const ModelConfig& cfg, const WeightStore& weights,
                                                      zmq::context_t& zctx);
  ~PrefillStage();

  // One iteration of the event loop: driver messages, received activations, then at most one chunk of
  // compute. Sleeps up to `idle_wait` in the driver's poll only when there is no work.
  Status run_once(std::chrono::milliseconds idle_wait);

  const std::string& listen_endpoint() const;
  bool decode_ready() const { return driver_->decode_ready(); }
  size_t sources_held() const { return driver_->sources_held(); }
  size_t requests_in_compute() const { return requests_.size(); }
  int free_cache_slots() const { return pools_->free_slots(); }
  const PrefixCache* prefix_cache() const { return prefix_ ? &prefix_->cache() : nullptr; }
  // What the stage's heartbeat tells the router about its prefix cache (block_tokens 0: off).
  protocol::PrefixCacheReport prefix_report() const;
  bool is_last() const { return opts_.stage + 1 == static_cast<int>(opts_.partition.size()); }
  transfer::PrefillDriver& driver() { return *driver_; }

  // Everything this node counts (k3-decode / k3-prefill --metrics-listen serve it).
  const protocol::MetricsRegistry& metrics() const { return metrics_; }
 private:
  struct Request {
    uint64_t id = 0;
    std::optional<protocol::Prefill> prefill;   // once the driver accepted the PREFILL
    std::deque<ActivationChunk> arrived;        // stages > 0: chunks not computed yet
    SeqCache seq;
    bool open = false;
    PrefixLease lease;                          // prefix-cache hold (inactive with the cache off)
    std::vector<int32_t> cached_prompt;         // stages > 0 with the cache: the prompt, from the first chunk
    uint32_t evicted = 0;                       // stage 0: cache evictions to announce with the next chunk
    uint32_t prompt_len = 0;                    // known from the PREFILL or the first chunk
    uint32_t epoch = 0;                         // which computation of the request (ActivationChunk::epoch)
    bool recompute = false;                     // stage 0: the next open is a forced miss (a stage asked)
    bool reported = false;                      // handed to the driver before: a recompute only feeds the
                                                // next stages and the caches
    int64_t computed = 0;                       // tokens through this stage's layers
    bool streaming = false;                     // the driver holds its image and writes it chunk by chunk
    int64_t rows_exported = 0;                  // streaming: rows copied into the driver's image
    int64_t compute_begin_us = -1;              // steady_us() at the first chunk (on_timing)
    Tensor last_logits;                         // last stage: logits of the prompt's final row (on the backend)
  };
  PrefillStage(const PrefillStageOptions& opts, Backend& backend) : opts_(opts), backend_(backend) {}

  void absorb(const transfer::Actions& actions);
  void on_accepted(const protocol::Prefill& p);
  void on_chunk(ActivationChunk c);
  Request* next_work();
  Status compute_chunk(Request& r);
  // Opens the request's caches at its first chunk (a prefix-cache hit restores a prefix); false when
  // the request failed.
  bool open_request(Request& r, ChunkCacheSync& sync);
  bool reserve(Request& r, int64_t n, uint32_t evictions);
  void maybe_report(Request& r);
  // Streaming: starts the request's stream once it can, then hands the driver the newly computed rows.
  void stream_rows(Request& r);
  bool may_stream(const Request& r) const;
  // on_timing: the writes' span from the driver's state hook (TRANSFERRING .. terminal).
  void note_writes_timing(uint64_t id, protocol::RequestState st);
  void end_request(uint64_t id);
  // Prefix-cache drift (see the flow above): a later stage asks for the request to be computed again.
  void ask_recompute(Request& r, const std::string& why);
  void on_recompute(const RecomputeRequest& rr);
  // Drops the request's try on this stage (caches, lease, queued chunks) and waits for `epoch`.
  void reset_request(Request& r, uint32_t epoch);
  // Drops the queued chunks (their announced evictions still happen on this replica).
  void drop_chunks(Request& r);
  // A reported request comes back for a recompute as `epoch`; false when it ended or is that old.
  bool revive(uint64_t id, uint32_t epoch);
  // Keeps a reported request's PREFILL for a recompute; forgets the oldest past kReportedTokens.
  void remember_reported(const protocol::Prefill& p, uint32_t epoch);
  void fail_request(uint64_t id, const std::string& why);
  // How log lines name a request: its trace id once the PREFILL told it, else the wire id.
  std::string trace_of(uint64_t id) const;

  PrefillStageOptions opts_;
  Backend& backend_;
  ModelConfig cfg_;
  int begin_ = 0, end_ = 0;
  transfer::CacheLayout layout_;
  transfer::PrefillLayout prefill_layout_;
  std::unique_ptr<Model> model_;
  std::unique_ptr<CachePools> pools_;
  std::unique_ptr<StagePrefixCache> prefix_;      // after pools_: gives its pages back first (null: off)
  int open_requests_ = 0;
  protocol::MetricsRegistry metrics_;
  std::unique_ptr<transfer::PrefillDriver> driver_;
  std::unique_ptr<StageReceiver> from_prev_;
  std::unique_ptr<StageSender> to_next_;
  uint64_t prompts_prefilled_ = 0;   // prompts this stage finished (heartbeat report)
  std::map<uint64_t, Request> requests_;          // live here (computing or waiting for the PREFILL)
  std::deque<uint64_t> order_;                    // arrival order: oldest request gets the next chunk
  std::deque<uint64_t> chunk_order_;              // stages > 0 with the prefix cache: owners of the queued
                                                  // chunks in arrival order (computed strictly in it)
  std::set<uint64_t> ended_;                      // requests whose late chunks / PREFILLs are dropped
  struct Reported {
    protocol::Prefill prefill;
    uint32_t epoch = 0;
  };
  std::map<uint64_t, Reported> reported_;         // with the prefix cache: recently reported requests
  std::deque<uint64_t> reported_order_;           // oldest first
  uint64_t reported_tokens_ = 0;                  // prompt tokens reported_ holds
  std::vector<uint64_t> pending_end_;             // terminal states seen by the driver's state hook
  std::map<uint64_t, int64_t> writes_begin_us_;   // on_timing: requests whose writes started (until they end)
};

}  // namespace k3::prefill
