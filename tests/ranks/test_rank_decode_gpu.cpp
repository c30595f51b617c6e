// GPU rank groups: the rank-sliced forward (engine/rank_model.h) on the CUDA backend, on the rank scenario
// with K3's head shapes (rank_scenario.h).
//   - one CUDA rank gives the CUDA engine's logits, bit for bit with kv_partitions 1, within kTol with 8,
//     with its collectives over a UCX communicator (host memory, staged) and over NCCL (device memory);
//   - DCP2, DCP4 and EP2 groups of real rank processes sharing one GPU, their collectives staged through
//     host UCX, give one CUDA rank's logits (same kv_partitions) bit for bit;
//   - with two GPUs or more, DCP2 and EP2 groups with one GPU per rank over NCCL do the same.
// Where the arithmetic differs (8 partitions merged against one pass), bf16 on the GPU: within kTol of the
// largest logit, and the same argmax unless the reference's two best are closer than that. Each case prints a GPU-RANKS line with its worst error and
// how many rows came out bit for bit. Without a GPU every case prints SKIPPED.
#include <catch2/catch.hpp>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <sstream>

#include "decode_node/group_collectives.h"
#include "tests/ranks/rank_peers.h"
#include "tests/ranks/rank_scenario.h"
#include "tests/transfer/process_guard.h"
#include "transfer/comm_ucx.h"

using namespace k3;
using namespace k3::test::ranks;
using namespace std::chrono_literals;

namespace {

constexpr double kTol = 2e-2;
// The same for k3-small's 93 layers, where the rounding of a merge travels through every later layer.
constexpr double kDeepTol = 0.1;

// Why the CUDA backend cannot run here ("" when it can), and how many GPUs it can use.
std::string no_gpu() {
  auto be = make_backend({.kind = "cuda"});
  return be.is_ok() ? "" : be.status().to_string();
}
int gpu_count() {
  int n = 1;
  while (n < 8 && make_backend({.kind = "cuda", .device = n}).is_ok()) ++n;
  return n;
}
// Why groups over NCCL with one GPU a rank cannot run here ("" when they can: NCCL and two GPUs or more).
std::string no_nccl_pair() {
  if (std::string why = no_gpu(); !why.empty()) return why;
  if (!decode::nccl_built()) return "this build has no NCCL";
  if (const int n = gpu_count(); n < 2) return "NCCL needs one GPU per rank, " + std::to_string(n) + " visible";
  return "";
}

// Worst |a - b| over the largest |b| of a row, with the argmax test.
struct RowCheck {
  double worst = 0;
  int rows = 0, bitwise = 0, argmax_differs = 0;
  void add(const std::vector<float>& got, const std::vector<float>& ref) {
    REQUIRE(got.size() == ref.size());
    double num = 0, den = 1e-30;
    size_t best = 0, got_best = 0;
    for (size_t i = 0; i < ref.size(); ++i) {
      num = std::max(num, double(std::fabs(got[i] - ref[i])));
      den = std::max(den, double(std::fabs(ref[i])));
      if (ref[i] > ref[best]) best = i;
      if (got[i] > got[got_best]) got_best = i;
    }
    worst = std::max(worst, num / den);
    ++rows;
    if (std::memcmp(got.data(), ref.data(), ref.size() * sizeof(float)) == 0) ++bitwise;
    // A different argmax is allowed only where the reference has a near tie.
    if (got_best != best && double(ref[best] - ref[got_best]) > kTol * den) ++argmax_differs;
  }
  void print(const std::string& what) const {
    std::printf("GPU-RANKS %s: %d rows, worst |d|/max|logit| %.3g, %d bit for bit, %d argmax off a tie\n", what.c_str(),
                rows, worst, bitwise, argmax_differs);
    std::fflush(stdout);
  }
  // `exact`: every row bit for bit (the same arithmetic on the same GPU), else within kTol.
  void report(const std::string& what, bool exact) const {
    print(what);
    INFO(what << ": worst " << worst);
    CHECK(worst < kTol);
    CHECK(argmax_differs == 0);
    if (exact) CHECK(bitwise == rows);
  }
};

StepLogits one_rank(const Scenario& sc, RankLayout g, Comm& comm, const std::string& backend = "cuda", int threads = 1) {
  auto out = run_group(sc, g, comm, threads, backend);
  INFO(out.status().to_string());
  REQUIRE(out.is_ok());
  return std::move(out).value();
}

std::vector<float> parse_row(const std::string& values) {
  std::vector<float> v;
  std::istringstream in(values);
  for (std::string x; in >> x;) v.push_back(std::strtof(x.c_str(), nullptr));
  return v;
}

// Starts the group's rank processes on the CUDA backend (rank r on GPU r % gpus) and returns each rank's
// logits: [rank] -> {"step req" -> row}.
std::vector<std::map<std::string, std::vector<float>>> run_gpu_processes(int heads, uint64_t seed, RankLayout g, int gpus,
                                                                        const std::string& collectives) {
  const int size = g.size();
  auto args = [&](int r, const std::string& ep) {
    return std::vector<std::string>{std::to_string(r), std::to_string(size), ep, std::to_string(heads),
                                    std::to_string(seed), std::to_string(g.dcp), std::to_string(g.ep),
                                    std::to_string(g.kv_partitions), "--backend", "cuda", "--gpus",
                                    std::to_string(gpus), "--collectives", collectives};
  };
  std::vector<std::map<std::string, std::vector<float>>> got(size);
  const auto lines = run_rank_peers(size, args, 180s);
  for (int r = 0; r < size; ++r)
    for (const std::string& line : lines[r]) {
      if (line.rfind("V ", 0) != 0) continue;
      std::istringstream in(line.substr(2));
      std::string step, req, rest;
      in >> step >> req;
      std::getline(in, rest);
      got[r][step + " " + req] = parse_row(rest);
    }
  return got;
}

// Every rank's rows against one CUDA rank's (the same kv_partitions), for the requests it serves.
void check_group(const std::string& what, const Scenario& sc, RankLayout g, int gpus, const std::string& collectives) {
  auto comm = transfer::UcxComm::create(0, 1, "tcp://127.0.0.1:*").value();
  const StepLogits ref = one_rank(sc, {.dcp = 1, .kv_partitions = g.dcp > 1 ? g.kv_partitions : 1}, *comm);
  const auto got = run_gpu_processes(static_cast<int>(sc.cfg.kda.num_heads), 0, g, gpus, collectives);
  RowCheck check;
  for (int r = 0; r < g.size(); ++r) {
    RankLayout mine = g;
    mine.rank = r;
    const auto served_here = served(mine, static_cast<int>(sc.prompts.size()));
    INFO(what << " rank " << r);
    CHECK(got[r].size() == ref.size() * served_here.size());
    for (size_t s = 0; s < ref.size(); ++s)
      for (int req : served_here) {
        const auto it = got[r].find(std::to_string(s) + " " + std::to_string(req));
        REQUIRE(it != got[r].end());
        check.add(it->second, ref[s].at(req));
      }
  }
  check.report(what, true);
}

}  // namespace

