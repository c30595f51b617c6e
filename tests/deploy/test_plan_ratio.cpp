// k3-plan ratio's sizing on a profile with known closed forms: prefill S(L) = 1 ms per token, decode
// ITL(b) = 10 ms + 2 ms x b. For input 500 (S = 0.5 s) and a 1 s TTFT SLA, M/D/1 allows utilisation
// 2 (T - S) / (2T - S) = 2/3, i.e. 4/3 req/s per prefill instance; a 30 ms ITL SLA allows batch 10, i.e.
// 10 / (50 x 0.03) = 6.67 req/s per decode rank at 50 output tokens.
#include <catch2/catch.hpp>

#include <fstream>
#include <random>

#include "deploy/ratio_plan.h"
#include "tests/support/run_command.h"

using namespace k3;
using nlohmann::json;

namespace {

const json kProfile = {{"prefill", {{{"input_tokens", 100}, {"seconds", 0.1}}, {{"input_tokens", 1000}, {"seconds", 1.0}}}},
                       {"decode", {{{"batch", 1}, {"itl_ms", 12}}, {{"batch", 16}, {"itl_ms", 42}}}},
                       {"decode_max_requests", 16}};

deploy::RatioWorkload workload(double rate) {
  return {.rate = rate, .input_tokens = 500, .output_tokens = 50, .prefix_hit = 0, .ttft_seconds = 1.0, .itl_seconds = 0.03};
}

deploy::CapacityProfile profile(int max_requests = 16) {
  json j = kProfile;
  j["decode_max_requests"] = max_requests;
  auto p = deploy::parse_capacity_profile(j);
  REQUIRE(p.is_ok());
  return *p;
}

}  // namespace

TEST_CASE("predict_ratio: capacities, goodput, predicted TTFT and the binding constraint", "[deploy][plan]") {
  auto r = deploy::predict_ratio(profile(), workload(3.5), 3, 1);
  REQUIRE(r.is_ok());
  CHECK(r->prefill_seconds == Approx(0.5));
  CHECK(r->prefill_capacity == Approx(3 * (2.0 / 3) / 0.5));
  CHECK(r->decode_batch == 10);
  CHECK(r->decode_capacity == Approx(10 / (50 * 0.03)));
  CHECK(r->goodput == Approx(3.5));
  CHECK(r->binding == "offered load");
  // rho = 3.5 x 0.5 / 3; TTFT = S + rho S / (2 (1 - rho)) = 0.85 s.
  CHECK(r->ttft_seconds == Approx(0.85));

  auto p1 = deploy::predict_ratio(profile(), workload(3.5), 1, 1);
  REQUIRE(p1.is_ok());
  CHECK(p1->goodput == Approx(4.0 / 3));
  CHECK(p1->binding == "prefill TTFT");
  // Enough prefill: the decode side binds, by ITL at 16 slots, by slots at 4.
  auto itl = deploy::predict_ratio(profile(16), workload(10), 10, 1);
  REQUIRE(itl.is_ok());
  CHECK(itl->binding == "decode ITL");
  CHECK(itl->goodput == Approx(10 / 1.5));
  auto kv = deploy::predict_ratio(profile(4), workload(10), 10, 1);
  REQUIRE(kv.is_ok());
  CHECK(kv->binding == "decode KV capacity");
  CHECK(kv->goodput == Approx(4 / (50 * 0.018)));
  // A prefix cache hit of half the input halves S.
  auto w = workload(3.5);
  w.prefix_hit = 0.5;
  CHECK(deploy::predict_ratio(profile(), w, 1, 1)->prefill_seconds == Approx(0.25));
  // An SLA no single request meets.
  w = workload(1);
  w.ttft_seconds = 0.4;
  auto none = deploy::predict_ratio(profile(), w, 4, 4);
  REQUIRE(none.is_ok());
  CHECK(none->goodput == 0);
  CHECK(none->binding.find("prefill TTFT: one request alone") == 0);
}

TEST_CASE("recommend_ratio: the smallest P and D for the rate, or the best split of a total", "[deploy][plan]") {
  auto r = deploy::recommend_ratio(profile(), workload(3.5));
  REQUIRE(r.is_ok());
  CHECK(r->prefill == 3);
  CHECK(r->decode == 1);
  CHECK(r->goodput == Approx(3.5));
  // Four processes: 1:3 gives 1.33 req/s, 2:2 2.67, 3:1 the whole 3.5.
  auto t = deploy::recommend_ratio(profile(), workload(3.5), 4);
  REQUIRE(t.is_ok());
  CHECK(t->prefill == 3);
  CHECK(t->decode == 1);
  // A decode-heavy workload moves the split: long outputs at a high rate need more decode ranks.
  auto w = workload(6);
  w.output_tokens = 400;
  w.input_tokens = 100;
  auto d = deploy::recommend_ratio(profile(), w, 8);
  REQUIRE(d.is_ok());
  CHECK(d->decode > d->prefill);
  // When every split serves the whole rate, the one with the most headroom: at 1 req/s over 4 processes,
  // 1:3 leaves 1.33 req/s of prefill, 2:2 2.67 (decode 13.3), 3:1 4.0 (decode 6.67): 3:1.
  auto low = deploy::recommend_ratio(profile(), workload(1), 4);
  REQUIRE(low.is_ok());
  CHECK(low->goodput == Approx(1));
  CHECK(low->prefill == 3);
  CHECK(!deploy::recommend_ratio(profile(), workload(1), 1).is_ok());
}

