// k3-router in local-engine mode for the duration of a bench run (`k3-bench serve --spawn-router`):
// started on a free port with the given extra flags, waited for until it prints its address, stopped
// (SIGTERM, then SIGKILL) when this goes away.
#pragma once
#include <memory>
#include <string>
#include <vector>

#include "deploy/child_process.h"

namespace k3::bench {

class SpawnedRouter {
 public:
  // Throws std::runtime_error when k3-router exits or prints no address within startup_s.
  static std::unique_ptr<SpawnedRouter> start(const std::string& exe, const std::string& model_dir,
                                              const std::vector<std::string>& extra_args, int startup_s);
  ~SpawnedRouter();
  const std::string& url() const { return url_; }
  pid_t pid() const { return child_->pid(); }

 private:
  explicit SpawnedRouter(std::unique_ptr<deploy::ChildProcess> c) : child_(std::move(c)) {}
  std::unique_ptr<deploy::ChildProcess> child_;
  std::string url_;
};

// k3-router next to this executable (or on PATH).
std::string default_router_exe();

}  // namespace k3::bench