TEST_CASE("GPU ranks: one CUDA rank gives the CUDA engine's logits over UCX and NCCL communicators", "[ranks][cuda]") {
  if (const std::string why = no_gpu(); !why.empty()) {
    WARN("SKIPPED: " << why);
    return;
  }
  Scenario sc = make_scenario(4, 5, 3, 4, true);
  // Every expert on every token (k = E; the weights do not change): with random weights the top-k choice
  // has near ties, where the rounding of 8 merged attention partitions instead of one pass picks
  // another expert (a logit change of the order of the logits themselves). kv_partitions 1 is bit for
  // bit either way.
  sc.cfg.num_experts_per_token = sc.cfg.num_experts;
  auto ref = monolithic(sc, "cuda");
  INFO(ref.status().to_string());
  REQUIRE(ref.is_ok());
  auto ucx = transfer::UcxComm::create(0, 1, "tcp://127.0.0.1:*").value();
  auto nccl = decode::make_group_collectives(decode::GroupCollectives::Nccl, *ucx, 0, std::chrono::seconds(60));
  if (!nccl.is_ok()) WARN("SKIPPED over NCCL: " << nccl.status().to_string());
  for (int kv : {1, 8}) {
    RowCheck over_ucx;
    const StepLogits a = one_rank(sc, {.dcp = 1, .kv_partitions = kv}, *ucx);
    for (size_t s = 0; s < a.size(); ++s)
      for (auto& [req, lg] : (*ref)[s]) over_ucx.add(a[s].at(req), lg);
    over_ucx.report("one rank, kv_partitions " + std::to_string(kv) + ", UCX, vs the engine", kv == 1);
    if (!nccl.is_ok()) continue;
    RowCheck over_nccl;
    const StepLogits b = one_rank(sc, {.dcp = 1, .kv_partitions = kv}, **nccl);
    for (size_t s = 0; s < b.size(); ++s)
      for (auto& [req, lg] : (*ref)[s]) over_nccl.add(b[s].at(req), lg);
    over_nccl.report("one rank, kv_partitions " + std::to_string(kv) + ", NCCL, vs the engine", kv == 1);
    // The same with a deadline and a waiting hook: every call then runs under the communicator's
    // watchdog (comm_nccl.h), and the bits do not move.
    (*nccl)->set_timeout(30s);
    std::atomic<int> hooks{0};
    (*nccl)->set_while_waiting([&] {
      ++hooks;
      return Status::ok();
    });
    RowCheck watched;
    const StepLogits c = one_rank(sc, {.dcp = 1, .kv_partitions = kv}, **nccl);
    (*nccl)->set_while_waiting({});
    (*nccl)->set_timeout(0ms);
    for (size_t s = 0; s < c.size(); ++s)
      for (auto& [req, lg] : (*ref)[s]) watched.add(c[s].at(req), lg);
    watched.report("one rank, kv_partitions " + std::to_string(kv) + ", NCCL under its watchdog (" +
                       std::to_string(hooks.load()) + " hook calls), vs the engine",
                   kv == 1);
  }
}

