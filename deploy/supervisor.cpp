#include "deploy/supervisor.h"

#include <nlohmann/json.hpp>

#include <algorithm>

namespace k3::deploy {

using std::chrono::milliseconds;

void set_option(std::vector<std::string>& args, const std::string& flag, const std::string& value) {
  auto it = std::find(args.begin(), args.end(), flag);
  if (it != args.end() && it + 1 != args.end()) {
    *(it + 1) = value;
    return;
  }
  args.push_back(flag);
  args.push_back(value);
}

const char* node_state_name(NodeState s) {
  switch (s) {
    case NodeState::Running: return "running";
    case NodeState::WaitingRestart: return "waiting_restart";
    case NodeState::Failed: return "failed";
    case NodeState::Stopped: return "stopped";
  }
  return "?";
}

Supervisor::Node* Supervisor::find(const std::string& name) {
  for (auto& n : nodes_)
    if (n->recipe.name == name) return n.get();
  return nullptr;
}

NodeRecipe& Supervisor::recipe(const std::string& name) {
  Node* n = find(name);
  if (!n) throw std::logic_error("supervisor: no node named " + name);
  return n->recipe;
}

Status Supervisor::spawn(Node& n, Clock::time_point now) {
  K3_ASSIGN_OR_RETURN(n.child, ChildProcess::start(n.recipe.name, n.recipe.exe, n.recipe.args, n.recipe.env,
                                                    n.recipe.log_path));
  n.state = NodeState::Running;
  n.started_at = now;
  publish();  // before the line: whoever reads it and then asks /status sees the new pid
  out_.say("STARTED " + n.recipe.name + " pid " + std::to_string(n.child->pid()));
  return Status::ok();
}

Result<ChildProcess*> Supervisor::start(NodeRecipe recipe) {
  if (find(recipe.name)) return invalid_argument("supervisor: node " + recipe.name + " is started twice");
  auto node = std::make_unique<Node>(Node{.recipe = std::move(recipe), .child = nullptr, .backoff = RestartBackoff(policy_)});
  nodes_.push_back(std::move(node));
  if (Status s = spawn(*nodes_.back(), Clock::now()); !s.is_ok()) {
    nodes_.pop_back();
    publish();
    return s;
  }
  return nodes_.back()->child.get();
}

void Supervisor::on_exit(Node& n, Clock::time_point now, std::vector<SupervisorEvent>& events) {
  const std::string how = n.child ? n.child->exit_description() : "could not be started";
  const std::string who = n.recipe.name + (n.child ? " (pid " + std::to_string(n.child->pid()) + ")" : "");
  any_crashed_ = true;
  n.last_exit = how;
  const auto lived = std::chrono::duration_cast<milliseconds>(now - n.started_at);
  const auto delay = n.backoff.on_exit(lived);
  n.state = delay ? NodeState::WaitingRestart : NodeState::Failed;
  if (delay) n.next_start = now + *delay;
  publish();  // before the lines: a reader of CHILD_EXITED / FAILED then sees the same state in /status
  out_.say("CHILD_EXITED " + n.recipe.name + " " + how);
  events.push_back({SupervisorEvent::Kind::Exited, n.recipe.name, how});
  if (delay) {
    out_.note(who + " " + how + " after " + std::to_string(lived.count()) + " ms; restart " +
              std::to_string(n.restarts + 1) + " (crash " + std::to_string(n.backoff.consecutive()) + " in a row) in " +
              std::to_string(delay->count()) + " ms");
    return;
  }
  const std::string why = policy_.enabled ? "crashed " + std::to_string(n.backoff.consecutive()) +
                                                " times in a row (restart.max_restarts " +
                                                std::to_string(policy_.max_restarts) + "): given up"
                                          : "restarts are off (spec restart.enabled false, or --exit-on-crash)";
  out_.note(who + " " + how + "; " + why + "; serving with the nodes that are left");
  out_.say("FAILED " + n.recipe.name);
  events.push_back({SupervisorEvent::Kind::Failed, n.recipe.name, why});
}

std::vector<SupervisorEvent> Supervisor::poll(Clock::time_point now) {
  std::vector<SupervisorEvent> events;
  for (auto& np : nodes_) {
    Node& n = *np;
    if (n.state == NodeState::Running && n.child->exited()) {
      on_exit(n, now, events);
    }
    if (n.state == NodeState::WaitingRestart && now >= n.next_start) {
      n.child.reset();
      if (Status s = spawn(n, now); !s.is_ok()) {
        out_.note(n.recipe.name + ": restart failed: " + s.message());
        on_exit(n, now, events);
      } else {
        ++n.restarts;
        publish();
        out_.say("RESTARTED " + n.recipe.name + " pid " + std::to_string(n.child->pid()) + " restarts " +
                 std::to_string(n.restarts));
        events.push_back({SupervisorEvent::Kind::Restarted, n.recipe.name, std::to_string(n.child->pid())});
      }
    }
  }
  return events;
}

std::optional<std::string> Supervisor::first_dead() {
  for (auto& n : nodes_)
    if (n->state == NodeState::Running && n->child->exited())
      return n->recipe.name + " (pid " + std::to_string(n->child->pid()) + ") " + n->child->exit_description();
  return std::nullopt;
}

void Supervisor::for_each_child(const std::function<void(const std::string&, ChildProcess&)>& fn) {
  for (auto& n : nodes_)
    if (n->child) fn(n->recipe.name, *n->child);
}

void Supervisor::stop_all(milliseconds grace) {
  // In start order (the router first: clients get their error events while the nodes are still up).
  for (auto& n : nodes_)
    if (n->child && n->recipe.stops_after.empty()) n->child->terminate();
  const auto deadline = Clock::now() + grace;
  const auto left = [&] { return std::max(std::chrono::duration_cast<milliseconds>(deadline - Clock::now()), milliseconds(0)); };
  for (auto& n : nodes_) {
    if (!n->child || n->recipe.stops_after.empty()) continue;
    for (auto& first : nodes_)
      if (first->recipe.name == n->recipe.stops_after && first->child) (void)first->child->wait_exit(left());
    n->child->terminate();
  }
  for (auto& n : nodes_) {
    if (!n->child) continue;
    if (!n->child->wait_exit(left())) {
      if (grace.count() > 0) out_.note(n->recipe.name + " did not stop in time: killed");
      n->child->kill_and_reap();
    }
    n->state = NodeState::Stopped;  // on purpose: not a crash, never restarted
  }
  publish();
}

void Supervisor::publish() {
  std::vector<Published> p;
  for (const auto& n : nodes_)
    p.push_back({.name = n->recipe.name, .state = node_state_name(n->state), .last_exit = n->last_exit,
                 .pid = n->state == NodeState::Running && n->child ? n->child->pid() : 0, .restarts = n->restarts,
                 .consecutive = n->backoff.consecutive()});
  std::lock_guard lk(pub_mu_);
  published_ = std::move(p);
}

std::string Supervisor::status_json() const {
  nlohmann::json nodes = nlohmann::json::array();
  std::lock_guard lk(pub_mu_);
  for (const auto& n : published_)
    nodes.push_back({{"name", n.name}, {"state", n.state}, {"pid", n.pid}, {"restarts", n.restarts},
                     {"consecutive_crashes", n.consecutive}, {"last_exit", n.last_exit}});
  return nlohmann::json{{"nodes", nodes}}.dump();
}

std::string Supervisor::prometheus_text() const {
  std::lock_guard lk(pub_mu_);
  std::string o;
  auto family = [&](const char* name, const char* type, const char* help, auto value) {
    o += std::string("# HELP ") + name + " " + help + "\n# TYPE " + name + " " + type + "\n";
    for (const auto& n : published_) o += std::string(name) + "{node=\"" + n.name + "\"} " + std::to_string(value(n)) + "\n";
  };
  family("k3_cluster_node_restarts_total", "counter", "Times k3-cluster started the node again after it died.",
         [](const Published& n) { return n.restarts; });
  family("k3_cluster_process_up", "gauge", "1 while the node's process runs (0: waiting for its restart, or failed).",
         [](const Published& n) { return n.state == "running" ? 1 : 0; });
  family("k3_cluster_process_failed", "gauge", "1 once k3-cluster gave the node up (crash-loop limit or restarts off).",
         [](const Published& n) { return n.state == "failed" ? 1 : 0; });
  return o;
}

}  // namespace k3::deploy
