// `k3-bench soak`: a chaos soak of a k3-cluster it spawns itself. For --duration seconds, about twice the
// decode capacity of concurrent /v1/completions streams (short and long prompts mixed, a fraction of
// clients disconnecting mid-stream) run while one node (a decode rank by default) is SIGKILLed; k3-cluster
// must restart it and the cluster must serve again. Every request must end: done, an error with a cause,
// or our own disconnect; a stream still open at its --request-deadline is HUNG. Reports requests, errors
// by cause (expected: 429 overload at any time, node-death causes while the killed node is away), hung
// requests, the restart and recovery times, and every process's RSS at start and end (pids from
// k3-cluster's /status). Exit status: 0 clean, 1 hung requests, 3 unexpected errors, 4 no recovery.
#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>
#include <signal.h>

#include <atomic>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <mutex>
#include <random>
#include <sstream>
#include <thread>

#include "bench/bench_commands.h"
#include "bench/completion_client.h"
#include "bench/process_rss.h"
#include "bench/soak_causes.h"
#include "bench/spawned_cluster.h"
#include "deploy/cluster_spec.h"
#include "deploy/http_probe.h"

namespace k3::bench {
namespace {

using Clock = std::chrono::steady_clock;
using json = nlohmann::json;

struct SoakOptions {
  std::string spec, cluster_exe, json_file, model, api_key, kill_node;
  int duration_s = 60, concurrency = 0, seed = 0, startup_s = 300, request_deadline_s = 120, token_id_max = 256;
  int short_min = 4, short_max = 24, long_min = 120, long_max = 240, out_min = 4, out_max = 24;
  double long_fraction = 0.3, disconnect_fraction = 0.1, kill_at_s = -1;
  bool no_kill = false;
  std::vector<std::string> cluster_args;
};

struct Outcome {
  Clock::time_point start, end;
  CompletionTiming t;
};

double since(Clock::time_point t0, Clock::time_point t) { return std::chrono::duration<double>(t - t0).count(); }

// name -> pid of every running node, from k3-cluster's GET /status.
std::map<std::string, pid_t> node_pids(int status_port) {
  std::map<std::string, pid_t> out;
  auto r = deploy::http_get("127.0.0.1", status_port, "/status", std::chrono::milliseconds(5000));
  if (!r.is_ok() || r->status != 200) {
    std::fprintf(stderr, "k3-bench soak: k3-cluster's /status on port %d: %s\n", status_port,
                 r.is_ok() ? ("HTTP " + std::to_string(r->status)).c_str() : r.status().to_string().c_str());
    return out;
  }
  const json status = json::parse(r->body);
  for (const auto& n : status.at("nodes"))
    if (n.at("pid").get<int>() > 0) out[n.at("name").get<std::string>()] = n.at("pid").get<pid_t>();
  return out;
}

std::map<std::string, std::pair<pid_t, long>> rss_snapshot(const SpawnedCluster& c) {
  std::map<std::string, std::pair<pid_t, long>> out;
  auto pids = node_pids(c.status_port());
  pids["k3-cluster"] = c.pid();
  for (const auto& [name, pid] : pids) out[name] = {pid, rss_kib(pid).value_or(-1)};
  return out;
}

struct SpecFacts {
  int decode_capacity = 0;  // requests the decode ranks hold at once
  std::string served_model;  // the model id the router serves (its rule: the name, else the dir's)
};

SpecFacts spec_facts(const std::string& spec_path) {
  auto spec = deploy::load_cluster_spec(spec_path);
  if (!spec.is_ok()) throw std::runtime_error(spec.status().message());
  SpecFacts f;
  for (const auto& d : deploy::decode_processes(*spec)) f.decode_capacity += d.max_requests;
  f.served_model = spec->served_model_name.empty()
                       ? std::filesystem::path(spec->model).lexically_normal().filename().string()
                       : spec->served_model_name;
  return f;
}

int run_soak(const SoakOptions& o) {
  const SpecFacts facts = spec_facts(o.spec);
  const int capacity = facts.decode_capacity;
  const std::string model = o.model.empty() ? facts.served_model : o.model;
  const int concurrency = o.concurrency > 0 ? o.concurrency : 2 * capacity;
  auto cluster = SpawnedCluster::start(o.cluster_exe.empty() ? default_cluster_exe() : o.cluster_exe, o.spec,
                                       o.startup_s, "k3-bench soak", o.cluster_args);
  if (cluster->status_port() == 0) throw std::runtime_error("k3-cluster printed no STATUS line");
  const int port = std::atoi(cluster->url().c_str() + cluster->url().rfind(':') + 1);
  std::string kill_node = o.kill_node;
  if (kill_node.empty())
    for (const auto& [name, pid] : node_pids(cluster->status_port()))
      if (name.rfind("decode/", 0) == 0 && kill_node.empty()) kill_node = name;
  const auto rss_start = rss_snapshot(*cluster);
  std::fprintf(stderr, "k3-bench soak: %s, concurrency %d (decode capacity %d), %d s, kill %s\n", cluster->url().c_str(),
               concurrency, capacity, o.duration_s, o.no_kill ? "none" : kill_node.c_str());

  const auto t0 = Clock::now();
  const auto end = t0 + std::chrono::seconds(o.duration_s);
  std::mutex mu;
  std::vector<Outcome> outcomes;
  std::atomic<int> workers_done{0};
  std::vector<std::jthread> workers;  // joined on every exit path (each ends by its request deadline)
  for (int w = 0; w < concurrency; ++w)
    workers.emplace_back([&, w] {
      std::mt19937_64 rng(static_cast<uint64_t>(o.seed) * 1000003 + static_cast<uint64_t>(w));
      auto uniform = [&](int lo, int hi) { return std::uniform_int_distribution<int>(lo, hi)(rng); };
      while (Clock::now() < end) {
        CompletionRequestSpec s{.port = port, .model = model, .prompt_ids = {}, .max_tokens = uniform(o.out_min, o.out_max),
                                .stream = true, .api_key = o.api_key};
        const bool long_prompt = std::uniform_real_distribution<double>(0, 1)(rng) < o.long_fraction;
        const int n_in = long_prompt ? uniform(o.long_min, o.long_max) : uniform(o.short_min, o.short_max);
        for (int i = 0; i < n_in; ++i) s.prompt_ids.push_back(uniform(0, o.token_id_max - 1));
        if (std::uniform_real_distribution<double>(0, 1)(rng) < o.disconnect_fraction)
          s.disconnect_after_tokens = uniform(0, s.max_tokens - 1);
        Outcome out{.start = Clock::now(), .end = {}, .t = {}};
        out.t = run_completion(s, out.start + std::chrono::seconds(o.request_deadline_s));
        out.end = Clock::now();
        std::lock_guard lk(mu);
        outcomes.push_back(std::move(out));
      }
      ++workers_done;
    });

  // The chaos: SIGKILL one node at kill_at, then watch k3-cluster's status until a new pid runs it.
  const double kill_at = o.kill_at_s >= 0 ? o.kill_at_s : o.duration_s / 3.0;
  std::optional<Clock::time_point> killed, restarted;
  pid_t old_pid = 0, new_pid = 0;
  std::vector<std::string> cluster_lines;
  while (Clock::now() < end || (killed && !restarted && Clock::now() < end + std::chrono::seconds(60))) {
    for (auto& l : cluster->drain()) cluster_lines.push_back(std::move(l));
    if (!o.no_kill && !killed && since(t0, Clock::now()) >= kill_at) {
      old_pid = node_pids(cluster->status_port())[kill_node];
      if (old_pid <= 0) throw std::runtime_error("no running node named '" + kill_node + "' in k3-cluster's /status");
      ::kill(old_pid, SIGKILL);
      killed = Clock::now();
      std::fprintf(stderr, "k3-bench soak: SIGKILL %s (pid %d) at %.1f s\n", kill_node.c_str(), old_pid, since(t0, *killed));
    }
    if (killed && !restarted) {
      const pid_t now_pid = node_pids(cluster->status_port())[kill_node];
      if (now_pid > 0 && now_pid != old_pid) {
        restarted = Clock::now();
        new_pid = now_pid;
      }
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  // The last requests end by their deadline; k3-cluster's stdout keeps being read meanwhile (a full
  // pipe would stall its supervision loop).
  while (workers_done < concurrency) {
    for (auto& l : cluster->drain()) cluster_lines.push_back(std::move(l));
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  for (auto& t : workers) t.join();
  const double wall = since(t0, Clock::now());
  const auto rss_end = rss_snapshot(*cluster);
  // The router's view of the nodes at the end (pool free bytes, running, failures by cause): evidence
  // for a run that went wrong.
  std::vector<std::string> router_cluster_metrics;
  if (auto m = deploy::http_get("127.0.0.1", port, "/metrics", std::chrono::milliseconds(5000)); m.is_ok()) {
    std::istringstream lines(m->body);
    for (std::string l; std::getline(lines, l);)
      if (l.rfind("k3_cluster_", 0) == 0) router_cluster_metrics.push_back(l);
  }

  // Served again: the first request started after the kill that completed (the killed node was needed).
  std::optional<Clock::time_point> served_again;
  if (killed)
    for (const auto& r : outcomes)
      if (r.t.ok && !r.t.disconnected && r.start >= *killed && (!served_again || r.end < *served_again)) served_again = r.end;
  // Node-death errors are expected while the node is away: from the kill until 10 s after it served again.
  const auto chaos_end = served_again ? *served_again + std::chrono::seconds(10) : end + std::chrono::hours(1);
  int ok = 0, disconnected = 0, hung = 0;
  std::map<std::string, int> causes, unexpected;
  for (const auto& r : outcomes) {
    if (r.t.ok) {
      ++(r.t.disconnected ? disconnected : ok);
      continue;
    }
    if (r.t.timed_out) {
      ++hung;
      continue;
    }
    const std::string cause = error_cause(r.t.error);
    ++causes[cause];
    const bool in_chaos = killed && r.end >= *killed && r.start <= chaos_end;
    if (!(is_overload_cause(cause) || (in_chaos && is_node_death_cause(cause)))) {
      if (++unexpected[cause] <= 5)  // a few examples per cause; the counts say the rest
        std::fprintf(stderr, "k3-bench soak: unexpected error at %.1f s: %s\n", since(t0, r.end), r.t.error.c_str());
    }
  }
  const int errors = static_cast<int>(outcomes.size()) - ok - disconnected - hung;
  // Requests ended per 5 s of the run, by outcome: shows when the cluster served and when it failed.
  std::map<int, std::map<std::string, int>> timeline;
  for (const auto& r : outcomes)
    ++timeline[static_cast<int>(since(t0, r.end)) / 5 * 5]
              [r.t.ok ? (r.t.disconnected ? "disconnected" : "completed") : r.t.timed_out ? "hung" : error_cause(r.t.error)];
  json timeline_j = json::array();
  for (const auto& [at, counts] : timeline) timeline_j.push_back({{"from_s", at}, {"ended", counts}});

  std::printf("k3-bench soak: %s, %d s (wall %.1f s), concurrency %d (2 x decode capacity %d)\n", cluster->url().c_str(),
              o.duration_s, wall, concurrency, capacity);
  std::printf("  requests %zu: completed %d, disconnected by the client %d, errors %d, HUNG %d\n", outcomes.size(), ok,
              disconnected, errors, hung);
  for (const auto& [cause, n] : causes)
    std::printf("  error %-40s x%d%s\n", cause.c_str(), n, unexpected.count(cause) ? "  (UNEXPECTED)" : "");
  json kill_j = nullptr;
  if (killed) {
    kill_j = {{"node", kill_node}, {"pid_before", old_pid}, {"pid_after", new_pid}, {"at_s", since(t0, *killed)},
              {"restarted_after_s", restarted ? json(since(*killed, *restarted)) : json(nullptr)},
              {"served_again_after_s", served_again ? json(since(*killed, *served_again)) : json(nullptr)}};
    std::printf("  SIGKILL %s (pid %d) at %.1f s: restarted (pid %d) after %s s, served again after %s s\n",
                kill_node.c_str(), old_pid, since(t0, *killed), new_pid,
                restarted ? std::to_string(since(*killed, *restarted)).c_str() : "never",
                served_again ? std::to_string(since(*killed, *served_again)).c_str() : "never");
  }
  json rss = json::array();
  std::printf("  %-16s %8s %12s %8s %12s\n", "process", "pid", "RSS start", "pid", "RSS end (KiB)");
  for (const auto& [name, start] : rss_start) {
    const auto e = rss_end.count(name) ? rss_end.at(name) : std::pair<pid_t, long>{0, -1};
    std::printf("  %-16s %8d %12ld %8d %12ld\n", name.c_str(), start.first, start.second, e.first, e.second);
    rss.push_back({{"name", name}, {"pid_start", start.first}, {"rss_start_kib", start.second}, {"pid_end", e.first},
                   {"rss_end_kib", e.second}});
  }
  std::fflush(stdout);
  if (!o.json_file.empty()) {
    json j = {{"duration_s", o.duration_s}, {"wall_s", wall}, {"concurrency", concurrency}, {"decode_capacity", capacity},
              {"requests", outcomes.size()}, {"completed", ok}, {"disconnected", disconnected}, {"errors", errors},
              {"hung", hung}, {"errors_by_cause", causes}, {"unexpected_errors_by_cause", unexpected}, {"kill", kill_j},
              {"rss", rss}, {"timeline", timeline_j}, {"router_cluster_metrics_end", router_cluster_metrics}, {"cluster_lines", cluster_lines}};
    std::ofstream f(o.json_file);
    f << j.dump(2) << "\n";
    if (!f) throw std::runtime_error("cannot write --json " + o.json_file);
  }
  if (hung > 0) return 1;
  if (!unexpected.empty()) return 3;
  if (killed && !served_again) return 4;
  return 0;
}

}  // namespace

void add_soak_command(CLI::App& app) {
  auto o = std::make_shared<SoakOptions>();
  auto* cmd = app.add_subcommand("soak", "chaos soak: spawn k3-cluster, overload it with mixed streams and client "
                                         "disconnects, SIGKILL a node mid-run; report errors by cause, hung requests, RSS");
  cmd->add_option("--spawn-cluster", o->spec, "cluster spec to run (k3-cluster on a free port)")->required();
  cmd->add_option("--cluster-exe", o->cluster_exe, "k3-cluster binary (default: next to k3-bench)");
  cmd->add_option("--cluster-arg", o->cluster_args, "extra k3-cluster argument, repeatable (e.g. --cluster-arg=--log-level=info)");
  cmd->add_option("--model", o->model, "served model name (default: the spec's, as the router names it)");
  cmd->add_option("--api-key", o->api_key, "send 'Authorization: Bearer <key>'");
  cmd->add_option("--duration", o->duration_s, "seconds of load (default 60)")->check(CLI::Range(1, 86400));
  cmd->add_option("--concurrency", o->concurrency, "streams in flight (default 2 x the spec's decode max_requests)")
      ->check(CLI::Range(0, 4096));
  cmd->add_option("--short-len", o->short_max, "short prompts: 4..this tokens (default 24)")->check(CLI::Range(4, 100000));
  cmd->add_option("--long-min", o->long_min, "long prompts: at least this many tokens (default 120)")->check(CLI::Range(1, 100000));
  cmd->add_option("--long-max", o->long_max, "long prompts: at most this many tokens (default 240)")->check(CLI::Range(1, 100000));
  cmd->add_option("--long-fraction", o->long_fraction, "share of long prompts (default 0.3)")->check(CLI::Range(0.0, 1.0));
  cmd->add_option("--output-max", o->out_max, "outputs: 4..this tokens (default 24)")->check(CLI::Range(4, 100000));
  cmd->add_option("--disconnect-fraction", o->disconnect_fraction, "share of clients that hang up mid-stream (default 0.1)")
      ->check(CLI::Range(0.0, 1.0));
  cmd->add_option("--kill", o->kill_node, "node to SIGKILL, e.g. decode/d, prefill/p/1, router (default: the first decode rank)");
  cmd->add_option("--kill-at", o->kill_at_s, "seconds into the run (default: a third of --duration)");
  cmd->add_flag("--no-kill", o->no_kill, "no chaos: load and disconnects only");
  cmd->add_option("--request-deadline", o->request_deadline_s, "a stream not ended after this many seconds is HUNG (default 120)")
      ->check(CLI::Range(1, 86400));
  cmd->add_option("--seed", o->seed, "seed for prompts, lengths and disconnects");
  cmd->add_option("--startup-timeout", o->startup_s, "seconds to wait for the cluster (default 300)")->check(CLI::Range(1, 3600));
  cmd->add_option("--json", o->json_file, "also write the report as JSON here");
  cmd->callback([o] {
    int rc;
    try {
      if (o->long_min > o->long_max) throw CLI::ValidationError("--long-min", "is above --long-max");
      rc = run_soak(*o);
    } catch (const CLI::Error&) {
      throw;
    } catch (const std::exception& e) {
      std::fprintf(stderr, "k3-bench soak: %s\n", e.what());
      rc = 2;
    }
    if (rc != 0) std::exit(rc);
  });
}

}  // namespace k3::bench
