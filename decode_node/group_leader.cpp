#include "decode_node/group_leader.h"

#include <spdlog/spdlog.h>

#include <algorithm>

#include "common/protocol/compat.h"
#include "common/core/node_process.h"
#include "decode_node/draw_tokens.h"
#include "decode_node/group_member.h"
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
  K3_ASSIGN_OR_RETURN(d->worker_, GroupWorker::create(backend, cfg, weights, opts.layout,
                                                          opts.collectives ? *opts.collectives : comm, o.cache));
  d->worker_->publish_to(d->metrics_);  // the leader's own steps and collectives on its /metrics
  d->next_.resize(static_cast<size_t>(opts.layout.size()));

  transfer::DecodeDriverConfig dc = decode_driver_config(o, cfg, d->full_layout_);
  // The leader's own region where its caches are (device memory on a GPU), as every member's is.
  dc.pool_memory = region_memory_for(backend);
  dc.cuda_device = o.cuda_device;
  // Every rank owns a region (region id = its global rank). DCP: one per rank of the layout, written by the
  // prefill stages with the interleave. EP: the leader's rank has the members' regions as alternates, and
  // a request is allocated whole in the region of the rank that will decode it (ep_region_order).
  for (int i = 1; i < opts.layout.size(); ++i) {
    const uint32_t id = o.rank + static_cast<uint32_t>(i);
    if (opts.layout.dcp > 1) dc.ranks.push_back(id);
    else dc.alternate_regions.push_back(id);
  }
  // Every other rank owns its region in its own process (member_region.h): ask all, then collect the answers.
  const GroupRegionRequest region_req{.first_rank = o.rank, .page_size = o.page_size, .num_pages = o.num_pages,
                                      .num_slots = o.num_slots};
  K3_ASSIGN_OR_RETURN(d->liveness_, MemberLiveness::bind(opts.liveness_bind, opts.layout.size(), o.heartbeat.interval,
                                                         o.heartbeat.misses, &d->metrics_));
  const GroupLiveness beacon_to{.endpoint = d->liveness_->endpoint(), .interval = o.heartbeat.interval};
  for (int i = 1; i < opts.layout.size(); ++i) {
    K3_TRY(send_region_request(comm, i, region_req));
    K3_TRY(send_group_liveness(comm, i, beacon_to));
  }
  for (int i = 1; i < opts.layout.size(); ++i) {
    K3_ASSIGN_OR_RETURN(protocol::MemoryRegion r, recv_region_offer(comm, i));
    if (r.region_id != o.rank + static_cast<uint32_t>(i))
      return invalid_argument("group rank " + std::to_string(i) + " offered the region of rank " +
                              std::to_string(r.region_id) + ", not " + std::to_string(o.rank + static_cast<uint32_t>(i)));
    dc.hosted_elsewhere.push_back(std::move(r));
  }
  // Every member's decode caches, before anything is admitted onto them (group_member.h).
  d->rooms_.resize(static_cast<size_t>(opts.layout.size()));
  d->committed_.assign(static_cast<size_t>(opts.layout.size()), 0);
  d->rooms_[0] = d->worker_->room();
  for (int i = 1; i < opts.layout.size(); ++i) {
    K3_ASSIGN_OR_RETURN(d->rooms_[static_cast<size_t>(i)], recv_group_room(comm, i));
  }
  GroupLeader* self = d.get();
  dc.on_state = [self](uint64_t id, protocol::RequestState st) {
    if (self->opts_.rank.on_state) self->opts_.rank.on_state(id, st);
    if (protocol::is_terminal(st)) self->pending_end_.push_back(id);
  };
  if (opts.layout.ep > 1)
    dc.side.region_order = [self](const protocol::Claim& c, std::vector<uint32_t> regions) {
      return self->ep_region_order(c, std::move(regions));
    };
  K3_ASSIGN_OR_RETURN(d->driver_, transfer::DecodeDriver::create(std::move(dc), zctx, &d->metrics_));
  d->liveness_->arm();  // every member beats by now: each started before it offered its region
  K3_TRY(d->driver_->connect_router());
  return d;
}

