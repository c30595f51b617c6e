// Starts build/bin/k3-router as a real process on a free port (--port 0; the port is read from its
// "listening on" line), notices an early exit, and always stops it: SIGTERM, then SIGKILL.
#pragma once
#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <fstream>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

namespace k3::test {

class RouterProcess {
 public:
  explicit RouterProcess(std::vector<std::string> args) {
    int out[2];
    if (::pipe(out) != 0) throw std::runtime_error("pipe");
    const std::string bin = std::string(K3_BIN_DIR) + "/k3-router";
    pid_ = ::fork();
    if (pid_ == 0) {
      ::dup2(out[1], 1);
      ::close(out[0]);
      ::close(out[1]);
      std::vector<char*> argv{const_cast<char*>(bin.c_str())};
      for (auto& a : args) argv.push_back(a.data());
      argv.push_back(nullptr);
      ::execv(bin.c_str(), argv.data());
      ::_exit(127);
    }
    ::close(out[1]);
    out_ = out[0];
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(120);
    std::string seen;
    const std::string marker = "listening on http://127.0.0.1:";
    while (seen.find(marker) == std::string::npos || seen.find('\n', seen.find(marker)) == std::string::npos) {
      if (std::chrono::steady_clock::now() > deadline) throw std::runtime_error("k3-router did not start: " + seen);
      int status;
      if (::waitpid(pid_, &status, WNOHANG) == pid_) {
        pid_ = -1;
        throw std::runtime_error("k3-router exited early: " + seen);
      }
      pollfd p{out_, POLLIN, 0};
      if (::poll(&p, 1, 100) > 0) {
        char buf[256];
        const ssize_t n = ::read(out_, buf, sizeof buf);
        if (n > 0) seen.append(buf, static_cast<size_t>(n));
      }
    }
    port_ = std::stoi(seen.substr(seen.find(marker) + marker.size()));
  }
  ~RouterProcess() {
    stop();
    if (out_ >= 0) ::close(out_);
  }
  RouterProcess(const RouterProcess&) = delete;
  RouterProcess& operator=(const RouterProcess&) = delete;

  int port() const { return port_; }
  pid_t pid() const { return pid_; }
  bool alive() {
    if (pid_ < 0) return false;
    int status;
    if (::waitpid(pid_, &status, WNOHANG) == pid_) {
      exit_status_ = status;
      pid_ = -1;
      return false;
    }
    return true;
  }
  long rss_kb() const { return proc_status("VmRSS:"); }
  long threads() const { return proc_status("Threads:"); }
  // A number from /proc/<pid>/status ("VmRSS:", "Threads:"); -1 when absent.
  long proc_status(const std::string& key) const {
    std::ifstream f("/proc/" + std::to_string(pid_) + "/status");
    std::string line;
    while (std::getline(f, line))
      if (line.rfind(key, 0) == 0) return std::stol(line.substr(key.size()));
    return -1;
  }
  // SIGTERM, wait up to `grace`, then SIGKILL. Returns the wait status (-1 if already reaped).
  int stop(std::chrono::seconds grace = std::chrono::seconds(10)) {
    if (pid_ < 0) return exit_status_;
    ::kill(pid_, SIGTERM);
    const auto deadline = std::chrono::steady_clock::now() + grace;
    int status = -1;
    while (std::chrono::steady_clock::now() < deadline) {
      if (::waitpid(pid_, &status, WNOHANG) == pid_) {
        pid_ = -1;
        exit_status_ = status;
        return status;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    ::kill(pid_, SIGKILL);
    ::waitpid(pid_, &status, 0);
    pid_ = -1;
    exit_status_ = -1;  // did not stop in time
    return -1;
  }

 private:
  pid_t pid_ = -1;
  int out_ = -1;
  int port_ = 0;
  int exit_status_ = -1;
};

}  // namespace k3::test
