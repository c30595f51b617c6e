// k3-cluster's node supervisor: owns every child process (router, prefill stages, decode ranks) with
// the recipe that starts it, and heals the cluster: a node that dies is started again from its recipe
// after a backoff (restart_policy.h), until the crash-loop limit gives it up as failed.
//
// A recipe is what a restart needs to come back *in the same place*: the launcher pins the endpoints
// the first incarnation picked (the router's HTTP port and control endpoint, a decode rank's control
// endpoint, a prefill stage's activation endpoint), so the peers' ZeroMQ sockets reconnect by
// themselves and the liveness layer reports the new incarnation (PeerDown(Restarted) + PeerUp), which
// makes prefill stages re-REGISTER with a restarted decode and learn its new UCX worker address and rkeys.
//
// poll() is non-blocking and driven by the launcher's loop. The state it publishes (status_json(),
// prometheus_text()) is guarded by a mutex: the status endpoint reads it from its own threads.
#pragma once
#include <chrono>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "deploy/child_process.h"
#include "deploy/restart_policy.h"

namespace k3::deploy {

struct NodeRecipe {
  std::string name;  // "router", "decode/<instance>", "prefill/<instance>/<stage>"
  std::string exe;   // absolute path
  std::vector<std::string> args;
  ChildEnvironment env;
  std::string log_path;  // its stderr (log lines) appended here across restarts; empty: the launcher's stderr
  // Non-empty: at shutdown this node is sent SIGTERM only once the node of that name has exited. A rank
  // group's member stops after its leader, which stops its members itself: a member signalled at the
  // same time vanishes under the leader's step, which then reports the group failed.
  std::string stops_after;
};

// Sets `flag value` in args: replaces the value after an existing `flag`, else appends both.
void set_option(std::vector<std::string>& args, const std::string& flag, const std::string& value);

enum class NodeState { Running, WaitingRestart, Failed, Stopped };
const char* node_state_name(NodeState s);

struct SupervisorEvent {
  enum class Kind { Exited, Restarted, Failed } kind;
  std::string name;
  std::string detail;  // Exited: how it ended; Restarted: the new pid; Failed: why it is given up
};

class Supervisor {
 public:
  using Clock = std::chrono::steady_clock;
  struct Output {
    std::function<void(const std::string&)> say;   // a stdout protocol line
    std::function<void(const std::string&)> note;  // a log line for people (stderr)
  };
  Supervisor(RestartPolicy policy, Output out) : policy_(policy), out_(std::move(out)) {}
  ~Supervisor() { stop_all(std::chrono::milliseconds(0)); }

  // Starts a node for the first time; says "STARTED <name> pid <pid>".
  Result<ChildProcess*> start(NodeRecipe recipe);
  // The recipe used for the node's next restart (the launcher pins endpoints in it).
  NodeRecipe& recipe(const std::string& name);

  // Reaps dead nodes (scheduling their restart or giving them up) and starts those whose backoff ran
  // out. Lines: "CHILD_EXITED <name> <how>", "RESTARTED <name> pid <pid> restarts <n>", "FAILED <name>".
  std::vector<SupervisorEvent> poll(Clock::time_point now);
  // The first node found dead since the last poll, without acting on it (for start-up: nothing restarts
  // before the cluster first served).
  std::optional<std::string> first_dead();

  // Every running child, in start order.
  void for_each_child(const std::function<void(const std::string& name, ChildProcess&)>& fn);
  // SIGTERM to every child (those with a stops_after once that node has exited), SIGKILL to those still
  // running after `grace`; reaps all.
  void stop_all(std::chrono::milliseconds grace);
  bool any_crashed() const { return any_crashed_; }

  // {"nodes":[{"name","state","pid","restarts","consecutive_crashes","last_exit"}...]}
  std::string status_json() const;
  // k3_cluster_node_restarts_total{node}, k3_cluster_process_up{node}, k3_cluster_process_failed{node}.
  std::string prometheus_text() const;

 private:
  struct Node {
    NodeRecipe recipe;
    std::unique_ptr<ChildProcess> child;
    RestartBackoff backoff;
    NodeState state = NodeState::Running;
    Clock::time_point started_at, next_start;
    int restarts = 0;
    std::string last_exit;
  };
  Node* find(const std::string& name);
  Status spawn(Node& n, Clock::time_point now);
  void on_exit(Node& n, Clock::time_point now, std::vector<SupervisorEvent>& events);
  void publish();

  RestartPolicy policy_;
  Output out_;
  std::vector<std::unique_ptr<Node>> nodes_;  // start order
  bool any_crashed_ = false;

  struct Published {
    std::string name, state, last_exit;
    int pid = 0, restarts = 0, consecutive = 0;
  };
  mutable std::mutex pub_mu_;
  std::vector<Published> published_;
};

}  // namespace k3::deploy
