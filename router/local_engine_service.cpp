#include "router/local_engine_service.h"

#include <algorithm>
#include <cmath>

#include "engine/token_logprobs.h"
#include "kernels/token_mask.h"
#include "router/local_engine_running.h"
#include "router/text_stream.h"

namespace k3::router {

Result<std::unique_ptr<LocalEngineService>> LocalEngineService::open(const std::string& model_dir,
                                                                     const LocalEngineOptions& opts) {
  K3_ASSIGN_OR_RETURN(ModelConfig cfg, load_model_config(model_dir + "/config.json"));
  K3_ASSIGN_OR_RETURN(Tokenizer tok, Tokenizer::load(model_dir));
  K3_ASSIGN_OR_RETURN(WeightStore weights, load_weights(model_dir, cfg));
  weights.set_upload_observer(opts.on_upload);
  return create(cfg, std::move(weights), std::make_shared<const Tokenizer>(std::move(tok)), opts);
}

Result<std::unique_ptr<LocalEngineService>> LocalEngineService::create(const ModelConfig& cfg, WeightStore weights,
                                                                       std::shared_ptr<const Tokenizer> tokenizer,
                                                                       const LocalEngineOptions& opts) {
  if (opts.max_running < 1) return invalid_argument("max_running must be >= 1");
  if (opts.max_queue < 0) return invalid_argument("max_queue must be >= 0");
  if (opts.prefill_chunk < 0) return invalid_argument("prefill_chunk must be >= 0");
  if (opts.page_size < 1) return invalid_argument("page_size must be >= 1");
  if (!tokenizer) return invalid_argument("tokenizer is required");
  std::unique_ptr<LocalEngineService> s(new LocalEngineService());
  s->cfg_ = cfg;
  s->opts_ = opts;
  s->tokenizer_ = std::move(tokenizer);
  s->weights_ = std::move(weights);
  s->vocab_bytes_ = grammar::TokenVocab::from_tokenizer(*s->tokenizer_);
  K3_ASSIGN_OR_RETURN(s->backend_, make_backend(opts.backend));
  EngineOptions eo;
  eo.prefill_chunk = opts.prefill_chunk;
  eo.top_logits = 0;
  eo.cache.max_seqs = opts.max_running;
  eo.cache.page_size = opts.page_size;
  // Enough pages for every slot at full context, so a reserve inside a step never fails mid-batch.
  const int64_t per_seq = (cfg.max_position_embeddings + opts.page_size - 1) / opts.page_size + 1;
  eo.cache.num_pages = opts.cache_pages > 0 ? opts.cache_pages : static_cast<int>(per_seq * opts.max_running);
  if (opts.prefix_checkpoint_slots > 0) {
    eo.cache.checkpoint_slots = opts.prefix_checkpoint_slots;
    eo.prefix_cache = {.enabled = true, .block_tokens = opts.prefix_block_tokens,
                       .checkpoint_every = opts.prefix_checkpoint_every, .budget_bytes = opts.prefix_budget_bytes};
  }
  eo.cache.region_bytes = opts.cache_region_bytes;
  K3_TRY(check_region_bytes(s->cfg_, *s->backend_, 0, s->cfg_.num_hidden_layers, eo.cache, "--cache-region-mib"));
  K3_ASSIGN_OR_RETURN(s->engine_, Engine::create(*s->backend_, s->cfg_, s->weights_, eo));
  s->free_slots_ = s->engine_->caches().free_slots();
  s->free_pages_ = s->engine_->caches().free_pages();
  s->publish_cache_region();
  s->worker_ = std::thread([p = s.get()] { p->worker_loop(); });
  return s;
}

LocalEngineService::~LocalEngineService() {
  shutdown();
  if (worker_.joinable()) worker_.join();
}

Result<RequestHandle> LocalEngineService::submit(GenerationParams params, EventSink sink) {
  K3_TRY(check_generation_params(params, bool(sink), cfg_.vocab_size, cfg_.max_position_embeddings));
  if (params.n > opts_.max_running)
    return invalid_argument("n: " + std::to_string(params.n) + " choices do not fit this server's running batch of " +
                            std::to_string(opts_.max_running) + " sequences");
  if (params.grammar.tool_calls && !vocab_bytes_->tools.present())
    return invalid_argument("tools: the tokenizer has no tool-call tokens, so tool calls cannot be served");
  std::lock_guard lk(mu_);
  if (stopping_) return Status(Code::Unavailable, "the engine is shutting down");
  // Free engine slots take requests at once, so they count as room too (max_queue 0 = no waiting).
  if (static_cast<int64_t>(waiting_.size()) >= opts_.max_queue + std::max<int64_t>(0, free_slots_.load()))
    return Status(Code::ResourceExhausted, "the request queue is full (" + std::to_string(opts_.max_queue) + " waiting)");
  const RequestHandle id = next_id_++;
  waiting_.push_back({.id = id, .params = std::move(params), .sink = std::move(sink)});
  live_.insert(id);
  cv_.notify_all();
  return id;
}

void LocalEngineService::cancel(RequestHandle handle) {
  {
    std::lock_guard lk(mu_);
    if (!live_.count(handle)) return;
    auto it = std::find_if(waiting_.begin(), waiting_.end(), [&](const Waiting& w) { return w.id == handle; });
    if (it != waiting_.end()) {
      waiting_.erase(it);
      live_.erase(handle);
      return;
    }
    cancelled_.insert(handle);
    cv_.notify_all();
  }
  // Wait out a callback that may be running right now; later ones see the cancelled mark.
  std::lock_guard sink_lk(sink_mu_);
}

ServiceStats LocalEngineService::stats() const {
  std::lock_guard lk(mu_);
  return {.waiting = static_cast<int64_t>(waiting_.size()), .running = running_count_.load(),
          .free_slots = free_slots_.load(), .free_pages = free_pages_.load(),
          .prefix_lookup_tokens = prefix_lookup_.load(), .prefix_hit_tokens = prefix_hit_.load(),
          .prefix_checkpoints_stored = prefix_stored_.load(), .prefix_checkpoints_evicted = prefix_evicted_.load(),
          .prefix_cache_bytes = prefix_bytes_.load(), .prompts_prefilled = prompts_prefilled_.load(),
          .cache_free_bytes = cache_free_bytes_.load(), .cache_largest_free_extent_bytes = cache_largest_free_.load(),
          .cache_free_extents = cache_free_extents_.load(), .cache_slot_moves = cache_slot_moves_.load()};
}

void LocalEngineService::shutdown() {
  std::lock_guard lk(mu_);
  stopping_ = true;
  cv_.notify_all();
}

void LocalEngineService::finish(Running& r, GenerationEvent&& ev) {
  if (r.done) return;
  r.done = true;
  ChoiceFamily& family = *r.family;
  // After a Failed event nothing more goes out for the request (the contract in generation_service.h).
  const bool send = !family.failed;
  if (ev.kind == GenerationEvent::Kind::Failed) family.failed = true;
  else ev.choice = r.choice;
  if (send) {
    std::lock_guard sink_lk(sink_mu_);
    bool cancelled;
    {
      std::lock_guard lk(mu_);
      cancelled = cancelled_.count(r.id) != 0;
    }
    if (!cancelled) r.sink(std::move(ev));
  }
  if (--family.open > 0) return;
  std::lock_guard lk(mu_);
  live_.erase(r.id);
  cancelled_.erase(r.id);
}

void LocalEngineService::emit_token(Running& r, const float* row) {
  if (r.family->failed) {  // another choice failed the request: this one ends without a word
    finish(r, {.kind = GenerationEvent::Kind::Failed});
    return;
  }
  const int64_t vocab = cfg_.vocab_size;
  ops::SamplingRow srow = r.params.sampling;
  srow.step = r.generated.size();
  srow.generated = r.generated;
  srow.logit_bias = r.params.logit_bias;
  std::vector<int32_t> out;
  Tensor one = Tensor::from_f32({1, vocab}, std::span<const float>(row, vocab));
  if (r.constraint) {
    // Structured output: only tokens that keep the text a prefix of a valid document (logprobs
    // below still describe the unmasked model).
    TokenMask mask(vocab);
    const size_t k = mask.add_row(0);
    if (r.constraint->fill_mask(mask.row_bits(k), vocab) == 0) {
      finish(r, {.kind = GenerationEvent::Kind::Failed,
                 .error = internal_error("constrained decoding: no token fits the grammar here")});
      return;
    }
    apply_token_mask(one, mask);
  }
  backend_->sample({.logits = one, .rows = {srow}, .out = &out});
  const int32_t id = out.at(0);
  r.generated.push_back(id);
  if (r.constraint) {
    if (Status st = r.constraint->accept(id); !st.is_ok()) {
      finish(r, {.kind = GenerationEvent::Kind::Failed, .error = st});
      return;
    }
  }

  GenerationEvent ev;
  ev.kind = GenerationEvent::Kind::Tokens;
  ev.choice = r.choice;
  ev.token_ids = {id};
  if (r.params.logprobs >= 0) {
    RowLogprobs lp = row_logprobs(row, vocab, id, r.params.logprobs);
    ev.logprobs.push_back({.id = id, .logprob = lp.logprob, .top = std::move(lp.top)});
  }
  auto text = r.text->push(id);
  if (!text.is_ok()) {
    finish(r, {.kind = GenerationEvent::Kind::Failed, .error = text.status()});
    return;
  }
  ev.text = std::move(text).value();

  std::string reason;
  const auto& stops = r.params.stop_ids;
  // A closed JSON document ends the generation at once: nothing may follow it but EOS.
  if (std::find(stops.begin(), stops.end(), id) != stops.end() || r.text->stopped() ||
      (r.constraint && r.constraint->closed()))
    reason = "stop";
  else if (static_cast<int>(r.generated.size()) >= r.params.max_tokens) reason = "length";
  if (!reason.empty()) ev.text += r.text->flush();
  {
    std::lock_guard sink_lk(sink_mu_);
    bool cancelled;
    {
      std::lock_guard lk(mu_);
      cancelled = cancelled_.count(r.id) != 0;
    }
    if (!cancelled) r.sink(std::move(ev));
  }
  if (!reason.empty())
    finish(r, {.kind = GenerationEvent::Kind::Finished, .finish_reason = reason,
               .prompt_tokens = static_cast<int64_t>(r.params.prompt.size()),
               .completion_tokens = static_cast<int64_t>(r.generated.size())});
}

void LocalEngineService::start_output(Running& r) {
  // submit() checked what create() needs: it cannot fail here.
  r.constraint = grammar::TokenConstraint::create(r.params.grammar, vocab_bytes_, r.params.stop_ids).value();
  r.text = std::make_unique<TextStream>(tokenizer_text_stream(tokenizer_, r.params.stop_strings, r.params.stop_ids));
}

Status LocalEngineService::fork_choices(Running& r, std::vector<std::unique_ptr<Running>>& forks) {
  const int n = r.params.n;
  r.forks_pending = 0;
  for (int i = 1; i < n; ++i) {
    auto seq = engine_->caches().fork(r.seq);
    if (!seq.is_ok()) {
      for (auto& f : forks) close_request(*f);
      r.family->open -= static_cast<int>(forks.size());
      forks.clear();
      return Status(seq.status().code(), "n: choice " + std::to_string(i) + " could not fork: " + seq.status().message());
    }
    auto f = std::make_unique<Running>();
    f->id = r.id;
    f->choice = i;
    f->family = r.family;
    ++f->family->open;
    f->params = r.params;
    f->params.sampling.seed = ops::choice_seed(r.params.sampling.seed, static_cast<uint32_t>(i));
    f->sink = r.sink;
    f->seq = std::move(seq).value();
    f->prefilled = r.prefilled;
    start_output(*f);
    forks.push_back(std::move(f));
  }
  return Status::ok();
}

void LocalEngineService::close_request(Running& r) {
  if (PrefixCache* pc = engine_->prefix_cache()) pc->release(r.lease);
  engine_->close(r.seq);
}

void LocalEngineService::publish_cache_region() {
  if (auto f = engine_->caches().fragmentation()) {
    cache_free_bytes_ = f->free_bytes;
    cache_largest_free_ = f->largest_extent_bytes;
    cache_free_extents_ = f->extents;
  }
  cache_slot_moves_ = engine_->caches().slot_moves();
}

void LocalEngineService::publish_stats(const std::vector<std::unique_ptr<Running>>& running) {
  running_count_ = static_cast<int64_t>(running.size());
  // Checkpoint slots share the allocator: report only what requests can still take.
  free_slots_ = std::min<int64_t>(engine_->caches().free_slots(), opts_.max_running - static_cast<int64_t>(running.size()));
  free_pages_ = engine_->caches().free_pages();
  publish_cache_region();
  if (const PrefixCache* pc = engine_->prefix_cache()) {
    prefix_lookup_ = pc->stats().lookup_tokens;
    prefix_hit_ = pc->stats().hit_tokens;
    prefix_stored_ = pc->stats().checkpoints_stored;
    prefix_evicted_ = pc->stats().checkpoints_evicted;
    prefix_bytes_ = pc->tree().bytes();
  }
}

void LocalEngineService::step(std::vector<std::unique_ptr<Running>>& running) {
  // 1. Drop cancelled requests (their caches go back now), 2. admit waiting ones into free slots.
  std::vector<std::pair<std::unique_ptr<Running>, Status>> refused;   // told outside the lock (finish takes it)
  {
    std::lock_guard lk(mu_);
    for (auto& r : running)   // every choice of a cancelled request
      if (cancelled_.count(r->id)) {
        close_request(*r);
        r.reset();
      }
    ended_ += std::erase(running, nullptr);
    for (RequestHandle id : cancelled_) live_.erase(id);
    std::erase_if(cancelled_, [&](RequestHandle id) { return !live_.count(id); });
    admit(running, refused);
  }
  for (auto& [r, why] : refused) finish(*r, {.kind = GenerationEvent::Kind::Failed, .error = why});
  publish_stats(running);

  auto fail = [&](Running& r, const Status& s) { finish(r, {.kind = GenerationEvent::Kind::Failed, .error = s}); };
  try {
    // 3. One prefill chunk per prefilling request.
    std::vector<std::unique_ptr<Running>> forked;
    for (auto& r : running) {
      const auto& prompt = r->params.prompt;
      if (r->done || r->prefilled >= prompt.size()) continue;
      const size_t chunk = opts_.prefill_chunk > 0 ? static_cast<size_t>(opts_.prefill_chunk) : prompt.size();
      const size_t end = std::min(prompt.size(), r->prefilled + chunk);
      Result<Tensor> logits = Status(Code::Internal, "not fed");
      if (PrefixCache* pc = engine_->prefix_cache()) {
        if (!pc->make_room(0, static_cast<int>(pages_for(*r, end)))) {
          fail(*r, Status(Code::ResourceExhausted, "out of KV pages"));
          continue;
        }
        logits = engine_->prefill_planned_on_backend(r->seq, prompt, r->lease.plan, static_cast<int64_t>(end));
        if (logits.is_ok()) logits = backend_->to_host(*logits);
        if (logits.is_ok() && end == prompt.size()) pc->commit(r->lease, prompt, r->seq);
      } else {
        std::vector<int32_t> piece(prompt.begin() + r->prefilled, prompt.begin() + end);
        SeqCache* s = &r->seq;
        logits = engine_->feed(std::span<SeqCache* const>(&s, 1), std::span<const std::vector<int32_t>>(&piece, 1));
      }
      if (!logits.is_ok()) { fail(*r, logits.status()); continue; }
      r->prefilled = end;
      if (end != prompt.size()) continue;
      ++prompts_prefilled_;
      // n > 1: the other choices fork from this prefill and draw their first tokens from its logits.
      std::vector<std::unique_ptr<Running>> forks;
      if (Status st = fork_choices(*r, forks); !st.is_ok()) {
        fail(*r, st);
        continue;
      }
      emit_token(*r, logits->f32());
      for (auto& f : forks) emit_token(*f, logits->f32());
      for (auto& f : forks) forked.push_back(std::move(f));
    }
    for (auto& f : forked) running.push_back(std::move(f));
    // 4. One batched decode step over every request that has a token to feed.
    std::vector<SeqCache*> seqs;
    std::vector<std::vector<int32_t>> toks;
    std::vector<Running*> which;
    for (auto& r : running)
      // Each decode feeds the last sampled token (a request whose prompt finished this step included).
      if (!r->done && r->prefilled == r->params.prompt.size() && !r->generated.empty()) {
        seqs.push_back(&r->seq);
        toks.push_back({r->generated.back()});
        which.push_back(r.get());
      }
    if (!seqs.empty()) {
      if (PrefixCache* pc = engine_->prefix_cache()) {
        int64_t need = 0;
        for (Running* r : which) need += pages_for(*r, r->seq.num_tokens + 1);
        pc->make_room(0, static_cast<int>(need));   // a shortfall fails in feed, naming it
      }
      auto logits = engine_->feed(seqs, toks);
      if (!logits.is_ok()) {
        for (Running* r : which) fail(*r, logits.status());
      } else {
        for (size_t j = 0; j < which.size(); ++j) emit_token(*which[j], logits->f32() + j * cfg_.vocab_size);
      }
    }
  } catch (const std::exception& e) {
    for (auto& r : running)
      if (!r->done) fail(*r, internal_error(std::string("engine step failed: ") + e.what()));
  }
  for (auto& r : running)
    if (r->done) {
      close_request(*r);
      r.reset();
    }
  ended_ += std::erase(running, nullptr);
  publish_stats(running);
}

void LocalEngineService::worker_loop() {
  std::vector<std::unique_ptr<Running>> running;
  for (;;) {
    {
      std::unique_lock lk(mu_);
      cv_.wait(lk, [&] { return stopping_.load() || !waiting_.empty() || !running.empty() || !cancelled_.empty(); });
      if (stopping_) break;
      // Cancellations of ids that are no longer running need no engine work.
      if (running.empty() && waiting_.empty()) cancelled_.clear();
    }
    step(running);
  }
  const Status bye(Code::Unavailable, "the server is shutting down");
  for (auto& r : running) {
    finish(*r, {.kind = GenerationEvent::Kind::Failed, .error = bye});
    close_request(*r);
  }
  running.clear();
  std::deque<Waiting> waiting;
  {
    std::lock_guard lk(mu_);
    waiting.swap(waiting_);
  }
  for (Waiting& w : waiting) {
    Running r;
    r.id = w.id;
    r.sink = std::move(w.sink);
    finish(r, {.kind = GenerationEvent::Kind::Failed, .error = bye});
  }
  publish_stats(running);
}

}  // namespace k3::router
