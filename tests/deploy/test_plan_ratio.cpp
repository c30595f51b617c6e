// k3-plan ratio's sizing on a profile with known closed forms: prefill S(L) = 1 ms per token, decode
// ITL(b) = 10 ms + 2 ms x b. For input 500 (S = 0.5 s) and a 1 s TTFT SLA, M/D/1 allows utilisation
// 2 (T - S) / (2T - S) = 2/3, i.e. 4/3 req/s per prefill instance; a 30 ms ITL SLA allows batch 10, i.e.
// 10 / (50 x 0.03) = 6.67 req/s per decode rank at 50 output tokens.
#include <catch2/catch.hpp>

#include <fstream>

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