Status GroupLeader::while_waiting() {
  K3_TRY(liveness_->check());
  driver_->heartbeat_if_due();
  return Status::ok();
}

uint64_t GroupLeader::pool_free_bytes() {
  uint64_t n = 0;
  for (uint32_t r : driver_->regions()) n += driver_->pool(r).free_bytes();
  return n;
}

uint64_t GroupLeader::pool_capacity_bytes() {
  uint64_t n = 0;
  for (uint32_t r : driver_->regions()) n += driver_->pool(r).capacity_bytes();
  return n;
}

void GroupLeader::after_driver() {
  for (uint64_t id : std::exchange(pending_end_, {})) {
    // Ended while waiting for room: it holds nothing of the group's caches.
    std::erase_if(waiting_, [&](const transfer::ReadyAction& w) { return w.request_id == id; });
    auto it = running_.find(id);
    if (it == running_.end()) continue;
    finished_.push_back({.request_id = id, .tokens = std::move(it->second.tokens), .finish = protocol::FinishReason::Aborted});
    drop(id);
  }
}

void GroupLeader::drop(uint64_t id) {
  worker_->drop(id);
  // A member applies a command's drops before its admits: an admit not sent yet is withdrawn instead.
  for (size_t i = 1; i < next_.size(); ++i) {
    auto& admits = next_[i].admits;
    const size_t before = admits.size();
    std::erase_if(admits, [&](const GroupAdmit& a) { return a.id == id; });
    if (admits.size() == before) next_[i].drops.push_back(id);
  }
  if (auto it = running_.find(id); it != running_.end())
    for (size_t i = 0; i < committed_.size(); ++i) committed_[i] -= it->second.pages[i];
  running_.erase(id);
  order_.erase(std::remove(order_.begin(), order_.end(), id), order_.end());
}

void GroupLeader::abort_local(uint64_t id, const std::string& why) {
  spdlog::warn("decode group {}: request {} aborted: {}", opts_.rank.instance_id, id, why);
  end_here(*driver_, opts_.rank, id, "decode group " + opts_.rank.instance_id, why);
  after_driver();
  if (running_.count(id)) {
    finished_.push_back({.request_id = id, .tokens = std::move(running_.at(id).tokens), .finish = protocol::FinishReason::Aborted});
    drop(id);
  }
}

void GroupLeader::finish(uint64_t id, protocol::FinishReason why) {
  auto it = running_.find(id);
  finished_.push_back({.request_id = id, .tokens = std::move(it->second.tokens), .finish = why});
  drop(id);
  driver_->apply([&](DecodeSide& side, Millis now) { return side.on_finished(id, now); });
  after_driver();
}

bool GroupLeader::emit(Running& r, int32_t token, std::vector<protocol::TokenLogprobs> logprobs) {
  const protocol::FinishReason why =
      stream_token(r, token, std::move(logprobs), *driver_, opts_.rank, "decode group " + opts_.rank.instance_id);
  if (why == protocol::FinishReason::None) return false;
  finish(r.id, why);
  return true;
}

Result<RegionTables> GroupLeader::own_tables(const transfer::RankAllocation& a, uint32_t prompt_len) {
  // The leader's share: the whole request (EP or alone), or its DCP slice (rows p % N == 0, its KDA heads).
  const bool dcp = opts_.layout.dcp > 1;
  const uint32_t rows = dcp ? static_cast<uint32_t>(dcp_rows_on(opts_.layout, prompt_len)) : prompt_len;
  const RegionEntries entries{.pages = a.pages.page_ids(), .slot = a.slot.slot()};
  return region_tables(dcp ? rank_layouts_.at(0) : full_layout_, driver_->pool(a.region_id).geometry(), entries,
                       driver_->memory(a.region_id), region_memory_for(backend_), rows);
}