TEST_CASE("k3-plan ratio reads a profile file and names bad input", "[deploy][plan]") {
  test::TempDir dir("plan-ratio");
  std::ofstream(dir.path() + "/profile.json") << kProfile.dump();
  const std::string bin = std::string(K3_BIN_DIR) + "/k3-plan ratio --profile " + dir.path() + "/profile.json ";
  auto r = test::run_command(bin + "--rate 3.5 --input 500 --output 50 --ttft-ms 1000 --itl-ms 30 --total 4 --json");
  REQUIRE(r.exit_code == 0);
  const json j = json::parse(r.out);
  CHECK(j.at("prefill_instances") == 3);
  CHECK(j.at("decode_ranks") == 1);
  CHECK(j.at("goodput_rps").get<double>() == Approx(3.5));
  CHECK(j.at("binding") == "offered load");
  CHECK(test::run_command(bin + "--rate 0 --input 5 --output 5 --ttft-ms 1 --itl-ms 1 2>&1").out.find("--rate must be > 0") !=
        std::string::npos);
  json bad = kProfile;
  bad["decode"][1]["batch"] = 1;
  std::ofstream(dir.path() + "/bad.json") << bad.dump();
  auto b = test::run_command(std::string(K3_BIN_DIR) + "/k3-plan ratio --profile " + dir.path() +
                             "/bad.json --rate 1 --input 5 --output 5 --ttft-ms 1 --itl-ms 1 2>&1");
  CHECK(b.exit_code == 2);
  CHECK(b.out.find("profile: decode[1]: batch must ascend") != std::string::npos);
}

// Shared compute (deploy/ratio_plan.h): the model must be today's when nothing is shared, and cap what
// processes on too few cores can do when something is.
TEST_CASE("shared compute: nothing shared gives the unshared prediction on random inputs", "[deploy][plan]") {
  std::mt19937_64 rng(16);
  std::uniform_real_distribution<double> u(0, 1);
  for (int i = 0; i < 300; ++i) {
    const double s0 = 0.01 + u(rng) * 0.2, per_token = 0.0005 + u(rng) * 0.002, itl0 = 0.002 + u(rng) * 0.02;
    auto p = deploy::parse_capacity_profile(
        {{"prefill", {{{"input_tokens", 64}, {"seconds", s0}}, {{"input_tokens", 1024}, {"seconds", s0 + 960 * per_token}}}},
         {"decode", {{{"batch", 1}, {"itl_ms", itl0 * 1e3}}, {{"batch", 32}, {"itl_ms", (itl0 + u(rng) * 0.05) * 1e3}}}},
         {"decode_max_requests", 1 + int(u(rng) * 32)}});
    REQUIRE(p.is_ok());
    const deploy::RatioWorkload w{.rate = 0.5 + u(rng) * 20, .input_tokens = 16 + u(rng) * 1000, .output_tokens = 8 + u(rng) * 200,
                                  .prefix_hit = u(rng) * 0.5, .ttft_seconds = 0.05 + u(rng) * 2, .itl_seconds = 0.005 + u(rng) * 0.06};
    const int P = 1 + int(u(rng) * 6), D = 1 + int(u(rng) * 6);
    auto plain = deploy::predict_ratio(*p, w, P, D);
    REQUIRE(plain.is_ok());
    CHECK(plain->compute_speed == 1);
    // Each process its own core (and more cores than processes).
    for (double cores : {double(P + D), double(P + D) + 3.5}) {
      auto own = deploy::predict_ratio(*p, w, P, D, {.cores = cores, .share = 1});
      REQUIRE(own.is_ok());
      INFO("case " << i << " P=" << P << " D=" << D << " cores=" << cores);
      CHECK(own->compute_speed == Approx(1));
      CHECK(own->goodput == Approx(plain->goodput));
      CHECK(own->prefill_capacity == Approx(plain->prefill_capacity));
      CHECK(own->decode_capacity == Approx(plain->decode_capacity));
      CHECK(own->binding == plain->binding);
    }
  }
}

