// The decode target choice (decode_choice.h) and the pair list's consistency check (check_pairs).
#include <catch2/catch.hpp>

#include <random>

#include "router/cluster_placement.h"
#include "router/decode_choice.h"

using namespace k3::router;

TEST_CASE("least_loaded_decode: fewest requests, then most free pages, ties rotate from start", "[router]") {
  CHECK(least_loaded_decode({}) == -1);
  std::vector<DecodeLoad> l(3);
  l[0].reserved_requests = 2;
  l[1].reported_running = 1;
  l[2].reserved_requests = 1;
  l[2].reported_running = 3;  // the larger of the two counts
  CHECK(least_loaded_decode(l) == 1);
  l[1].reserved_requests = 2;  // now 2, 2, 3: the free cache pages decide
  l[0].free_cache_pages = 10;
  l[1].free_cache_pages = 20;
  CHECK(least_loaded_decode(l) == 1);
  l[0].free_cache_pages = 20;  // equal pages: the pool decides
  l[0].free_pool_pages = 5;
  CHECK(least_loaded_decode(l) == 0);
  // All equal: the first at or after `start`, cyclically.
  std::vector<DecodeLoad> same(3);
  for (size_t s = 0; s < 7; ++s) CHECK(least_loaded_decode(same, s) == static_cast<int>(s % 3));
}

TEST_CASE("least_loaded_decode equals a brute-force minimum on random loads", "[router]") {
  std::mt19937 rng(7);
  auto r = [&](int hi) { return std::uniform_int_distribution<int64_t>(0, hi)(rng); };
  for (int trial = 0; trial < 500; ++trial) {
    std::vector<DecodeLoad> l(1 + r(5));
    for (auto& x : l) x = {.reserved_requests = r(3), .reported_running = r(3), .free_cache_pages = r(4), .free_pool_pages = r(4)};
    const size_t start = r(10);
    const int got = least_loaded_decode(l, start);
    REQUIRE(got >= 0);
    for (size_t i = 0; i < l.size(); ++i) {
      const auto& a = l[got];
      const auto& b = l[i];
      const int64_t ra = std::max(a.reserved_requests, a.reported_running), rb = std::max(b.reserved_requests, b.reported_running);
      CHECK(ra <= rb);  // nothing has fewer requests
      if (ra == rb) {
        CHECK(a.free_cache_pages >= b.free_cache_pages);
        if (a.free_cache_pages == b.free_cache_pages) CHECK(a.free_pool_pages >= b.free_pool_pages);
      }
    }
  }
}

TEST_CASE("check_pairs: any to any is allowed, inconsistent instances and repeats are named", "[router]") {
  auto pair = [](const std::string& t) {
    auto p = parse_cluster_pair(t);
    REQUIRE(p.is_ok());
    return *p;
  };
  CHECK(check_pairs({pair("p0:1:d-0:0"), pair("p0:1:d-1:1"), pair("p1:1:d-0:0"), pair("p1:1:d-1:1")}).is_ok());
  auto bad = check_pairs({pair("p0:1:d-0:0"), pair("p0:2:d-1:1")});
  CHECK(bad.message().find("prefill 'p0' has 1 stage(s) in another pair") != std::string::npos);
  bad = check_pairs({pair("p0:1:d-0:0"), pair("p1:1:d-0:1")});
  CHECK(bad.message().find("decode 'd-0' has rank 0") != std::string::npos);
  bad = check_pairs({pair("p0:1:d-0:0"), pair("p0:1:d-0:0")});
  CHECK(bad.message().find("paired twice") != std::string::npos);
}

TEST_CASE("prefer_other_prefill: a retry avoids the prefill instances that failed it while another fits", "[router]") {
  using k3::router::ClusterPair;
  const std::vector<ClusterPair> pairs = {{.prefill_instance = "a", .decode_instance = "d"},
                                          {.prefill_instance = "b", .decode_instance = "d"},
                                          {.prefill_instance = "a", .decode_instance = "e"},
                                          {.prefill_instance = "c", .decode_instance = "e"}};
  using k3::router::prefer_other_prefill;
  CHECK(prefer_other_prefill({0, 1, 2, 3}, pairs, {}) == std::vector<int>{0, 1, 2, 3});
  CHECK(prefer_other_prefill({0, 1, 2, 3}, pairs, {"a"}) == std::vector<int>{1, 3});
  CHECK(prefer_other_prefill({0, 2, 3}, pairs, {"a", "c"}) == std::vector<int>{0, 2, 3});  // none left: all
  CHECK(prefer_other_prefill({0, 2}, pairs, {"b"}) == std::vector<int>{0, 2});
  CHECK(prefer_other_prefill({}, pairs, {"a"}).empty());
}
