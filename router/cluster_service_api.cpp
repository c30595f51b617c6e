// ClusterService's thread-safe face: submit (every check the HTTP status depends on), cancel, ready,
// stats, shutdown. The worker thread (cluster_service.cpp) does the rest.
#include <sys/eventfd.h>
#include <unistd.h>

#include <algorithm>

#include "router/cluster_request.h"

namespace k3::router {

ClusterService::~ClusterService() {
  shutdown();
  if (worker_.joinable()) worker_.join();
  if (wake_fd_ >= 0) ::close(wake_fd_);
}

void ClusterService::wake() {
  const uint64_t one = 1;
  (void)!::write(wake_fd_, &one, sizeof one);
}

Status ClusterService::check_fits(const GenerationParams& params) const {
  std::lock_guard lk(pub_mu_);
  std::string why;
  for (const auto& p : opts_.pairs) {
    auto it = capacity_.find(decode_control_name(p));
    if (it == capacity_.end()) continue;
    why = never_fits(it->second, static_cast<int64_t>(params.prompt.size()), params.max_tokens);
    if (why.empty()) return Status::ok();  // some decode rank can hold it
  }
  return why.empty() ? Status::ok() : invalid_argument(why);
}

Result<RequestHandle> ClusterService::submit(GenerationParams params, EventSink sink) {
  // Logprobs travel in the sampling params; the last prefill stage and the decode rank compute them.
  K3_TRY(check_generation_params(params, bool(sink), cfg_.vocab_size, cfg_.max_position_embeddings));
  if (!ready()) return Status(Code::Unavailable, "no prefill/decode pair is ready");
  if (Status fits = check_fits(params); !fits.is_ok()) {
    std::lock_guard lk(pub_mu_);
    ++rejected_["never_fits"];
    return fits;
  }
  auto r = std::make_unique<Request>();
  // The same text rules as the local engine (tokenizer_text_stream).
  r->choices.resize(static_cast<size_t>(params.n));
  r->open_choices = params.n;
  for (Request::Choice& c : r->choices)
    c.text = std::make_unique<TextStream>(tokenizer_text_stream(tokenizer_, params.stop_strings, params.stop_ids));
  r->params = std::move(params);
  r->sink = std::move(sink);
  r->queued_since = std::chrono::steady_clock::now();
  RequestHandle id;
  {
    std::lock_guard lk(mu_);
    if (stopping_) return Status(Code::Unavailable, "the router is shutting down");
    if (queued_ >= opts_.max_queue) {
      std::lock_guard plk(pub_mu_);
      ++rejected_["queue_full"];
      return Status(Code::ResourceExhausted, "the admission queue is full (" + std::to_string(queued_) +
                                                 " requests waiting for decode room, --max-queue " +
                                                 std::to_string(opts_.max_queue) + ")");
    }
    id = next_id_++;
    r->id = id;
    live_.insert(id);
    ++queued_;
    submitted_.push_back(std::move(r));
  }
  wake();
  return id;
}

void ClusterService::cancel(RequestHandle handle) {
  {
    std::lock_guard lk(mu_);
    if (!live_.count(handle)) return;
    cancelled_.insert(handle);
  }
  wake();
  std::lock_guard sink_lk(sink_mu_);  // wait out a callback in progress; later ones see the mark
}

bool ClusterService::ready() const {
  if (stopping_) return false;
  std::lock_guard lk(pub_mu_);
  return any_ready_;
}

ServiceStats ClusterService::stats() const {
  int64_t queued;
  {
    std::lock_guard lk(mu_);
    queued = queued_;
  }
  std::lock_guard lk(pub_mu_);
  int64_t free_slots = 0, free_pages = 0;
  for (const auto& [node, cap] : capacity_) {
    auto it = node_load_.find(node);
    const CapacityLedger::Used used = it == node_load_.end() ? CapacityLedger::Used{} : it->second.reserved;
    free_slots += std::max<int64_t>(0, int64_t(std::min(cap.pool_slots, cap.cache_seqs)) - used.requests);
    free_pages += std::max<int64_t>(0, int64_t(cap.cache_pages) - used.cache_pages);
  }
  const protocol::PrefixCacheReport prefix = prefix_reports_.instance_totals();
  return {.waiting = queued, .running = running_, .free_slots = free_slots, .free_pages = free_pages,
          .prefix_lookup_tokens = prefix.lookup_tokens, .prefix_hit_tokens = prefix.hit_tokens,
          .prefix_checkpoints_stored = prefix.checkpoints_stored, .prefix_checkpoints_evicted = prefix.checkpoints_evicted,
          .prefix_cache_bytes = prefix.cache_bytes, .prompts_prefilled = prefix.prompts_prefilled};
}

void ClusterService::shutdown() {
  {
    std::lock_guard lk(mu_);
    stopping_ = true;
  }
  if (wake_fd_ >= 0) wake();
}

std::set<std::string> ClusterService::live_nodes() const {
  std::lock_guard lk(pub_mu_);
  return live_nodes_;
}

}  // namespace k3::router
