// The launcher behind k3-cluster (deploy/k3_cluster.cpp): starts the router, every decode rank and
// every prefill stage of a spec as child processes on free ports, waits until the cluster serves,
// supervises it (deploy/supervisor.h) and stops it. Its stdout lines (say_line) are the protocol
// k3-cluster's header comment lists; its notes (note_line) go to stderr.
#pragma once
#include <signal.h>

#include <chrono>
#include <optional>
#include <string>
#include <vector>

#include "common/core/free_port.h"
#include "deploy/child_process.h"
#include "deploy/cluster_spec.h"
#include "deploy/request_logs.h"
#include "deploy/supervisor.h"
#include "transfer/cluster_key_files.h"

namespace k3::deploy {

// One stdout line of k3-cluster's protocol, flushed.
void say_line(const std::string& s);
// One "k3-cluster: ..." line on stderr, flushed.
void note_line(const std::string& s);

class Launcher {
 public:
  Launcher(ClusterSpec spec, std::string bin, std::string log_level, bool verbose, bool exit_on_crash, sigset_t sigs,
           std::string api_key, std::string run_dir, std::string log_dir)
      : spec_(std::move(spec)), bin_(std::move(bin)), log_level_(std::move(log_level)), verbose_(verbose),
        exit_on_crash_(exit_on_crash), sigs_(sigs), api_key_(std::move(api_key)),
        supervisor_(spec_.restart, {.say = say_line, .note = note_line}), run_dir_(std::move(run_dir)),
        log_dir_(std::move(log_dir)),
        logs_(log_dir_.empty() ? std::nullopt : std::optional<NodeLogFiles>(std::in_place, log_dir_)) {}
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
  // stops_after: NodeRecipe::stops_after (a rank group member names its leader).
  Result<ChildProcess*> spawn(const std::string& name, const std::string& exe, const std::vector<std::string>& args,
                              const std::string& stops_after = "");
  // The environment of every child: no inherited K3_API_KEY, except the router's own key.
  ChildEnvironment child_env(const std::string& name) const;
  // The rest of a stdout line starting with `prefix` from `c`; fails when c dies, a signal arrives or time is up.
  Result<std::string> wait_line(ChildProcess& c, const std::string& prefix, std::chrono::steady_clock::time_point deadline);
  // Reads the node's METRICS line and makes a restart of it serve /metrics on the same port.
  Status keep_metrics_port(ChildProcess& c, std::chrono::steady_clock::time_point deadline);
  Status check_alive();
  void pump_outputs();
  // The next port of this launcher's block (start() takes one block of free consecutive ports below the
  // kernel's ephemeral range): where a node binds what the launcher pins across its restarts.
  std::string pinned_port();
  Status wait_serving(std::chrono::steady_clock::time_point deadline);

  ClusterSpec spec_;
  std::string bin_, log_level_;
  bool verbose_;
  bool exit_on_crash_;
  sigset_t sigs_;
  std::string api_key_;
  bool interrupted_ = false, stopped_ = false;
  Supervisor supervisor_;
  int port_ = 0;
  PortBlock ports_;  // pinned_port()'s block
  std::string run_dir_;
  std::string log_dir_;  // non-empty: every child's output and stderr go to <log_dir>/<node>.log (request_logs.h)
  std::optional<NodeLogFiles> logs_;  // set when log_dir_ is
  std::optional<transfer::ClusterKeyFiles> keys_;  // every child's control-plane keys (by control name = child name)
};

}  // namespace k3::deploy
