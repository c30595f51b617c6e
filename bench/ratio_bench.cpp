// `k3-bench ratio`: checks a `k3-plan ratio` recommendation against measurement. For each prefill:decode
// split of the same total number of processes it starts k3-cluster (the spec template's first prefill
// instance repeated P times, its first decode entry with D ranks: any prefill instance feeds any decode
// rank), sends one open-loop workload (Poisson arrivals at --rate, the same prompts and arrival times
// for every split), and measures goodput: requests that met both SLAs (TTFT, and mean time per output
// token after the first as the ITL) per second of offered load. The profile (k3-bench profile) gives
// each split's predicted goodput (deploy/ratio_plan.h) and the recommended split; the report says
// whether the recommended split measured best and how far its prediction was from its measurement.
// All processes run on this host, so the prediction shares its cores (--cores) among them, and other work
// on the host as it did when the profile was taken (deploy/ratio_plan.h SharedCompute).
#include <nlohmann/json.hpp>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <memory>
#include <random>
#include <sstream>
#include <thread>

#include "bench/bench_commands.h"
#include "bench/completion_client.h"
#include "bench/latency_summary.h"
#include "bench/spawned_cluster.h"
#include "deploy/ratio_plan.h"

namespace k3::bench {
namespace {

using Clock = std::chrono::steady_clock;
using json = nlohmann::json;

struct RatioOptions {
  std::string spec, profile, cluster_exe, model = "k3-tiny", splits, out = "ratio.json", work_dir;
  int total = 4, requests = 60, input = 64, output = 16, token_id_max = 256, startup_s = 300, seed = 0;
  double rate = 4, ttft_ms = 500, itl_ms = 50;
  double cores = std::thread::hardware_concurrency(), core_share = 0;  // core_share 0: as when the profile was taken
};

struct Split {
  int prefill = 0, decode = 0;
};

// "1:3,2:2,3:1"; empty: every split of `total` (P from 1 to total-1).
std::vector<Split> parse_splits(const std::string& text, int total) {
  std::vector<Split> out;
  if (text.empty()) {
    for (int p = 1; p < total; ++p) out.push_back({p, total - p});
    return out;
  }
  std::stringstream ss(text);
  std::string item;
  while (std::getline(ss, item, ',')) {
    const size_t colon = item.find(':');
    Split s;
    try {
      if (colon == std::string::npos) throw std::invalid_argument(item);
      s.prefill = std::stoi(item.substr(0, colon));
      s.decode = std::stoi(item.substr(colon + 1));
    } catch (const std::exception&) {
      throw CLI::ValidationError("--splits", "'" + item + "' is not P:D");
    }
    if (s.prefill < 1 || s.decode < 1) throw CLI::ValidationError("--splits", "'" + item + "': P and D must be >= 1");
    if (s.prefill + s.decode != total)
      throw CLI::ValidationError("--splits", "'" + item + "' does not add up to --total " + std::to_string(total));
    out.push_back(s);
  }
  return out;
}

// The spec template with P copies of its first prefill instance (ids p0..) and its first decode entry
// with D ranks.
json spec_for(const json& base, const Split& s) {
  json j = base;
  if (!j.contains("prefill") || !j["prefill"].is_array() || j["prefill"].empty())
    throw CLI::ValidationError("--spec", "needs a non-empty \"prefill\" list (its first entry is the template)");
  if (!j.contains("decode") || !j["decode"].is_array() || j["decode"].empty())
    throw CLI::ValidationError("--spec", "needs a non-empty \"decode\" list (its first entry is the template)");
  json p = j["prefill"][0], d = j["decode"][0];
  j["prefill"] = json::array();
  for (int i = 0; i < s.prefill; ++i) {
    p["id"] = "p" + std::to_string(i);
    j["prefill"].push_back(p);
  }
  d.erase("dp");
  d["ranks"] = s.decode;
  j["decode"] = json::array({d});
  if (!j.contains("router")) j["router"] = json::object();
  j["router"]["port"] = 0;
  return j;
}

struct Arrival {
  double at_s = 0;
  std::vector<int32_t> prompt;
};

std::vector<Arrival> make_arrivals(const RatioOptions& o) {
  std::mt19937_64 rng(static_cast<uint64_t>(o.seed));
  std::exponential_distribution<double> gap(o.rate);
  std::uniform_int_distribution<int32_t> id(0, o.token_id_max - 1);
  std::vector<Arrival> out;
  double t = 0;
  for (int i = 0; i < o.requests; ++i) {
    Arrival a{.at_s = t};
    for (int k = 0; k < o.input; ++k) a.prompt.push_back(id(rng));
    out.push_back(std::move(a));
    t += gap(rng);
  }
  return out;
}

struct Measured {
  int ok = 0, good = 0, failed = 0;
  double goodput = 0, offered_s = 0;
  LatencySummary ttft, itl;
  std::string first_error;
};

Measured run_split(const RatioOptions& o, const json& spec, const std::vector<Arrival>& arrivals, const std::string& path) {
  std::ofstream(path) << spec.dump(2) << "\n";
  auto cluster = SpawnedCluster::start(o.cluster_exe.empty() ? default_cluster_exe() : o.cluster_exe, path, o.startup_s,
                                       "k3-bench ratio");
  const int port = std::atoi(cluster->url().c_str() + cluster->url().rfind(':') + 1);
  std::vector<CompletionTiming> out(arrivals.size());
  std::vector<std::thread> clients;
  const auto start = Clock::now();
  const auto deadline = start + std::chrono::seconds(600);
  for (size_t i = 0; i < arrivals.size(); ++i) {
    std::this_thread::sleep_until(start + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(arrivals[i].at_s)));
    (void)cluster->drain();  // keep k3-cluster's stdout pipe from filling
    clients.emplace_back([&, i] {
      out[i] = run_completion({.port = port, .model = o.model, .prompt_ids = arrivals[i].prompt, .max_tokens = o.output,
                               .stream = true},
                              deadline);
    });
  }
  for (auto& c : clients) c.join();
  Measured m;
  std::vector<double> ttft, itl;
  for (const auto& t : out) {
    if (!t.ok) {
      ++m.failed;
      if (m.first_error.empty()) m.first_error = t.error;
      continue;
    }
    ++m.ok;
    const double per_token = t.output_tokens > 1 ? (t.e2e_s - t.ttft_s) / (t.output_tokens - 1) : 0;
    ttft.push_back(t.ttft_s);
    itl.push_back(per_token);
    if (t.ttft_s * 1e3 <= o.ttft_ms && per_token * 1e3 <= o.itl_ms) ++m.good;
  }
  // The offered duration: the arrival span plus one mean gap (n arrivals cover n gaps on average).
  m.offered_s = arrivals.back().at_s + 1.0 / o.rate;
  m.goodput = m.good / m.offered_s;
  m.ttft = summarize(ttft);
  m.itl = summarize(itl);
  return m;
}

int run_ratio(const RatioOptions& o) {
  const std::vector<Split> splits = parse_splits(o.splits, o.total);
  std::ifstream pf(o.profile);
  if (!pf) throw CLI::ValidationError("--profile", "cannot read " + o.profile);
  auto profile = deploy::parse_capacity_profile(json::parse(pf));
  if (!profile.is_ok()) throw CLI::ValidationError("--profile", profile.status().message());
  std::ifstream sf(o.spec);
  if (!sf) throw CLI::ValidationError("--spec", "cannot read " + o.spec);
  const json base = json::parse(sf);
  const deploy::RatioWorkload w{.rate = o.rate, .input_tokens = double(o.input), .output_tokens = double(o.output),
                                .prefix_hit = 0, .ttft_seconds = o.ttft_ms / 1e3, .itl_seconds = o.itl_ms / 1e3};
  // Other work on this host is taken to share the cores as it did while the profile was measured.
  const deploy::SharedCompute compute{
      .cores = o.cores,
      .share = o.core_share > 0 ? o.core_share : profile->cores_per_process / profile->threads_per_process};
  std::fprintf(stderr, "k3-bench ratio: %g cores, of which the node processes get %.2f of the time\n", compute.cores,
               compute.share);
  auto rec = deploy::recommend_ratio(*profile, w, o.total, compute);
  if (!rec.is_ok()) throw std::runtime_error("k3-plan ratio: " + rec.status().message());
  std::fprintf(stderr, "k3-bench ratio: recommended P=%d D=%d (predicted goodput %.2f req/s, bound by %s)\n", rec->prefill,
               rec->decode, rec->goodput, rec->binding.c_str());
  const std::string dir = o.work_dir.empty() ? std::filesystem::temp_directory_path().string() : o.work_dir;
  const auto arrivals = make_arrivals(o);
  json rows = json::array();
  double best_measured = -1, rec_measured = -1, rec_predicted = rec->goodput;
  for (const Split& s : splits) {
    auto pred = deploy::predict_ratio(*profile, w, s.prefill, s.decode, compute);
    if (!pred.is_ok()) throw std::runtime_error("prediction for " + std::to_string(s.prefill) + ":" + std::to_string(s.decode) +
                                                ": " + pred.status().message());
    const std::string path = dir + "/ratio-spec-" + std::to_string(s.prefill) + "-" + std::to_string(s.decode) + ".json";
    const Measured m = run_split(o, spec_for(base, s), arrivals, path);
    std::fprintf(stderr,
                 "k3-bench ratio: P=%d D=%d (speed %.2f, %s) predicted %.2f req/s measured %.2f req/s (%d/%d "
                 "within SLA, %d failed; TTFT p50 %.0f p90 %.0f ms; ITL p50 %.1f p90 %.1f ms)\n",
                 s.prefill, s.decode, pred->compute_speed, pred->binding.c_str(), pred->goodput, m.goodput,
                 m.good, o.requests, m.failed, m.ttft.p50 * 1e3,
                 m.ttft.p90 * 1e3, m.itl.p50 * 1e3, m.itl.p90 * 1e3);
    if (m.failed) std::fprintf(stderr, "k3-bench ratio:   first failure: %s\n", m.first_error.c_str());
    best_measured = std::max(best_measured, m.goodput);
    const bool recommended = s.prefill == rec->prefill && s.decode == rec->decode;
    if (recommended) rec_measured = m.goodput;
    rows.push_back({{"prefill", s.prefill}, {"decode", s.decode}, {"recommended", recommended},
                    {"predicted", deploy::ratio_prediction_json(*pred)}, {"measured_goodput", m.goodput},
                    {"within_sla", m.good}, {"ok", m.ok}, {"failed", m.failed}, {"offered_s", m.offered_s},
                    {"ttft_ms", {{"p50", m.ttft.p50 * 1e3}, {"p90", m.ttft.p90 * 1e3}, {"max", m.ttft.max * 1e3}}},
                    {"itl_ms", {{"p50", m.itl.p50 * 1e3}, {"p90", m.itl.p90 * 1e3}, {"max", m.itl.max * 1e3}}}});
  }
  json verdict = {{"recommended", {{"prefill", rec->prefill}, {"decode", rec->decode}}}};
  if (rec_measured >= 0) {
    // Relative to the measurement; with nothing measured within the SLA the error has no bound (null).
    verdict["recommended_is_best_measured"] = rec_measured >= best_measured;
    std::string error_text = "unbounded";
    if (rec_measured > 0) {
      const double error = std::abs(rec_predicted - rec_measured) / rec_measured;
      verdict["prediction_error"] = error;
      error_text = std::to_string(static_cast<int>(std::lround(error * 100))) + "%";
    } else {
      verdict["prediction_error"] = nullptr;
    }
    std::printf("RATIO recommended %d:%d best_measured=%s predicted=%.2f measured=%.2f error=%s\n", rec->prefill,
                rec->decode, rec_measured >= best_measured ? "yes" : "no", rec_predicted, rec_measured,
                error_text.c_str());
  } else {
    std::printf("RATIO recommended %d:%d was not among --splits\n", rec->prefill, rec->decode);
  }
  const json report = {{"workload", {{"rate", o.rate}, {"requests", o.requests}, {"input", o.input}, {"output", o.output},
                                     {"ttft_ms", o.ttft_ms}, {"itl_ms", o.itl_ms}, {"seed", o.seed}}},
                       {"total", o.total}, {"cores", o.cores}, {"core_share", compute.share},
                       {"splits", rows}, {"verdict", verdict}};
  std::ofstream f(o.out);
  f << report.dump(2) << "\n";
  if (!f) throw std::runtime_error("cannot write --out " + o.out);
  return 0;
}

}  // namespace

