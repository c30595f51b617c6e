#include "decode_node/decode_rank.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <cstdio>

#include "engine/cache_io.h"
#include "common/protocol/compat.h"
#include "decode_node/cache_in_pool.h"
#include "decode_node/region_image.h"

namespace k3::decode {

using namespace std::chrono_literals;
using transfer::Actions;
using transfer::DecodeSide;
using transfer::Millis;

transfer::DecodeDriverConfig decode_driver_config(const DecodeRankOptions& opts, const ModelConfig& cfg,
                                                  const transfer::CacheLayout& layout) {
  transfer::DecodeDriverConfig dc;
  dc.side = {.instance_id = opts.instance_id, .model = layout, .kda_head_sliced = true, .timeouts = opts.timeouts};
  dc.ranks = {opts.rank};
  dc.page_size = opts.page_size;
  dc.num_pages = opts.num_pages;
  dc.num_slots = opts.num_slots;
  dc.compat.model_hash = protocol::model_config_hash(cfg);
  dc.compat.kv_dtype = layout.dtypes.kv;
  dc.compat.state_dtype = layout.dtypes.state;
  dc.compat.page_size = opts.page_size;
  dc.compat.layout.dp_size = opts.dp_size;  // registration requires rank < dp_size * dcp_size
  dc.compat.layout.dcp_size = 1;
  dc.bind_endpoint = opts.bind_endpoint;
  dc.advertise_host = opts.advertise_host;
  dc.router_endpoint = opts.router_endpoint;
  dc.heartbeat = opts.heartbeat;
  dc.control_keys = opts.control_keys;
  dc.ucx_net_devices = opts.ucx_net_devices;
  return dc;
}

DecodeRank::~DecodeRank() { batch_.reset(); }

Result<std::unique_ptr<DecodeRank>> DecodeRank::create(const DecodeRankOptions& opts, Backend& backend,
                                                       const ModelConfig& cfg, const WeightStore& weights,
                                                       zmq::context_t& zctx) {
  if (opts.max_tokens < 1) return invalid_argument("--max-tokens must be >= 1");
  // A request holds its transfer slot until it finishes, so the running batch never exceeds num_slots.
  if (!opts.cache_in_pool && opts.cache.max_seqs < static_cast<int>(opts.num_slots))
    return invalid_argument("--max-requests (" + std::to_string(opts.cache.max_seqs) + ") must be >= --pool-slots (" +
                            std::to_string(opts.num_slots) + ")");
  std::unique_ptr<DecodeRank> d(new DecodeRank(opts, backend));
  d->cfg_ = cfg;
  K3_ASSIGN_OR_RETURN(d->layout_, cache_layout(cfg, backend));
  EngineOptions eo;
  eo.cache = opts.cache;
  eo.top_logits = 0;
  if (!opts.cache_in_pool) {
    K3_ASSIGN_OR_RETURN(d->engine_, Engine::create(backend, cfg, weights, eo));
    d->batch_ = std::make_unique<DecodeBatch>(*d->engine_, backend);
  }

  transfer::DecodeDriverConfig dc = decode_driver_config(opts, cfg, d->layout_);
  // With the cache in the pool the region is where the engine's caches live: device memory on a GPU.
  const bool on_gpu = backend.kind() == BackendKind::Cuda;
  if (opts.cache_in_pool && on_gpu) {
    dc.pool_memory = transfer::MemoryType::Cuda;
    dc.cuda_device = opts.cuda_device;
  }
  DecodeRank* self = d.get();
  dc.on_state = [self](uint64_t id, protocol::RequestState st) {
    // Called inside driver calls: note it; the rank reacts after the call returns.
    if (self->opts_.on_state) self->opts_.on_state(id, st);
    if (protocol::is_terminal(st)) self->pending_end_.push_back(id);
  };
  K3_ASSIGN_OR_RETURN(d->driver_, transfer::DecodeDriver::create(std::move(dc), zctx, &d->metrics_));
  if (opts.cache_in_pool) {
    // The engine's pools are views of the registered region; the pool's ids are the engine's (counted).
    transfer::RankPool& pool = d->driver_->pool(opts.rank);
    K3_ASSIGN_OR_RETURN(auto memory, cache_memory_in_region(d->layout_, pool.geometry(), d->driver_->memory(opts.rank),
                                                            on_gpu ? Device::Cuda : Device::Cpu));
    eo.cache = cache_options_for(pool.geometry(), std::move(memory));
    K3_ASSIGN_OR_RETURN(d->engine_, Engine::create(backend, cfg, weights, eo));
    d->batch_ = std::make_unique<DecodeBatch>(*d->engine_, backend);
    d->pool_ids_ = std::make_shared<CachePoolIds>(d->engine_->caches());
    K3_TRY(pool.share_ids(d->pool_ids_));
  }
  K3_TRY(d->driver_->connect_router());  // up at the router only now that the engine can serve
  return d;
}

void DecodeRank::after_driver() {
  for (uint64_t id : std::exchange(pending_end_, {})) drop(id);
}

void DecodeRank::drop(uint64_t id) {
  auto it = running_.find(id);
  if (it == running_.end()) return;  // not decoding here (yet, or any more)
  for (const Choice& c : it->second.choices) {
    batch_->remove(c.key);
    by_key_.erase(c.key);
  }
  finished_.push_back({.request_id = id, .tokens = std::move(it->second.choices.at(0).req.tokens),
                       .finish = protocol::FinishReason::Aborted});
  running_.erase(it);
}

std::string DecodeRank::trace_of(uint64_t id) const {
  if (const protocol::Claim* c = driver_->side().claim(id); c && !c->trace_id.empty()) return c->trace_id;
  char buf[24];
  std::snprintf(buf, sizeof buf, "wire:%016llx", static_cast<unsigned long long>(id));
  return buf;
}

void DecodeRank::abort_local(uint64_t id, const std::string& why) {
  spdlog::warn("decode rank {}: request {} aborted: {}", opts_.rank, trace_of(id), why);
  end_here(*driver_, opts_, id, "decode rank " + std::to_string(opts_.rank), why);
  after_driver();
  drop(id);
}

void DecodeRank::finish(uint64_t id, protocol::FinishReason why) {
  auto it = running_.find(id);
  size_t generated = 0;
  for (const Choice& c : it->second.choices) generated += c.req.tokens.size();
  spdlog::info("decode rank {}: request {} finished: {}, {} tokens in {} choice(s)", opts_.rank, trace_of(id),
               protocol::finish_reason_name(why), generated, it->second.choices.size());
  for (const Choice& c : it->second.choices) {
    batch_->remove(c.key);
    by_key_.erase(c.key);
  }
  finished_.push_back({.request_id = id, .tokens = std::move(it->second.choices.at(0).req.tokens), .finish = why});
  running_.erase(it);
  // Decoding ended normally: the state machine releases the transfer pool entries once.
  driver_->apply([&](DecodeSide& side, Millis now) { return side.on_finished(id, now); });
  after_driver();
}

bool DecodeRank::emit(Running& r, Choice& c, int32_t token, std::vector<protocol::TokenLogprobs> logprobs) {
  const protocol::FinishReason why =
      stream_token(c.req, token, std::move(logprobs), *driver_, opts_, "decode rank " + std::to_string(opts_.rank));
  if (why == protocol::FinishReason::None) return false;
  c.done = true;
  batch_->remove(c.key);
  by_key_.erase(c.key);
  if (std::any_of(r.choices.begin(), r.choices.end(), [](const Choice& x) { return !x.done; })) return false;
  finish(r.id, why);
  return true;
}

Status DecodeRank::add_choices(Running& r, const SeqCache* resident, const std::vector<uint8_t>* image,
                               int64_t num_tokens) {
  for (size_t i = 1; i < r.choices.size(); ++i) {
    Choice& c = r.choices[i];
    const int32_t first = c.req.tokens.at(0);
    if (resident) {
      auto seq = engine_->caches().fork(*resident);
      if (!seq.is_ok()) return Status(seq.status().code(), "choice " + std::to_string(i) + ": " + seq.status().message());
      batch_->add_resident(c.key, std::move(seq).value(), first, c.req.sampling, /*step=*/1, r.logprobs,
                           c.req.constraint.get());
    } else {
      batch_->add(c.key, *image, num_tokens, first, c.req.sampling, /*step=*/1, r.logprobs, c.req.constraint.get());
    }
  }
  return Status::ok();
}

void DecodeRank::admit(const transfer::ReadyAction& ready) {
  const uint64_t id = ready.request_id;
  const auto* alloc = driver_->side().allocation(id);
  if (!alloc) return abort_local(id, "ready but holds no transfer memory");
  const transfer::RankAllocation* mine = nullptr;
  for (const auto& a : *alloc)
    if (a.rank == opts_.rank) mine = &a;
  if (!mine || alloc->size() != 1)
    return abort_local(id, "k3-decode serves plain DP (one rank per request); the CLAIM named " +
                               std::to_string(alloc->size()) + " ranks");
  // cache_in_pool: the engine takes references on the pages and slot the transfer wrote (no copy);
  // otherwise the request's bytes are copied out of the region and imported when the cache has room.
  Result<std::vector<uint8_t>> image = std::vector<uint8_t>{};
  // Every early return below drops the engine's references again (the transfer still holds its own).
  struct Resident {
    CachePools* pools = nullptr;
    SeqCache seq;
    ~Resident() {
      if (pools) pools->close(seq);
    }
  } resident;
  if (opts_.cache_in_pool) {
    const auto& ids = mine->pages.page_ids();
    auto seq = engine_->caches().adopt(mine->slot.slot() ? static_cast<int>(*mine->slot.slot()) : -1,
                                       std::vector<int32_t>(ids.begin(), ids.end()), ready.prompt_len);
    if (!seq.is_ok()) return abort_local(id, seq.status().to_string());
    resident.pools = &engine_->caches();
    resident.seq = std::move(seq).value();
  } else {
    image = packed_image_from_region(layout_, driver_->pool(opts_.rank).geometry(), *mine, driver_->memory(opts_.rank),
                                     ready.prompt_len);
    if (!image.is_ok()) return abort_local(id, image.status().to_string());
  }
  // The CLAIM's sampling params rule; a CLAIM without them (max_tokens 0) falls back to the flags.
  const protocol::Claim* claim = driver_->side().claim(id);
  const uint32_t n = claim && claim->sampling.max_tokens > 0 ? std::max<uint32_t>(claim->sampling.n, 1) : 1;
  if (ready.choice_first_tokens.size() + 1 != n)
    return abort_local(id, "the last prefill stage sent " + std::to_string(ready.choice_first_tokens.size() + 1) +
                               " first tokens for " + std::to_string(n) + " choices");
  Running r{.id = id};
  for (uint32_t i = 0; i < n; ++i) {
    auto made = streamed_request(id, opts_, claim);
    if (!made.is_ok()) return abort_local(id, made.status().to_string());
    Choice c{.key = next_key_++, .req = std::move(made).value()};
    c.req.choice = i;
    c.req.sampling.seed = ops::choice_seed(c.req.sampling.seed, i);
    r.logprobs = c.req.logprobs;
    // The last prefill stage drew the first token under the same grammar: advance the state past it.
    const int32_t first = i == 0 ? ready.first_token : ready.choice_first_tokens[i - 1];
    std::vector<protocol::TokenLogprobs> first_logprobs;
    if (ready.first_logprobs.size() == n) first_logprobs.push_back(ready.first_logprobs[i]);
    if (Status st = take_first_token(c.req, first, first_logprobs); !st.is_ok()) return abort_local(id, st.to_string());
    c.req.tokens.push_back(first);   // held here until the choices are in the batch; emit() records it again
    r.choices.push_back(std::move(c));
  }
  auto [it, fresh] = running_.emplace(id, std::move(r));
  if (!fresh) return;  // a Ready is emitted once per request; a duplicate would be a driver bug
  Running& run = it->second;
  for (const Choice& c : run.choices) by_key_[c.key] = {id, c.req.choice};
  spdlog::info("decode rank {}: request {} decoding (wire id {:016x}, {} prompt tokens, {} choice(s))", opts_.rank,
               trace_of(id), id, ready.prompt_len, n);
  // Every choice joins the batch first (choices 1..n-1 fork the caches), then each first token is emitted:
  // a choice its first token ends leaves the batch again; the request ends with its last choice.
  if (Status st = add_choices(run, opts_.cache_in_pool ? &resident.seq : nullptr, &image.value(), ready.prompt_len);
      !st.is_ok())
    return abort_local(id, st.to_string());
  Choice& c0 = run.choices[0];
  if (opts_.cache_in_pool) {
    resident.pools = nullptr;  // the batch owns the sequence now
    batch_->add_resident(c0.key, std::move(resident.seq), c0.req.tokens[0], c0.req.sampling, /*step=*/1, run.logprobs,
                         c0.req.constraint.get());
    // The engine holds every page and the slot now: the transfer lets go, so that a preemption (which
    // closes the engine's sequence) returns the request's pages to the pool instead of leaving them held
    // by the transfer until the request ends.
    if (Status st = driver_->side().hand_over(id); !st.is_ok()) return abort_local(id, st.to_string());
  } else {
    // It joins the batch when the decode cache has room (decode_batch.h); its image stays in host memory until then.
    batch_->add(c0.key, std::move(image).value(), ready.prompt_len, c0.req.tokens[0], c0.req.sampling, /*step=*/1,
                run.logprobs, c0.req.constraint.get());
  }
  for (uint32_t i = 0; i < n; ++i) {
    Choice& c = run.choices[i];
    const int32_t first = c.req.tokens[0];
    c.req.tokens.clear();
    std::vector<protocol::TokenLogprobs> lp;
    if (run.logprobs >= 0) lp.push_back(ready.first_logprobs[i]);
    if (emit(run, c, first, std::move(lp))) return;  // the request ended with this first token
  }
}

Status DecodeRank::decode_step() {
  if (batch_->size() == 0) return Status::ok();
  DecodeBatch::StepResult step = batch_->step();
  std::map<uint64_t, std::string> failed;   // by request: one of its choices failed, so it did
  for (const auto& [key, why] : step.failed)
    if (auto k = by_key_.find(key); k != by_key_.end()) failed.emplace(k->second.first, why);
  for (const auto& [id, why] : failed) abort_local(id, why);
  for (const auto& [key, token] : step.tokens) {
    auto k = by_key_.find(key);
    if (k == by_key_.end()) continue;
    auto it = running_.find(k->second.first);
    if (it == running_.end()) continue;
    auto lp = step.logprobs.find(key);
    emit(it->second, it->second.choices.at(k->second.second), token,
         lp == step.logprobs.end() ? std::vector<protocol::TokenLogprobs>{} : std::vector{to_wire(lp->second)});
  }
  return Status::ok();
}

protocol::DecodeRoom DecodeRank::room() {
  transfer::RankPool& pool = driver_->pool(opts_.rank);
  const CachePools& c = engine_->caches();
  return {.pool_page_size = opts_.page_size, .pool_pages = opts_.num_pages, .pool_free_pages = pool.free_pages(),
          .pool_slots = opts_.num_slots, .pool_free_slots = pool.free_slots(),
          .cache_page_size = static_cast<uint32_t>(c.options().page_size),
          .cache_pages = static_cast<uint32_t>(c.options().num_pages),
          .cache_free_pages = static_cast<uint32_t>(c.free_pages()),
          .cache_seqs = static_cast<uint32_t>(c.options().max_seqs),
          .cache_free_seqs = static_cast<uint32_t>(c.free_slots()),
          .paused = static_cast<uint32_t>(batch_->num_paused()),
          .preemptions = batch_->preemptions()};
}

Status DecodeRank::run_once(std::chrono::milliseconds idle_wait) {
  K3_ASSIGN_OR_RETURN(Actions actions, driver_->step(batch_->num_running() == 0 ? idle_wait : 0ms));
  after_driver();
  for (const transfer::Action& a : actions)
    if (const auto* ready = std::get_if<transfer::ReadyAction>(&a)) admit(*ready);
  return decode_step();
}

}  // namespace k3::decode
