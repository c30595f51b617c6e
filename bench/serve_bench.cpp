// `k3-bench serve`: drives an OpenAI-compatible endpoint (k3-router) with N concurrent
// /v1/completions streams of random token-id prompts and exact output lengths, and reports TTFT, ITL,
// TPOT, E2E (p50/p90/p99), request throughput and output tok/s. Every failed request is counted and
// its reason printed. --spawn-cluster starts k3-cluster on a free port for the run and always stops it.
//
// Alongside the client-side TTFT it reads the router's own TTFT histogram (/metrics, delta over the
// run): the difference is what the HTTP front end + SSE framing + loopback add on top of the router's
// arrival → first-token-event time.
#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <mutex>
#include <random>
#include <thread>

#include "bench/bench_commands.h"
#include "bench/completion_client.h"
#include "bench/latency_summary.h"
#include "bench/process_cpu.h"
#include "bench/serve_workload.h"
#include "bench/spawned_cluster.h"
#include "bench/spawned_router.h"
#include "deploy/http_probe.h"

namespace k3::bench {
namespace {

using Clock = std::chrono::steady_clock;
using json = nlohmann::json;

struct LengthRange {
  int min = 1, max = 1;
};

struct ServeOptions {
  std::string url, model = "k3-tiny", spawn_spec, cluster_exe, json_file;
  int concurrency = 1, requests = 8, seed = 0, token_id_max = 256, timeout_s = 600, startup_s = 300;
  std::string input_len = "16:128", output_len = "16:64";
  bool stream = false;
  std::string workload = "random";
  int system_len = 2048, turns = 4;
  std::string spawn_router, router_exe;        // local-engine router: model dir, binary
  std::vector<std::string> router_args;        // extra k3-router flags
  int compare_prefix_slots = 0;                // >0: cache off then on (this many checkpoint slots)
  int prefix_block = 256;
};

LengthRange parse_range(const std::string& s, const std::string& flag) {
  const size_t colon = s.find(':');
  LengthRange r;
  try {
    if (colon == std::string::npos) r.min = r.max = std::stoi(s);
    else r.min = std::stoi(s.substr(0, colon)), r.max = std::stoi(s.substr(colon + 1));
  } catch (const std::exception&) {
    throw CLI::ValidationError(flag, "expected MIN:MAX or N, got '" + s + "'");
  }
  if (r.min < 1 || r.max < r.min) throw CLI::ValidationError(flag, "need 1 <= MIN <= MAX, got '" + s + "'");
  return r;
}

// http://127.0.0.1:PORT → PORT (the client connects over loopback only).
int loopback_port(const std::string& url) {
  for (const std::string prefix : {"http://127.0.0.1:", "http://localhost:"})
    if (url.rfind(prefix, 0) == 0) {
      const int port = std::atoi(url.c_str() + prefix.size());
      if (port > 0 && port < 65536) return port;
    }
  throw CLI::ValidationError("--url", "expected http://127.0.0.1:PORT or http://localhost:PORT, got '" + url + "'");
}

// The router's TTFT histogram totals (sum in seconds, count); {0,0} when /metrics does not answer.
std::pair<double, double> router_ttft_totals(int port) {
  auto r = deploy::http_get("127.0.0.1", port, "/metrics", std::chrono::milliseconds(5000));
  if (!r.is_ok() || r->status != 200) return {0, 0};
  auto value = [&](const std::string& name) {
    const auto at = r->body.find("\n" + name + " ");
    return at == std::string::npos ? 0.0 : std::atof(r->body.c_str() + at + name.size() + 2);
  };
  return {value("k3_router_time_to_first_token_seconds_sum"), value("k3_router_time_to_first_token_seconds_count")};
}

json summary_json(const LatencySummary& s) {
  return {{"count", s.count}, {"mean_ms", s.mean * 1e3}, {"p50_ms", s.p50 * 1e3}, {"p90_ms", s.p90 * 1e3},
          {"p99_ms", s.p99 * 1e3}, {"max_ms", s.max * 1e3}};
}

void print_row(const char* name, const LatencySummary& s) {
  std::printf("  %-5s %8.1f %8.1f %8.1f %8.1f %8.1f  (n=%zu)\n", name, s.mean * 1e3, s.p50 * 1e3, s.p90 * 1e3, s.p99 * 1e3,
              s.max * 1e3, s.count);
}

// One of the router's counters on /metrics (0 when absent or unreachable).
double router_counter(int port, const std::string& name) {
  auto r = deploy::http_get("127.0.0.1", port, "/metrics", std::chrono::milliseconds(5000));
  if (!r.is_ok() || r->status != 200) return 0;
  const auto at = r->body.find("\n" + name + " ");
  return at == std::string::npos ? 0.0 : std::atof(r->body.c_str() + at + name.size() + 2);
}

// Every request's shape, drawn up front from the seed, so a run repeats exactly.
std::vector<CompletionRequestSpec> make_specs(const ServeOptions& o) {
  const LengthRange in = parse_range(o.input_len, "--input-len"), out = parse_range(o.output_len, "--output-len");
  std::vector<std::vector<int32_t>> prompts;
  try {
    prompts = make_workload({.kind = o.workload, .requests = o.requests, .input_min = in.min, .input_max = in.max,
                             .system_len = o.system_len, .turns = o.turns, .token_id_max = o.token_id_max,
                             .seed = static_cast<uint64_t>(o.seed)});
  } catch (const std::invalid_argument& e) {
    throw CLI::ValidationError("--workload", e.what());
  }
  std::mt19937_64 rng(static_cast<uint64_t>(o.seed) + 1);
  std::vector<CompletionRequestSpec> specs(prompts.size());
  for (size_t i = 0; i < specs.size(); ++i) {
    specs[i].model = o.model;
    specs[i].stream = o.stream;
    specs[i].max_tokens = std::uniform_int_distribution<int>(out.min, out.max)(rng);
    specs[i].prompt_ids = std::move(prompts[i]);
  }
  return specs;
}

struct RunFigures {
  json j;
  double ttft_p50 = 0, ttft_p99 = 0, req_per_s = 0, hit_rate = 0;
  double cpu_s_per_request = 0;   // the spawned router's CPU seconds per completed request (0: not known)
  int failed = 0;
};

// Runs the specs against `url`, prints the summary, returns its figures. server_pid (> 0): a local
// process serving it, whose CPU time is counted too.
RunFigures run_specs(const ServeOptions& o, std::vector<CompletionRequestSpec> specs, const std::string& url,
                     pid_t server_pid = 0) {
  const int port = loopback_port(url);
  const double cpu_before = server_pid > 0 ? cpu_seconds(server_pid).value_or(0) : 0;
  for (auto& s : specs) s.port = port;
  const double hit_before = router_counter(port, "k3_prefix_cache_hit_tokens_total");
  const double lookup_before = router_counter(port, "k3_prefix_cache_lookup_tokens_total");

  const auto router_before = router_ttft_totals(port);
  std::vector<CompletionTiming> results(specs.size());
  std::atomic<size_t> next{0};
  const auto start = Clock::now();
  const auto deadline = start + std::chrono::seconds(o.timeout_s);
  std::vector<std::thread> workers;
  for (int w = 0; w < o.concurrency; ++w)
    workers.emplace_back([&] {
      for (size_t i; (i = next.fetch_add(1)) < specs.size();) {
        if (Clock::now() >= deadline) results[i].error = "not started: the total timeout (--timeout) ran out";
        else results[i] = run_completion(specs[i], deadline);
      }
    });
  for (auto& t : workers) t.join();
  const double wall = std::chrono::duration<double>(Clock::now() - start).count();
  const auto router_after = router_ttft_totals(port);

  std::vector<double> ttft, itl, tpot, e2e;
  long long out_tokens = 0, in_tokens = 0;
  int ok = 0;
  std::map<std::string, int> errors;
  for (size_t i = 0; i < results.size(); ++i) {
    const auto& r = results[i];
    if (!r.ok) {
      ++errors[r.error];
      continue;
    }
    ++ok;
    out_tokens += r.output_tokens;
    in_tokens += static_cast<long long>(specs[i].prompt_ids.size());
    e2e.push_back(r.e2e_s);
    if (!o.stream) continue;
    ttft.push_back(r.ttft_s);
    itl.insert(itl.end(), r.itl_s.begin(), r.itl_s.end());
    if (r.output_tokens > 1) tpot.push_back((r.e2e_s - r.ttft_s) / (r.output_tokens - 1));
  }
  const int failed = static_cast<int>(results.size()) - ok;
  const double cpu_used = server_pid > 0 ? cpu_seconds(server_pid).value_or(0) - cpu_before : 0;
  const double lookups = router_counter(port, "k3_prefix_cache_lookup_tokens_total") - lookup_before;
  const double hit_rate = lookups > 0 ? (router_counter(port, "k3_prefix_cache_hit_tokens_total") - hit_before) / lookups : 0;
  const auto s_ttft = summarize(ttft), s_itl = summarize(itl), s_tpot = summarize(tpot), s_e2e = summarize(e2e);
  const double router_count = router_after.second - router_before.second;
  const double router_ttft_mean = router_count > 0 ? (router_after.first - router_before.first) / router_count : 0;

  std::printf("k3-bench serve: %s model %s, workload %s, %d requests, concurrency %d, input %s, output %s, seed %d, %s\n",
              url.c_str(), o.model.c_str(), o.workload.c_str(), o.requests, o.concurrency, o.input_len.c_str(),
              o.output_len.c_str(), o.seed, o.stream ? "streaming" : "not streaming");
  if (cpu_used > 0 && ok > 0)
    std::printf("  server CPU %.2f s, %.3f s per request (load-independent cost)\n", cpu_used, cpu_used / ok);
  if (lookups > 0) std::printf("  prefix cache hit rate %.3f (%.0f of %.0f prompt tokens)\n", hit_rate, hit_rate * lookups, lookups);
  std::printf("  completed %d, failed %d, wall %.2f s\n", ok, failed, wall);
  std::printf("  request throughput %.3f req/s, output %.1f tok/s, input %.1f tok/s\n", ok / wall, out_tokens / wall, in_tokens / wall);
  std::printf("  %-5s %8s %8s %8s %8s %8s  (ms)\n", "", "mean", "p50", "p90", "p99", "max");
  if (o.stream) {
    print_row("TTFT", s_ttft);
    print_row("ITL", s_itl);
    print_row("TPOT", s_tpot);
  }
  print_row("E2E", s_e2e);
  if (o.stream && router_count > 0)
    std::printf("  router-side TTFT mean %.1f ms over %.0f requests (client-side mean %.1f ms; difference %.1f ms)\n",
                router_ttft_mean * 1e3, router_count, s_ttft.mean * 1e3, (s_ttft.mean - router_ttft_mean) * 1e3);
  for (const auto& [why, n] : errors) std::printf("  ERROR x%d: %s\n", n, why.c_str());
  std::fflush(stdout);

  RunFigures fig;
  {
    json j = {{"url", url}, {"workload", o.workload}, {"prefix_hit_rate", hit_rate}, {"model", o.model}, {"requests", o.requests}, {"concurrency", o.concurrency},
              {"input_len", o.input_len}, {"output_len", o.output_len}, {"seed", o.seed}, {"stream", o.stream},
              {"completed", ok}, {"failed", failed}, {"wall_s", wall}, {"request_throughput", ok / wall},
              {"output_tokens", out_tokens}, {"input_tokens", in_tokens}, {"output_tok_s", out_tokens / wall},
              {"e2e", summary_json(s_e2e)}, {"errors", errors}};
    long long expected_out = 0;
    for (const auto& s : specs) expected_out += s.max_tokens;
    j["expected_output_tokens"] = expected_out;
    if (o.stream) {
      j["ttft"] = summary_json(s_ttft);
      j["itl"] = summary_json(s_itl);
      j["tpot"] = summary_json(s_tpot);
      j["router_ttft_mean_ms"] = router_ttft_mean * 1e3;
      j["router_ttft_count"] = router_count;
    }
    fig.j = j;
  }
  fig.ttft_p50 = s_ttft.p50;
  fig.ttft_p99 = s_ttft.p99;
  fig.req_per_s = ok / wall;
  fig.hit_rate = hit_rate;
  fig.failed = failed;
  fig.cpu_s_per_request = cpu_used > 0 && ok > 0 ? cpu_used / ok : 0;
  if (fig.cpu_s_per_request > 0) fig.j["server_cpu_s_per_request"] = fig.cpu_s_per_request;
  return fig;
}

void write_json(const std::string& file, const json& j) {
  if (file.empty()) return;
  std::ofstream f(file);
  f << j.dump(2) << "\n";
  if (!f) throw std::runtime_error("cannot write --json " + file);
}

int run_serve(const ServeOptions& o) {
  const std::vector<CompletionRequestSpec> specs = make_specs(o);
  const std::string router_exe = o.router_exe.empty() ? default_router_exe() : o.router_exe;
  std::vector<std::string> router_args = {"--served-model-name", o.model};
  router_args.insert(router_args.end(), o.router_args.begin(), o.router_args.end());
  if (o.compare_prefix_slots > 0) {
    // The same prompts against a router without the prefix cache, then one with it.
    if (o.spawn_router.empty()) throw CLI::ValidationError("--compare-prefix-cache", "needs --spawn-router MODEL_DIR");
    RunFigures off, on;
    {
      auto r = SpawnedRouter::start(router_exe, o.spawn_router, router_args, o.startup_s);
      std::printf("== prefix cache off\n");
      off = run_specs(o, specs, r->url(), r->pid());
    }
    {
      std::vector<std::string> args = router_args;
      args.insert(args.end(), {"--prefix-cache-slots", std::to_string(o.compare_prefix_slots), "--prefix-block",
                               std::to_string(o.prefix_block)});
      auto r = SpawnedRouter::start(router_exe, o.spawn_router, args, o.startup_s);
      std::printf("== prefix cache on (%d checkpoint slots, %d-token blocks)\n", o.compare_prefix_slots, o.prefix_block);
      on = run_specs(o, specs, r->url(), r->pid());
    }
    const double ttft_ratio = off.ttft_p50 > 0 ? on.ttft_p50 / off.ttft_p50 : 0;
    const double tput_ratio = off.req_per_s > 0 ? on.req_per_s / off.req_per_s : 0;
    // Throughput from CPU cost: requests per CPU-second, on / off (what a saturated server would do).
    const double cpu_tput_ratio = on.cpu_s_per_request > 0 ? off.cpu_s_per_request / on.cpu_s_per_request : 0;
    std::printf("== %s: cache on / off: TTFT p50 %.3fx, TTFT p99 %.3fx, request throughput %.3fx (wall), %.3fx "
                "(per server CPU-second), hit rate %.3f\n",
                o.workload.c_str(), ttft_ratio, off.ttft_p99 > 0 ? on.ttft_p99 / off.ttft_p99 : 0, tput_ratio,
                cpu_tput_ratio, on.hit_rate);
    std::fflush(stdout);
    write_json(o.json_file, {{"cache_off", off.j}, {"cache_on", on.j}, {"ttft_p50_ratio", ttft_ratio},
                             {"throughput_ratio", tput_ratio}, {"cpu_throughput_ratio", cpu_tput_ratio},
                             {"hit_rate", on.hit_rate}});
    return off.failed + on.failed == 0 ? 0 : 1;
  }
  std::unique_ptr<SpawnedCluster> cluster;
  std::unique_ptr<SpawnedRouter> router;
  std::string url = o.url;
  if (!o.spawn_spec.empty()) {
    cluster = SpawnedCluster::start(o.cluster_exe.empty() ? default_cluster_exe() : o.cluster_exe, o.spawn_spec, o.startup_s,
                                    "k3-bench serve");
    url = cluster->url();
    std::fprintf(stderr, "k3-bench serve: spawned cluster at %s\n", url.c_str());
  } else if (!o.spawn_router.empty()) {
    router = SpawnedRouter::start(router_exe, o.spawn_router, router_args, o.startup_s);
    url = router->url();
  }
  if (url.empty()) throw CLI::ValidationError("--url", "give --url, --spawn-cluster or --spawn-router");
  RunFigures fig = run_specs(o, specs, url);
  write_json(o.json_file, fig.j);
  return fig.failed == 0 ? 0 : 1;
}

}  // namespace

void add_serve_command(CLI::App& app) {
  auto o = std::make_shared<ServeOptions>();
  auto* cmd = app.add_subcommand("serve", "concurrent /v1/completions streams against a router: TTFT, ITL, TPOT, E2E, throughput");
  cmd->add_option("--url", o->url, "endpoint, http://127.0.0.1:PORT");
  cmd->add_option("--spawn-cluster", o->spawn_spec, "start k3-cluster with this spec on a free port for the run (stopped after)");
  cmd->add_option("--cluster-exe", o->cluster_exe, "k3-cluster binary (default: next to k3-bench)");
  cmd->add_option("--model", o->model, "served model name (default k3-tiny)");
  cmd->add_option("--concurrency", o->concurrency, "requests in flight at once")->check(CLI::Range(1, 1024));
  cmd->add_option("--requests", o->requests, "total requests")->check(CLI::Range(1, 1000000));
  cmd->add_option("--input-len", o->input_len, "prompt length in tokens, MIN:MAX uniform (default 16:128)");
  cmd->add_option("--output-len", o->output_len, "exact output length, MIN:MAX uniform (default 16:64)");
  cmd->add_option("--seed", o->seed, "seed for lengths and prompt ids");
  cmd->add_option("--token-id-max", o->token_id_max, "prompt ids are drawn from [0, this) (default 256)")->check(CLI::Range(1, 1 << 30));
  cmd->add_flag("--stream", o->stream, "stream (SSE): needed for TTFT/ITL/TPOT; without it only E2E");
  cmd->add_option("--timeout", o->timeout_s, "total seconds for the run; requests not done by then fail (default 600)")->check(CLI::Range(1, 86400));
  cmd->add_option("--startup-timeout", o->startup_s, "seconds to wait for a spawned cluster (default 300)")->check(CLI::Range(1, 3600));
  cmd->add_option("--json", o->json_file, "also write the summary as JSON here");
  cmd->add_option("--workload", o->workload,
                  "random (default): --input-len prompts; shared-prefix: a --system-len system prompt and multi-turn "
                  "chats of --turns turns (each user turn --input-len); unique: the same lengths, nothing shared");
  cmd->add_option("--system-len", o->system_len, "shared-prefix: system prompt tokens (default 2048)")->check(CLI::NonNegativeNumber);
  cmd->add_option("--turns", o->turns, "shared-prefix / unique: turns per chat (default 4)")->check(CLI::PositiveNumber);
  cmd->add_option("--spawn-router", o->spawn_router, "start k3-router (local engine) on this model dir for the run");
  cmd->add_option("--router-exe", o->router_exe, "k3-router binary (default: next to k3-bench)");
  cmd->add_option("--router-arg", o->router_args, "extra k3-router flag for --spawn-router (repeat; e.g. --router-arg=--threads=2)");
  cmd->add_option("--compare-prefix-cache", o->compare_prefix_slots,
                  "with --spawn-router: run the prompts on a router without the prefix cache, then with it (this many "
                  "checkpoint slots), and print the on/off ratios")
      ->check(CLI::NonNegativeNumber);
  cmd->add_option("--prefix-block", o->prefix_block, "--compare-prefix-cache: checkpoint alignment in tokens (default 256)")
      ->check(CLI::PositiveNumber);
  cmd->callback([o] {
    int rc;
    try {
      rc = run_serve(*o);
    } catch (const CLI::Error&) {
      throw;
    } catch (const std::exception& e) {
      std::fprintf(stderr, "k3-bench serve: %s\n", e.what());
      rc = 2;
    }
    if (rc != 0) std::exit(rc);
  });
}

}  // namespace k3::bench