uint32_t GroupLeader::pages_on(int rank, int64_t tokens) const {
  RankLayout g = opts_.layout;
  g.rank = rank;
  const int64_t rows = g.dcp > 1 ? dcp_rows_on(g, tokens) : tokens;
  const int64_t ps = rooms_[static_cast<size_t>(rank)].page_size;
  return static_cast<uint32_t>((rows + ps - 1) / ps);
}

std::string GroupLeader::room_of(int rank, uint32_t need) const {
  const GroupRoom& r = rooms_[static_cast<size_t>(rank)];
  return "rank " + std::to_string(rank) + " has " + std::to_string(r.free_pages) + " of " + std::to_string(r.cache_pages) +
         " cache pages free (" + std::to_string(committed_[static_cast<size_t>(rank)]) + " promised to its requests) and " +
         std::to_string(r.free_seqs) + " of " + std::to_string(r.seqs) + " slots, needs " + std::to_string(need);
}

bool GroupLeader::fits_now(int rank, int64_t prompt_len, int max_tokens) const {
  const auto k = static_cast<size_t>(rank);
  const uint32_t whole = pages_on(rank, prompt_len + max_tokens), now = pages_on(rank, prompt_len);
  return committed_[k] + whole <= rooms_[k].cache_pages && now <= rooms_[k].free_pages && rooms_[k].free_seqs > 0;
}

std::vector<uint32_t> GroupLeader::ep_region_order(const protocol::Claim& c, std::vector<uint32_t> regions) const {
  // Decided when the prefill stages are about to write, since the request is then decoded where they wrote
  // it: first the ranks whose decode caches hold it now, then the ones holding the fewest requests (running,
  // waiting or still being written: the transfer slots they hold), then the lowest rank.
  const int max_tokens = c.sampling.max_tokens > 0 ? static_cast<int>(c.sampling.max_tokens) : opts_.rank.max_tokens;
  auto key = [&](uint32_t region) {
    const int rank = static_cast<int>(region - opts_.rank.rank);
    const transfer::RankPool& pool = driver_->pool(region);
    return std::make_tuple(!fits_now(rank, c.prompt_len, max_tokens), pool.geometry().num_slots - pool.free_slots(),
                           pool.geometry().num_pages - pool.free_pages(), region);
  };
  std::sort(regions.begin(), regions.end(), [&](uint32_t a, uint32_t b) { return key(a) < key(b); });
  return regions;
}

GroupLeader::Placement GroupLeader::place(int64_t prompt_len, int max_tokens, int ep_rank) const {
  // A request takes on a rank the pages of its prompt now and, by its end, those of prompt + max_tokens:
  // the latter are promised (committed_) so that running requests never run a rank out of pages.
  // DCP: it needs every rank; EP: the rank whose region the prefill stages wrote it into.
  Placement p;
  const bool dcp = opts_.layout.dcp > 1;
  std::string rooms;
  bool never = false, waits = false;
  for (int i = 0; i < opts_.layout.size(); ++i) {
    const uint32_t whole = pages_on(i, prompt_len + max_tokens);
    rooms += (rooms.empty() ? "" : "; ") + room_of(i, whole);
    if (!dcp && i != ep_rank) continue;
    never = never || whole > rooms_[static_cast<size_t>(i)].cache_pages;
    if (!fits_now(i, prompt_len, max_tokens)) {
      waits = true;
      p.why += (p.why.empty() ? "" : "; ") + room_of(i, whole);
    }
  }
  if (never) {
    // The ranks are alike: what one can never hold, none can.
    p.never = true;
    p.why = "no rank of the group can ever hold " + std::to_string(prompt_len) + " + " + std::to_string(max_tokens) +
            " tokens: " + rooms;
  } else if (!waits) {
    p.rank = dcp ? 0 : ep_rank;  // DCP: rank 0 stands for the group
  }
  return p;
}

