// The rank-sliced decode (engine/rank_model.h) against its references, bit for bit:
//   - one rank with kv_partitions 1 is the monolithic engine (same logits bits, every step);
//   - DCP2/4/8 groups of real rank processes give, on every rank, the bits of DCP1 with the same
//     kv_partitions; and stay within 1e-5 of the monolithic engine (only the MLA merge order differs);
//   - EP2/EP4 groups give each request the bits of EP1, which is the monolithic engine; an EP rank
//     without requests still joins every expert exchange;
//   - layouts that do not split the model evenly are refused, naming the field.
#include <catch2/catch.hpp>

#include <cmath>
#include <memory>

#include "tests/ranks/rank_peers.h"
#include "tests/ranks/rank_scenario.h"
#include "tests/transfer/process_guard.h"
#include "transfer/comm_ucx.h"

using namespace k3;
using namespace k3::test::ranks;
using namespace std::chrono_literals;
using k3::test::ProcessGuard;

namespace {

StepLogits engine_logits(const Scenario& sc) {
  auto out = monolithic(sc);
  INFO(out.status().to_string());
  REQUIRE(out.is_ok());
  return std::move(out).value();
}

// One rank alone (a communicator of one).
StepLogits single_rank(const Scenario& sc, RankLayout g) {
  auto comm = transfer::UcxComm::create(0, 1, "tcp://127.0.0.1:*").value();
  auto out = run_group(sc, g, *comm);
  INFO(out.status().to_string());
  REQUIRE(out.is_ok());
  return std::move(out).value();
}

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

std::string digest(const std::vector<float>& v) {
  char b[17];
  std::snprintf(b, sizeof b, "%016llx", static_cast<unsigned long long>(fnv(v.data(), v.size() * 4)));
  return b;
}

// Starts the group's rank processes and returns what each printed: [rank] -> {"step req" -> digest}.
std::vector<std::map<std::string, std::string>> run_processes(int heads, uint64_t seed, RankLayout g) {
  const int size = g.size();
  auto args = [&](int r, const std::string& ep) {
    return std::vector<std::string>{std::to_string(r), std::to_string(size), ep, std::to_string(heads),
                                    std::to_string(seed), std::to_string(g.dcp), std::to_string(g.ep),
                                    std::to_string(g.kv_partitions)};
  };
  std::vector<std::map<std::string, std::string>> got(size);
  const auto lines = run_rank_peers(size, args, 120s);
  for (int r = 0; r < size; ++r)
    for (const std::string& line : lines[r]) {
      if (line.rfind("L ", 0) != 0) continue;
      const auto last = line.rfind(' ');
      got[r][line.substr(2, last - 2)] = line.substr(last + 1);
    }
  return got;
}

}  // namespace

TEST_CASE("rank layouts that do not split the model are refused by name", "[ranks]") {
  const Scenario sc = make_scenario(4, 1, 1, 1);
  auto why = [&](RankLayout g) { return validate_rank_layout(g, sc.cfg).to_string(); };
  CHECK(validate_rank_layout({.dcp = 4, .kv_partitions = 8, .rank = 3}, sc.cfg).is_ok());
  CHECK(why({.dcp = 8, .kv_partitions = 8}).find("linear_attn_config.num_heads = 4") != std::string::npos);
  CHECK(why({.dcp = 3, .kv_partitions = 6}).find("do not split evenly over dcp = 3") != std::string::npos);
  CHECK(why({.ep = 3}).find("num_experts = 8") != std::string::npos);
  CHECK(why({.dcp = 2, .ep = 2, .kv_partitions = 2}).find("together are not supported") != std::string::npos);
  CHECK(why({.dcp = 4, .kv_partitions = 6}).find("kv_partitions = 6 is not a multiple of dcp = 4") != std::string::npos);
  CHECK(why({.dcp = 2, .kv_partitions = 2, .rank = 2}).find("rank 2 is outside the group 0..1") != std::string::npos);
  Scenario odd = make_scenario(4, 1, 1, 1);
  odd.cfg.num_attention_heads = odd.cfg.num_key_value_heads = 6;
  CHECK(validate_rank_layout({.dcp = 4, .kv_partitions = 4}, odd.cfg).to_string().find("num_attention_heads = 6") !=
        std::string::npos);
  // The rank-sliced forward is K3's: a Kimi Linear model is refused by name.
  const ModelConfig kimi = preset_config("kimi-linear-tiny").value();
  CHECK(validate_rank_layout({.dcp = 1, .kv_partitions = 1}, kimi).to_string().find("Kimi Linear") != std::string::npos);
  // The communicator must match the layout.
  auto comm = transfer::UcxComm::create(0, 1, "tcp://127.0.0.1:*").value();
  auto be = make_cpu_backend({.threads = 1});
  auto bad = RankModel::create(*be, sc.cfg, sc.weights, {.dcp = 2, .kv_partitions = 2}, *comm, {});
  REQUIRE_FALSE(bad.is_ok());
  CHECK(bad.status().to_string().find("the communicator is rank 0 of 1") != std::string::npos);
}

TEST_CASE("one rank with kv_partitions 1 is the monolithic engine, bit for bit", "[ranks]") {
  const Scenario sc = make_scenario(4, 11);
  const StepLogits mono = engine_logits(sc), one = single_rank(sc, {});
  for (size_t s = 0; s < mono.size(); ++s)
    for (auto& [req, lg] : mono[s]) {
      INFO("step " << s << " request " << req);
      CHECK(same_bits(one[s].at(req), lg));
    }
}

