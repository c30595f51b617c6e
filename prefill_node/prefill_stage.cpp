#include "prefill_node/prefill_stage.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <cstdio>

#include "engine/cache_io.h"
#include "kernels/token_mask.h"
#include "engine/sampling_wire.h"
#include "engine/token_logprobs.h"
#include "common/protocol/compat.h"
#include "prefill_node/partition.h"

namespace k3::prefill {

using namespace std::chrono_literals;
using transfer::Millis;

namespace {

constexpr size_t kEndedMemory = 1 << 16;  // ended ids remembered to drop their late chunks

Activations host_copy(Backend& be, const Activations& a) {
  Activations out;
  out.partial = be.to_host(a.partial);
  for (const Tensor& b : a.bank) out.bank.push_back(be.to_host(b));
  return out;
}

// Activations from the stage link (host F32, exact copies of the sender's values) onto this stage's
// backend in its compute dtype: bf16 -> f32 -> bf16 is exact, so a GPU pipeline computes the same
// values as one process.
Activations on_backend(Backend& be, Activations a) {
  a.partial = be.from_host(a.partial, be.compute_dtype());
  for (Tensor& b : a.bank) b = be.from_host(b, be.compute_dtype());
  return a;
}

}  // namespace

const char* span_name(StageTiming::Span s) {
  switch (s) {
    case StageTiming::Span::Compute: return "compute";
    case StageTiming::Span::Writes: return "writes";
    case StageTiming::Span::WritesDone: return "writes_done";
  }
  return "?";
}

int64_t steady_us() {
  return std::chrono::duration_cast<std::chrono::microseconds>(std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

PrefillStage::~PrefillStage() {
  for (auto& [id, r] : requests_) {
    if (prefix_) prefix_->release(r.lease);
    if (r.open) pools_->close(r.seq);
  }
}

Result<std::unique_ptr<PrefillStage>> PrefillStage::create(const PrefillStageOptions& opts, Backend& backend,
                                                           const ModelConfig& cfg, const WeightStore& weights,
                                                           zmq::context_t& zctx) {
  const int stages = static_cast<int>(opts.partition.size());
  if (opts.stage < 0 || opts.stage >= stages)
    return invalid_argument("--stage " + std::to_string(opts.stage) + " is outside 0.." + std::to_string(stages - 1));
  if (opts.chunk_size <= 0) return invalid_argument("--chunk-size must be > 0");
  if (backend.chunk_invariant() && opts.chunk_size % 64 != 0)
    spdlog::warn("prefill stage {}: --chunk-size {} is not a multiple of 64: with batch-invariant kernels a prompt's "
                 "tokens then equal k3-generate's only to rounding (KDA cuts at multiples of 64 keep them bitwise)",
                 opts.stage, opts.chunk_size);
  if (opts.max_inflight_chunks < 1)
    return invalid_argument("--max-inflight-chunks must be >= 1 (got " + std::to_string(opts.max_inflight_chunks) + ")");
  if (opts.decodes.empty()) return invalid_argument("--decode-endpoint is required");
  const bool last = opts.stage + 1 == stages;
  if (!last && opts.next_endpoint.empty())
    return invalid_argument("--next-endpoint is required on every stage but the last");
  if (opts.stage > 0 && opts.listen_endpoint.empty())
    return invalid_argument("--listen is required on every stage but the first");
  std::unique_ptr<PrefillStage> s(new PrefillStage(opts, backend));
  protocol::metric::report_kernels(s->metrics_, backend.name(), backend.batch_invariant());
  s->cfg_ = cfg;
  s->begin_ = stage_begin(opts.partition, opts.stage);
  s->end_ = s->begin_ + opts.partition[opts.stage];
  K3_ASSIGN_OR_RETURN(s->layout_, cache_layout(cfg, backend));
  for (int n : opts.partition) s->prefill_layout_.partition.push_back(static_cast<uint32_t>(n));
  K3_TRY(s->prefill_layout_.validate(s->layout_));
  K3_TRY(check_region_bytes(cfg, backend, s->begin_, s->end_, opts.cache, "--cache-region-mib"));   // before the weights go up
  K3_ASSIGN_OR_RETURN(s->model_, Model::create(backend, cfg, weights, s->begin_, s->end_));
  s->pools_ = std::make_unique<CachePools>(backend, cfg, s->begin_, s->end_, opts.cache);
  if (opts.prefix.enabled) {
    K3_ASSIGN_OR_RETURN(s->prefix_, StagePrefixCache::create(*s->pools_, cfg, s->layout_, opts.prefix, opts.chunk_size, backend));
  }

  transfer::PrefillDriverConfig dc;
  dc.side = {.instance_id = opts.instance_id, .stage = static_cast<uint32_t>(opts.stage), .model = s->layout_,
             .prefill = s->prefill_layout_, .decode_kda_head_sliced = true, .timeouts = opts.timeouts};
  dc.compat.model_hash = protocol::model_config_hash(cfg);
  dc.compat.kv_dtype = s->layout_.dtypes.kv;
  dc.compat.state_dtype = s->layout_.dtypes.state;
  dc.compat.page_size = opts.transfer_page_size;
  dc.compat.layout.pp_partition = s->prefill_layout_.partition;
  dc.decodes = opts.decodes;
  dc.router_endpoint = opts.router_endpoint;
  dc.heartbeat = opts.heartbeat;
  dc.control_keys = opts.control_keys;
  dc.ucx_net_devices = opts.ucx_net_devices;
  // On a GPU the images the puts read are device memory: rows go cache -> image on the device, and the
  // puts read the GPU (cuda_ipc into a decode rank's GPU region on one host); nothing is staged on the host.
  if (backend.kind() == BackendKind::Cuda) {
    dc.source_memory = transfer::MemoryType::Cuda;
    dc.cuda_device = opts.cuda_device;
  }
  const int64_t default_arena_mib =
      backend.kind() == BackendKind::Cuda ? kDefaultSourceArenaMiBDevice : kDefaultSourceArenaMiBHost;
  dc.source_arena_bytes = static_cast<size_t>(opts.source_arena_bytes >= 0 ? opts.source_arena_bytes : default_arena_mib << 20);
  dc.writer.busy_poll = std::chrono::microseconds(opts.transfer_busy_poll_us >= 0
                                                      ? opts.transfer_busy_poll_us
                                                      : default_transfer_busy_poll_us(backend.kind() == BackendKind::Cuda));
  PrefillStage* self = s.get();
  dc.on_state = [self](uint64_t id, protocol::RequestState st) {
    // Called inside driver calls: only note it; the loop frees the request after the call returns.
    if (self->opts_.on_timing) self->note_writes_timing(id, st);
    if (protocol::is_terminal(st)) self->pending_end_.push_back(id);
  };
  if (opts.on_timing)
    dc.on_write_span = [self](uint64_t id, int64_t begin_us, int64_t end_us, uint64_t bytes) {
      self->opts_.on_timing(
          {.request_id = id, .span = StageTiming::Span::Writes, .begin_us = begin_us, .end_us = end_us, .bytes = bytes});
    };
  K3_ASSIGN_OR_RETURN(s->driver_, transfer::PrefillDriver::create(std::move(dc), zctx, &s->metrics_));
  // The neighbours' control names: each link accepts / trusts only the adjacent stage's key.
  auto stage_name = [](const std::string& instance, int stage) {
    return transfer::control_name(
        transfer::Peer{.role = protocol::Role::Prefill, .instance = instance, .stage = static_cast<uint32_t>(stage)});
  };
  if (opts.stage > 0) {
    K3_ASSIGN_OR_RETURN(s->from_prev_, StageReceiver::bind(zctx, opts.listen_endpoint, opts.control_keys,
                                                           stage_name(opts.instance_id, opts.stage - 1)));
  }
  if (!last) {
    K3_ASSIGN_OR_RETURN(s->to_next_, StageSender::connect(zctx, opts.next_endpoint, opts.control_keys,
                                                          stage_name(opts.instance_id, opts.stage + 1)));
  }
  return s;
}

const std::string& PrefillStage::listen_endpoint() const {
  static const std::string none;
  return from_prev_ ? from_prev_->endpoint() : none;
}

void PrefillStage::absorb(const transfer::Actions&) {
  // The driver executed the actions already; what the stage itself must react to is a request
  // ending (its local caches and queued chunks go).
  for (uint64_t id : std::exchange(pending_end_, {})) {
    // A recompute of a reported request is unknown to the driver, whose part of the request may end
    // (its transfer done) while the recompute still feeds the next stages: it ends when it is computed.
    if (auto it = requests_.find(id); it != requests_.end() && it->second.reported) continue;
    end_request(id);
  }
}

void PrefillStage::end_request(uint64_t id) {
  auto it = requests_.find(id);
  if (it != requests_.end()) {
    if (prefix_) prefix_->release(it->second.lease);
    if (it->second.open) {
      pools_->close(it->second.seq);
      --open_requests_;
    }
    requests_.erase(it);
    order_.erase(std::remove(order_.begin(), order_.end(), id), order_.end());
    // A revived request (a recompute) must not find chunk entries of its ended try.
    chunk_order_.erase(std::remove(chunk_order_.begin(), chunk_order_.end(), id), chunk_order_.end());
  }
  if (ended_.insert(id).second && ended_.size() > kEndedMemory) ended_.erase(ended_.begin());  // oldest ids first
}

std::string PrefillStage::trace_of(uint64_t id) const {
  auto it = requests_.find(id);
  if (it != requests_.end() && it->second.prefill && !it->second.prefill->trace_id.empty()) return it->second.prefill->trace_id;
  char buf[24];
  std::snprintf(buf, sizeof buf, "wire:%016llx", static_cast<unsigned long long>(id));
  return buf;
}

void PrefillStage::fail_request(uint64_t id, const std::string& why) {
  spdlog::warn("prefill stage {}: request {} failed: {}", opts_.stage, trace_of(id), why);
  absorb(driver_->inject_abort(id, protocol::AbortReason::Internal));
  end_request(id);
  // The abort above is local, so the state machine tells nobody upstream: without this FAILED the
  // router would wait for the request's tokens until its deadline.
  Status st = driver_->send_to_router(protocol::Failed{.request_id = id, .cause = protocol::AbortReason::Internal,
                                                       .detail = "prefill stage " + std::to_string(opts_.stage) + ": " + why});
  if (!st.is_ok()) spdlog::debug("prefill stage {}: FAILED for {} not sent: {}", opts_.stage, trace_of(id), st.to_string());
}

void PrefillStage::on_accepted(const protocol::Prefill& p) {
  if (ended_.count(p.request_id)) return;
  if (p.token_ids.empty()) return fail_request(p.request_id, "empty prompt");
  for (int32_t t : p.token_ids)
    if (t < 0 || t >= cfg_.vocab_size)
      return fail_request(p.request_id, "token id " + std::to_string(t) + " outside the vocabulary");
  auto [it, fresh] = requests_.try_emplace(p.request_id);
  Request& r = it->second;
  if (fresh) {
    r.id = p.request_id;
    order_.push_back(r.id);
  }
  const uint32_t len = static_cast<uint32_t>(p.token_ids.size());
  if (r.prompt_len != 0 && r.prompt_len != len)
    return fail_request(r.id, "PREFILL has " + std::to_string(len) + " tokens but stage " +
                                  std::to_string(opts_.stage - 1) + " sent activations for " + std::to_string(r.prompt_len));
  r.prompt_len = len;
  r.prefill = p;
  spdlog::info("prefill stage {}: request {} accepted (wire id {:016x}, {} prompt tokens)", opts_.stage, trace_of(r.id), r.id, len);
  const uint64_t id = r.id;
  stream_rows(r);   // stages > 0 may have computed chunks before their PREFILL arrived
  if (auto again = requests_.find(id); again != requests_.end()) maybe_report(again->second);  // or all of them
}

void PrefillStage::on_chunk(ActivationChunk c) {
  if (ended_.count(c.request_id) && !(c.epoch > 0 && revive(c.request_id, c.epoch))) {
    if (prefix_) prefix_->replay_evictions(c.cache.evictions_before);
    return;
  }
  auto [it, fresh] = requests_.try_emplace(c.request_id);
  Request& r = it->second;
  if (fresh) {
    r.id = c.request_id;
    order_.push_back(r.id);
  }
  if (c.epoch < r.epoch) {   // a try that a recompute replaced
    if (prefix_) prefix_->replay_evictions(c.cache.evictions_before);
    return;
  }
  if (c.epoch > r.epoch) reset_request(r, c.epoch);   // stage 0 computes it again: this stage's try goes
  if (r.prompt_len != 0 && r.prompt_len != c.prompt_len)
    return fail_request(r.id, "activations for " + std::to_string(c.prompt_len) + " tokens, the request has " +
                                  std::to_string(r.prompt_len));
  r.prompt_len = c.prompt_len;
  // A request's first chunk starts where stage 0's prefix-cache hit ended (0 without one).
  int64_t expected = r.open ? r.computed : !r.arrived.empty() ? static_cast<int64_t>(r.arrived.front().chunk_start)
                                                              : static_cast<int64_t>(c.chunk_start);
  for (const ActivationChunk& q : r.arrived) expected += q.act.rows();
  if (static_cast<int64_t>(c.chunk_start) != expected)
    return fail_request(r.id, "activation chunk starts at " + std::to_string(c.chunk_start) + ", expected " +
                                  std::to_string(expected));
  r.arrived.push_back(std::move(c));
  if (prefix_) chunk_order_.push_back(r.id);
}

PrefillStage::Request* PrefillStage::next_work() {
  // A request takes a cache slot at its first chunk; while none is free, only requests holding one
  // progress (the others wait, their chunks queued).
  // Streaming: while max_inflight_chunks write batches are unflushed, compute waits (step() wakes on a flush).
  if (opts_.stream && driver_->write_jobs_in_flight() >= static_cast<size_t>(opts_.max_inflight_chunks)) return nullptr;
  const bool slot_free = open_requests_ < opts_.cache.max_seqs;   // the pool's other slots are the cache's
  if (prefix_ && opts_.stage > 0) {
    // The cache replicas must make stage 0's lookups and commits in stage 0's order, which is the
    // order its chunks arrive in: compute strictly in that order (ids of ended requests are skipped).
    while (!chunk_order_.empty() && !requests_.count(chunk_order_.front())) chunk_order_.pop_front();
    if (chunk_order_.empty()) return nullptr;
    Request& r = requests_.at(chunk_order_.front());
    return r.open || slot_free ? &r : nullptr;
  }
  for (uint64_t id : order_) {
    Request& r = requests_.at(id);
    const bool has_input = opts_.stage == 0 ? (r.prefill && r.computed < r.prompt_len) : !r.arrived.empty();
    if (has_input && (r.open || slot_free)) return &r;
  }
  return nullptr;
}

bool PrefillStage::open_request(Request& r, ChunkCacheSync& sync) {
  const uint64_t resume_at = opts_.stage == 0 ? 0 : r.arrived.front().chunk_start;
  Result<PrefixLease> lease = PrefixLease{};
  if (!prefix_) {
    if (resume_at != 0) {
      fail_request(r.id, "stage 0 resumed the prompt at " + std::to_string(resume_at) +
                             " from its prefix cache but this stage runs without one (give every stage the same --prefix-* flags)");
      return false;
    }
    auto seq = pools_->open();
    if (!seq.is_ok()) {  // next_work saw a free slot: this is a bug, not back-pressure
      fail_request(r.id, "no free cache slot: " + seq.status().to_string());
      return false;
    }
    r.seq = std::move(seq).value();
  } else if (opts_.stage == 0) {
    lease = prefix_->open_first(r.prefill->token_ids, r.seq, sync, std::exchange(r.recompute, false));
  } else if (r.arrived.front().cache.prompt.empty()) {
    fail_request(r.id, "stage 0 runs without the prefix cache but this stage has one (give every stage the same --prefix-* flags)");
    return false;
  } else {
    const ChunkCacheSync& first = r.arrived.front().cache;
    r.cached_prompt = first.prompt;
    lease = prefix_->open_replica(r.cached_prompt, r.seq, resume_at, first.plan, opts_.stage);
    if (!lease.is_ok() && lease.status().code() == Code::NotFound) {   // this replica drifted
      ask_recompute(r, lease.status().message());
      return false;
    }
  }
  if (!lease.is_ok()) {
    fail_request(r.id, "prefix cache: " + lease.status().to_string());
    return false;
  }
  r.lease = std::move(lease).value();
  r.computed = r.lease.cached_tokens;
  r.open = true;
  ++open_requests_;
  return true;
}

bool PrefillStage::reserve(Request& r, int64_t n, uint32_t evictions) {
  Status st = !prefix_ ? pools_->reserve(r.seq, n)
              : opts_.stage == 0 ? prefix_->reserve_first(r.seq, n, r.evicted)
                                 : prefix_->reserve_replica(r.seq, n, evictions);
  if (!st.is_ok()) fail_request(r.id, "no room in the stage's caches: " + st.to_string());
  return st.is_ok();
}

Status PrefillStage::compute_chunk(Request& r) {
  ChunkCacheSync sync;   // stage 0's prefix-cache moves, sent with the chunk (later stages pass theirs on)
  if (!r.open && !open_request(r, sync)) return Status::ok();
  if (r.compute_begin_us < 0) r.compute_begin_us = steady_us();
  Activations act;
  const int64_t start = r.computed;
  if (opts_.stage == 0) {
    // Chunks end at absolute multiples of chunk_size: a prompt resumed from the cache cuts its KDA
    // chunks where the full pass does, so its caches and logits are the same bits.
    const int64_t end = std::min<int64_t>(r.prompt_len, (start / opts_.chunk_size + 1) * opts_.chunk_size);
    act = model_->embed(std::span<const int32_t>(r.prefill->token_ids).subspan(start, end - start));
  } else {
    sync = std::move(r.arrived.front().cache);
    act = on_backend(backend_, std::move(r.arrived.front().act));
    r.arrived.pop_front();
    if (prefix_) chunk_order_.pop_front();   // next_work took this request from its front
  }
  const int64_t n = act.rows();
  if (!reserve(r, n, sync.evictions_before)) return Status::ok();
  if (opts_.stage == 0) sync.evictions_before = std::exchange(r.evicted, 0);
  BatchItem item{.seq = &r.seq, .num_new = n};
  if (prefix_) item.checkpoints = StagePrefixCache::checkpoints_in(r.lease, start, n);
  // A chunk can compute for longer than the heartbeat timeout (a big model, a loaded host): the
  // heartbeats due go out between its layers so decode and the router do not take the stage for dead.
  // Only sends: what arrived meanwhile is read by the next step(), after the chunk.
  const auto chunk_began = std::chrono::steady_clock::now();
  model_->forward(std::span(&item, 1), act, *pools_, [this] { driver_->heartbeat_if_due(); });
  spdlog::debug("prefill stage {}: request {} chunk [{}, {}) computed in {} ms", opts_.stage, trace_of(r.id), start,
                start + n,
                std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() - chunk_began).count());
  r.seq.num_tokens += n;
  r.computed += n;
  if (prefix_ && r.computed == r.prompt_len)   // every stage commits at its compute end: the same order
    prefix_->commit(r.lease, opts_.stage == 0 ? std::span<const int32_t>(r.prefill->token_ids) : r.cached_prompt, r.seq);
  if (to_next_) {
    K3_TRY(to_next_->send(ActivationChunk{.request_id = r.id, .epoch = r.epoch, .chunk_start = static_cast<uint64_t>(start),
                                          .prompt_len = r.prompt_len, .act = host_copy(backend_, act),
                                          .cache = std::move(sync)}));
  } else if (r.computed == r.prompt_len) {
    const int32_t row = static_cast<int32_t>(n - 1);
    r.last_logits = model_->backend_logits(act, std::span(&row, 1));
  }
  const uint64_t id = r.id;
  stream_rows(r);   // may end the request (its driver record ended meanwhile): look it up again
  if (auto it = requests_.find(id); it != requests_.end()) maybe_report(it->second);
  return Status::ok();
}

void PrefillStage::maybe_report(Request& r) {
  if (!r.prefill || r.prompt_len == 0 || r.computed != r.prompt_len) return;
  if (r.reported) return end_request(r.id);   // a recompute for the later stages: reported before
  if (opts_.on_timing)
    opts_.on_timing({.request_id = r.id, .span = StageTiming::Span::Compute, .begin_us = r.compute_begin_us, .end_us = steady_us()});
  std::vector<uint8_t> bytes;
  transfer::StageSource src =
      transfer::pack_stage_source(layout_, prefill_layout_, static_cast<uint32_t>(opts_.stage), r.prompt_len);
  if (!r.streaming) {
    export_caches(backend_, *pools_, r.seq, begin_, end_, bytes);
    if (src.total_bytes != bytes.size())
      return fail_request(r.id, "cache image is " + std::to_string(bytes.size()) + " bytes, the transfer layout expects " +
                                    std::to_string(src.total_bytes));
  } else if (uint8_t* image = driver_->stream_buffer(r.id)) {
    // The rows went chunk by chunk; the KDA states are final only now.
    export_cache_part(backend_, *pools_, r.seq, begin_, end_, r.prompt_len, r.rows_exported, r.prompt_len, true, image);
    r.rows_exported = r.prompt_len;
  } else {
    return end_request(r.id);   // the driver ended its part (abort, failure): nothing to report
  }
  std::optional<int32_t> first_token;
  std::vector<protocol::TokenLogprobs> first_logprobs;
  std::vector<int32_t> choice_first_tokens;
  if (is_last()) {
    const protocol::SamplingParams& sp = r.prefill->sampling;
    // Logprobs describe the model: their copy is taken before a structured-output mask changes the row.
    Tensor host;
    if (sp.logprobs >= 0) host = backend_.to_host(r.last_logits);
    auto constraint = grammar::TokenConstraint::for_format(sp.output_format, opts_.vocab, sp.stop_token_ids);
    if (!constraint.is_ok()) return fail_request(r.id, "output format: " + constraint.status().to_string());
    if (*constraint) {
      TokenMask mask(cfg_.vocab_size);
      const size_t k = mask.add_row(0);
      if ((*constraint)->fill_mask(mask.row_bits(k), cfg_.vocab_size) == 0)
        return fail_request(r.id, "constrained decoding: no token fits the grammar at the start");
      apply_token_mask(r.last_logits, mask);
    }
    // n choices share this prefill: each draws its first token from the same row with its own seed stream.
    const std::vector<ops::LogitBias> biases = logit_biases(sp);
    for (uint32_t c = 0; c < std::max<uint32_t>(sp.n, 1); ++c) {
      std::vector<int32_t> out;
      ops::SamplingRow row = sampling_row(sp);  // step 0: nothing generated yet for the penalties
      row.seed = ops::choice_seed(sp.seed, c);
      row.logit_bias = biases;
      backend_.sample({.logits = r.last_logits, .rows = {row}, .out = &out});
      if (c == 0) first_token = out.at(0);
      else choice_first_tokens.push_back(out.at(0));
      if (sp.logprobs >= 0)  // the only time the logits leave the backend: they were asked for
        first_logprobs.push_back(to_wire(row_logprobs(host.f32(), cfg_.vocab_size, out.at(0), sp.logprobs)));
    }
  }
  const uint64_t id = r.id;
  spdlog::info("prefill stage {}: request {} computed ({} tokens{})", opts_.stage, trace_of(id), r.prompt_len,
               first_token ? ", first token " + std::to_string(*first_token) : std::string());
  if (prefix_) remember_reported(*r.prefill, r.epoch);   // a later stage may ask for a recompute
  const bool streamed = r.streaming;
  end_request(id);  // local caches go now: the driver holds the packed copy until the request ends
  ++prompts_prefilled_;
  if (streamed)
    absorb(driver_->stream_computed(id, std::move(src), first_token, std::move(first_logprobs), std::move(choice_first_tokens)));
  else
    absorb(driver_->stage_computed(id, std::move(src), std::move(bytes), first_token, std::move(first_logprobs),
                                   std::move(choice_first_tokens)));
}

Status PrefillStage::run_once(std::chrono::milliseconds idle_wait) {
  const bool busy = next_work() != nullptr;
  // Stages > 0 also wait on the activation socket, which the driver's poll does not watch.
  const auto wait = busy ? 0ms : (from_prev_ ? std::min(idle_wait, std::chrono::milliseconds(2)) : idle_wait);
  K3_ASSIGN_OR_RETURN(auto step, driver_->step(wait));
  absorb(step.actions);
  for (const protocol::Prefill& p : step.accepted) on_accepted(p);
  if (from_prev_) {
    for (;;) {
      K3_ASSIGN_OR_RETURN(auto frame, from_prev_->try_receive());
      if (!frame) break;
      auto chunk = decode_chunk(*frame);
      if (!chunk.is_ok()) {
        spdlog::warn("prefill stage {}: dropped a bad activation frame: {}", opts_.stage, chunk.status().to_string());
        continue;
      }
      on_chunk(std::move(chunk).value());
    }
  }
  if (to_next_) {
    for (;;) {
      K3_ASSIGN_OR_RETURN(auto frame, to_next_->try_receive_back());
      if (!frame) break;
      auto rr = decode_recompute(*frame);
      if (!rr.is_ok()) {
        spdlog::warn("prefill stage {}: dropped a bad frame from the next stage: {}", opts_.stage, rr.status().to_string());
        continue;
      }
      on_recompute(*rr);
    }
  }
  if (Request* r = next_work()) K3_TRY(compute_chunk(*r));
  return Status::ok();
}

protocol::PrefixCacheReport PrefillStage::prefix_report() const {
  protocol::PrefixCacheReport r;
  r.pool_pages = static_cast<uint32_t>(opts_.cache.num_pages);
  r.pool_free_pages = static_cast<uint32_t>(pools_->free_pages());
  r.pool_slots = static_cast<uint32_t>(pools_->total_slots());
  r.pool_free_slots = static_cast<uint32_t>(pools_->free_slots());
  r.prompts_prefilled = prompts_prefilled_;
  if (auto f = pools_->fragmentation()) {
    r.region_free_bytes = f->free_bytes;
    r.region_free_extents = f->extents;
  }
  r.region_slot_moves = pools_->slot_moves();
  if (!prefix_) return r;
  const PrefixCache& c = prefix_->cache();
  r.block_tokens = static_cast<uint32_t>(c.options().block_tokens);
  r.block_hashes = c.tree().checkpoint_hashes();
  r.lookup_tokens = c.stats().lookup_tokens;
  r.hit_tokens = c.stats().hit_tokens;
  r.checkpoints_stored = c.stats().checkpoints_stored;
  r.checkpoints_evicted = c.stats().checkpoints_evicted;
  r.cache_bytes = c.tree().bytes();
  return r;
}

}  // namespace k3::prefill
