// k3-cluster: brings up a whole disaggregated cluster on this machine from a spec (cluster_spec.h):
// the router (k3-router in cluster mode), every prefill stage (k3-prefill) and every decode rank
// (k3-decode), wired through free ports; waits until /health answers and every node registered,
// prints the endpoint, and supervises in the foreground: a child that dies is reported and started
// again in the same place after a backoff (deploy/supervisor.h; the router fails the dead node's
// requests and answers 503 while no pair is complete); a node that crash-loops is given up and the
// cluster serves with what is left (a given-up router, or any death with --exit-on-crash, stops
// everything); Ctrl-C / SIGTERM stops every child (SIGTERM, then SIGKILL after the shutdown timeout) and
// exits, non-zero when a child had crashed. The router's API key (spec router.api_key, --api-key or
// K3_API_KEY) reaches it through its environment, never its command line. The status endpoint
// (--status-port) serves GET /status (JSON: every node's state, pid, restarts) and GET /metrics
// (k3_cluster_node_restarts_total{node} ...).
//
// stdout lines (tests read them): "STARTED <name> pid <pid>", then "STATUS http://127.0.0.1:<port>",
// "ENDPOINT http://<host>:<port>", "NODE <name> HELD <sources held> <requests computing>" (a prefill
// stage's state changed) and "NODE <name> IDLE <pool free bytes> <pool capacity bytes>" (a decode rank
// ran out of requests), "NODE <name> GROUP_FAILED <status>" + "NODE <name> FREE <free pages> <pages> <free slots>
// <slots>" (a decode rank group failed; every rank that noticed says so); "CHILD_EXITED <name> <description>" for a crash, then "STARTED <name> pid <pid>"
// + "RESTARTED <name> pid <pid> restarts <n>" or "FAILED <name>" (given up); at the end "STOPPED".
// Control-plane keys: a CURVE keypair per process (and the router's) in <run dir>/keys, 0600 files in a
// 0700 directory (transfer/cluster_key_files.h); every child gets its keypair and the cluster's public keys.
// ("CONTROL <router control endpoint>" follows the router's STARTED line.)
#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>
#include <signal.h>
#include <unistd.h>

#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <thread>

#include "deploy/child_process.h"
#include "deploy/cluster_spec.h"
#include "deploy/cluster_tools.h"
#include "deploy/http_probe.h"
#include "deploy/node_commands.h"
#include "deploy/request_logs.h"
#include "deploy/status_server.h"
#include "deploy/supervisor.h"
#include "transfer/cluster_key_files.h"

using namespace k3;
using namespace k3::deploy;
namespace fs = std::filesystem;
using std::chrono::milliseconds;
using Clock = std::chrono::steady_clock;

namespace {

void say(const std::string& s) {
  std::printf("%s\n", s.c_str());
  std::fflush(stdout);
}
void note(const std::string& s) {
  std::fprintf(stderr, "k3-cluster: %s\n", s.c_str());
  std::fflush(stderr);
}

// k3-decode's rank group flags of a decode DP rank (none for a single process).
std::vector<std::string> group_args(const DecodeProcess& d) {
  if (d.group_size() == 1) return {};
  std::vector<std::string> a = {d.dcp > 1 ? "--group-dcp" : "--group-ep", std::to_string(d.group_size()),
                                "--group-step-deadline-ms", std::to_string(d.step_deadline_ms)};
  if (d.kv_partitions > 0) a.insert(a.end(), {"--kv-partitions", std::to_string(d.kv_partitions)});
  return a;
}

// SIGINT/SIGTERM are blocked in the launcher and collected here without waiting.
bool stop_requested(const sigset_t& sigs) {
  timespec zero{0, 0};
  return sigtimedwait(&sigs, nullptr, &zero) > 0;
}

class Launcher {
 public:
  Launcher(ClusterSpec spec, std::string bin, std::string log_level, bool verbose, bool exit_on_crash, sigset_t sigs,
           std::string api_key, std::string run_dir, std::string log_dir)
      : spec_(std::move(spec)), bin_(std::move(bin)), log_level_(std::move(log_level)), verbose_(verbose),
        exit_on_crash_(exit_on_crash), sigs_(sigs), api_key_(std::move(api_key)), run_dir_(std::move(run_dir)),
        log_dir_(std::move(log_dir)),
        logs_(log_dir_.empty() ? std::nullopt : std::optional<NodeLogFiles>(std::in_place, log_dir_)),
        supervisor_(spec_.restart, {.say = say, .note = note}) {}
  ~Launcher() { shutdown(); }