void add_ratio_command(CLI::App& app) {
  auto o = std::make_shared<RatioOptions>();
  auto* cmd = app.add_subcommand("ratio", "measure goodput of several prefill:decode splits of the same processes "
                                          "under one workload and compare with k3-plan ratio's prediction");
  cmd->add_option("--spec", o->spec, "k3-cluster spec template (first prefill instance and decode entry are repeated)")
      ->required();
  cmd->add_option("--profile", o->profile, "capacity profile from k3-bench profile")->required();
  cmd->add_option("--total", o->total, "prefill instances + decode ranks (default 4)")->check(CLI::Range(2, 64));
  cmd->add_option("--splits", o->splits, "P:D list, e.g. 1:3,2:2,3:1 (default every split of --total)");
  cmd->add_option("--rate", o->rate, "requests per second, Poisson arrivals (default 4)")->check(CLI::PositiveNumber);
  cmd->add_option("--requests", o->requests, "requests per split (default 60)")->check(CLI::Range(1, 100000));
  cmd->add_option("--input", o->input, "prompt tokens (default 64)")->check(CLI::Range(1, 1 << 20));
  cmd->add_option("--output", o->output, "output tokens (default 16)")->check(CLI::Range(2, 1 << 20));
  cmd->add_option("--ttft-ms", o->ttft_ms, "TTFT SLA (default 500)")->check(CLI::PositiveNumber);
  cmd->add_option("--itl-ms", o->itl_ms, "ITL SLA: mean time per output token after the first (default 50)")
      ->check(CLI::PositiveNumber);
  cmd->add_option("--cores", o->cores, "cores this host's node processes share (default: this host's)")
      ->check(CLI::PositiveNumber);
  cmd->add_option("--core-share", o->core_share,
                  "fraction of each core's time the nodes get (default: the profile's cores_per_process / threads)")
      ->check(CLI::Range(0.0, 1.0));
  cmd->add_option("--model", o->model, "served model name (default k3-tiny)");
  cmd->add_option("--cluster-exe", o->cluster_exe, "k3-cluster binary (default: next to k3-bench)");
  cmd->add_option("--work-dir", o->work_dir, "where the per-split specs are written (default: the temp dir)");
  cmd->add_option("--startup-timeout", o->startup_s, "seconds to wait for each cluster (default 300)");
  cmd->add_option("--seed", o->seed, "seed of prompts and arrival times");
  cmd->add_option("--out", o->out, "report JSON to write (default ratio.json)");
  cmd->callback([o] {
    int rc;
    try {
      rc = run_ratio(*o);
    } catch (const CLI::Error&) {
      throw;
    } catch (const std::exception& e) {
      std::fprintf(stderr, "k3-bench ratio: %s\n", e.what());
      rc = 2;
    }
    if (rc != 0) std::exit(rc);
  });
}

}  // namespace k3::bench
