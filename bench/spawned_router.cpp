#include "bench/spawned_router.h"

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <stdexcept>

namespace k3::bench {

std::unique_ptr<SpawnedRouter> SpawnedRouter::start(const std::string& exe, const std::string& model_dir,
                                                    const std::vector<std::string>& extra_args, int startup_s) {
  std::vector<std::string> args = {"--model", model_dir, "--port", "0"};
  args.insert(args.end(), extra_args.begin(), extra_args.end());
  auto child = deploy::ChildProcess::start("k3-router", exe, args);
  if (!child.is_ok()) throw std::runtime_error("cannot start " + exe + ": " + child.status().to_string());
  std::unique_ptr<SpawnedRouter> r(new SpawnedRouter(std::move(*child)));
  const std::string mark = "listening on ";
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(startup_s);
  while (std::chrono::steady_clock::now() < deadline) {
    if (r->child_->exited()) throw std::runtime_error("k3-router exited before serving: " + r->child_->exit_description());
    auto line = r->child_->read_line(std::chrono::milliseconds(200));
    if (line && line->rfind(mark, 0) == 0) {
      r->url_ = line->substr(mark.size());
      return r;
    }
  }
  throw std::runtime_error("k3-router printed no address within " + std::to_string(startup_s) + " s");
}

SpawnedRouter::~SpawnedRouter() {
  child_->terminate();
  for (int i = 0; i < 150 && !child_->wait_exit(std::chrono::milliseconds(100)); ++i) child_->drain();
  if (!child_->exited()) child_->kill_and_reap();
}

std::string default_router_exe() {
  std::error_code ec;
  const auto self = std::filesystem::read_symlink("/proc/self/exe", ec);
  return ec ? "k3-router" : (self.parent_path() / "k3-router").string();
}

}  // namespace k3::bench
