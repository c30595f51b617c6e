#include "common/core/node_process.h"

#include <csignal>
#include <cstdio>

namespace k3 {
namespace {
// Process-wide by nature: a signal handler can reach nothing else.
std::atomic<bool> stop_flag{false};
void on_stop_signal(int) { stop_flag = true; }
}  // namespace

const std::atomic<bool>& install_stop_signals() {
  struct sigaction sa {};
  sa.sa_handler = on_stop_signal;
  sigaction(SIGTERM, &sa, nullptr);
  sigaction(SIGINT, &sa, nullptr);
  return stop_flag;
}

void say_line(const std::string& line) {
  std::printf("%s\n", line.c_str());
  std::fflush(stdout);
}

int fail_status(const char* program, const Status& s) {
  std::fprintf(stderr, "%s: %s\n", program, s.to_string().c_str());
  return 1;
}

}  // namespace k3
