// k3-cluster: brings up a whole disaggregated cluster on this machine from a spec (cluster_spec.h):
// the router (k3-router in cluster mode), every prefill stage (k3-prefill) and every decode rank
// (k3-decode), wired through free ports; waits until /health answers and every node registered,
// prints the endpoint, and supervises in the foreground: a child that dies is reported (the router
// then fails its requests and answers 503 while no pair is complete; a dead router, or any death with
// --exit-on-crash, stops everything); Ctrl-C / SIGTERM stops every child (SIGTERM, then SIGKILL after
// the shutdown timeout) and exits, non-zero when a child had crashed.
//
// stdout lines (tests read them): "STARTED <name> pid <pid>", then "ENDPOINT http://<host>:<port>",
// "NODE <name> HELD <sources held> <requests computing>" (a prefill stage's state changed) and
// "NODE <name> IDLE <pool free bytes> <pool capacity bytes>" (a decode rank ran out of requests),
// and at the end "CHILD_EXITED <name> <description>" for a crash and "STOPPED".
#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>
#include <signal.h>
#include <unistd.h>

#include <csignal>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <set>
#include <thread>

#include "deploy/child_process.h"
#include "deploy/cluster_spec.h"
#include "deploy/http_probe.h"

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

// SIGINT/SIGTERM are blocked in the launcher and collected here without waiting.
bool stop_requested(const sigset_t& sigs) {
  timespec zero{0, 0};
  return sigtimedwait(&sigs, nullptr, &zero) > 0;
}

class Launcher {
 public:
  Launcher(ClusterSpec spec, std::string bin, std::string log_level, bool verbose, bool exit_on_crash, sigset_t sigs)
      : spec_(std::move(spec)), bin_(std::move(bin)), log_level_(std::move(log_level)), verbose_(verbose),
        exit_on_crash_(exit_on_crash), sigs_(sigs) {}
  ~Launcher() { shutdown(); }

  // Starts everything and waits until the cluster serves. Errors say what did not come up.
  Status start();
  // Runs until a child dies (returns 1) or a signal arrives (returns 0); then shuts down.
  int supervise();
  void shutdown();
  int port() const { return port_; }

 private:
  Result<ChildProcess*> spawn(const std::string& name, const std::string& exe, const std::vector<std::string>& args);
  // The rest of a stdout line starting with `prefix` from `c`; fails when c dies, a signal arrives or time is up.
  Result<std::string> wait_line(ChildProcess& c, const std::string& prefix, Clock::time_point deadline);
  Status check_alive();
  void pump_outputs();
  Status wait_serving(Clock::time_point deadline);

  ClusterSpec spec_;
  std::string bin_, log_level_;
  bool verbose_;
  bool exit_on_crash_;
  sigset_t sigs_;
  bool interrupted_ = false;
  std::vector<std::unique_ptr<ChildProcess>> children_;  // start order
  int port_ = 0;
};

Result<ChildProcess*> Launcher::spawn(const std::string& name, const std::string& exe, const std::vector<std::string>& args) {
  K3_ASSIGN_OR_RETURN(auto c, ChildProcess::start(name, bin_ + "/" + exe, args));
  say("STARTED " + name + " pid " + std::to_string(c->pid()));
  children_.push_back(std::move(c));
  return children_.back().get();
}

Status Launcher::check_alive() {
  if (!interrupted_ && stop_requested(sigs_)) interrupted_ = true;
  if (interrupted_) return Status(Code::Aborted, "interrupted");
  for (auto& c : children_)
    if (c->exited()) return Status(Code::Unavailable, c->name() + " (pid " + std::to_string(c->pid()) + ") " + c->exit_description());
  return Status::ok();
}

Result<std::string> Launcher::wait_line(ChildProcess& c, const std::string& prefix, Clock::time_point deadline) {
  for (;;) {
    K3_TRY(check_alive());
    if (Clock::now() >= deadline) return Status(Code::DeadlineExceeded, c.name() + ": no '" + prefix + "' line in time");
    auto line = c.read_line(milliseconds(100));
    if (!line) continue;
    if (verbose_) note(c.name() + ": " + *line);
    if (line->rfind(prefix, 0) == 0) return line->substr(prefix.size());
  }
}