  // Starts everything and waits until the cluster serves. Errors say what did not come up.
  Status start();
  // Heals the cluster (Supervisor::poll) until a signal arrives (returns 1 when a child had crashed, else
  // 0) or the router is given up / a child dies with --exit-on-crash (returns 1); then shuts down.
  int supervise();
  void shutdown();
  int port() const { return port_; }
  const Supervisor& supervisor() const { return supervisor_; }

 private:
  // What a restarted node binds: the port it was announced with, on network.bind_host (the announced
  // endpoint may name another host, e.g. with bind_host 0.0.0.0).
  std::string rebind(const std::string& announced) const {
    return "tcp://" + spec_.bind_host + announced.substr(announced.rfind(':'));
  }
  Result<ChildProcess*> spawn(const std::string& name, const std::string& exe, const std::vector<std::string>& args);
  // The environment of every child: no inherited K3_API_KEY, except the router's own key.
  ChildEnvironment child_env(const std::string& name) const;
  // The rest of a stdout line starting with `prefix` from `c`; fails when c dies, a signal arrives or time is up.
  Result<std::string> wait_line(ChildProcess& c, const std::string& prefix, Clock::time_point deadline);
  // Reads the node's METRICS line and makes a restart of it serve /metrics on the same port.
  Status keep_metrics_port(ChildProcess& c, Clock::time_point deadline);
  Status check_alive();
  void pump_outputs();
  Status wait_serving(Clock::time_point deadline);