TEST_CASE("shared compute: too few cores cap the goodput and the binding says so", "[deploy][plan]") {
  // 3 prefill instances + 1 decode rank on one core. Alone, P=3 serves 4 req/s within the TTFT SLA; on one
  // core the prefill work (S = 0.5 core-seconds per request) cannot exceed 1 / 0.5 = 2 req/s.
  auto free = deploy::predict_ratio(profile(), workload(10), 3, 1);
  auto one_core = deploy::predict_ratio(profile(), workload(10), 3, 1, {.cores = 1});
  REQUIRE(free.is_ok());
  REQUIRE(one_core.is_ok());
  CHECK(free->goodput == Approx(4));
  CHECK(one_core->goodput < 2);
  CHECK(one_core->goodput > 0.5);
  CHECK(one_core->compute_speed < 1);
  CHECK(one_core->compute_speed >= 0.25);  // never below an even split over all 4 processes
  CHECK(one_core->prefill_seconds == Approx(0.5 / one_core->compute_speed));
  CHECK(one_core->binding.rfind("compute sharing (4 processes on 1 cores", 0) == 0);
  CHECK(one_core->binding.find("then prefill TTFT") != std::string::npos);
  // Two cores: more goodput than one, still below the unshared 4.
  auto two = deploy::predict_ratio(profile(), workload(10), 3, 1, {.cores = 2});
  REQUIRE(two.is_ok());
  CHECK(two->goodput > one_core->goodput);
  CHECK(two->goodput < free->goodput);
  // A light load on shared cores is served whole: the processes are rarely busy together.
  auto light = deploy::predict_ratio(profile(), workload(0.5), 3, 1, {.cores = 1});
  REQUIRE(light.is_ok());
  CHECK(light->goodput == Approx(0.5));
  CHECK(light->binding == "offered load");
  // Recommending 4 processes on one core: no split serves more than one core's worth.
  auto rec = deploy::recommend_ratio(profile(), workload(10), 4, {.cores = 1});
  REQUIRE(rec.is_ok());
  CHECK(rec->goodput < 2);
  // Without a total, the search stops growing once more processes add nothing: still a valid split.
  auto smallest = deploy::recommend_ratio(profile(), workload(10), 0, {.cores = 1});
  REQUIRE(smallest.is_ok());
  CHECK(smallest->goodput < 2);
}

TEST_CASE("shared compute: a profile taken on part of a core scales to the cores deployed", "[deploy][plan]") {
  json j = kProfile;
  j["cores_per_process"] = 0.5;  // measured while other work took half the core
  auto half = deploy::parse_capacity_profile(j);
  REQUIRE(half.is_ok());
  // A dedicated host with a core per process: twice as fast as profiled.
  auto fast = deploy::predict_ratio(*half, workload(1), 2, 2, {.cores = 4, .share = 1});
  REQUIRE(fast.is_ok());
  CHECK(fast->compute_speed == Approx(2));
  CHECK(fast->prefill_seconds == Approx(0.25));
  // The host shared as it was when profiled: as profiled.
  auto same = deploy::predict_ratio(*half, workload(1), 2, 2, {.cores = 4, .share = 0.5});
  REQUIRE(same.is_ok());
  CHECK(same->compute_speed == Approx(1));
  CHECK(same->goodput == Approx(deploy::predict_ratio(profile(), workload(1), 2, 2)->goodput));
}

TEST_CASE("shared compute: bad input is named", "[deploy][plan]") {
  CHECK(deploy::predict_ratio(profile(), workload(1), 1, 1, {.cores = -1}).status().message().find("--cores") != std::string::npos);
  CHECK(deploy::predict_ratio(profile(), workload(1), 1, 1, {.cores = 2, .share = 0}).status().message().find("--core-share") !=
        std::string::npos);
  CHECK(deploy::predict_ratio(profile(), workload(1), 1, 1, {.cores = 2, .share = 1.5}).status().message().find("--core-share") !=
        std::string::npos);
  json j = kProfile;
  j["cores_per_process"] = 2;  // more cores than its one thread can use
  CHECK(deploy::parse_capacity_profile(j).status().message().find("profile: cores_per_process") != std::string::npos);
  j["threads_per_process"] = 0;
  CHECK(deploy::parse_capacity_profile(j).status().message().find("profile: threads_per_process") != std::string::npos);
}

TEST_CASE("k3-plan ratio --cores predicts on shared cores", "[deploy][plan]") {
  test::TempDir dir("plan-ratio-cores");
  std::ofstream(dir.path() + "/profile.json") << kProfile.dump();
  auto r = test::run_command(std::string(K3_BIN_DIR) + "/k3-plan ratio --profile " + dir.path() +
                             "/profile.json --rate 10 --input 500 --output 50 --ttft-ms 1000 --itl-ms 30 --prefill 3 --decode 1 "
                             "--cores 1 --json");
  REQUIRE(r.exit_code == 0);
  const json j = json::parse(r.out);
  CHECK(j.at("compute_speed").get<double>() < 1);
  CHECK(j.at("goodput_rps").get<double>() < 2);
  CHECK(j.at("binding").get<std::string>().rfind("compute sharing", 0) == 0);
}
