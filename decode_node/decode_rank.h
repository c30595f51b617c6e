// One decode DP rank: the transfer DecodeDriver (its registered pool region, control server, router
// connection), the full model (all layers) through an Engine, and the running batch.
//
//  - A request becomes ready when every prefill stage's TRANSFER_DONE arrived. Its bytes are read out of
//    the region (its page table and slot, region_image.h) into the Engine's CachePools (import_caches);
//    its first token (sampled by the last prefill stage) is emitted and it joins the running batch.
//    With cache_in_pool the Engine's CachePools live in the region itself: the request's pages and slot
//    are adopted where the transfer wrote them (no copy) and it joins the batch at once. On the cuda
//    backend that region is device memory (the driver's pool_memory Cuda), so the puts land on the GPU.
//  - Its transfer pool entries stay held until decoding ends (on_finished releases them exactly once):
//    the DecodeSide keeps the request in DECODING, so a router ABORT or a router death during decoding
//    ends it through the state machine, which is how the rank learns to drop it. The pool is the
//    admission budget of the rank.
//  - A request for n choices (SamplingParams.n) decodes n sequences from the one transfer: choice 0 in
//    the transferred caches, choices 1..n-1 in forks of them (CachePools::fork with cache_in_pool, else a
//    copy of the packed image each), every one with its own seed stream (ops::choice_seed) and the first
//    token the last prefill stage drew for it. TOKENS name the choice; the transfer pool entries are
//    released once, when the last choice ends.
//  - Every step feeds all running requests in one batched forward (DecodeBatch over Engine::feed),
//    samples per request (SamplingRow with its seed and step), stops on max_tokens or a stop id, and
//    streams one TOKENS message per token to the router (finish set on the last one).
//  - When the Engine's cache runs out mid-decode the newest request is preempted (its caches copied out
//    to host memory, resumed later with the same tokens; decode_batch.h) instead of failing. A request
//    this rank ends on its own (a failed import or step) is reported to the router with FAILED.
//
// Sampling and stop conditions of decode steps come from the CLAIM's SamplingParams; a CLAIM without them
// (max_tokens 0) falls back to this rank's options. The first token uses the PREFILL's params (last stage).
#pragma once
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "decode_node/decode_batch.h"
#include "decode_node/decode_rank_options.h"
#include "decode_node/streamed_request.h"
#include "engine/engine.h"
#include "transfer/ucx_decode_driver.h"

namespace k3::decode {

struct FinishedRequest {
  uint64_t request_id = 0;
  std::vector<int32_t> tokens;
  protocol::FinishReason finish = protocol::FinishReason::None;
};

// The transfer driver's configuration that follows from a rank's options, its model and the cache layout
// its region holds (one rank's, or a whole DCP group's at its leader); callers add their state hook and,
// for a group, the other ranks' regions.
transfer::DecodeDriverConfig decode_driver_config(const DecodeRankOptions& opts, const ModelConfig& cfg,
                                                  const transfer::CacheLayout& layout);

class DecodeRank {
 public:
  static Result<std::unique_ptr<DecodeRank>> create(const DecodeRankOptions& opts, Backend& backend,
                                                    const ModelConfig& cfg, const WeightStore& weights,
                                                    zmq::context_t& zctx);
  ~DecodeRank();

  const std::string& endpoint() const { return driver_->endpoint(); }
  // One loop iteration: driver events (sleeping up to `idle_wait` only when no request decodes: none, or
  // only paused ones that wait for memory, which driver events give back), newly ready
  // requests join, then one batched decode step.
  Status run_once(std::chrono::milliseconds idle_wait);

  // Everything this node counts (k3-decode / k3-prefill --metrics-listen serve it).
  const protocol::MetricsRegistry& metrics() const { return metrics_; }
  protocol::MetricsRegistry& metrics() { return metrics_; }
  size_t num_running() const { return running_.size(); }
  // Capacity and free room of the transfer pool and the decode cache (the router's admission input).
  protocol::DecodeRoom room();
  uint64_t preemptions() const { return batch_ ? batch_->preemptions() : 0; }
  // Requests that ended since the last call (normally, or aborted: finish Aborted).
  std::vector<FinishedRequest> take_finished() { return std::exchange(finished_, {}); }
  uint64_t pool_free_bytes() { return driver_->pool(opts_.rank).free_bytes(); }
  uint64_t pool_capacity_bytes() { return driver_->pool(opts_.rank).capacity_bytes(); }
  transfer::DecodeDriver& driver() { return *driver_; }

 private:
  // One of a request's n choices: one sequence of the batch (under its own batch key). Its StreamedRequest
  // holds what it generated, its stop conditions, its sampling with this choice's seed stream, and its
  // grammar (the batch masks with and advances it while the choice runs there).
  struct Choice {
    uint64_t key = 0;                  // its id in batch_
    StreamedRequest req;               // req.choice is the choice's index
    bool done = false;
  };
  // A request past its transfer (its caches are in batch_, one sequence per choice).
  struct Running {
    uint64_t id = 0;
    int logprobs = -1;                 // from the CLAIM: report each token's logprob and this many alternatives
    std::vector<Choice> choices;       // n >= 1
  };
  DecodeRank(const DecodeRankOptions& opts, Backend& backend) : opts_(opts), backend_(backend) {}

  void after_driver();
  void admit(const transfer::ReadyAction& ready);
  // Records the token, streams it, and ends the request when a stop condition holds. Returns true when ended.
  bool emit(Running& r, Choice& c, int32_t token, std::vector<protocol::TokenLogprobs> logprobs = {});
  // Choices 1..n-1 of a request whose caches are `resident` (cache_in_pool) or `image`: forked and added to the batch.
  Status add_choices(Running& r, const SeqCache* resident, const std::vector<uint8_t>* image, int64_t num_tokens);
  void finish(uint64_t id, protocol::FinishReason why);
  // Ends a request this rank cannot continue: ABORT to its prefill stages, FAILED to the router.
  void abort_local(uint64_t id, const std::string& why);
  void drop(uint64_t id);
  Status decode_step();
  // How log lines name a request: the trace id its CLAIM carried, else the wire id.
  std::string trace_of(uint64_t id) const;

  DecodeRankOptions opts_;
  Backend& backend_;
  ModelConfig cfg_;
  transfer::CacheLayout layout_;
  std::shared_ptr<transfer::PoolIds> pool_ids_;  // cache_in_pool: the engine's ids, shared with the pool
  std::unique_ptr<Engine> engine_;
  std::unique_ptr<DecodeBatch> batch_;
  protocol::MetricsRegistry metrics_;
  std::unique_ptr<transfer::DecodeDriver> driver_;
  std::map<uint64_t, Running> running_;
  std::map<uint64_t, std::pair<uint64_t, uint32_t>> by_key_;  // batch key -> (request id, choice)
  uint64_t next_key_ = 1;
  std::vector<uint64_t> pending_end_;   // terminal states seen by the driver's state hook
  std::vector<FinishedRequest> finished_;
};

}  // namespace k3::decode
