// One supervised child process of the launcher: started with its stdout on a pipe (read line by
// line, so the child never blocks on a full pipe), its stderr shared with the launcher or appended to
// a log file of its own (the nodes' log lines: `k3-cluster logs` reads them back), and
// PR_SET_PDEATHSIG so it dies with the launcher even if the launcher is killed (no orphans).
// The destructor kills and reaps a child still running. The child inherits the launcher's environment
// with ChildEnvironment's changes (a secret such as the router's API key travels there, never in argv,
// which every user can read in /proc/<pid>/cmdline).
#pragma once
#include <sys/types.h>

#include <chrono>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "common/core/status.h"

namespace k3::deploy {

// Changes to the inherited environment: `unset` names are dropped, then `set` entries are added.
struct ChildEnvironment {
  std::vector<std::string> unset;
  std::vector<std::pair<std::string, std::string>> set;
};

class ChildProcess {
 public:
  // name: how reports call it, e.g. "decode/d"; exe: absolute path.
  // stderr_path: where its stderr goes (appended; created 0600); empty: the launcher's stderr.
  static Result<std::unique_ptr<ChildProcess>> start(std::string name, const std::string& exe,
                                                     const std::vector<std::string>& args,
                                                     const ChildEnvironment& env = {},
                                                     const std::string& stderr_path = "");
  ~ChildProcess();
  ChildProcess(const ChildProcess&) = delete;
  ChildProcess& operator=(const ChildProcess&) = delete;

  const std::string& name() const { return name_; }
  pid_t pid() const { return pid_; }
  int stdout_fd() const { return out_fd_; }

  // The next complete stdout line, waiting up to `timeout`; nullopt on timeout or end of output.
  std::optional<std::string> read_line(std::chrono::milliseconds timeout);
  // Reads whatever is buffered without waiting; returns the complete lines.
  std::vector<std::string> drain();
  // Non-blocking: true once the child exited (its status is then in exit_description()).
  bool exited();
  std::string exit_description() const;
  // The raw wait status once exited() (WIFEXITED / WIFSIGNALED decode it).
  int wait_status() const { return status_; }
  // SIGTERM now (no wait).
  void terminate();
  // SIGKILL and reap (idempotent).
  void kill_and_reap();
  // Reaps within `timeout`; false if still running.
  bool wait_exit(std::chrono::milliseconds timeout);

 private:
  ChildProcess() = default;
  bool fill(int timeout_ms);  // one read into buf_; false on EOF/timeout

  std::string name_;
  pid_t pid_ = -1;
  int out_fd_ = -1;
  std::string buf_;
  bool reaped_ = false;
  int status_ = 0;
};

}  // namespace k3::deploy
