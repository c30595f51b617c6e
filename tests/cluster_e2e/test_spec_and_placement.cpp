// The launcher's spec validation (errors name the field) and the router's placement policies.
#include <catch2/catch.hpp>

#include <nlohmann/json.hpp>

#include <fstream>
#include <set>

#include "deploy/cluster_spec.h"
#include "router/cluster_service.h"

using nlohmann::json;
using namespace k3;

namespace {

json minimal() {
  return {{"model", "m"}, {"prefill", json::array({{{"stages", 2}}})}, {"decode", json::array({{{"ranks", 1}}})}};
}

std::string error_of(const json& j) {
  auto s = deploy::parse_cluster_spec(j);
  return s.is_ok() ? std::string() : s.status().message();
}

}  // namespace

TEST_CASE("cluster spec: defaults, the default spec file, decode processes", "[cluster_e2e]") {
  auto s = deploy::parse_cluster_spec(minimal());
  REQUIRE(s.is_ok());
  CHECK(s->port == 8000);
  CHECK(s->host == "127.0.0.1");
  CHECK(s->prefill.at(0).id == "p0");
  CHECK(s->prefill.at(0).stages == 2);
  CHECK(s->decode.at(0).id == "d0");

  auto def = deploy::load_cluster_spec(std::string(K3_SOURCE_DIR) + "/deploy/cluster-default.json");
  REQUIRE(def.is_ok());
  CHECK(def->port == 8000);
  CHECK(def->prefill.size() == 1);
  CHECK(def->prefill[0].stages == 2);
  CHECK(deploy::decode_processes(*def).size() == 1);
  CHECK(def->preset == "k3-tiny");
  CHECK(def->backend == "cpu");  // the embedded default stays on the CPU
  CHECK(s->backend == "cpu");
  json gpu = minimal();
  gpu["backend"] = "cuda";
  CHECK(deploy::parse_cluster_spec(gpu)->backend == "cuda");

  // The prefill prefix cache: off by default; on, its flags for every stage; bad values named.
  CHECK(s->prefill[0].prefix_slots == 0);
  CHECK(deploy::prefix_cache_args(s->prefill[0]).empty());
  json cached = minimal();
  cached["prefill"][0]["chunk_size"] = 128;
  cached["prefill"][0]["prefix_cache"] = {{"block_tokens", 128}};
  auto c = deploy::parse_cluster_spec(cached);
  REQUIRE(c.is_ok());
  CHECK(deploy::prefix_cache_args(c->prefill[0]) ==
        std::vector<std::string>{"--prefix-cache-slots", "8", "--prefix-block", "128", "--prefix-checkpoint-every", "1",
                                 "--prefix-budget-mb", "0"});
  cached["prefill"][0]["prefix_cache"]["block_tokens"] = 100;
  CHECK(error_of(cached).find("prefill[0].prefix_cache.block_tokens") != std::string::npos);
  cached["prefill"][0]["prefix_cache"] = {{"slots", 2}};
  cached["prefill"][0]["chunk_size"] = 100;
  CHECK(error_of(cached).find("prefill[0].chunk_size: must be a multiple of 64") != std::string::npos);
  cached["prefill"][0]["chunk_size"] = 64;
  cached["prefill"][0]["prefix_cache"] = {{"slot", 2}};
  CHECK(error_of(cached).find("prefill[0].prefix_cache.slot") != std::string::npos);

  json two = minimal();
  two["decode"] = json::array({{{"id", "a"}, {"ranks", 2}}, {{"id", "b"}}});
  auto t = deploy::parse_cluster_spec(two);
  REQUIRE(t.is_ok());
  const auto procs = deploy::decode_processes(*t);
  REQUIRE(procs.size() == 3);
  CHECK(procs[0].instance == "a-0");
  CHECK(procs[1].instance == "a-1");
  CHECK(procs[2].instance == "b");
  CHECK(procs[2].rank == 2);
}