void GroupLeader::admit_waiting() {
  // In arrival order: a request that must wait keeps the ones behind it waiting too (no overtaking).
  // Taken out first: ending a request (refused) runs after_driver, which edits waiting_.
  while (!waiting_.empty()) {
    const transfer::ReadyAction ready = waiting_.front();
    waiting_.pop_front();
    if (!start(ready)) {
      waiting_.push_front(ready);
      return;
    }
  }
}

bool GroupLeader::start(const transfer::ReadyAction& ready) {
  const uint64_t id = ready.request_id;
  const auto* alloc = driver_->side().allocation(id);
  if (!alloc) return abort_local(id, "ready but holds no transfer memory"), true;
  const bool started = admit(ready, *alloc);
  if (started) said_waiting_.erase(id);
  return started;
}

bool GroupLeader::admit(const transfer::ReadyAction& ready, const std::vector<transfer::RankAllocation>& allocation) {
  const uint64_t id = ready.request_id;
  const auto* alloc = &allocation;
  auto refuse = [&](const std::string& why) { abort_local(id, why); return true; };
  const size_t regions = static_cast<size_t>(opts_.layout.dcp);
  if (alloc->size() != regions)
    return refuse("the CLAIM named " + std::to_string(alloc->size()) + " ranks; this group " + to_string(opts_.layout) +
                  " takes " + std::to_string(regions));
  for (size_t i = 0; i < regions; ++i)
    if ((*alloc)[i].rank != opts_.rank.rank + i)
      return refuse("the CLAIM's rank " + std::to_string((*alloc)[i].rank) + " is not rank " + std::to_string(i) +
                    " of this group");
  const protocol::Claim* claim = driver_->side().claim(id);
  if (claim && claim->sampling.max_tokens > 0 && claim->sampling.n > 1)
    return refuse("n > 1 (several choices of one prompt) is not served by decode rank groups yet");
  auto made = streamed_request(id, opts_.rank, claim);
  if (!made.is_ok()) return refuse(made.status().to_string());
  Running r;
  static_cast<StreamedRequest&>(r) = std::move(made).value();
  // Admission by every rank's own room: EP the request lives whole on the rank whose region the prefill
  // stages wrote (ep_region_order chose it), DCP on every rank. It waits (holding its transfer memory) until
  // that room exists, or is refused naming the ranks when it never can.
  const int64_t T = ready.prompt_len;
  const Placement where = place(T, r.max_tokens, static_cast<int>((*alloc)[0].region_id - opts_.rank.rank));
  if (where.never) return refuse(where.why);
  if (where.rank < 0) {
    if (said_waiting_.insert(id).second) {
      spdlog::info("decode group {}: request {} waits for room: {}", opts_.rank.instance_id, id, where.why);
      say_line("WAITING " + std::to_string(id) + " " + where.why);
    }
    return false;
  }
  r.rank = where.rank;
  r.pages.assign(committed_.size(), 0);
  const int target = r.rank;
  auto [it, fresh] = running_.emplace(id, std::move(r));
  if (!fresh) return true;
  for (int i = 0; i < opts_.layout.size(); ++i) {
    if (opts_.layout.ep > 1 && i != target) continue;
    const auto k = static_cast<size_t>(i);
    it->second.pages[k] = pages_on(i, T + it->second.max_tokens);
    committed_[k] += it->second.pages[k];
    // Until the rank's next report: what this admit takes now.
    rooms_[k].free_pages -= std::min(rooms_[k].free_pages, pages_on(i, T));
    rooms_[k].free_seqs -= std::min<uint32_t>(rooms_[k].free_seqs, 1);
  }
  order_.push_back(id);
  say_line("JOINED " + std::to_string(id) + " " + std::to_string(target));
  // The last prefill stage drew the first token under the same grammar: advance the state past it.
  if (Status st = take_first_token(it->second, ready.first_token, ready.first_logprobs); !st.is_ok())
    return refuse(st.to_string());
  if (emit(it->second, ready.first_token, ready.first_logprobs)) return true;  // ended with its first token
  // Every rank that holds the request reads its share from its own region, where the prefill stages wrote
  // it: the leader here, a member before it joins the next step (the pages stay allocated here until the
  // request ends, which is after that step). Nothing travels in the command but the page table and slot.
  for (size_t i = 0; i < regions; ++i) {
    const transfer::RankAllocation& a = (*alloc)[i];
    const int holder = opts_.layout.dcp > 1 ? static_cast<int>(i) : target;
    if (holder == 0) {
      auto tables = own_tables(a, static_cast<uint32_t>(T));
      if (!tables.is_ok()) return refuse(tables.status().to_string());
      const GroupAdmit own{.id = id, .position = T, .from_region = true};
      if (Status st = worker_->admit_from(own, tables->tables); !st.is_ok()) return refuse(st.to_string());
      say_imported(own, tables->image.total_bytes, true);
      continue;
    }
    next_[static_cast<size_t>(holder)].admits.push_back(
        {.id = id, .position = T, .image = {}, .from_region = true, .page_ids = a.pages.page_ids(),
         .slot = a.slot.slot() ? static_cast<int64_t>(*a.slot.slot()) : -1});
  }
  return true;
}

