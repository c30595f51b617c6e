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
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <thread>

#include "deploy/child_process.h"
#include "deploy/cluster_launcher.h"
#include "deploy/cluster_spec.h"
#include "deploy/cluster_tools.h"
#include "deploy/node_commands.h"
#include "deploy/status_server.h"

using namespace k3;
using namespace k3::deploy;
namespace fs = std::filesystem;
using std::chrono::milliseconds;

namespace {

// The directory of this executable (the sibling binaries live there).
std::string own_bin_dir() {
  std::error_code ec;
  const fs::path exe = fs::read_symlink("/proc/self/exe", ec);
  return ec ? std::string(".") : exe.parent_path().string();
}

Status ensure_model(ClusterSpec& spec, const std::string& bin) {
  spec.model = fs::absolute(spec.model).lexically_normal().string();
  if (fs::exists(spec.model + "/config.json")) return Status::ok();
  note_line("model dir " + spec.model + " has no config.json: generating '" + spec.preset + "' weights (first use)");
  std::vector<std::string> args = {"--preset", spec.preset, "--seed", std::to_string(spec.seed), "--out", spec.model};
  if (fs::exists(spec.model)) args.push_back("--force");
  K3_ASSIGN_OR_RETURN(auto gen, ChildProcess::start("k3-genweights", bin + "/k3-genweights", args));
  while (!gen->exited()) {
    for (const auto& line : gen->drain()) note_line("k3-genweights: " + line);
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
    note_line(spec.status().message());
    return 2;
  }
  if (port >= 0) spec->port = port;
  if (exit_on_crash) spec->restart.enabled = false;
  auto api_key = resolve_api_key(*spec, api_key_flag, std::getenv("K3_API_KEY"));
  if (!api_key.is_ok()) {
    note_line(api_key.status().message());
    return 2;
  }
  if (!model_override.empty()) spec->model = model_override;
  if (Status s = ensure_model(*spec, bin); !s.is_ok()) {
    note_line(s.message());
    return 1;
  }
  if (Status s = check_model(*spec); !s.is_ok()) {
    note_line(s.message());
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
      note_line("cannot create a run directory under " + fs::temp_directory_path().string());
      return 1;
    }
    run_dir = owned.path = tmpl;
  }
  if (!log_dir.empty()) {
    std::error_code ec;
    fs::create_directories(log_dir, ec);
    if (ec) {
      note_line("--log-dir: cannot create " + log_dir + ": " + ec.message());
      return 2;
    }
  }
  Launcher launcher(*spec, bin, log_level, verbose, exit_on_crash, sigs, *api_key, run_dir, log_dir);
  if (Status s = launcher.start(); !s.is_ok()) {
    const bool interrupted = s.code() == Code::Aborted;
    if (!interrupted) note_line("start failed: " + s.message());
    launcher.shutdown();
    return interrupted ? 0 : 1;
  }
  std::size_t stages = 0;
  for (const auto& p : spec->prefill) stages += p.stages;
  note_line("serving model " + spec->model + " on http://" + spec->host + ":" + std::to_string(launcher.port()) + " (" +
       std::to_string(spec->prefill.size()) + " prefill instance(s), " + std::to_string(stages) + " stage(s); " +
       std::to_string(decode_processes(*spec).size()) + " decode rank(s); Ctrl-C stops)");
  auto status = start_status_server(static_cast<uint16_t>(status_port), launcher.supervisor());
  if (!status.is_ok()) {
    note_line("status endpoint: " + status.status().message());
    launcher.shutdown();
    return 1;
  }
  say_line("STATUS http://127.0.0.1:" + std::to_string((*status)->port()));
  say_line("ENDPOINT http://" + spec->host + ":" + std::to_string(launcher.port()));
  return launcher.supervise();
}