TEST_CASE("GPU ranks: DCP2 DCP4 and EP2 rank processes sharing one GPU over host UCX give one CUDA rank's logits",
          "[ranks][cuda][process]") {
  if (const std::string why = no_gpu(); !why.empty()) {
    WARN("SKIPPED: " << why);
    return;
  }
  const Scenario sc = make_scenario(4, 0, 3, 4, true);
  check_group("DCP2 on one GPU (UCX)", sc, {.dcp = 2, .kv_partitions = 4}, 1, "ucx");
  check_group("DCP4 on one GPU (UCX)", sc, {.dcp = 4, .kv_partitions = 8}, 1, "ucx");
  check_group("EP2 on one GPU (UCX)", sc, {.ep = 2}, 1, "ucx");
}

TEST_CASE("GPU ranks: DCP2 and EP2 rank processes with one GPU each over NCCL give one CUDA rank's logits",
          "[ranks][cuda][process]") {
  if (const std::string why = no_nccl_pair(); !why.empty()) {
    WARN("SKIPPED: " << why);
    return;
  }
  const int gpus = gpu_count();
  const Scenario sc = make_scenario(4, 0, 3, 4, true);
  check_group("DCP2 on two GPUs (NCCL)", sc, {.dcp = 2, .kv_partitions = 4}, 2, "nccl");
  check_group("EP2 on two GPUs (NCCL)", sc, {.ep = 2}, 2, "nccl");
  if (gpus >= 4) check_group("DCP4 on four GPUs (NCCL)", sc, {.dcp = 4, .kv_partitions = 8}, 4, "nccl");
}

TEST_CASE("GPU ranks: over NCCL, a rank killed mid-step fails its group within 5 s and leaks no pages",
          "[ranks][cuda][process]") {
  if (const std::string why = no_nccl_pair(); !why.empty()) {
    WARN("SKIPPED: " << why);
    return;
  }
  // DCP2 over NCCL, one GPU a rank, a 2 s step deadline. Without a deadline of its own NCCL would wait for
  // the dead rank for ever; the communicator's watchdog aborts it at the deadline (comm_nccl.h).
  const auto exe = k3::test::helper_path("k3-test-rank-peer");
  auto args = [&](int r, const std::string& ep) {
    return std::vector<std::string>{std::to_string(r), "2", ep, "4", "63", "2", "1", "2", "2000",
                                    "--backend", "cuda", "--gpus", "2", "--collectives", "nccl"};
  };
  std::vector<std::unique_ptr<k3::test::ProcessGuard>> ranks;
  ranks.push_back(std::make_unique<k3::test::ProcessGuard>(exe, args(0, "tcp://127.0.0.1:*")));
  auto ep = ranks[0]->wait_for("BOUND ", 30s);
  REQUIRE(ep);
  ranks.push_back(std::make_unique<k3::test::ProcessGuard>(exe, args(1, *ep)));
  for (auto& r : ranks) REQUIRE(r->wait_for("STEP 3", 180s));
  ranks[1]->kill_now();
  const auto t0 = std::chrono::steady_clock::now();
  auto failed = ranks[0]->wait_for("FAILED ", 30s);
  REQUIRE(failed);
  const auto at = std::chrono::steady_clock::time_point(std::chrono::microseconds(std::stoll(*failed)));
  const double after = std::chrono::duration<double>(at - t0).count();
  INFO("failed " << after << " s after the kill: " << *failed);
  CHECK(after < 5.0);
  auto free = ranks[0]->wait_for("FREE ", 10s);
  REQUIRE(free);
  int fp = 0, np = 0, fs = 0, ns = 0;
  REQUIRE(std::sscanf(free->c_str(), "%d %d %d %d", &fp, &np, &fs, &ns) == 4);
  CHECK(fp == np);
  CHECK(fs == ns);
  CHECK(ranks[0]->wait_exit(10s) == 0);
}