  ClusterSpec spec_;
  std::string bin_, log_level_;
  bool verbose_;
  bool exit_on_crash_;
  sigset_t sigs_;
  std::string api_key_;
  bool interrupted_ = false, stopped_ = false;
  Supervisor supervisor_;
  int port_ = 0;
  std::string run_dir_;
  std::string log_dir_;  // non-empty: every child's output and stderr go to <log_dir>/<node>.log (request_logs.h)
  std::optional<NodeLogFiles> logs_;  // set when log_dir_ is
  std::optional<transfer::ClusterKeyFiles> keys_;  // every child's control-plane keys (by control name = child name)
};

ChildEnvironment Launcher::child_env(const std::string& name) const {
  ChildEnvironment env{.unset = {"K3_API_KEY"}, .set = {}};
  if (name == "router" && !api_key_.empty()) env.set.emplace_back("K3_API_KEY", api_key_);
  return env;
}

Result<ChildProcess*> Launcher::spawn(const std::string& name, const std::string& exe, const std::vector<std::string>& args) {
  std::vector<std::string> all = args;
  if (keys_) {
    const auto key_flags = keys_->flags(name);
    all.insert(all.end(), key_flags.begin(), key_flags.end());
  }
  return supervisor_.start({.name = name, .exe = bin_ + "/" + exe, .args = all, .env = child_env(name),
                            .log_path = log_dir_.empty() ? "" : node_log_path(log_dir_, name)});
}

Status Launcher::check_alive() {
  if (!interrupted_ && stop_requested(sigs_)) interrupted_ = true;
  if (interrupted_) return Status(Code::Aborted, "interrupted");
  // Nothing restarts before the cluster first served: a node that dies while starting is a start failure.
  if (auto dead = supervisor_.first_dead()) return Status(Code::Unavailable, *dead);
  return Status::ok();
}

Result<std::string> Launcher::wait_line(ChildProcess& c, const std::string& prefix, Clock::time_point deadline) {
  for (;;) {
    K3_TRY(check_alive());
    if (Clock::now() >= deadline) return Status(Code::DeadlineExceeded, c.name() + ": no '" + prefix + "' line in time");
    auto line = c.read_line(milliseconds(100));
    if (!line) continue;
    if (verbose_) note(c.name() + ": " + *line);
    if (logs_) logs_->append(c.name(), *line);
    if (line->rfind(prefix, 0) == 0) return line->substr(prefix.size());
  }
}

Status Launcher::keep_metrics_port(ChildProcess& c, Clock::time_point deadline) {
  K3_ASSIGN_OR_RETURN(std::string url, wait_line(c, "METRICS ", deadline));   // http://HOST:PORT/metrics
  const std::string hostport = url.substr(url.find("//") + 2, url.rfind('/') - url.find("//") - 2);
  set_option(supervisor_.recipe(c.name()).args, "--metrics-listen", spec_.bind_host + hostport.substr(hostport.rfind(':')));
  return Status::ok();
}

void Launcher::pump_outputs() {
  supervisor_.for_each_child([&](const std::string& name, ChildProcess& c) {
    for (const auto& line : c.drain()) {
      if (verbose_) note(name + ": " + line);
      if (logs_) logs_->append(name, line);
      // The nodes' memory state lines (prefill "HELD <sources> <computing>", decode "IDLE <pool free>
      // <pool capacity>") are relayed so that memory release is observable from outside the cluster.
      // A decode rank group that failed says so and what its caches hold after closing every request.
      if (line.rfind("HELD ", 0) == 0 || line.rfind("IDLE ", 0) == 0 || line.rfind("GROUP_FAILED ", 0) == 0 ||
          line.rfind("FREE ", 0) == 0)
        say("NODE " + name + " " + line);
    }
  });
}

Status Launcher::wait_serving(Clock::time_point deadline) {
  for (;;) {
    K3_TRY(check_alive());
    pump_outputs();
    auto health = http_get(spec_.host, port_, "/health", milliseconds(2000));
    if (health.is_ok() && health->status == 200) {
      auto metrics = http_get(spec_.host, port_, "/metrics", milliseconds(2000));
      if (metrics.is_ok() && metrics->status == 200) {
        auto value = [&](const std::string& name) -> long {
          const auto at = metrics->body.find("\n" + name + " ");
          return at == std::string::npos ? -1 : std::atol(metrics->body.c_str() + at + name.size() + 2);
        };
        const long up = value("k3_cluster_nodes_registered"), expected = value("k3_cluster_nodes_expected");
        if (expected > 0 && up == expected) return Status::ok();
      }
    }
    if (Clock::now() >= deadline) return Status(Code::DeadlineExceeded, "the router did not report every node registered in time");
    std::this_thread::sleep_for(milliseconds(100));
  }
}

Status Launcher::start() {
  const auto deadline = Clock::now() + std::chrono::seconds(spec_.startup_s);
  const std::string hb = std::to_string(spec_.heartbeat_ms), misses = std::to_string(spec_.heartbeat_misses);
  const std::string threads = std::to_string(spec_.threads);
  const auto decodes = decode_processes(spec_);
  std::vector<std::string> names = {"router"};
  for (const auto& d : decodes) {
    names.push_back("decode/" + d.instance);
    // A group's members have no control plane, but k3-decode takes its keys like every node.
    for (int i = 1; i < d.group_size(); ++i) names.push_back("decode/" + d.instance + "/" + std::to_string(i));
  }
  for (const auto& p : spec_.prefill)
    for (int st = 0; st < p.stages; ++st) names.push_back("prefill/" + p.id + "/" + std::to_string(st));
  K3_ASSIGN_OR_RETURN(keys_, transfer::ClusterKeyFiles::write(run_dir_ + "/keys", names));

  // Router first: the nodes connect to its control endpoint (ZeroMQ retries until it is there).
  std::vector<std::string> rargs = {"--model", spec_.model, "--host", spec_.host, "--port", std::to_string(spec_.port),
                                    "--cluster-endpoint", "tcp://" + spec_.bind_host + ":*", "--placement", spec_.placement,
                                    "--heartbeat-ms", hb, "--heartbeat-misses", misses,
                                    "--claim-timeout-ms", std::to_string(spec_.claim_ms), "--log-level", log_level_};
  if (!spec_.served_model_name.empty()) rargs.insert(rargs.end(), {"--served-model-name", spec_.served_model_name});
  if (spec_.affinity_tokens > 0) rargs.insert(rargs.end(), {"--affinity-tokens", std::to_string(spec_.affinity_tokens)});
  // Nodes bind network.bind_host and are announced (READY / LISTEN / CLUSTER lines) at advertise_host.
  const std::vector<std::string> advertise =
      spec_.advertise_host.empty() ? std::vector<std::string>{} : std::vector<std::string>{"--advertise-host", spec_.advertise_host};
  rargs.insert(rargs.end(), advertise.begin(), advertise.end());
  for (const std::string& pair : router_pair_flags(spec_)) rargs.insert(rargs.end(), {"--pair", pair});
  K3_ASSIGN_OR_RETURN(ChildProcess * router, spawn("router", "k3-router", rargs));
  K3_ASSIGN_OR_RETURN(std::string control, wait_line(*router, "CLUSTER ", deadline));
  say("CONTROL " + control);
  K3_ASSIGN_OR_RETURN(std::string listening, wait_line(*router, "listening on http://", deadline));
  port_ = std::atoi(listening.substr(listening.rfind(':') + 1).c_str());
  if (port_ <= 0) return internal_error("router printed no port: '" + listening + "'");
  // A restarted router comes back on the same HTTP port and control endpoint (the nodes reconnect).
  set_option(supervisor_.recipe("router").args, "--port", std::to_string(port_));
  set_option(supervisor_.recipe("router").args, "--cluster-endpoint", rebind(control));

  // Decode ranks next: the prefill stages need their endpoints. A rank group's leader binds the group's
  // communicator (GROUP line) and waits for its members before it connects anywhere (READY line).
  std::vector<std::string> decode_eps;
  uint32_t global_ranks = 0;
  for (const auto& d : decodes) global_ranks += static_cast<uint32_t>(d.group_size());
  for (const auto& d : decodes) {
    std::vector<std::string> args = {"--model", spec_.model, "--router-endpoint", control, "--instance", d.instance, "--rank",
                                     std::to_string(d.rank), "--dp-size", std::to_string(global_ranks), "--max-requests",
                                     std::to_string(d.max_requests), "--threads", threads, "--backend", spec_.backend,
                                     "--heartbeat-ms", hb, "--heartbeat-misses", misses, "--log-level", log_level_,
                                     "--bind", "tcp://" + spec_.bind_host + ":*", "--interface", spec_.reachable_host(),
                                     "--metrics-listen", spec_.bind_host + ":0"};
    args.insert(args.end(), advertise.begin(), advertise.end());
    const std::vector<std::string> group = group_args(d);
    args.insert(args.end(), group.begin(), group.end());
    K3_ASSIGN_OR_RETURN(ChildProcess * c, spawn("decode/" + d.instance, "k3-decode", args));
    if (d.group_size() > 1) {
      K3_ASSIGN_OR_RETURN(std::string group_ep, wait_line(*c, "GROUP ", deadline));
      // A restarted leader binds the same endpoint, so restarted members find it.
      set_option(supervisor_.recipe(c->name()).args, "--group-endpoint", group_ep);
      for (int i = 1; i < d.group_size(); ++i) {
        std::vector<std::string> margs = {"--model", spec_.model, "--instance", d.instance, "--threads", threads,
                                          "--backend", spec_.backend, "--max-requests", std::to_string(d.max_requests),
                                          "--log-level", log_level_, "--group-rank", std::to_string(i),
                                          "--group-endpoint", group_ep};
        margs.insert(margs.end(), group.begin(), group.end());
        K3_TRY(spawn("decode/" + d.instance + "/" + std::to_string(i), "k3-decode", margs).status());
      }
    }
    K3_TRY(keep_metrics_port(*c, deadline));
    K3_ASSIGN_OR_RETURN(std::string ep, wait_line(*c, "READY ", deadline));
    decode_eps.push_back(ep);
    // A restarted rank binds the same endpoint: the prefill stages' sockets reconnect and re-REGISTER.
    set_option(supervisor_.recipe(c->name()).args, "--bind", rebind(ep));
  }

  // Each prefill instance, last stage first: a stage needs the LISTEN endpoint of the next.
  std::vector<ChildProcess*> stages;
  for (size_t i = 0; i < spec_.prefill.size(); ++i) {
    const auto& p = spec_.prefill[i];
    std::string partition;
    for (int n : p.partition) partition += (partition.empty() ? "" : ",") + std::to_string(n);
    std::string next;
    for (int st = p.stages - 1; st >= 0; --st) {
      std::vector<std::string> args = {"--model", spec_.model, "--stage", std::to_string(st), "--stages",
                                       std::to_string(p.stages), "--chunk-size", std::to_string(p.chunk_size),
                                       "--max-requests", std::to_string(p.max_requests), "--instance", p.id};
      for (size_t di = 0; di < decodes.size(); ++di)  // any prefill instance feeds any decode process
        args.insert(args.end(), {"--decode-instance", decodes[di].instance, "--decode-endpoint", decode_eps[di]});
      args.insert(args.end(), {"--router-endpoint", control, "--threads", threads, "--backend", spec_.backend, "--heartbeat-ms", hb,
                                "--heartbeat-misses", misses, "--log-level", log_level_});
      if (!partition.empty()) args.insert(args.end(), {"--partition", partition});
      const std::vector<std::string> prefix = prefix_cache_args(p);
      const std::vector<std::string> stream = stream_args(p);
      const std::vector<std::string> region = prefill_memory_args(p);
      args.insert(args.end(), prefix.begin(), prefix.end());
      args.insert(args.end(), stream.begin(), stream.end());
      args.insert(args.end(), region.begin(), region.end());
      args.insert(args.end(), {"--interface", spec_.reachable_host(), "--metrics-listen", spec_.bind_host + ":0"});
      args.insert(args.end(), advertise.begin(), advertise.end());
      if (st > 0) args.insert(args.end(), {"--listen", "tcp://" + spec_.bind_host + ":*"});
      if (!next.empty()) args.insert(args.end(), {"--next-endpoint", next});
      K3_ASSIGN_OR_RETURN(ChildProcess * c, spawn("prefill/" + p.id + "/" + std::to_string(st), "k3-prefill", args));
      K3_TRY(keep_metrics_port(*c, deadline));
      if (st > 0) {
        K3_ASSIGN_OR_RETURN(next, wait_line(*c, "LISTEN ", deadline));
        set_option(supervisor_.recipe(c->name()).args, "--listen", rebind(next));  // the previous stage pushes there
      }
      stages.push_back(c);
    }
  }
  for (ChildProcess* c : stages) K3_TRY(wait_line(*c, "DECODE_READY", deadline));
  return wait_serving(deadline);
}

int Launcher::supervise() {
  for (;;) {
    if (stop_requested(sigs_)) {
      note("signal received, shutting down");
      shutdown();
      return supervisor_.any_crashed() ? 1 : 0;
    }
    pump_outputs();  // before poll: a dead child's last lines are relayed before it is replaced
    for (const SupervisorEvent& e : supervisor_.poll(Clock::now())) {
      // Without the router nothing serves: a router given up (or any death with --exit-on-crash) stops all.
      const bool fatal = (e.kind == SupervisorEvent::Kind::Exited && exit_on_crash_) ||
                         (e.kind == SupervisorEvent::Kind::Failed && e.name == "router");
      if (fatal) {
        note(e.name + (exit_on_crash_ ? " died (--exit-on-crash)" : " is given up") + "; shutting the cluster down");
        shutdown();
        return 1;
      }
    }
    std::this_thread::sleep_for(milliseconds(100));
  }
}

void Launcher::shutdown() {
  if (stopped_) return;
  stopped_ = true;
  // The router first (clients get their error events while the nodes are still up), then the nodes.
  supervisor_.stop_all(milliseconds(spec_.shutdown_ms));
  pump_outputs();
  say("STOPPED");
}

// The directory of this executable (the sibling binaries live there).
std::string own_bin_dir() {
  std::error_code ec;
  const fs::path exe = fs::read_symlink("/proc/self/exe", ec);
  return ec ? std::string(".") : exe.parent_path().string();
}

Status ensure_model(ClusterSpec& spec, const std::string& bin) {
  spec.model = fs::absolute(spec.model).lexically_normal().string();
  if (fs::exists(spec.model + "/config.json")) return Status::ok();
  note("model dir " + spec.model + " has no config.json: generating '" + spec.preset + "' weights (first use)");
  std::vector<std::string> args = {"--preset", spec.preset, "--seed", std::to_string(spec.seed), "--out", spec.model};
  if (fs::exists(spec.model)) args.push_back("--force");
  K3_ASSIGN_OR_RETURN(auto gen, ChildProcess::start("k3-genweights", bin + "/k3-genweights", args));
  while (!gen->exited()) {
    for (const auto& line : gen->drain()) note("k3-genweights: " + line);
    std::this_thread::sleep_for(milliseconds(50));
  }
  if (gen->exit_description() != "exited with status 0")
    return internal_error("k3-genweights " + gen->exit_description() + " (model: spec field 'model', preset: 'generate.preset')");
  return Status::ok();
}

Status check_model(const ClusterSpec& spec) {
  std::ifstream in(spec.model + "/config.json");
  nlohmann::json cfg;
  try {
    cfg = nlohmann::json::parse(in);
  } catch (const std::exception& e) {
    return invalid_argument(spec.model + "/config.json: " + e.what());
  }
  if (!cfg.contains("num_hidden_layers") || !cfg.at("num_hidden_layers").is_number_integer())
    return invalid_argument(spec.model + "/config.json: num_hidden_layers missing");
  return check_against_model(spec, cfg.at("num_hidden_layers").get<int>());
}

}  // namespace