void Launcher::pump_outputs() {
  for (auto& c : children_)
    for (const auto& line : c->drain()) {
      if (verbose_) note(c->name() + ": " + line);
      // The nodes' memory state lines (prefill "HELD <sources> <computing>", decode "IDLE <pool free>
      // <pool capacity>") are relayed so that memory release is observable from outside the cluster.
      if (line.rfind("HELD ", 0) == 0 || line.rfind("IDLE ", 0) == 0) say("NODE " + c->name() + " " + line);
    }
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

  // Router first: the nodes connect to its control endpoint (ZeroMQ retries until it is there).
  std::vector<std::string> rargs = {"--model", spec_.model, "--host", spec_.host, "--port", std::to_string(spec_.port),
                                    "--cluster-endpoint", "tcp://127.0.0.1:*", "--placement", spec_.placement,
                                    "--heartbeat-ms", hb, "--heartbeat-misses", misses,
                                    "--claim-timeout-ms", std::to_string(spec_.claim_ms)};
  if (!spec_.served_model_name.empty()) rargs.insert(rargs.end(), {"--served-model-name", spec_.served_model_name});
  for (size_t i = 0; i < spec_.prefill.size(); ++i) {
    const auto& p = spec_.prefill[i];
    const auto& d = decodes[i % decodes.size()];
    rargs.insert(rargs.end(), {"--pair", p.id + ":" + std::to_string(p.stages) + ":" + d.instance + ":" + std::to_string(d.rank)});
  }
  K3_ASSIGN_OR_RETURN(ChildProcess * router, spawn("router", "k3-router", rargs));
  K3_ASSIGN_OR_RETURN(std::string control, wait_line(*router, "CLUSTER ", deadline));
  K3_ASSIGN_OR_RETURN(std::string listening, wait_line(*router, "listening on http://", deadline));
  port_ = std::atoi(listening.substr(listening.rfind(':') + 1).c_str());
  if (port_ <= 0) return internal_error("router printed no port: '" + listening + "'");

  // Decode ranks next: the prefill stages need their endpoints.
  std::vector<std::string> decode_eps;
  for (const auto& d : decodes) {
    K3_ASSIGN_OR_RETURN(ChildProcess * c,
                        spawn("decode/" + d.instance, "k3-decode",
                              {"--model", spec_.model, "--router-endpoint", control, "--instance", d.instance, "--rank",
                               std::to_string(d.rank), "--dp-size", std::to_string(decodes.size()), "--max-requests", std::to_string(d.max_requests), "--threads",
                               threads, "--backend", spec_.backend, "--heartbeat-ms", hb, "--heartbeat-misses", misses, "--log-level", log_level_}));
    K3_ASSIGN_OR_RETURN(std::string ep, wait_line(*c, "READY ", deadline));
    decode_eps.push_back(ep);
  }

  // Each prefill instance, last stage first: a stage needs the LISTEN endpoint of the next.
  std::vector<ChildProcess*> stages;
  for (size_t i = 0; i < spec_.prefill.size(); ++i) {
    const auto& p = spec_.prefill[i];
    const size_t di = i % decodes.size();
    std::string partition;
    for (int n : p.partition) partition += (partition.empty() ? "" : ",") + std::to_string(n);
    std::string next;
    for (int st = p.stages - 1; st >= 0; --st) {
      std::vector<std::string> args = {"--model", spec_.model, "--stage", std::to_string(st), "--stages",
                                       std::to_string(p.stages), "--chunk-size", std::to_string(p.chunk_size),
                                       "--max-requests", std::to_string(p.max_requests), "--instance", p.id,
                                       "--decode-instance", decodes[di].instance, "--decode-endpoint", decode_eps[di],
                                       "--router-endpoint", control, "--threads", threads, "--backend", spec_.backend, "--heartbeat-ms", hb,
                                       "--heartbeat-misses", misses, "--log-level", log_level_};
      if (!partition.empty()) args.insert(args.end(), {"--partition", partition});
      if (st > 0) args.insert(args.end(), {"--listen", "tcp://127.0.0.1:*"});
      if (!next.empty()) args.insert(args.end(), {"--next-endpoint", next});
      K3_ASSIGN_OR_RETURN(ChildProcess * c, spawn("prefill/" + p.id + "/" + std::to_string(st), "k3-prefill", args));
      if (st > 0) {
        K3_ASSIGN_OR_RETURN(next, wait_line(*c, "LISTEN ", deadline));
      }
      stages.push_back(c);
    }
  }
  for (ChildProcess* c : stages) K3_TRY(wait_line(*c, "DECODE_READY", deadline));
  return wait_serving(deadline);
}

