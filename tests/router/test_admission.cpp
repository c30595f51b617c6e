// The router's admission and deadline logic without sockets: what a request demands of a decode rank,
// which requests can never fit (HTTP 400), the capacity ledger, the bounded FIFO queue (HTTP 429 when
// full, head-of-line order, requests sent back keep their place) and the per-phase deadlines.
#include <catch2/catch.hpp>

#include <vector>

#include "router/admission_queue.h"
#include "router/request_deadlines.h"

using namespace k3::router;
using namespace std::chrono_literals;

namespace {
// The default decode rank: 256 pool pages of 16 tokens, 8 slots; 256 cache pages of 16 tokens, 8 sequences.
DecodeCapacity default_rank() {
  return {.pool_page_size = 16, .pool_pages = 256, .pool_slots = 8, .cache_page_size = 16, .cache_pages = 256,
          .cache_seqs = 8};
}
}  // namespace

TEST_CASE("demand: transfer pages for the prompt, cache pages for prompt + reserve", "[admission]") {
  const DecodeCapacity c = default_rank();
  CHECK(demand_of(c, 1, 0) == Demand{.pool_pages = 1, .cache_pages = 1});
  CHECK(demand_of(c, 16, 0) == Demand{.pool_pages = 1, .cache_pages = 1});
  CHECK(demand_of(c, 17, 15) == Demand{.pool_pages = 2, .cache_pages = 2});
  CHECK(demand_of(c, 17, 16) == Demand{.pool_pages = 2, .cache_pages = 3});
  DecodeCapacity other = c;
  other.cache_page_size = 64;
  CHECK(demand_of(other, 100, 32) == Demand{.pool_pages = 7, .cache_pages = 3});
}

TEST_CASE("never_fits names the limit and the numbers", "[admission]") {
  const DecodeCapacity c = default_rank();
  CHECK(never_fits(c, 4000, 96).empty());
  CHECK(never_fits(c, 4096, 0).empty());
  const std::string pool = never_fits(c, 4097, 1);
  CHECK_THAT(pool, Catch::Contains("4097 tokens") && Catch::Contains("257 transfer pool pages") &&
                       Catch::Contains("256 (4096 tokens)"));
  const std::string cache = never_fits(c, 4000, 97);
  CHECK_THAT(cache, Catch::Contains("max_tokens (97)") && Catch::Contains("257 decode cache pages") &&
                        Catch::Contains("256 (4096 tokens)"));
  CHECK(never_fits(DecodeCapacity{}, 1 << 20, 1 << 20).empty());  // capacity unknown: nothing to say
}

TEST_CASE("ledger: reservations against capacity, slots, give back once", "[admission]") {
  CapacityLedger l;
  CHECK_FALSE(l.fits("decode/d", {.pool_pages = 1, .cache_pages = 1}));  // unknown rank
  l.set_capacity("decode/d", {.pool_page_size = 16, .pool_pages = 10, .pool_slots = 2, .cache_page_size = 16,
                              .cache_pages = 12, .cache_seqs = 4});
  REQUIRE(l.capacity("decode/d").has_value());
  CHECK(l.fits("decode/d", {.pool_pages = 10, .cache_pages = 12}));
  CHECK_FALSE(l.fits("decode/d", {.pool_pages = 11, .cache_pages = 1}));
  CHECK_FALSE(l.fits("decode/d", {.pool_pages = 1, .cache_pages = 13}));
  l.take(1, "decode/d", {.pool_pages = 6, .cache_pages = 6});
  CHECK(l.fits("decode/d", {.pool_pages = 4, .cache_pages = 6}));
  CHECK_FALSE(l.fits("decode/d", {.pool_pages = 5, .cache_pages = 1}));
  l.take(2, "decode/d", {.pool_pages = 1, .cache_pages = 1});
  // Two requests hold both pool slots: nothing more fits, however small.
  CHECK_FALSE(l.fits("decode/d", {.pool_pages = 0, .cache_pages = 0}));
  CHECK(l.used("decode/d").requests == 2);
  l.give_back(1);
  l.give_back(1);  // once only
  CHECK(l.used("decode/d").pool_pages == 1);
  CHECK(l.used("decode/d").cache_pages == 1);
  CHECK(l.used("decode/d").requests == 1);
  // A second take for the same id replaces the first.
  l.take(2, "decode/d", {.pool_pages = 3, .cache_pages = 2});
  CHECK(l.used("decode/d").pool_pages == 3);
  CHECK(l.used("decode/d").requests == 1);
  l.give_back(2);
  CHECK(l.used("decode/d").requests == 0);
}

