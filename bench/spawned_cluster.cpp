#include "bench/spawned_cluster.h"

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <stdexcept>

namespace k3::bench {

std::unique_ptr<SpawnedCluster> SpawnedCluster::start(const std::string& exe, const std::string& spec, int startup_s,
                                                      const std::string& tag, const std::vector<std::string>& extra_args) {
  std::vector<std::string> args = {"--spec", spec, "--port", "0"};
  args.insert(args.end(), extra_args.begin(), extra_args.end());
  auto child = deploy::ChildProcess::start("k3-cluster", exe, args);
  if (!child.is_ok()) throw std::runtime_error("cannot start " + exe + ": " + child.status().to_string());
  std::unique_ptr<SpawnedCluster> c(new SpawnedCluster(std::move(*child), tag));
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(startup_s);
  while (std::chrono::steady_clock::now() < deadline) {
    if (c->child_->exited()) throw std::runtime_error("k3-cluster exited before serving: " + c->child_->exit_description());
    auto line = c->child_->read_line(std::chrono::milliseconds(200));
    if (line && line->rfind("STATUS http://127.0.0.1:", 0) == 0) c->status_port_ = std::atoi(line->c_str() + 24);
    if (line && line->rfind("ENDPOINT ", 0) == 0) {
      c->url_ = line->substr(9);
      return c;
    }
  }
  throw std::runtime_error("k3-cluster printed no ENDPOINT line within " + std::to_string(startup_s) + " s");
}

SpawnedCluster::~SpawnedCluster() {
  child_->terminate();
  // Reading its stdout while it stops: a full pipe would block its last lines and its exit.
  for (int i = 0; i < 150 && !child_->wait_exit(std::chrono::milliseconds(100)); ++i) child_->drain();
  if (!child_->exited()) child_->kill_and_reap();
  std::fprintf(stderr, "%s: k3-cluster stopped (%s)\n", tag_.c_str(), child_->exit_description().c_str());
}

std::string default_cluster_exe() {
  std::error_code ec;
  const auto self = std::filesystem::read_symlink("/proc/self/exe", ec);
  return ec ? "k3-cluster" : (self.parent_path() / "k3-cluster").string();
}

}  // namespace k3::bench