TEST_CASE("cluster spec: every bad field is named", "[cluster_e2e]") {
  struct Case {
    std::function<void(json&)> edit;
    std::string field;
  };
  const std::vector<Case> cases = {
      {[](json& j) { j.erase("model"); }, "model"},
      {[](json& j) { j["model"] = 3; }, "model"},
      {[](json& j) { j.erase("prefill"); }, "prefill"},
      {[](json& j) { j["prefill"] = json::array(); }, "prefill"},
      {[](json& j) { j["decode"] = "x"; }, "decode"},
      {[](json& j) { j["prefill"][0]["stages"] = 0; }, "prefill[0].stages"},
      {[](json& j) { j["prefill"][0]["stages"] = "2"; }, "prefill[0].stages"},
      {[](json& j) { j["prefill"][0]["partition"] = {1, 2, 3}; }, "prefill[0].partition"},
      {[](json& j) { j["prefill"][0]["partition"] = {1, -2}; }, "prefill[0].partition"},
      {[](json& j) { j["prefill"][0]["chunk_size"] = 0; }, "prefill[0].chunk_size"},
      {[](json& j) { j["prefill"][0]["max_inflight_chunks"] = 0; }, "prefill[0].max_inflight_chunks"},
      {[](json& j) { j["prefill"][0]["stream"] = "yes"; }, "prefill[0].stream"},
      {[](json& j) { j["prefill"][0]["id"] = "a/b"; }, "prefill[0].id"},
      {[](json& j) { j["prefill"][0]["colour"] = 1; }, "prefill[0].colour"},
      {[](json& j) { j["decode"][0]["ranks"] = 0; }, "decode[0].ranks"},
      {[](json& j) { j["network"] = {{"bind_host", "0.0.0.0"}}; }, "network.advertise_host"},
      {[](json& j) { j["network"] = {{"bind_host", ""}}; }, "network.bind_host"},
      {[](json& j) { j["network"] = {{"bind", "x"}}; }, "network.bind"},
      {[](json& j) { j["decode"].push_back({{"id", "d0"}}); }, "decode[1].id"},
      {[](json& j) { j["router"] = {{"port", 70000}}; }, "router.port"},
      {[](json& j) { j["router"] = {{"placement", "random"}}; }, "router.placement"},
      {[](json& j) { j["timeouts"] = {{"heartbeat_ms", 1}}; }, "timeouts.heartbeat_ms"},
      {[](json& j) { j["threads"] = -1; }, "threads"},
      {[](json& j) { j["backend"] = "tpu"; }, "backend"},
      {[](json& j) { j["backend"] = 1; }, "backend"},
      {[](json& j) { j["kernels"] = "quick"; }, "kernels"},
      {[](json& j) { j["kernels"] = true; }, "kernels"},
      {[](json& j) { j["extra"] = true; }, "extra"},
  };
  for (const auto& c : cases) {
    json j = minimal();
    c.edit(j);
    const std::string err = error_of(j);
    INFO(j.dump() << " -> " << err);
    CHECK(err.find("spec: " + c.field + ":") != std::string::npos);
  }
  auto s = deploy::parse_cluster_spec([] {
    json j = minimal();
    j["prefill"][0]["partition"] = {3, 3};
    return j;
  }());
  REQUIRE(s.is_ok());
  CHECK(deploy::check_against_model(*s, 6).is_ok());
  const Status bad = deploy::check_against_model(*s, 8);
  CHECK(bad.message().find("prefill[0].partition") != std::string::npos);
}

TEST_CASE("router --pair and --placement parsing", "[cluster_e2e]") {
  auto p = router::parse_cluster_pair("p:2:d:0");
  REQUIRE(p.is_ok());
  CHECK(*p == router::ClusterPair{.prefill_instance = "p", .stages = 2, .decode_instance = "d", .decode_rank = 0});
  CHECK_FALSE(router::parse_cluster_pair("p:2:d").is_ok());
  CHECK_FALSE(router::parse_cluster_pair("p:0:d:0").is_ok());
  CHECK_FALSE(router::parse_cluster_pair("p:x:d:0").is_ok());
  CHECK_FALSE(router::parse_cluster_pair(":2:d:0").is_ok());
  CHECK(router::parse_placement("least-loaded").value() == router::Placement::LeastLoaded);
  CHECK_FALSE(router::parse_placement("random").is_ok());
}

