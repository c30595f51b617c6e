// LocalEngineService's admission: a waiting request starts when a slot (and one per fork to come) and
// its pages are free. Pages: its prompt and a generation reserve, less what a prefix-cache hit shares,
// beside what the running requests still take.
#include <algorithm>
#include <string>

#include "router/local_engine_running.h"

namespace k3::router {
namespace {

// Tokens of generation a request is admitted with room for (as the cluster router's reserve): more
// would keep long-answer requests out for room they may never use; past it the pages are taken as it goes.
constexpr int64_t kGenerationReserve = 32;

// Slots the running requests hold now, and the ones their pending forks will take.
int64_t slots_claimed(const std::vector<std::unique_ptr<LocalEngineService::Running>>& running, bool pending_only) {
  int64_t n = 0;
  for (const auto& r : running)
    if (r) n += r->forks_pending + (pending_only ? 0 : 1);
  return n;
}

// Pages to take for `tokens` tokens of pages of `page_size` tokens, holding `held` already.
int64_t pages_beyond(int64_t tokens, int64_t held, int page_size) {
  return std::max<int64_t>(0, (tokens + page_size - 1) / page_size - held);
}

}  // namespace

int64_t LocalEngineService::pages_for(const Running& r, int64_t tokens) const {
  return pages_beyond(tokens, static_cast<int64_t>(r.seq.pages.size()), opts_.page_size);
}

int64_t LocalEngineService::owed_by(const GenerationParams& p, int64_t held_pages, int forks) const {
  const int64_t reserve = std::min<int64_t>(p.max_tokens, kGenerationReserve);
  // A fork shares the full pages and copies the last partial one, then grows on its own.
  const int64_t per_fork = 1 + pages_beyond(reserve, 0, opts_.page_size);
  return pages_beyond(static_cast<int64_t>(p.prompt.size()) + reserve, held_pages, opts_.page_size) + forks * per_fork;
}

int64_t LocalEngineService::pages_owed(const Running& r) const {
  return owed_by(r.params, static_cast<int64_t>(r.seq.pages.size()), r.forks_pending);
}

int64_t LocalEngineService::hit_pages(std::span<const int32_t> prompt) const {
  const PrefixCache* pc = engine_->prefix_cache();
  if (!pc || prompt.empty()) return 0;
  // The lookup's own limit (the last prompt token is always computed); the pages are shared, not taken.
  return static_cast<int64_t>(pc->tree().peek(prompt, static_cast<int64_t>(prompt.size()) - 1).pages.size());
}

bool LocalEngineService::pages_fit(int64_t pages) {
  if (PrefixCache* pc = engine_->prefix_cache()) return pc->make_room(0, static_cast<int>(pages));
  return engine_->caches().free_pages() >= pages;
}

void LocalEngineService::admit(std::vector<std::unique_ptr<Running>>& running,
                               std::vector<std::pair<std::unique_ptr<Running>, Status>>& refused) {
  // A request takes its n slots' room at admission (its forks take theirs when its prefill ends). One
  // short of pages is tried again only once a running request ended (nothing else gives pages back).
  if (pages_blocked_at_ && (*pages_blocked_at_ != ended_ || running.empty())) pages_blocked_at_.reset();
  while (!pages_blocked_at_ && !waiting_.empty() &&
         slots_claimed(running, false) + waiting_.front().params.n <= opts_.max_running &&
         engine_->caches().free_slots() - slots_claimed(running, true) >= waiting_.front().params.n) {
    // Pages: its prompt and generation reserve (less the pages a prefix hit shares) beside what the
    // running ones still take. Short, it waits at the head of the queue (no overtaking) while they make
    // room; with nothing running there is nobody to make room, so it could never run: it fails, saying so.
    // Checked first without the lookup (which counts in the cache's statistics and copies a checkpoint),
    // then again with what the lookup took: its slot and planned checkpoints take region bytes too (in a
    // unified region, page room); short then, it backs out as if never looked up.
    Waiting& head = waiting_.front();
    int64_t others = 0;
    for (const auto& q : running) others += pages_owed(*q);
    int64_t owed = others + owed_by(head.params, hit_pages(head.params.prompt), head.params.n - 1);
    std::unique_ptr<Running> r;
    if (pages_fit(owed)) {
      r = std::make_unique<Running>();
      if (PrefixCache* pc = engine_->prefix_cache()) {
        // A hit restores the cached prefix into the request's own slot (copy-on-write) and pages.
        auto lease = pc->acquire(head.params.prompt, r->seq);
        if (!lease.is_ok()) break;
        r->lease = std::move(lease).value();
        r->prefilled = static_cast<size_t>(r->lease.cached_tokens);
      } else {
        auto seq = engine_->open();
        if (!seq.is_ok()) break;
        r->seq = std::move(seq).value();
      }
      owed = others + owed_by(head.params, static_cast<int64_t>(r->seq.pages.size()), head.params.n - 1);
      if (!pages_fit(owed)) {
        if (PrefixCache* pc = engine_->prefix_cache()) pc->withdraw(r->lease, head.params.prompt);
        engine_->close(r->seq);
        r.reset();
      }
    }
    if (!r) {
      if (!running.empty()) {
        pages_blocked_at_ = ended_;
        break;
      }
      auto refused_one = std::make_unique<Running>();
      refused_one->id = head.id;
      refused_one->sink = std::move(head.sink);
      refused.emplace_back(std::move(refused_one), Status(Code::ResourceExhausted,
          "out of KV pages: the prompt and a " + std::to_string(kGenerationReserve) + "-token generation reserve need " +
              std::to_string(owed) + " pages, the cache has " + std::to_string(engine_->caches().free_pages()) +
              " free with nothing else running"));
      waiting_.pop_front();
      continue;
    }
    r->id = head.id;
    r->params = std::move(head.params);
    r->sink = std::move(head.sink);
    r->forks_pending = r->params.n - 1;
    waiting_.pop_front();
    start_output(*r);
    running.push_back(std::move(r));
  }
}

}  // namespace k3::router