TEST_CASE("DCP rank processes give DCP1's logits bit for bit", "[ranks][process]") {
  const auto [heads, dcp] = GENERATE(std::pair{4, 2}, std::pair{4, 4}, std::pair{8, 8});
  const uint64_t seed = 20 + dcp;
  const Scenario sc = make_scenario(heads, seed);
  const RankLayout one{.dcp = 1, .kv_partitions = 8};
  const StepLogits ref = single_rank(sc, one);
  const StepLogits mono = engine_logits(sc);
  for (size_t s = 0; s < ref.size(); ++s)
    for (auto& [req, lg] : ref[s]) {  // V = 8 partials differ from one pass only in the merge's rounding
      double num = 0, den = 1;
      for (size_t i = 0; i < lg.size(); ++i) {
        num = std::max(num, double(std::fabs(lg[i] - mono[s].at(req)[i])));
        den = std::max(den, double(std::fabs(lg[i])));
      }
      CHECK(num / den < 1e-5);
    }
  const auto got = run_processes(heads, seed, {.dcp = dcp, .kv_partitions = 8});
  for (int r = 0; r < dcp; ++r) {
    INFO("DCP" << dcp << " rank " << r << " (heads " << heads << ")");
    REQUIRE(got[r].size() == ref.size() * sc.prompts.size());
    for (size_t s = 0; s < ref.size(); ++s)
      for (auto& [req, lg] : ref[s]) CHECK(got[r].at(std::to_string(s) + " " + std::to_string(req)) == digest(lg));
  }
}

TEST_CASE("EP rank processes give EP1's logits bit for bit, an idle rank included", "[ranks][process]") {
  const int ep = GENERATE(2, 4);
  const uint64_t seed = 40 + ep;
  const Scenario sc = make_scenario(4, seed);  // 3 requests: with EP4, rank 3 serves none
  const StepLogits ref = engine_logits(sc);       // EP1 == monolithic (previous test case)
  const auto got = run_processes(4, seed, {.ep = ep});
  for (int r = 0; r < ep; ++r) {
    INFO("EP" << ep << " rank " << r);
    const auto mine = served({.ep = ep, .rank = r}, static_cast<int>(sc.prompts.size()));
    CHECK(got[r].size() == ref.size() * mine.size());
    for (size_t s = 0; s < ref.size(); ++s)
      for (int req : mine) CHECK(got[r].at(std::to_string(s) + " " + std::to_string(req)) == digest(ref[s].at(req)));
  }
}

TEST_CASE("a rank killed mid-step fails its group within 5 s, no pool leaks, the other group serves on",
          "[ranks][process]") {
  // Group A: DCP4 on a long run with a 2 s step deadline; group B: an independent DCP2 group.
  const int heads = 4;
  const uint64_t seed_a = 61, seed_b = 62;
  const RankLayout a{.dcp = 4, .kv_partitions = 4};
  const auto exe = k3::test::helper_path("k3-test-rank-peer");
  auto args = [&](int r, const std::string& ep) {
    return std::vector<std::string>{std::to_string(r), "4", ep, std::to_string(heads), std::to_string(seed_a), "4", "1",
                                    "4", "2000"};
  };
  std::vector<std::unique_ptr<ProcessGuard>> ranks;
  ranks.push_back(std::make_unique<ProcessGuard>(exe, args(0, "tcp://127.0.0.1:*")));
  auto ep = ranks[0]->wait_for("BOUND ", 30s);
  REQUIRE(ep);
  for (int r = 1; r < a.size(); ++r) ranks.push_back(std::make_unique<ProcessGuard>(exe, args(r, *ep)));
  for (int r = 0; r < a.size(); ++r) REQUIRE(ranks[r]->wait_for("STEP 3", 120s));

  ranks[2]->kill_now();
  const auto t0 = std::chrono::steady_clock::now();
  // The other group serves meanwhile, and gives its reference bits.
  const Scenario sc_b = make_scenario(heads, seed_b);
  const StepLogits ref_b = single_rank(sc_b, {.dcp = 1, .kv_partitions = 2});
  const auto got_b = run_processes(heads, seed_b, {.dcp = 2, .kv_partitions = 2});
  for (int r = 0; r < 2; ++r)
    for (size_t s = 0; s < ref_b.size(); ++s)
      for (auto& [req, lg] : ref_b[s]) CHECK(got_b[r].at(std::to_string(s) + " " + std::to_string(req)) == digest(lg));

  for (int r : {0, 1, 3}) {
    INFO("survivor rank " << r);
    auto failed = ranks[r]->wait_for("FAILED ", 30s);
    REQUIRE(failed);
    // The rank stamps its failure with the machine-wide monotonic clock (steady_clock), like t0.
    const auto at = std::chrono::steady_clock::time_point(std::chrono::microseconds(std::stoll(*failed)));
    const double after = std::chrono::duration<double>(at - t0).count();
    INFO("failed " << after << " s after the kill: " << *failed);
    CHECK(after < 5.0);
    auto free = ranks[r]->wait_for("FREE ", 10s);
    REQUIRE(free);
    int fp = 0, np = 0, fs = 0, ns = 0;
    REQUIRE(std::sscanf(free->c_str(), "%d %d %d %d", &fp, &np, &fs, &ns) == 4);
    CHECK(fp == np);
    CHECK(fs == ns);
    CHECK(ranks[r]->wait_exit(10s) == 0);
  }
}
