#include "decode_node/group_leader.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <cstring>

#include "common/protocol/compat.h"
#include "decode_node/region_image.h"

namespace k3::decode {

using namespace std::chrono_literals;
using transfer::Actions;
using transfer::DecodeSide;
using transfer::Millis;

GroupLeader::~GroupLeader() { worker_.reset(); }

Result<std::unique_ptr<GroupLeader>> GroupLeader::create(const GroupLeaderOptions& opts, Backend& backend,
                                                         const ModelConfig& cfg, const WeightStore& weights, Comm& comm,
                                                         zmq::context_t& zctx) {
  const DecodeRankOptions& o = opts.rank;
  if (o.max_tokens < 1) return invalid_argument("--max-tokens must be >= 1");
  if (o.cache.max_seqs < static_cast<int>(o.num_slots))
    return invalid_argument("--max-requests (" + std::to_string(o.cache.max_seqs) + ") must be >= --pool-slots (" +
                            std::to_string(o.num_slots) + ")");
  if (opts.layout.rank != 0 || comm.rank() != 0) return invalid_argument("the group leader is rank 0 of its group");
  if (comm.size() != opts.layout.size())
    return invalid_argument("the group communicator has " + std::to_string(comm.size()) + " ranks, the layout " +
                            to_string(opts.layout));
  K3_TRY(validate_rank_layout(opts.layout, cfg));
  std::unique_ptr<GroupLeader> d(new GroupLeader(opts, backend, comm));
  d->cfg_ = cfg;
  K3_ASSIGN_OR_RETURN(d->full_layout_, cache_layout(cfg, backend));
  for (int i = 0; i < opts.layout.dcp && opts.layout.dcp > 1; ++i) {
    RankLayout g = opts.layout;
    g.rank = i;
    K3_ASSIGN_OR_RETURN(auto l, cache_layout(rank_cache_config(cfg, g), backend));
    d->rank_layouts_.push_back(l);
  }
  K3_ASSIGN_OR_RETURN(d->worker_, GroupWorker::create(backend, cfg, weights, opts.layout, comm, o.cache));
  d->next_.resize(static_cast<size_t>(opts.layout.size()));

  transfer::DecodeDriverConfig dc;
  dc.side = {.instance_id = o.instance_id, .model = d->full_layout_, .kda_head_sliced = true, .timeouts = o.timeouts};
  // DCP: one region per rank (region id = global rank), written by the prefill stages with the interleave.
  dc.ranks = {o.rank};
  for (int i = 1; i < opts.layout.dcp; ++i) dc.ranks.push_back(o.rank + static_cast<uint32_t>(i));
  dc.page_size = o.page_size;
  dc.num_pages = o.num_pages;
  dc.num_slots = o.num_slots;
  dc.compat.model_hash = protocol::model_config_hash(cfg);
  dc.compat.kv_dtype = d->full_layout_.dtypes.kv;
  dc.compat.state_dtype = d->full_layout_.dtypes.state;
  dc.compat.page_size = o.page_size;
  dc.compat.layout.dp_size = o.dp_size;  // registration requires rank < dp_size * dcp_size
  dc.compat.layout.dcp_size = 1;
  dc.bind_endpoint = o.bind_endpoint;
  dc.router_endpoint = o.router_endpoint;
  dc.heartbeat = o.heartbeat;
  dc.control_keys = o.control_keys;
  dc.ucx_net_devices = o.ucx_net_devices;
  GroupLeader* self = d.get();
  dc.on_state = [self](uint64_t id, protocol::RequestState st) {
    if (self->opts_.rank.on_state) self->opts_.rank.on_state(id, st);
    if (protocol::is_terminal(st)) self->pending_end_.push_back(id);
  };
  K3_ASSIGN_OR_RETURN(d->driver_, transfer::DecodeDriver::create(std::move(dc), zctx, &d->metrics_));
  return d;
}

uint64_t GroupLeader::pool_free_bytes() {
  uint64_t n = 0;
  for (uint32_t r : driver_->ranks()) n += driver_->pool(r).free_bytes();
  return n;
}

uint64_t GroupLeader::pool_capacity_bytes() {
  uint64_t n = 0;
  for (uint32_t r : driver_->ranks()) n += driver_->pool(r).capacity_bytes();
  return n;
}

void GroupLeader::after_driver() {
  for (uint64_t id : std::exchange(pending_end_, {})) {
    auto it = running_.find(id);
    if (it == running_.end()) continue;
    finished_.push_back({.request_id = id, .tokens = std::move(it->second.tokens), .finish = protocol::FinishReason::Aborted});
    drop(id);
  }
}

void GroupLeader::drop(uint64_t id) {
  worker_->drop(id);
  for (size_t i = 1; i < next_.size(); ++i) next_[i].drops.push_back(id);
  running_.erase(id);
  order_.erase(std::remove(order_.begin(), order_.end(), id), order_.end());
}

void GroupLeader::abort_local(uint64_t id, const std::string& why) {
  spdlog::warn("decode group {}: request {} aborted: {}", opts_.rank.instance_id, id, why);
  driver_->apply([&](DecodeSide& side, Millis now) {
    return side.on_abort(protocol::Abort{.request_id = id, .reason = protocol::AbortReason::Internal,
                                         .origin_role = protocol::Role::Decode, .origin_instance = opts_.rank.instance_id},
                         now);
  });
  after_driver();
  if (running_.count(id)) {
    finished_.push_back({.request_id = id, .tokens = std::move(running_.at(id).tokens), .finish = protocol::FinishReason::Aborted});
    drop(id);
  }
  // The ABORT came from here, so the state machine tells nobody upstream: the router must hear it.
  if (!opts_.rank.router_endpoint.empty()) {
    Status st = driver_->send_to_router(protocol::Failed{.request_id = id, .cause = protocol::AbortReason::Internal,
                                                         .detail = "decode group " + opts_.rank.instance_id + ": " + why});
    if (!st.is_ok()) spdlog::warn("decode group {}: FAILED for {} not sent: {}", opts_.rank.instance_id, id, st.to_string());
  }
}

void GroupLeader::finish(uint64_t id, protocol::FinishReason why) {
  auto it = running_.find(id);
  finished_.push_back({.request_id = id, .tokens = std::move(it->second.tokens), .finish = why});
  drop(id);
  driver_->apply([&](DecodeSide& side, Millis now) { return side.on_finished(id, now); });
  after_driver();
}

bool GroupLeader::emit(Running& r, int32_t token) {
  r.tokens.push_back(token);
  protocol::FinishReason why = protocol::FinishReason::None;
  if (std::find(r.stop_ids.begin(), r.stop_ids.end(), token) != r.stop_ids.end())
    why = protocol::FinishReason::Stop;
  else if (static_cast<int>(r.tokens.size()) >= r.max_tokens)
    why = protocol::FinishReason::Length;
  if (!opts_.rank.router_endpoint.empty()) {
    Status st = driver_->send_to_router(protocol::Tokens{.request_id = r.id, .token_ids = {token}, .finish = why});
    if (!st.is_ok()) spdlog::warn("decode group {}: TOKENS for {} not sent: {}", opts_.rank.instance_id, r.id, st.to_string());
  }
  if (why == protocol::FinishReason::None) return false;
  finish(r.id, why);
  return true;
}

Result<std::vector<uint8_t>> GroupLeader::rank_image(uint64_t id, const transfer::RankAllocation& a, int rank_index,
                                                     uint32_t prompt_len) {
  (void)id;
  const RankLayout& g = opts_.layout;
  if (g.dcp == 1)
    return packed_image_from_region(full_layout_, driver_->pool(a.rank).geometry(), a, driver_->memory(a.rank), prompt_len);
  RankLayout gi = g;
  gi.rank = rank_index;
  return packed_image_from_region(rank_layouts_.at(static_cast<size_t>(rank_index)), driver_->pool(a.rank).geometry(), a,
                                  driver_->memory(a.rank), static_cast<uint32_t>(dcp_rows_on(gi, prompt_len)));
}

int GroupLeader::least_loaded_rank() const {
  std::vector<int> n(static_cast<size_t>(opts_.layout.size()), 0);
  for (const auto& [id, r] : running_) ++n[static_cast<size_t>(r.rank)];
  return static_cast<int>(std::min_element(n.begin(), n.end()) - n.begin());
}

void GroupLeader::admit(const transfer::ReadyAction& ready) {
  const uint64_t id = ready.request_id;
  const auto* alloc = driver_->side().allocation(id);
  if (!alloc) return abort_local(id, "ready but holds no transfer memory");
  const size_t regions = static_cast<size_t>(opts_.layout.dcp);
  if (alloc->size() != regions)
    return abort_local(id, "the CLAIM named " + std::to_string(alloc->size()) + " ranks; this group " +
                               to_string(opts_.layout) + " takes " + std::to_string(regions));
  std::vector<std::vector<uint8_t>> images;
  for (size_t i = 0; i < regions; ++i) {
    if ((*alloc)[i].rank != opts_.rank.rank + i)
      return abort_local(id, "the CLAIM's rank " + std::to_string((*alloc)[i].rank) + " is not rank " + std::to_string(i) +
                                 " of this group");
    auto image = rank_image(id, (*alloc)[i], static_cast<int>(i), ready.prompt_len);
    if (!image.is_ok()) return abort_local(id, image.status().to_string());
    images.push_back(std::move(image).value());
  }
  Running r{.id = id};
  r.sampling = opts_.rank.sampling;
  r.max_tokens = opts_.rank.max_tokens;
  r.stop_ids = opts_.rank.stop_ids;
  if (const protocol::Claim* c = driver_->side().claim(id); c && c->sampling.max_tokens > 0) {
    const protocol::SamplingParams& sp = c->sampling;
    // A group samples without the token mask and without logprobs: say so rather than serve free text
    // or drop the numbers the client asked for.
    if (!sp.output_format.empty()) return abort_local(id, "constrained output (response_format, tools) is not served by decode rank groups yet");
    if (sp.logprobs >= 0) return abort_local(id, "logprobs are not served by decode rank groups yet");
    r.sampling = {.temperature = sp.temperature, .top_k = sp.top_k, .top_p = sp.top_p, .seed = sp.seed};
    r.max_tokens = static_cast<int>(sp.max_tokens);
    r.stop_ids = sp.stop_token_ids;
  }
  // EP: the request lives whole on one rank, the one with the fewest requests; DCP: on every rank.
  r.rank = opts_.layout.ep > 1 ? least_loaded_rank() : 0;
  const int count = static_cast<int>(std::count_if(running_.begin(), running_.end(),
                                                   [&](const auto& kv) { return kv.second.rank == r.rank; }));
  if (count >= opts_.rank.cache.max_seqs) return abort_local(id, "every rank of the group serves --max-requests requests");
  const int target = r.rank;
  auto [it, fresh] = running_.emplace(id, std::move(r));
  if (!fresh) return;
  order_.push_back(id);
  if (emit(it->second, ready.first_token)) return;  // ended with its first token
  // The leader imports its slice first: a request its caches cannot hold is refused before any member
  // took it (rank 0 of a DCP group holds the most rows; the pools of every rank are the same size).
  const int64_t T = ready.prompt_len;
  if (opts_.layout.dcp > 1) {
    if (Status st = worker_->admit({.id = id, .position = T, .image = std::move(images[0])}); !st.is_ok())
      return abort_local(id, st.to_string());
    for (size_t i = 1; i < regions; ++i) next_[i].admits.push_back({.id = id, .position = T, .image = std::move(images[i])});
  } else if (target == 0) {
    if (Status st = worker_->admit({.id = id, .position = T, .image = std::move(images[0])}); !st.is_ok())
      return abort_local(id, st.to_string());
  } else {
    next_[static_cast<size_t>(target)].admits.push_back({.id = id, .position = T, .image = std::move(images[0])});
  }
}

Status GroupLeader::fail_group(const Status& why) {
  spdlog::error("decode group {}: {}", opts_.rank.instance_id, why.to_string());
  const std::vector<uint64_t> ids = order_;
  for (uint64_t id : ids) abort_local(id, "the decode group failed: " + why.message());
  worker_->close_all();
  return Status(why.code(), "decode group " + opts_.rank.instance_id + " failed: " + why.message());
}

Status GroupLeader::step() {
  const bool ep = opts_.layout.ep > 1;
  const size_t n = next_.size();
  std::vector<std::vector<GroupFeed>> feeds(n);
  std::vector<std::vector<uint64_t>> ids(n);
  for (uint64_t id : order_) {
    const Running& r = running_.at(id);
    for (size_t i = 0; i < n; ++i) {
      if (ep && static_cast<size_t>(r.rank) != i) continue;
      feeds[i].push_back({.id = id, .token = r.tokens.back()});
      ids[i].push_back(id);
    }
  }
  const bool has_step = !order_.empty();
  for (size_t i = 1; i < n; ++i) {
    GroupCommand& c = next_[i];
    c.step = has_step;
    c.feeds = feeds[i];
    if (Status st = send_group_command(comm_, static_cast<int>(i), c); !st.is_ok()) return fail_group(st);
    c = {};
  }
  if (!has_step) return Status::ok();
  auto own = worker_->step(feeds[0]);
  if (!own.is_ok()) {
    if (own.status().code() != Code::ResourceExhausted) return fail_group(own.status());
    // Every rank refused the step before touching a cache: the newest request gives way.
    abort_local(order_.back(), "the decode cache of the group is full: " + own.status().message());
    return Status::ok();
  }
  const int64_t V = cfg_.vocab_size;
  std::vector<uint64_t> sampled;
  std::vector<float> logits;
  for (size_t i = 0; i < (ep ? n : 1); ++i) {
    sampled.insert(sampled.end(), ids[i].begin(), ids[i].end());
    const size_t at = logits.size();
    logits.resize(at + ids[i].size() * static_cast<size_t>(V));
    if (i == 0) {
      std::copy(own->begin(), own->end(), logits.begin() + static_cast<std::ptrdiff_t>(at));
    } else if (!ids[i].empty()) {
      if (Status st = recv_group_logits(comm_, static_cast<int>(i), std::span(logits).subspan(at)); !st.is_ok())
        return fail_group(st);
    }
  }
  Tensor lg = backend_.alloc({static_cast<int64_t>(sampled.size()), V}, DType::F32);
  std::memcpy(lg.f32(), logits.data(), logits.size() * sizeof(float));
  std::vector<ops::SamplingRow> rows;
  for (uint64_t id : sampled) {
    ops::SamplingRow row = running_.at(id).sampling;
    row.step = running_.at(id).step;
    rows.push_back(row);
  }
  std::vector<int32_t> next;
  backend_.sample({.logits = lg, .rows = rows, .out = &next});
  for (size_t k = 0; k < sampled.size(); ++k) {
    auto it = running_.find(sampled[k]);
    if (it == running_.end()) continue;
    ++it->second.step;
    emit(it->second, next[k]);
  }
  return Status::ok();
}

void GroupLeader::stop_members() {
  for (size_t i = 1; i < next_.size(); ++i) (void)send_group_command(comm_, static_cast<int>(i), GroupCommand{.stop = true});
}

protocol::DecodeRoom GroupLeader::room() {
  transfer::RankPool& pool = driver_->pool(opts_.rank.rank);
  const CachePools& c = worker_->caches();
  return {.pool_page_size = opts_.rank.page_size, .pool_pages = opts_.rank.num_pages, .pool_free_pages = pool.free_pages(),
          .pool_slots = opts_.rank.num_slots, .pool_free_slots = pool.free_slots(),
          .cache_page_size = static_cast<uint32_t>(c.options().page_size),
          .cache_pages = static_cast<uint32_t>(c.options().num_pages),
          .cache_free_pages = static_cast<uint32_t>(c.free_pages()),
          .cache_seqs = static_cast<uint32_t>(c.options().max_seqs),
          .cache_free_seqs = static_cast<uint32_t>(c.free_slots()),
          .paused = 0,
          .preemptions = 0};
}

Status GroupLeader::run_once(std::chrono::milliseconds idle_wait) {
  K3_ASSIGN_OR_RETURN(Actions actions, driver_->step(running_.empty() ? idle_wait : 0ms));
  after_driver();
  for (const transfer::Action& a : actions)
    if (const auto* ready = std::get_if<transfer::ReadyAction>(&a)) admit(*ready);
  return step();
}

}  // namespace k3::decode
