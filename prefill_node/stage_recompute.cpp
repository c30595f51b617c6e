// The prefill stage's half of prefix-cache drift repair (docs/PREFIX_CACHE.md, "On a prefill pipeline"):
// a later stage whose replica lacks the state stage 0 resumed a request from asks, backwards over the
// stage link, for the request to be computed again; stage 0 does so as the next epoch with a forced
// miss, and every stage drops its older try.
#include <spdlog/spdlog.h>

#include <algorithm>

#include "prefill_node/prefill_stage.h"

namespace k3::prefill {

namespace {
constexpr uint64_t kReportedTokens = uint64_t{1} << 22;   // 16 MB of prompt token ids
}  // namespace

void PrefillStage::remember_reported(const protocol::Prefill& p, uint32_t epoch) {
  auto [it, fresh] = reported_.insert_or_assign(p.request_id, Reported{.prefill = p, .epoch = epoch});
  if (!fresh) return;   // a recompute of it reported again: it is remembered already
  reported_order_.push_back(p.request_id);
  reported_tokens_ += p.token_ids.size();
  while (reported_tokens_ > kReportedTokens && reported_order_.size() > 1) {
    auto old = reported_.find(reported_order_.front());
    reported_tokens_ -= old->second.prefill.token_ids.size();
    reported_.erase(old);
    reported_order_.pop_front();
  }
}

void PrefillStage::drop_chunks(Request& r) {
  for (const ActivationChunk& c : r.arrived)
    if (prefix_) prefix_->replay_evictions(c.cache.evictions_before);
  r.arrived.clear();
  chunk_order_.erase(std::remove(chunk_order_.begin(), chunk_order_.end(), r.id), chunk_order_.end());
}

void PrefillStage::reset_request(Request& r, uint32_t epoch) {
  if (prefix_) prefix_->release(r.lease);
  if (r.open) {
    pools_->close(r.seq);
    --open_requests_;
    r.open = false;
  }
  drop_chunks(r);
  r.cached_prompt.clear();
  r.computed = 0;   // rows_exported stays: those rows are in the image and sent, and the new try's are equal
  r.last_logits = Tensor{};
  r.epoch = epoch;
}

bool PrefillStage::revive(uint64_t id, uint32_t epoch) {
  auto it = reported_.find(id);
  if (it == reported_.end() || epoch <= it->second.epoch) return false;
  it->second.epoch = epoch;
  ended_.erase(id);
  Request& r = requests_[id];
  r = Request{};
  r.id = id;
  r.prefill = it->second.prefill;
  r.prompt_len = static_cast<uint32_t>(r.prefill->token_ids.size());
  r.reported = true;
  r.epoch = epoch;
  order_.push_back(id);
  return true;
}

void PrefillStage::ask_recompute(Request& r, const std::string& why) {
  const RecomputeRequest rr{.request_id = r.id, .epoch = r.epoch + 1};
  spdlog::warn("prefill stage {}: request {}: {}; asking stage 0 to compute it again (epoch {})", opts_.stage,
               trace_of(r.id), why, rr.epoch);
  reset_request(r, rr.epoch);
  if (Status st = from_prev_->send_back(encode_recompute(rr)); !st.is_ok())
    fail_request(r.id, "prefix cache: " + why + ", and the recompute request was not sent: " + st.to_string());
}

void PrefillStage::on_recompute(const RecomputeRequest& rr) {
  if (opts_.stage > 0) {   // relay towards stage 0
    if (Status st = from_prev_->send_back(encode_recompute(rr)); !st.is_ok())
      spdlog::warn("prefill stage {}: recompute of {} not relayed: {}", opts_.stage, trace_of(rr.request_id), st.to_string());
    return;
  }
  auto it = requests_.find(rr.request_id);
  if (it != requests_.end()) {
    if (rr.epoch <= it->second.epoch) return;   // asked twice
    reset_request(it->second, rr.epoch);
  } else if (!revive(rr.request_id, rr.epoch)) {
    spdlog::info("prefill stage 0: recompute of {} dropped: the request ended", trace_of(rr.request_id));
    return;
  }
  Request& r = requests_.at(rr.request_id);
  r.recompute = true;
  spdlog::info("prefill stage 0: request {} is computed again from token 0 (epoch {}): a later stage's prefix cache "
               "lacked its state", trace_of(r.id), r.epoch);
}

}  // namespace k3::prefill
