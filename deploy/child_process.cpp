#include "deploy/child_process.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <thread>

namespace k3::deploy {

namespace {

// The child's environment as "K=V" strings: ours minus env.unset and the names env.set replaces.
// Built before fork: after it only async-signal-safe calls are allowed (the launcher has threads).
std::vector<std::string> child_environment(const ChildEnvironment& env) {
  std::vector<std::string> dropped = env.unset;
  for (const auto& [k, v] : env.set) dropped.push_back(k);
  std::vector<std::string> out;
  for (char** e = ::environ; e && *e; ++e) {
    const std::string entry = *e;
    const std::string key = entry.substr(0, entry.find('='));
    if (std::find(dropped.begin(), dropped.end(), key) == dropped.end()) out.push_back(entry);
  }
  for (const auto& [k, v] : env.set) out.push_back(k + "=" + v);
  return out;
}

}  // namespace

Result<std::unique_ptr<ChildProcess>> ChildProcess::start(std::string name, const std::string& exe,
                                                          const std::vector<std::string>& args,
                                                          const ChildEnvironment& env,
                                                          const std::string& stderr_path) {
  // Opened here, so a bad path is an error of the launcher's, not a silent child exit.
  struct Fd {
    int fd = -1;
    ~Fd() {
      if (fd >= 0) ::close(fd);
    }
  } log;
  if (!stderr_path.empty()) {
    log.fd = ::open(stderr_path.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0600);
    if (log.fd < 0) return internal_error(name + ": cannot open its log file " + stderr_path + ": " + std::strerror(errno));
  }
  int fds[2];
  if (::pipe2(fds, O_CLOEXEC) != 0) return internal_error(name + ": pipe failed: " + std::strerror(errno));
  std::vector<char*> argv;
  argv.push_back(const_cast<char*>(exe.c_str()));
  for (const auto& a : args) argv.push_back(const_cast<char*>(a.c_str()));
  argv.push_back(nullptr);
  const std::vector<std::string> env_strings = child_environment(env);
  std::vector<char*> envp;
  for (const auto& e : env_strings) envp.push_back(const_cast<char*>(e.c_str()));
  envp.push_back(nullptr);
  const pid_t parent = ::getpid();
  const pid_t pid = ::fork();
  if (pid < 0) {
    ::close(fds[0]);
    ::close(fds[1]);
    return internal_error(name + ": fork failed: " + std::strerror(errno));
  }
  if (pid == 0) {
    // The launcher blocks SIGINT/SIGTERM for sigwait; the child must get them normally.
    sigset_t none;
    sigemptyset(&none);
    ::sigprocmask(SIG_SETMASK, &none, nullptr);
    ::prctl(PR_SET_PDEATHSIG, SIGTERM);
    if (::getppid() != parent) ::_exit(127);  // the launcher died before prctl
    ::dup2(fds[1], STDOUT_FILENO);
    if (log.fd >= 0) ::dup2(log.fd, STDERR_FILENO);
    ::execve(exe.c_str(), argv.data(), envp.data());
    ::_exit(127);
  }
  ::close(fds[1]);
  ::fcntl(fds[0], F_SETFL, ::fcntl(fds[0], F_GETFL) | O_NONBLOCK);
  std::unique_ptr<ChildProcess> c(new ChildProcess());
  c->name_ = std::move(name);
  c->pid_ = pid;
  c->out_fd_ = fds[0];
  return c;
}

ChildProcess::~ChildProcess() {
  kill_and_reap();
  if (out_fd_ >= 0) ::close(out_fd_);
}

bool ChildProcess::fill(int timeout_ms) {
  pollfd p{.fd = out_fd_, .events = POLLIN, .revents = 0};
  if (::poll(&p, 1, timeout_ms) <= 0) return false;
  char tmp[4096];
  const ssize_t n = ::read(out_fd_, tmp, sizeof tmp);
  if (n <= 0) return false;
  buf_.append(tmp, static_cast<size_t>(n));
  return true;
}

std::optional<std::string> ChildProcess::read_line(std::chrono::milliseconds timeout) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  for (;;) {
    const auto nl = buf_.find('\n');
    if (nl != std::string::npos) {
      std::string line = buf_.substr(0, nl);
      buf_.erase(0, nl + 1);
      return line;
    }
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
    if (left.count() <= 0) return std::nullopt;
    if (!fill(static_cast<int>(left.count()))) {
      if (std::chrono::steady_clock::now() >= deadline) return std::nullopt;
      // EOF (child gone) or a spurious wakeup: do not spin on a closed pipe.
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
  }
}

std::vector<std::string> ChildProcess::drain() {
  while (fill(0)) {
  }
  std::vector<std::string> lines;
  for (auto nl = buf_.find('\n'); nl != std::string::npos; nl = buf_.find('\n')) {
    lines.push_back(buf_.substr(0, nl));
    buf_.erase(0, nl + 1);
  }
  if (buf_.size() > (1u << 20)) buf_.clear();  // a child writing without newlines must not grow us forever
  return lines;
}

bool ChildProcess::exited() {
  if (reaped_) return true;
  if (::waitpid(pid_, &status_, WNOHANG) == pid_) reaped_ = true;
  return reaped_;
}

std::string ChildProcess::exit_description() const {
  if (!reaped_) return "running";
  if (WIFEXITED(status_)) return "exited with status " + std::to_string(WEXITSTATUS(status_));
  if (WIFSIGNALED(status_)) return std::string("killed by signal ") + std::to_string(WTERMSIG(status_)) + " (" +
                                   ::strsignal(WTERMSIG(status_)) + ")";
  return "ended";
}

void ChildProcess::terminate() {
  if (!exited()) ::kill(pid_, SIGTERM);
}

void ChildProcess::kill_and_reap() {
  if (reaped_ || pid_ <= 0) return;
  ::kill(pid_, SIGKILL);
  if (::waitpid(pid_, &status_, 0) == pid_) reaped_ = true;
}

bool ChildProcess::wait_exit(std::chrono::milliseconds timeout) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  while (!exited()) {
    if (std::chrono::steady_clock::now() >= deadline) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return true;
}

}  // namespace k3::deploy
