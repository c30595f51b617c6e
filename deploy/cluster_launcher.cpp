// The launcher behind k3-cluster (cluster_launcher.h).
#include "deploy/cluster_launcher.h"

#include <cstdio>
#include <filesystem>
#include <map>
#include <memory>
#include <set>
#include <thread>

#include "common/core/free_port.h"
#include "deploy/cluster_tools.h"
#include "deploy/http_probe.h"
#include "deploy/node_commands.h"

namespace k3::deploy {

namespace fs = std::filesystem;
using std::chrono::milliseconds;
using Clock = std::chrono::steady_clock;

void say_line(const std::string& s) {
  std::printf("%s\n", s.c_str());
  std::fflush(stdout);
}
void note_line(const std::string& s) {
  std::fprintf(stderr, "k3-cluster: %s\n", s.c_str());
  std::fflush(stderr);
}

namespace {

// SIGINT/SIGTERM are blocked in the launcher and collected here without waiting.
bool stop_requested(const sigset_t& sigs) {
  timespec zero{0, 0};
  return sigtimedwait(&sigs, nullptr, &zero) > 0;
}

}  // namespace

ChildEnvironment Launcher::child_env(const std::string& name) const {
  ChildEnvironment env{.unset = {"K3_API_KEY"}, .set = {}};
  if (name == "router" && !api_key_.empty()) env.set.emplace_back("K3_API_KEY", api_key_);
  return env;
}

Result<ChildProcess*> Launcher::spawn(const std::string& name, const std::string& exe, const std::vector<std::string>& args,
                                      const std::string& stops_after) {
  std::vector<std::string> all = args;
  if (keys_) {
    const auto key_flags = keys_->flags(name);
    all.insert(all.end(), key_flags.begin(), key_flags.end());
  }
  return supervisor_.start({.name = name, .exe = bin_ + "/" + exe, .args = all, .env = child_env(name),
                            .log_path = log_dir_.empty() ? "" : node_log_path(log_dir_, name), .stops_after = stops_after});
}

// The ports of the endpoints the launcher pins across restarts (a node comes back in the same place, so
// its peers reconnect) lie below the kernel's ephemeral range (free_port.h); the nodes do not bind port 0.
// A node restarted on a pinned port inside that range could find it taken, and for good: its peers'
// ZeroMQ sockets retry their connects to it every 100 ms from ephemeral local ports, and a retry to a
// local port nobody listens on can connect to itself (source port = destination port) and hold it. Seen
// as "Address already in use" on restart, the group given up after five tries. The ports come as one
// block that this process holds (PortBlock) and releases one by one as it starts the nodes: a node binds
// its port seconds after the pick (it loads the model first), and launchers starting at the same time
// picked the same ports (once in 18 runs with three rank-group clusters starting together).
std::string Launcher::pinned_port() {
  if (const int port = ports_.take(); port > 0) return std::to_string(port);
  return std::to_string(free_tcp_port());
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
    if (verbose_) note_line(c.name() + ": " + *line);
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
      if (verbose_) note_line(name + ": " + line);
      if (logs_) logs_->append(name, line);
      // The nodes' memory state lines (prefill "HELD <sources> <computing>", decode "IDLE <pool free>
      // <pool capacity>") are relayed so that memory release is observable from outside the cluster.
      // A decode rank group that failed says so and what its caches hold after closing every request.
      if (line.rfind("HELD ", 0) == 0 || line.rfind("IDLE ", 0) == 0 || line.rfind("GROUP_FAILED ", 0) == 0 ||
          line.rfind("FREE ", 0) == 0)
        say_line("NODE " + name + " " + line);
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
  // pinned_port()'s block: the router's two endpoints, a decode rank's control endpoint and metrics, a
  // group leader's communicator, a member's metrics, a prefill stage's metrics and activation endpoint.
  int pinned = 2;
  for (const auto& d : decodes) pinned += 2 + d.group_size();
  for (const auto& p : spec_.prefill) pinned += 2 * p.stages;
  ports_ = PortBlock::reserve(pinned);

  // Router first: the nodes connect to its control endpoint (ZeroMQ retries until it is there).
  std::vector<std::string> rargs = {"--model", spec_.model, "--host", spec_.host, "--port",
                                    spec_.port > 0 ? std::to_string(spec_.port) : pinned_port(), "--cluster-endpoint",
                                    "tcp://" + spec_.bind_host + ":" + pinned_port(), "--placement", spec_.placement,
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
  say_line("CONTROL " + control);
  K3_ASSIGN_OR_RETURN(std::string listening, wait_line(*router, "listening on http://", deadline));
  port_ = std::atoi(listening.substr(listening.rfind(':') + 1).c_str());
  if (port_ <= 0) return internal_error("router printed no port: '" + listening + "'");
  // A restarted router comes back on the same HTTP port and control endpoint (the nodes reconnect).
  set_option(supervisor_.recipe("router").args, "--port", std::to_string(port_));
  set_option(supervisor_.recipe("router").args, "--cluster-endpoint", rebind(control));

  // Decode ranks next: the prefill stages need their endpoints. A rank group's leader binds the group's
  // communicator (GROUP line) and waits for its members before it connects anywhere (READY line).
  const std::vector<std::string> kernels = kernels_flags(spec_);
  std::vector<std::string> decode_eps;
  uint32_t global_ranks = 0;
  for (const auto& d : decodes) global_ranks += static_cast<uint32_t>(d.group_size());
  for (const auto& d : decodes) {
    std::vector<std::string> args = {"--model", spec_.model, "--router-endpoint", control, "--instance", d.instance, "--rank",
                                     std::to_string(d.rank), "--dp-size", std::to_string(global_ranks), "--max-requests",
                                     std::to_string(d.max_requests), "--threads", threads, "--backend", spec_.backend,
                                     "--heartbeat-ms", hb, "--heartbeat-misses", misses, "--log-level", log_level_,
                                     "--bind", "tcp://" + spec_.bind_host + ":" + pinned_port(), "--interface",
                                     spec_.reachable_host(), "--metrics-listen", spec_.bind_host + ":" + pinned_port()};
    if (spec_.backend == "cuda") args.insert(args.end(), {"--device", std::to_string(d.device_of(0))});
    args.insert(args.end(), kernels.begin(), kernels.end());
    args.insert(args.end(), advertise.begin(), advertise.end());
    const std::vector<std::string> group = group_args(d);
    args.insert(args.end(), group.begin(), group.end());
    if (d.group_size() > 1)  // the leader binds the group's communicator there (members connect to it)
      args.insert(args.end(), {"--group-endpoint", "tcp://" + spec_.reachable_host() + ":" + pinned_port()});
    K3_ASSIGN_OR_RETURN(ChildProcess * c, spawn("decode/" + d.instance, "k3-decode", args));
    std::vector<ChildProcess*> members;
    if (d.group_size() > 1) {
      K3_ASSIGN_OR_RETURN(std::string group_ep, wait_line(*c, "GROUP ", deadline));
      // A restarted leader binds the same endpoint, so restarted members find it.
      set_option(supervisor_.recipe(c->name()).args, "--group-endpoint", group_ep);
      for (int i = 1; i < d.group_size(); ++i) {
        std::vector<std::string> margs = {"--model", spec_.model, "--instance", d.instance, "--threads", threads,
                                          "--backend", spec_.backend, "--max-requests", std::to_string(d.max_requests),
                                          "--log-level", log_level_, "--group-rank", std::to_string(i),
                                          "--group-endpoint", group_ep, "--interface", spec_.reachable_host(),
                                          "--metrics-listen", spec_.bind_host + ":" + pinned_port()};
        if (spec_.backend == "cuda") margs.insert(margs.end(), {"--device", std::to_string(d.device_of(i))});
        margs.insert(margs.end(), kernels.begin(), kernels.end());
        margs.insert(margs.end(), group.begin(), group.end());
        K3_ASSIGN_OR_RETURN(ChildProcess * m, spawn("decode/" + d.instance + "/" + std::to_string(i), "k3-decode", margs,
                                                    "decode/" + d.instance));
        members.push_back(m);
      }
    }
    K3_TRY(keep_metrics_port(*c, deadline));
    K3_ASSIGN_OR_RETURN(std::string ep, wait_line(*c, "READY ", deadline));
    decode_eps.push_back(ep);
    // The leader is ready once every member joined, and a member serves its /metrics before it joins.
    for (ChildProcess* m : members) K3_TRY(keep_metrics_port(*m, deadline));
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
      args.insert(args.end(), kernels.begin(), kernels.end());
      const std::vector<std::string> prefix = prefix_cache_args(p);
      const std::vector<std::string> stream = stream_args(p);
      const std::vector<std::string> region = prefill_memory_args(p);
      args.insert(args.end(), prefix.begin(), prefix.end());
      args.insert(args.end(), stream.begin(), stream.end());
      args.insert(args.end(), region.begin(), region.end());
      args.insert(args.end(),
                  {"--interface", spec_.reachable_host(), "--metrics-listen", spec_.bind_host + ":" + pinned_port()});
      args.insert(args.end(), advertise.begin(), advertise.end());
      if (st > 0) args.insert(args.end(), {"--listen", "tcp://" + spec_.bind_host + ":" + pinned_port()});
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
      note_line("signal received, shutting down");
      shutdown();
      return supervisor_.any_crashed() ? 1 : 0;
    }
    pump_outputs();  // before poll: a dead child's last lines are relayed before it is replaced
    for (const SupervisorEvent& e : supervisor_.poll(Clock::now())) {
      // Without the router nothing serves: a router given up (or any death with --exit-on-crash) stops all.
      const bool fatal = (e.kind == SupervisorEvent::Kind::Exited && exit_on_crash_) ||
                         (e.kind == SupervisorEvent::Kind::Failed && e.name == "router");
      if (fatal) {
        note_line(e.name + (exit_on_crash_ ? " died (--exit-on-crash)" : " is given up") + "; shutting the cluster down");
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
  say_line("STOPPED");
}

}  // namespace k3::deploy
