// `k3-bench profile`: the capacity profile `k3-plan ratio` reads, measured on a running cluster of one
// prefill instance and one decode rank (--url, or --spawn-cluster SPEC for the run):
//   prefill: for each input length, requests one at a time with max_tokens 1; the median time to the
//            first token is the instance's service time S(L) for one request alone;
//   decode:  for each batch size b, b streams started together with --output-len tokens each; the
//            median over the streams of (end - first token) / (tokens - 1) is the rank's ITL at batch b.
//   cores:   with --spawn-cluster, the cluster's CPU seconds over the wall time of the prefill requests is
//            the share of the cores a busy process had (less than its threads when other work shares them).
// Writes {"prefill": [{"input_tokens", "seconds"}], "decode": [{"batch", "itl_ms"}], "decode_max_requests",
// "threads_per_process", "cores_per_process", "measured": {...}} (deploy/ratio_plan.h).
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <memory>
#include <random>
#include <thread>

#include "bench/bench_commands.h"
#include "bench/completion_client.h"
#include "bench/host_load.h"
#include "bench/latency_summary.h"
#include "bench/spawned_cluster.h"
#include "common/core/parse.h"

namespace k3::bench {
namespace {

using Clock = std::chrono::steady_clock;

struct ProfileOptions {
  std::string url, spawn_spec, cluster_exe, model = "k3-tiny", out = "profile.json", input_lens = "32,128,512",
                                                  batches = "1,2,4,8";
  int output_len = 32, reps = 3, decode_max_requests = 8, startup_s = 300, token_id_max = 256, seed = 0, threads = 1;
};

std::vector<int32_t> parse_list(const std::string& text, const char* flag) {
  auto v = parse_token_ids(text, flag, false);
  if (!v.is_ok()) throw CLI::ValidationError(flag, v.status().message());
  for (int32_t x : *v)
    if (x < 1) throw CLI::ValidationError(flag, "every entry must be >= 1");
  return *v;
}

int run_profile(const ProfileOptions& o) {
  const auto lens = parse_list(o.input_lens, "--input-lens"), batches = parse_list(o.batches, "--batches");
  std::unique_ptr<SpawnedCluster> cluster;
  std::string url = o.url;
  if (!o.spawn_spec.empty()) {
    cluster = SpawnedCluster::start(o.cluster_exe.empty() ? default_cluster_exe() : o.cluster_exe, o.spawn_spec, o.startup_s,
                                    "k3-bench profile");
    url = cluster->url();
  }
  const std::string prefix = "http://127.0.0.1:";
  if (url.rfind(prefix, 0) != 0) throw CLI::ValidationError("--url", "give --url http://127.0.0.1:PORT or --spawn-cluster");
  const int port = std::atoi(url.c_str() + prefix.size());
  std::mt19937_64 rng(static_cast<uint64_t>(o.seed));
  auto request = [&](int input, int max_tokens) {
    CompletionRequestSpec s{.port = port, .model = o.model, .prompt_ids = {}, .max_tokens = max_tokens, .stream = true};
    std::uniform_int_distribution<int32_t> id(0, o.token_id_max - 1);
    for (int i = 0; i < input; ++i) s.prompt_ids.push_back(id(rng));
    return s;
  };
  auto deadline = [] { return Clock::now() + std::chrono::seconds(300); };
  nlohmann::json prefill = nlohmann::json::array(), decode = nlohmann::json::array();
  // The cores a busy process had while measured: the spawned cluster's CPU seconds over the wall time of
  // the prefill requests (one at a time, so one node computes at once); nodes of a --url cluster are not
  // ours to read, so there it is the thread count.
  const double cpu_before = cluster ? process_tree_cpu_seconds(cluster->pid()) : 0;
  const auto wall_before = Clock::now();
  for (int L : lens) {
    std::vector<double> ttft;
    for (int r = 0; r < o.reps; ++r) {
      const auto t = run_completion(request(L, 1), deadline());
      if (!t.ok) throw std::runtime_error("prefill of " + std::to_string(L) + " tokens failed: " + t.error);
      ttft.push_back(t.ttft_s);
    }
    const double s = summarize(ttft).p50;
    std::fprintf(stderr, "k3-bench profile: prefill %5d tokens: %.4f s\n", L, s);
    prefill.push_back({{"input_tokens", L}, {"seconds", s}});
  }
  double cores = o.threads;
  if (cluster) {
    const double wall = std::chrono::duration<double>(Clock::now() - wall_before).count();
    cores = std::clamp((process_tree_cpu_seconds(cluster->pid()) - cpu_before) / wall, 0.01, double(o.threads));
    std::fprintf(stderr, "k3-bench profile: a busy process had %.2f of %d core(s)\n", cores, o.threads);
  }
  for (int b : batches) {
    std::vector<CompletionRequestSpec> specs;
    for (int i = 0; i < b; ++i) specs.push_back(request(lens.front(), o.output_len));
    std::vector<CompletionTiming> out(specs.size());
    std::vector<std::thread> streams;
    const auto until = deadline();
    for (size_t i = 0; i < specs.size(); ++i) streams.emplace_back([&, i] { out[i] = run_completion(specs[i], until); });
    for (auto& t : streams) t.join();
    // Time per output token after the first (tokens may arrive several to a chunk, so chunk gaps undercount).
    std::vector<double> per_token;
    for (const auto& t : out) {
      if (!t.ok) throw std::runtime_error("decode batch " + std::to_string(b) + " failed: " + t.error);
      per_token.push_back((t.e2e_s - t.ttft_s) / (t.output_tokens - 1));
    }
    const double itl = summarize(per_token).p50;
    std::fprintf(stderr, "k3-bench profile: decode batch %3d: ITL %.2f ms\n", b, itl * 1e3);
    decode.push_back({{"batch", b}, {"itl_ms", itl * 1e3}});
  }
  const nlohmann::json j = {{"prefill", prefill},
                            {"decode", decode},
                            {"decode_max_requests", o.decode_max_requests},
                            {"threads_per_process", o.threads},
                            {"cores_per_process", cores},
                            {"measured", {{"url", url}, {"reps", o.reps}, {"output_len", o.output_len}}}};
  std::ofstream f(o.out);
  f << j.dump(2) << "\n";
  if (!f) throw std::runtime_error("cannot write --out " + o.out);
  std::printf("PROFILE %s\n", o.out.c_str());
  return 0;
}

}  // namespace

void add_profile_command(CLI::App& app) {
  auto o = std::make_shared<ProfileOptions>();
  auto* cmd = app.add_subcommand("profile", "capacity profile for k3-plan ratio: prefill time vs input length, decode "
                                            "ITL vs batch, on one prefill instance + one decode rank");
  cmd->add_option("--url", o->url, "endpoint, http://127.0.0.1:PORT");
  cmd->add_option("--spawn-cluster", o->spawn_spec, "start k3-cluster with this spec for the run (stopped after)");
  cmd->add_option("--cluster-exe", o->cluster_exe, "k3-cluster binary (default: next to k3-bench)");
  cmd->add_option("--model", o->model, "served model name (default k3-tiny)");
  cmd->add_option("--input-lens", o->input_lens, "prefill input lengths (default 32,128,512)");
  cmd->add_option("--batches", o->batches, "decode batch sizes (default 1,2,4,8)");
  cmd->add_option("--output-len", o->output_len, "tokens per decode stream (default 32)")->check(CLI::Range(2, 100000));
  cmd->add_option("--reps", o->reps, "prefill requests per length (median; default 3)")->check(CLI::Range(1, 1000));
  cmd->add_option("--decode-max-requests", o->decode_max_requests,
                  "requests a decode rank holds (the spec's decode max_requests; default 8)")->check(CLI::Range(1, 1 << 20));
  cmd->add_option("--threads", o->threads, "compute threads per node process (the spec's threads; default 1)")
      ->check(CLI::Range(1, 1024));
  cmd->add_option("--startup-timeout", o->startup_s, "seconds to wait for a spawned cluster (default 300)");
  cmd->add_option("--seed", o->seed, "seed for prompt ids");
  cmd->add_option("--out", o->out, "profile JSON to write (default profile.json)");
  cmd->callback([o] {
    int rc;
    try {
      rc = run_profile(*o);
    } catch (const CLI::Error&) {
      throw;
    } catch (const std::exception& e) {
      std::fprintf(stderr, "k3-bench profile: %s\n", e.what());
      rc = 2;
    }
    if (rc != 0) std::exit(rc);
  });
}

}  // namespace k3::bench