int Launcher::supervise() {
  std::set<std::string> reported;
  for (;;) {
    if (stop_requested(sigs_)) {
      note("signal received, shutting down");
      shutdown();
      return reported.empty() ? 0 : 1;
    }
    for (auto& c : children_)
      if (c->exited() && reported.insert(c->name()).second) {
        say("CHILD_EXITED " + c->name() + " " + c->exit_description());
        // Without the router nothing serves; a lost node leaves the cluster degraded (the router fails its
        // requests and answers 503 while no pair is complete) unless --exit-on-crash.
        const bool fatal = exit_on_crash_ || c->name() == "router";
        note(c->name() + " (pid " + std::to_string(c->pid()) + ") " + c->exit_description() +
             (fatal ? "; shutting the cluster down" : "; serving degraded (Ctrl-C stops)"));
        if (fatal) {
          shutdown();
          return 1;
        }
      }
    pump_outputs();
    std::this_thread::sleep_for(milliseconds(100));
  }
}

void Launcher::shutdown() {
  if (children_.empty()) return;
  // The router first (clients get their error events while the nodes are still up), then the nodes.
  for (auto& c : children_) c->terminate();
  const auto deadline = Clock::now() + milliseconds(spec_.shutdown_ms);
  for (auto& c : children_) {
    const auto left = std::chrono::duration_cast<milliseconds>(deadline - Clock::now());
    if (!c->wait_exit(std::max(left, milliseconds(0)))) {
      note(c->name() + " did not stop in time: killed");
      c->kill_and_reap();
    }
  }
  pump_outputs();
  children_.clear();
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
  CLI::App app{
      "k3-cluster: start a disaggregated k3serve cluster on this machine and supervise it in the foreground.\n"
      "Reads a cluster spec (JSON; see deploy/cluster-default.json: router + prefill PP2 + decode DP1 on k3-tiny, "
      "port 8000), generates the model with k3-genweights if its directory is missing, starts k3-router (cluster "
      "mode), every k3-decode rank and every k3-prefill stage on free ports, waits until /health is OK and every node "
      "registered, and prints the endpoint. A node that dies is reported and the cluster serves degraded (503 while "
      "no prefill/decode pair is complete); a dead router stops everything. Ctrl-C or SIGTERM stops it cleanly "
      "(SIGTERM to every child, SIGKILL after timeouts.shutdown_ms; no process is left behind)."};
  std::string spec_path = "deploy/cluster-default.json", bin, log_level = "warn", model_override;
  int port = -1;
  bool verbose = false, exit_on_crash = false;
  app.add_option("--spec", spec_path, "cluster spec JSON (default deploy/cluster-default.json)");
  app.add_option("--model", model_override, "model directory, overriding the spec's \"model\" (generated there if missing)");
  app.add_option("--port", port, "HTTP port, overriding router.port (0 = pick a free one)")->check(CLI::Range(0, 65535));
  app.add_option("--bin-dir", bin, "where k3-router, k3-prefill, k3-decode, k3-genweights are (default: next to k3-cluster)");
  app.add_option("--log-level", log_level, "the nodes' log level: trace, debug, info, warn (default), error");
  app.add_flag("--verbose", verbose, "echo every child's stdout lines on stderr");
  app.add_flag("--exit-on-crash", exit_on_crash,
               "stop the whole cluster when any child dies (default: only when the router dies; a lost node leaves "
               "the cluster serving degraded, new requests get 503 while no prefill/decode pair is complete)");
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
  if (!model_override.empty()) spec->model = model_override;
  if (Status s = ensure_model(*spec, bin); !s.is_ok()) {
    note(s.message());
    return 1;
  }
  if (Status s = check_model(*spec); !s.is_ok()) {
    note(s.message());
    return 2;
  }
  Launcher launcher(*spec, bin, log_level, verbose, exit_on_crash, sigs);
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
  say("ENDPOINT http://" + spec->host + ":" + std::to_string(launcher.port()));
  return launcher.supervise();
}