// A diagnosis for GPU hosts (hidden; tests/cuda/run_small_diag_on_gpu_host.sh runs it): k3-small (93 layers,
// 32 experts, top-4, random bf16 weights) decoded by one CUDA rank with kv_partitions 2 against the same rank
// with kv_partitions 1. Served by clusters on the H200, the two part at the first or second decoded token of
// every request. If the cause is the expert choice (a near tie of the router's scores flipped by the rounding
// of two merged attention partitions instead of one pass), then with every expert routed (k = E) the two
// agree with the same argmax: that case is checked; the top-4 case is reported. The bound is kDeepTol, not
// kTol: 93 layers carry the bf16 rounding of the merge further than the tiny models' few (measured on the
// H200: 0.042 with every expert routed, against 1.07 and 10 of 16 argmaxes changed with top-4).
// K3_DIAG_BACKEND=cpu runs the same on the CPU backend (fp32), and K3_DIAG_LAYERS=N keeps the first N layers
// (the whole k3-small does not fit a small host's memory in fp32).
TEST_CASE("GPU ranks: k3-small with kv_partitions 2 against 1, top-4 and every expert routed", "[.][diag][small]") {
  const char* env_backend = std::getenv("K3_DIAG_BACKEND");
  const std::string backend = env_backend ? env_backend : "cuda";
  if (backend == "cuda") {
    if (const std::string why = no_gpu(); !why.empty()) {
      WARN("SKIPPED: " << why);
      return;
    }
  }
  const int threads = backend == "cpu" ? 0 : 1;  // the CPU backend: every core
  for (const bool every_expert : {false, true}) {
    Scenario sc;
    sc.cfg = preset_config("k3-small").value();
    sc.cfg.vocab_size = 2048;
    sc.cfg.eos_token_ids.clear();
    if (every_expert) sc.cfg.num_experts_per_token = sc.cfg.num_experts;
    if (const char* n = std::getenv("K3_DIAG_LAYERS"); n && std::atoi(n) > 0 && std::atoi(n) < sc.cfg.num_hidden_layers) {
      sc.cfg.num_hidden_layers = std::atoi(n);
      sc.cfg.attn_res_block_size = std::min(sc.cfg.attn_res_block_size, sc.cfg.num_hidden_layers);
      std::erase_if(sc.cfg.kda.kda_layers, [&](int l) { return l > sc.cfg.num_hidden_layers; });
      std::erase_if(sc.cfg.kda.full_attn_layers, [&](int l) { return l > sc.cfg.num_hidden_layers; });
    }
    sc.weights = WeightStore::synthetic({.cfg = sc.cfg, .seed = 5, .matrix_dtype = DType::BF16});
    std::mt19937 rng(9);
    std::uniform_int_distribution<int32_t> tok(0, sc.cfg.vocab_size - 1);
    for (int i = 0; i < 4; ++i) {
      std::vector<int32_t> p(48 + 16 * i);
      for (auto& t : p) t = tok(rng);
      sc.prompts.push_back(p);
    }
    for (int st = 0; st < 4; ++st) {
      std::vector<int32_t> t(sc.prompts.size());
      for (auto& x : t) x = tok(rng);
      sc.steps.push_back(t);
    }
    auto comm = transfer::UcxComm::create(0, 1, "tcp://127.0.0.1:*").value();
    const StepLogits one = one_rank(sc, {.dcp = 1, .kv_partitions = 1}, *comm, backend, threads);
    const StepLogits two = one_rank(sc, {.dcp = 1, .kv_partitions = 2}, *comm, backend, threads);
    RowCheck check;
    for (size_t st = 0; st < one.size(); ++st)
      for (auto& [req, lg] : one[st]) check.add(two[st].at(req), lg);
    const std::string what =
        "k3-small on " + backend + ", kv_partitions 2 vs 1, " + (every_expert ? "every expert" : "top-4");
    if (every_expert) {
      check.print(what);
      INFO(what << ": worst " << check.worst);
      CHECK(check.worst < kDeepTol);
      CHECK(check.argmax_differs == 0);
    } else {
      check.print(what);
    }
  }
}
