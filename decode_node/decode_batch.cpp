#include "decode_node/decode_batch.h"

#include <spdlog/spdlog.h>

#include <algorithm>

#include "engine/cache_io.h"
#include "decode_node/draw_tokens.h"

namespace k3::decode {

DecodeBatch::~DecodeBatch() {
  for (auto& [id, s] : seqs_) engine_.close(s.cache);
}

void DecodeBatch::add(uint64_t id, std::vector<uint8_t> image, int64_t num_tokens, int32_t last_token,
                      ops::SamplingRow sampling, uint64_t step, int logprobs, grammar::TokenConstraint* constraint) {
  K3_CHECK(step == 1, "decode batch: a request joins after its first token (step 1), got step " + std::to_string(step));
  remove(id);
  seqs_[id] = Seq{.order = next_order_++, .running = false, .cache = {}, .image = std::move(image),
                  .num_tokens = num_tokens, .last_token = last_token, .sampling = sampling, .step = step,
                  .generated = {last_token}, .logit_bias = {sampling.logit_bias.begin(), sampling.logit_bias.end()},
                  .logprobs = logprobs, .constraint = constraint};
}

void DecodeBatch::add_resident(uint64_t id, SeqCache cache, int32_t last_token, ops::SamplingRow sampling,
                               uint64_t step, int logprobs, grammar::TokenConstraint* constraint) {
  K3_CHECK(step == 1, "decode batch: a request joins after its first token (step 1), got step " + std::to_string(step));
  remove(id);
  const int64_t num_tokens = cache.num_tokens;
  seqs_[id] = Seq{.order = next_order_++, .running = true, .cache = std::move(cache), .image = {},
                  .num_tokens = num_tokens, .last_token = last_token, .sampling = sampling, .step = step,
                  .generated = {last_token}, .logit_bias = {sampling.logit_bias.begin(), sampling.logit_bias.end()},
                  .logprobs = logprobs, .constraint = constraint};
}

void DecodeBatch::remove(uint64_t id) {
  auto it = seqs_.find(id);
  if (it == seqs_.end()) return;
  engine_.close(it->second.cache);
  seqs_.erase(it);
}

size_t DecodeBatch::num_running() const {
  return static_cast<size_t>(std::count_if(seqs_.begin(), seqs_.end(), [](const auto& kv) { return kv.second.running; }));
}

int64_t DecodeBatch::pages_for(int64_t tokens) const {
  const int64_t ps = engine_.caches().options().page_size;
  return (tokens + ps - 1) / ps;
}

int64_t DecodeBatch::growth_pages() const {
  int64_t need = 0;
  for (const auto& [id, s] : seqs_)
    if (s.running) need += std::max<int64_t>(0, pages_for(s.num_tokens + 1) - static_cast<int64_t>(s.cache.pages.size()));
  return need;
}

std::vector<uint64_t> DecodeBatch::by_order(bool running) const {
  std::vector<std::pair<uint64_t, uint64_t>> v;
  for (const auto& [id, s] : seqs_)
    if (s.running == running) v.push_back({s.order, id});
  std::sort(v.begin(), v.end());
  std::vector<uint64_t> ids;
  for (const auto& [order, id] : v) ids.push_back(id);
  return ids;
}

Status DecodeBatch::resume(Seq& s) {
  CachePools& pools = engine_.caches();
  K3_ASSIGN_OR_RETURN(SeqCache cache, engine_.open());
  if (Status st = pools.reserve(cache, s.num_tokens); !st.is_ok()) {
    engine_.close(cache);
    return st;
  }
  const int layers = engine_.config().num_hidden_layers;
  if (Status st = import_caches(backend_, pools, cache, 0, layers, s.num_tokens, s.image.data(), s.image.size()); !st.is_ok()) {
    engine_.close(cache);
    return st;
  }
  cache.num_tokens = s.num_tokens;
  s.cache = std::move(cache);
  s.image = {};
  s.image.shrink_to_fit();
  s.running = true;
  return Status::ok();
}

void DecodeBatch::preempt(Seq& s) {
  export_caches(backend_, engine_.caches(), s.cache, 0, engine_.config().num_hidden_layers, s.image);
  engine_.close(s.cache);
  s.running = false;
  ++preemptions_;
}

bool DecodeBatch::fail_if_never_fits(uint64_t id, StepResult& out) {
  const int64_t total_pages = engine_.caches().options().num_pages;
  const int64_t tokens = seqs_.at(id).num_tokens + 1;
  if (pages_for(tokens) <= total_pages) return false;
  out.failed.push_back({id, "the decode cache (" + std::to_string(total_pages) + " pages) cannot hold " +
                                std::to_string(tokens) + " tokens"});
  remove(id);
  return true;
}

DecodeBatch::StepResult DecodeBatch::step() {
  StepResult out;
  CachePools& pools = engine_.caches();
  // Resume waiting requests, oldest first, while each fits with a page of headroom per running request.
  for (uint64_t id : by_order(false)) {
    if (fail_if_never_fits(id, out)) continue;
    Seq& s = seqs_.at(id);
    const size_t running = num_running();
    const int64_t need = pages_for(s.num_tokens + 1);
    // With none running, too, it waits until it can also take its next step (the pages it lacks are held
    // by others that give them back; resuming only to pause again would copy its caches every step).
    const int64_t headroom = growth_pages() + static_cast<int64_t>(running);
    if (pools.free_slots() == 0 || pools.free_pages() < need + headroom) break;
    if (Status st = resume(s); !st.is_ok()) {
      // Retried after the running ones made room, or (none running) after memory others hold comes back:
      // transfers landing in a cache that lives in the transfer pool, which end by their deadlines.
      if (running > 0 || st.code() == Code::ResourceExhausted) break;
      out.failed.push_back({id, "resume failed: " + st.to_string()});
      remove(id);
    }
  }
  // Every running request must be able to grow by one token: preempt the newest until they can.
  for (std::vector<uint64_t> running = by_order(true); growth_pages() > pools.free_pages() && running.size() > 1;
       running.pop_back()) {
    spdlog::info("decode: cache full ({} free pages), request {} preempted", pools.free_pages(), running.back());
    preempt(seqs_.at(running.back()));
  }
  std::vector<uint64_t> ids = by_order(true);
  if (ids.empty()) return out;
  if (growth_pages() > pools.free_pages()) {
    // A single request that cannot grow. Alone in the cache it always can (it fits the whole cache: checked
    // when it resumed, and its growth is bounded the same way below), so the pages it lacks are held by
    // others that give them back: requests still transferring into a cache that is the transfer pool. It
    // waits paused, as any preempted request does.
    if (fail_if_never_fits(ids[0], out)) return out;
    spdlog::info("decode: cache full ({} free pages, held by transfers), request {} paused", pools.free_pages(), ids[0]);
    preempt(seqs_.at(ids[0]));
    return out;
  }
  std::vector<SeqCache*> caches;
  std::vector<std::vector<int32_t>> toks;
  std::vector<DrawRow> rows;
  for (uint64_t id : ids) {
    Seq& s = seqs_.at(id);
    caches.push_back(&s.cache);
    toks.push_back({s.last_token});
    DrawRow row{.sampling = s.sampling, .logprobs = s.logprobs, .constraint = s.constraint};
    row.sampling.step = s.step;
    row.sampling.generated = s.generated;
    row.sampling.logit_bias = s.logit_bias;
    rows.push_back(row);
  }
  auto logits = engine_.feed_on_backend(caches, toks);  // sampled on the backend: only ids come back
  if (!logits.is_ok()) {
    for (uint64_t id : ids) {
      out.failed.push_back({id, "decode step failed: " + logits.status().to_string()});
      remove(id);
    }
    return out;
  }
  const std::vector<Drawn> drawn = draw_tokens(backend_, *logits, rows, engine_.config().vocab_size);
  for (size_t i = 0; i < ids.size(); ++i) {
    Seq& s = seqs_.at(ids[i]);
    if (!drawn[i].status.is_ok()) {
      out.failed.push_back({ids[i], drawn[i].status.to_string()});
      remove(ids[i]);
      continue;
    }
    s.num_tokens = s.cache.num_tokens;
    s.last_token = drawn[i].token;
    s.generated.push_back(drawn[i].token);
    ++s.step;
    out.tokens.push_back({ids[i], drawn[i].token});
    if (drawn[i].logprobs) out.logprobs[ids[i]] = *drawn[i].logprobs;
  }
  return out;
}

}  // namespace k3::decode