Status GroupLeader::fail_group(const Status& why) {
  // Aborted is a stop signal that came while the leader waited on its members: the process is being
  // stopped, not failing, so operators' error alerts should not fire on every ordinary shutdown.
  if (why.code() == Code::Aborted) spdlog::warn("decode group {}: stopping: {}", opts_.rank.instance_id, why.to_string());
  else spdlog::error("decode group {}: {}", opts_.rank.instance_id, why.to_string());
  std::vector<uint64_t> ids = order_;
  for (const auto& w : std::exchange(waiting_, {})) ids.push_back(w.request_id);
  for (uint64_t id : ids) abort_local(id, "the decode group failed: " + why.message());
  worker_->close_all();
  return Status(why.code(), "decode group " + opts_.rank.instance_id + " failed: " + why.message());
}

Status GroupLeader::step_batch() {
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
  // A step of a big model on a shared GPU, with the group's collectives through the host, can outlast the
  // router's heartbeat window: the leader keeps beating between layers so it is not taken for dead. It also
  // reads its members' beats as they come, so their times stay true through a long compute (the verdict
  // on a silent member is the next wait's: that is where the leader would block on it).
  auto own = worker_->step(feeds[0], [this] {
    (void)liveness_->check();
    driver_->heartbeat_if_due();
  });
  if (!own.is_ok()) {
    if (own.status().code() != Code::ResourceExhausted) return fail_group(own.status());
    // Every rank refused the step before touching a cache: the newest request gives way.
    abort_local(order_.back(), "the decode cache of the group is full: " + own.status().message());
    return Status::ok();
  }
  const int64_t V = cfg_.vocab_size;
  std::vector<uint64_t> sampled;
  std::vector<float> logits;
  for (size_t i = 0; i < (members_return_logits(opts_.layout) ? n : 1); ++i) {
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
  // Host logits: every rank's rows came back to the host; the draw takes them there on any backend.
  const Tensor lg = Tensor::from_f32({static_cast<int64_t>(sampled.size()), V}, logits);
  std::vector<DrawRow> rows;
  for (uint64_t id : sampled) {
    const Running& r = running_.at(id);
    rows.push_back(draw_row(r, r.step));
  }
  const std::vector<Drawn> drawn = draw_tokens(backend_, lg, rows, V);
  for (size_t k = 0; k < sampled.size(); ++k) {
    auto it = running_.find(sampled[k]);
    if (it == running_.end()) continue;
    if (!drawn[k].status.is_ok()) {
      abort_local(sampled[k], drawn[k].status.to_string());
      continue;
    }
    ++it->second.step;
    emit(it->second, drawn[k].token,
         drawn[k].logprobs ? std::vector{to_wire(*drawn[k].logprobs)} : std::vector<protocol::TokenLogprobs>{});
  }
  return Status::ok();
}

Status GroupLeader::step() {
  // The group's first step runs under the start-up timeout (GroupDeadlines): every rank pays its one-time
  // costs in it.
  const bool first_step = !stepped_ && !order_.empty();
  if (first_step) opts_.deadlines.use(opts_.deadlines.startup);
  K3_TRY(step_batch());
  // Every member answers every command with its room (group_member.h).
  rooms_[0] = worker_->room();
  for (size_t i = 1; i < rooms_.size(); ++i) {
    auto r = recv_group_room(comm_, static_cast<int>(i));
    if (!r.is_ok()) return fail_group(r.status());
    rooms_[i] = *r;
  }
  if (first_step) {
    stepped_ = true;
    opts_.deadlines.use(opts_.deadlines.step);
  }
  return Status::ok();
}

void GroupLeader::stop_members() {
  for (size_t i = 1; i < next_.size(); ++i) (void)send_group_command(comm_, static_cast<int>(i), GroupCommand{.stop = true});
}

protocol::DecodeRoom GroupLeader::room() {
  // The group as one placement target. DCP: a request takes 1/N of its rows and a slot on every rank, so the
  // group holds N times the fullest rank's pages and as many requests as its fullest rank. EP: a request
  // lives on one rank, so the group holds the sum. The transfer pools (in this process's bookkeeping) follow
  // the same rule. The router's figures are an upper bound; the leader checks every rank's own room before a
  // request joins (place()).
  const bool dcp = opts_.layout.dcp > 1;
  const auto n = static_cast<uint32_t>(rooms_.size());
  uint32_t pages = dcp ? UINT32_MAX : 0, free_pages = pages, seqs = pages, free_seqs = pages;
  for (const GroupRoom& r : rooms_) {
    if (dcp) {
      pages = std::min(pages, r.cache_pages);
      free_pages = std::min(free_pages, r.free_pages);
      seqs = std::min(seqs, r.seqs);
      free_seqs = std::min(free_seqs, r.free_seqs);
    } else {
      pages += r.cache_pages;
      free_pages += r.free_pages;
      seqs += r.seqs;
      free_seqs += r.free_seqs;
    }
  }
  if (dcp) {
    pages *= n;
    free_pages *= n;
  }
  // Transfer pools: DCP a request takes pages and a slot in every rank's region (the fullest bounds the
  // group), EP in one rank's region (the group holds the sum).
  uint32_t pool_pages = 0, pool_free_pages = dcp ? UINT32_MAX : 0, pool_slots = 0, pool_free_slots = pool_free_pages;
  for (uint32_t region : driver_->regions()) {
    const transfer::RankPool& pool = driver_->pool(region);
    pool_pages += pool.geometry().num_pages;
    pool_slots = dcp ? pool.geometry().num_slots : pool_slots + pool.geometry().num_slots;
    pool_free_pages = dcp ? std::min(pool_free_pages, pool.free_pages()) : pool_free_pages + pool.free_pages();
    pool_free_slots = dcp ? std::min(pool_free_slots, pool.free_slots()) : pool_free_slots + pool.free_slots();
  }
  if (dcp) pool_free_pages *= n;
  return {.pool_page_size = opts_.rank.page_size, .pool_pages = pool_pages, .pool_free_pages = pool_free_pages,
          .pool_slots = pool_slots, .pool_free_slots = pool_free_slots,
          .cache_page_size = rooms_[0].page_size, .cache_pages = pages, .cache_free_pages = free_pages, .cache_seqs = seqs,
          .cache_free_seqs = free_seqs, .paused = static_cast<uint32_t>(waiting_.size()), .preemptions = 0};
}

Status GroupLeader::run_once(std::chrono::milliseconds idle_wait) {
  K3_ASSIGN_OR_RETURN(Actions actions, driver_->step(running_.empty() ? idle_wait : 0ms));
  after_driver();
  for (const transfer::Action& a : actions)
    if (const auto* ready = std::get_if<transfer::ReadyAction>(&a)) waiting_.push_back(*ready);
  admit_waiting();
  return step();
}

}  // namespace k3::decode