TEST_CASE("placement: round-robin cycles, least-loaded picks the idlest, prefix-affinity is sticky", "[cluster_e2e]") {
  const std::vector<int> ready = {0, 2, 3};
  std::vector<router::PairLoad> load(4);
  router::PlacementPolicy rr(router::Placement::RoundRobin, 4);
  std::vector<int> seen;
  for (int i = 0; i < 6; ++i) seen.push_back(rr.pick(ready, load, {1}));
  CHECK(seen == std::vector<int>{0, 2, 3, 0, 2, 3});
  CHECK(rr.pick({}, load, {1}) == -1);

  router::PlacementPolicy ll(router::Placement::LeastLoaded, 4);
  load[0].in_flight = 3;
  load[2].in_flight = 1;
  load[3].in_flight = 0;
  load[3].reported_running = 2;  // decode's heartbeat counts too
  CHECK(ll.pick(ready, load, {1}) == 2);
  load[2].in_flight = 5;
  CHECK(ll.pick(ready, load, {1}) == 3);

  router::PlacementPolicy pa(router::Placement::PrefixAffinity, 3);
  std::vector<router::PairLoad> idle(4);
  const int first = pa.pick(ready, idle, {7, 8, 9, 100});
  idle[first].in_flight = 10;  // busy now, but the same prefix still goes there
  CHECK(pa.pick(ready, idle, {7, 8, 9, 555, 1}) == first);
  // A different prefix goes to the least-loaded pair.
  const int other = pa.pick(ready, idle, {1, 2, 3});
  CHECK(other != first);
  // The sticky pair is gone: the prefix moves.
  std::vector<int> without;
  for (int r : ready)
    if (r != first) without.push_back(r);
  const int moved = pa.pick(without, idle, {7, 8, 9});
  CHECK(moved != first);
  CHECK(std::find(without.begin(), without.end(), moved) != without.end());
}

TEST_CASE("cluster spec: prefill streaming fields become k3-prefill flags", "[cluster_e2e]") {
  json j = minimal();
  auto s = deploy::parse_cluster_spec(j);
  REQUIRE(s.is_ok());
  CHECK(deploy::stream_args(s->prefill[0]) == std::vector<std::string>{"--max-inflight-chunks", "4"});
  j["prefill"][0]["max_inflight_chunks"] = 2;
  s = deploy::parse_cluster_spec(j);
  REQUIRE(s.is_ok());
  CHECK(deploy::stream_args(s->prefill[0]) == std::vector<std::string>{"--max-inflight-chunks", "2"});
  j["prefill"][0]["stream"] = false;
  s = deploy::parse_cluster_spec(j);
  REQUIRE(s.is_ok());
  CHECK(deploy::stream_args(s->prefill[0]) == std::vector<std::string>{"--no-stream"});
  j["prefill"][0]["max_inflight_chunks"] = 5000;
  CHECK(error_of(j).find("prefill[0].max_inflight_chunks: 5000 outside [1, 4096]") != std::string::npos);
}

TEST_CASE("cluster spec: prefill cache_region_mib and source_arena_mib become k3-prefill's memory flags", "[cluster_e2e]") {
  json j = minimal();
  auto s = deploy::parse_cluster_spec(j);
  REQUIRE(s.is_ok());
  CHECK(deploy::prefill_memory_args(s->prefill[0]).empty());
  j["prefill"][0]["cache_region_mib"] = 64;
  s = deploy::parse_cluster_spec(j);
  REQUIRE(s.is_ok());
  CHECK(deploy::prefill_memory_args(s->prefill[0]) == std::vector<std::string>{"--cache-region-mib", "64.0"});
  j["prefill"][0]["cache_region_mib"] = 0.5;
  s = deploy::parse_cluster_spec(j);
  REQUIRE(s.is_ok());
  CHECK(deploy::prefill_memory_args(s->prefill[0]) == std::vector<std::string>{"--cache-region-mib", "0.5"});
  j["prefill"][0]["cache_region_mib"] = -1;
  CHECK(error_of(j).find("prefill[0].cache_region_mib: -1.0 outside [0.0, 16777216.0]") != std::string::npos);
  j["prefill"][0]["cache_region_mib"] = "big";
  CHECK(error_of(j).find("prefill[0].cache_region_mib: must be a number") != std::string::npos);
  j["prefill"][0]["cache_region_mib"] = 0;
  j["prefill"][0]["source_arena_mib"] = 0;   // none: every image allocated on its own
  s = deploy::parse_cluster_spec(j);
  REQUIRE(s.is_ok());
  CHECK(deploy::prefill_memory_args(s->prefill[0]) == std::vector<std::string>{"--source-arena-mib", "0.0"});
  j["prefill"][0]["source_arena_mib"] = -2;
  CHECK(error_of(j).find("prefill[0].source_arena_mib: -2.0 outside [0.0, 16777216.0]") != std::string::npos);
}