int main(int argc, char** argv) {
  if (argc > 1 && is_cluster_tool(argv[1])) return cluster_tool_main(argc, argv);  // render, keys, probe
  CLI::App app{
      "k3-cluster: start a disaggregated k3serve cluster on this machine and supervise it in the foreground.\n"
      "Reads a cluster spec (JSON; see deploy/cluster-default.json: router + prefill PP2 + decode DP1 on k3-tiny, "
      "port 8000), generates the model with k3-genweights if its directory is missing, starts k3-router (cluster "
      "mode), every k3-decode rank and every k3-prefill stage on free ports, waits until /health is OK and every node "
      "registered, and prints the endpoint. A node that dies (the router too) is reported and started again in the same "
      "place after a backoff (spec \"restart\": 0.2 s doubling to 10 s, reset after 30 s of stable running; after 5 "
      "crashes in a row it is given up and the cluster serves with what is left, 503 while no prefill/decode pair is "
      "complete; a given-up router stops everything). GET /status and /metrics on the status port show every node's "
      "state, pid and restarts. Ctrl-C or SIGTERM stops it cleanly (SIGTERM to every child, SIGKILL after "
      "timeouts.shutdown_ms; no process is left behind).\n"
      "API key (/v1 needs 'Authorization: Bearer <key>'): the spec's router.api_key, else --api-key, else the "
      "environment variable K3_API_KEY; it reaches k3-router through its environment, never a command line."};
  std::string spec_path = "deploy/cluster-default.json", bin, log_level = "warn", model_override;
  std::string api_key_flag;
  int port = -1, status_port = 0;
  bool verbose = false, exit_on_crash = false;
  app.add_option("--spec", spec_path, "cluster spec JSON (default deploy/cluster-default.json)");
  app.add_option("--model", model_override, "model directory, overriding the spec's \"model\" (generated there if missing)");
  app.add_option("--port", port, "HTTP port, overriding router.port (0 = pick a free one)")->check(CLI::Range(0, 65535));
  app.add_option("--bin-dir", bin, "where k3-router, k3-prefill, k3-decode, k3-genweights are (default: next to k3-cluster)");
  app.add_option("--log-level", log_level, "the log level of the router and the nodes: trace, debug, info (a line per request and process), warn (default), error");
  app.add_flag("--verbose", verbose, "echo every child's stdout lines on stderr");
  std::string run_dir, log_dir;
  app.add_option("--log-dir", log_dir,
                 "write every node's log lines (its stderr) to <dir>/<node>.log, appended across restarts ('/' in a "
                 "node name becomes '_'); `k3-cluster logs --log-dir <dir> REQUEST_ID` shows one request's path");
  app.add_option("--run-dir", run_dir,
                 "where the control-plane keys are written (<dir>/keys: a CURVE keypair per process, mode 0600, and "
                 "the public keys; kept); default: a private temporary directory removed at exit");
  app.add_flag("--exit-on-crash", exit_on_crash,
               "stop the whole cluster when any child dies (default: only when the router dies; a lost node leaves "
               "the cluster serving degraded, new requests get 503 while no prefill/decode pair is complete)");
  app.add_option("--api-key", api_key_flag,
                 "require 'Authorization: Bearer <key>' on /v1/* (used when the spec has no router.api_key; "
                 "prefer K3_API_KEY: a flag is visible in ps)");
  app.add_option("--status-port", status_port,
                 "port of k3-cluster's own status endpoint on 127.0.0.1 (GET /status, GET /metrics; 0 = a free one, "
                 "printed as STATUS)")->check(CLI::Range(0, 65535));
  CLI11_PARSE(app, argc, argv);
  if (bin.empty()) bin = own_bin_dir();

  // Blocked here (children unblock them): collected by stop_requested, never delivered asynchronously.
  sigset_t sigs;
  sigemptyset(&sigs);
  sigaddset(&sigs, SIGINT);
  sigaddset(&sigs, SIGTERM);
  sigprocmask(SIG_BLOCK, &sigs, nullptr);
  std::signal(SIGPIPE, SIG_IGN);

  auto spec = load_cluster_spec(spec_path);
  if (!spec.is_ok()) {
    note(spec.status().message());
    return 2;
  }
  if (port >= 0) spec->port = port;
  if (exit_on_crash) spec->restart.enabled = false;
  auto api_key = resolve_api_key(*spec, api_key_flag, std::getenv("K3_API_KEY"));
  if (!api_key.is_ok()) {
    note(api_key.status().message());
    return 2;
  }
  if (!model_override.empty()) spec->model = model_override;
  if (Status s = ensure_model(*spec, bin); !s.is_ok()) {
    note(s.message());
    return 1;
  }
  if (Status s = check_model(*spec); !s.is_ok()) {
    note(s.message());
    return 2;
  }
  // The default run dir is private (mkdtemp: 0700) and goes with the launcher; a given one is kept.
  struct OwnedDir {
    std::string path;
    ~OwnedDir() {
      std::error_code ec;
      if (!path.empty()) fs::remove_all(path, ec);
    }
  } owned;
  if (run_dir.empty()) {
    std::string tmpl = (fs::temp_directory_path() / "k3-cluster-XXXXXX").string();
    if (!::mkdtemp(tmpl.data())) {
      note("cannot create a run directory under " + fs::temp_directory_path().string());
      return 1;
    }
    run_dir = owned.path = tmpl;
  }
  if (!log_dir.empty()) {
    std::error_code ec;
    fs::create_directories(log_dir, ec);
    if (ec) {
      note("--log-dir: cannot create " + log_dir + ": " + ec.message());
      return 2;
    }
  }
  Launcher launcher(*spec, bin, log_level, verbose, exit_on_crash, sigs, *api_key, run_dir, log_dir);
  if (Status s = launcher.start(); !s.is_ok()) {
    const bool interrupted = s.code() == Code::Aborted;
    if (!interrupted) note("start failed: " + s.message());
    launcher.shutdown();
    return interrupted ? 0 : 1;
  }
  std::size_t stages = 0;
  for (const auto& p : spec->prefill) stages += p.stages;
  note("serving model " + spec->model + " on http://" + spec->host + ":" + std::to_string(launcher.port()) + " (" +
       std::to_string(spec->prefill.size()) + " prefill instance(s), " + std::to_string(stages) + " stage(s); " +
       std::to_string(decode_processes(*spec).size()) + " decode rank(s); Ctrl-C stops)");
  auto status = start_status_server(static_cast<uint16_t>(status_port), launcher.supervisor());
  if (!status.is_ok()) {
    note("status endpoint: " + status.status().message());
    launcher.shutdown();
    return 1;
  }
  say("STATUS http://127.0.0.1:" + std::to_string((*status)->port()));
  say("ENDPOINT http://" + spec->host + ":" + std::to_string(launcher.port()));
  return launcher.supervise();
}