TEST_CASE("queue: bounded, FIFO, head-of-line, sent-back requests keep their place", "[admission]") {
  const auto t0 = AdmissionClock::now();
  AdmissionQueue q(3);
  CHECK(q.push(1, t0));
  CHECK(q.push(2, t0 + 1s));
  CHECK(q.push(3, t0 + 2s));
  CHECK(q.full());
  CHECK_FALSE(q.push(4, t0));  // full: the caller answers 429
  CHECK(q.size() == 3);

  // Room for one request of size <= 5 units; request 1 is large (8), so nobody passes it.
  std::map<uint64_t, int> size{{1, 8}, {2, 1}, {3, 1}, {5, 1}};
  int room = 5;
  std::vector<uint64_t> placed;
  auto try_place = [&](uint64_t id) {
    if (size[id] > room) return false;
    room -= size[id];
    placed.push_back(id);
    return true;
  };
  CHECK(q.drain(try_place) == 0);
  CHECK(placed.empty());
  room = 10;
  CHECK(q.drain(try_place) == 3);
  CHECK(placed == std::vector<uint64_t>{1, 2, 3});
  CHECK(q.size() == 0);

  // A request sent back goes to the head, even over the bound.
  CHECK(q.push(2, t0));
  CHECK(q.push(3, t0));
  CHECK(q.push(5, t0));
  q.push_front(1, t0);
  CHECK(q.size() == 4);
  CHECK(q.remove(3));
  CHECK_FALSE(q.remove(3));
  placed.clear();
  room = 100;
  CHECK(q.drain(try_place) == 3);
  CHECK(placed == std::vector<uint64_t>{1, 2, 5});
}

TEST_CASE("queue: try_place may fail the head (it leaves the queue) and admission goes on", "[admission]") {
  AdmissionQueue q(4);
  const auto t0 = AdmissionClock::now();
  for (uint64_t id : {1, 2, 3}) REQUIRE(q.push(id, t0));
  std::vector<uint64_t> seen;
  // Request 1 can never be placed: the callback removes it (as the router's fail() does) and says it left.
  CHECK(q.drain([&](uint64_t id) {
    seen.push_back(id);
    if (id == 1) q.remove(1);
    return true;
  }) == 3);
  CHECK(seen == std::vector<uint64_t>{1, 2, 3});
  CHECK(q.size() == 0);
}

TEST_CASE("deadlines: one budget per phase, tokens restart the decoding clock", "[deadlines]") {
  const PhaseTimeouts t{.queued = 10s, .claimed = 2s, .prefilling = 20s, .decoding = 5s};
  RequestDeadlines d(t);
  const auto t0 = RequestDeadlines::Clock::now();
  d.enter(1, RequestPhase::Queued, t0);
  d.enter(2, RequestPhase::Claimed, t0);
  d.enter(3, RequestPhase::Prefilling, t0);
  d.enter(4, RequestPhase::Decoding, t0);
  CHECK(d.take_expired(t0 + 1s).empty());
  CHECK(d.next_deadline() == t0 + 2s);
  auto e = d.take_expired(t0 + 2s);
  REQUIRE(e.size() == 1);
  CHECK(e[0].id == 2);
  CHECK(e[0].phase == RequestPhase::Claimed);
  CHECK(e[0].budget == 2s);
  CHECK_FALSE(d.phase(2).has_value());  // reported once

  // Request 4 keeps getting tokens: it never expires while they come within 5 s of each other.
  d.progress(4, t0 + 4s);
  d.progress(4, t0 + 8s);
  CHECK(d.take_expired(t0 + 9s).empty());
  // Request 1 leaves the queue at 9 s: the prefilling budget starts then.
  d.enter(1, RequestPhase::Prefilling, t0 + 9s);
  e = d.take_expired(t0 + 13s);
  REQUIRE(e.size() == 1);
  CHECK(e[0].id == 4);
  CHECK(e[0].phase == RequestPhase::Decoding);
  // Oldest deadline first.
  e = d.take_expired(t0 + 60s);
  REQUIRE(e.size() == 2);
  CHECK(e[0].id == 3);
  CHECK(e[1].id == 1);
  CHECK(d.size() == 0);
  d.progress(99, t0);  // unknown: no-op
  d.forget(99);
  CHECK(d.size() == 0);
}

TEST_CASE("deadlines: phase names and forget", "[deadlines]") {
  CHECK(std::string(request_phase_name(RequestPhase::Queued)) == "queued");
  CHECK(std::string(request_phase_name(RequestPhase::Claimed)) == "claimed");
  CHECK(std::string(request_phase_name(RequestPhase::Prefilling)) == "prefilling");
  CHECK(std::string(request_phase_name(RequestPhase::Decoding)) == "decoding");
  RequestDeadlines d(PhaseTimeouts{});
  const auto t0 = RequestDeadlines::Clock::now();
  d.enter(7, RequestPhase::Decoding, t0);
  CHECK(d.phase(7) == RequestPhase::Decoding);
  d.forget(7);
  CHECK(d.take_expired(t0 + 3600s).empty());
}
