// k3-cluster for the duration of a bench run (`k3-bench serve --spawn-cluster`, `k3-bench soak`):
// started on a free port, waited for until it prints ENDPOINT, stopped (SIGTERM, then SIGKILL) when
// this goes away. Its stdout must keep being read (drain()) on long runs, or a full pipe stalls it.
#pragma once
#include <memory>
#include <string>
#include <vector>

#include "deploy/child_process.h"

namespace k3::bench {

class SpawnedCluster {
 public:
  // Throws std::runtime_error when k3-cluster exits or prints no ENDPOINT within startup_s.
  static std::unique_ptr<SpawnedCluster> start(const std::string& exe, const std::string& spec, int startup_s,
                                               const std::string& tag = "k3-bench",
                                               const std::vector<std::string>& extra_args = {});
  ~SpawnedCluster();
  const std::string& url() const { return url_; }
  int status_port() const { return status_port_; }  // k3-cluster's own status endpoint (0: none printed)
  pid_t pid() const { return child_->pid(); }
  // k3-cluster's stdout lines that arrived since the last call (never waits).
  std::vector<std::string> drain() { return child_->drain(); }

 private:
  explicit SpawnedCluster(std::unique_ptr<deploy::ChildProcess> c, std::string tag)
      : child_(std::move(c)), tag_(std::move(tag)) {}
  std::unique_ptr<deploy::ChildProcess> child_;
  std::string tag_, url_;
  int status_port_ = 0;
};

// k3-cluster next to this executable (or on PATH).
std::string default_cluster_exe();

}  // namespace k3::bench
