// RAII guard of one child process for multi-process tests: starts it with its stdout on a pipe,
// reads its lines under a deadline, and always stops it: the destructor sends SIGKILL and reaps it,
// so a failing test never leaves a process behind. A test can also freeze it for a while (SIGSTOP) to
// hold a node in one state.
#pragma once
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

namespace k3::test {

class ProcessGuard {
 public:
  ProcessGuard(const std::string& exe, const std::vector<std::string>& args) {
    int fds[2];
    if (::pipe2(fds, O_CLOEXEC) != 0) throw std::runtime_error("pipe failed");
    pid_ = ::fork();
    if (pid_ < 0) throw std::runtime_error("fork failed");
    if (pid_ == 0) {
      ::dup2(fds[1], STDOUT_FILENO);
      ::close(fds[0]);
      ::close(fds[1]);
      std::vector<char*> argv;
      argv.push_back(const_cast<char*>(exe.c_str()));
      for (auto& a : args) argv.push_back(const_cast<char*>(a.c_str()));
      argv.push_back(nullptr);
      ::execv(exe.c_str(), argv.data());
      ::_exit(127);
    }
    ::close(fds[1]);
    out_fd_ = fds[0];
  }
  ~ProcessGuard() {
    kill_now();
    if (out_fd_ >= 0) ::close(out_fd_);
  }
  ProcessGuard(const ProcessGuard&) = delete;
  ProcessGuard& operator=(const ProcessGuard&) = delete;

  pid_t pid() const { return pid_; }
  // SIGKILL and reap (idempotent).
  void kill_now() {
    if (reaped_) return;
    ::kill(pid_, SIGKILL);
    reap_blocking();
  }
  // Waits for a clean exit up to `timeout`; kills on timeout. Returns the exit status (-1 on signal
  // or timeout).
  int wait_exit(std::chrono::milliseconds timeout) {
    const auto deadline = std::chrono::steady_clock::now() + timeout;
    while (!reaped_ && std::chrono::steady_clock::now() < deadline) {
      if (try_reap()) break;
      ::usleep(5000);
    }
    if (!reaped_) kill_now();
    return exit_code_;
  }
  bool running() { return !reaped_ && !try_reap(); }
  // Stops the child (SIGSTOP) and returns once it is stopped (waitpid reports it, no polling); false
  // when it had exited instead. A frozen node keeps what it holds and sends nothing, heartbeats
  // included, until thaw(). FrozenProcess below does both for a scope.
  bool freeze() {
    if (reaped_ || ::kill(pid_, SIGSTOP) != 0) return false;
    int st = 0;
    pid_t got;
    while ((got = ::waitpid(pid_, &st, WUNTRACED)) < 0 && errno == EINTR) {
    }
    if (got == pid_ && WIFSTOPPED(st)) return true;
    reaped_ = true;  // it exited (or was killed) before it could stop
    exit_code_ = got == pid_ && WIFEXITED(st) ? WEXITSTATUS(st) : -1;
    return false;
  }
  // Lets a frozen child go on (SIGCONT).
  void thaw() {
    if (!reaped_) ::kill(pid_, SIGCONT);
  }

  // Next line of the child's stdout (without '\n'), or nullopt on timeout / EOF.
  std::optional<std::string> read_line(std::chrono::milliseconds timeout) {
    const auto deadline = std::chrono::steady_clock::now() + timeout;
    for (;;) {
      auto nl = buf_.find('\n');
      if (nl != std::string::npos) {
        std::string line = buf_.substr(0, nl);
        buf_.erase(0, nl + 1);
        return line;
      }
      auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
      if (left.count() <= 0) return std::nullopt;
      pollfd p{out_fd_, POLLIN, 0};
      if (::poll(&p, 1, static_cast<int>(left.count())) <= 0) continue;
      char tmp[4096];
      ssize_t n = ::read(out_fd_, tmp, sizeof tmp);
      if (n <= 0) return std::nullopt;
      buf_.append(tmp, static_cast<size_t>(n));
    }
  }
  // Reads lines until one starts with `prefix`; returns the rest of that line.
  std::optional<std::string> wait_for(const std::string& prefix, std::chrono::milliseconds timeout) {
    const auto deadline = std::chrono::steady_clock::now() + timeout;
    for (;;) {
      auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
      if (left.count() <= 0) return std::nullopt;
      auto line = read_line(left);
      if (!line) return std::nullopt;
      if (line->rfind(prefix, 0) == 0) return line->substr(prefix.size());
    }
  }

 private:
  bool try_reap() {
    int st = 0;
    if (::waitpid(pid_, &st, WNOHANG) == pid_) {
      reaped_ = true;
      exit_code_ = WIFEXITED(st) ? WEXITSTATUS(st) : -1;
      return true;
    }
    return false;
  }
  void reap_blocking() {
    int st = 0;
    while (::waitpid(pid_, &st, 0) < 0 && errno == EINTR) {
    }
    reaped_ = true;
    exit_code_ = WIFEXITED(st) ? WEXITSTATUS(st) : -1;
  }
  pid_t pid_ = -1;
  int out_fd_ = -1;
  bool reaped_ = false;
  int exit_code_ = -1;
  std::string buf_;
};

// Freezes a child for a scope and thaws it when the scope ends, also when an assertion throws inside.
class FrozenProcess {
 public:
  explicit FrozenProcess(ProcessGuard& p) : p_(p), frozen_(p.freeze()) {}
  ~FrozenProcess() { p_.thaw(); }
  FrozenProcess(const FrozenProcess&) = delete;
  FrozenProcess& operator=(const FrozenProcess&) = delete;
  bool frozen() const { return frozen_; }  // false: the child had exited

 private:
  ProcessGuard& p_;
  bool frozen_;
};

inline std::string helper_path(const std::string& name) { return std::string(K3_BIN_DIR) + "/" + name; }

}  // namespace k3::test
