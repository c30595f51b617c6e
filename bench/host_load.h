// The CPU seconds a process tree has used: the share of the cores a cluster's processes got while
// measured (deploy/ratio_plan.h SharedCompute), on a host other work may share.
#pragma once
#include <sys/types.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include "bench/process_cpu.h"

namespace k3::bench {

// CPU seconds used so far by `root` and every process below it (a k3-cluster and its nodes). Processes
// that exited before the call are not counted, so take both readings while the tree runs.
inline double process_tree_cpu_seconds(pid_t root) {
  std::map<pid_t, std::vector<pid_t>> children;
  for (const auto& e : std::filesystem::directory_iterator("/proc")) {
    const std::string name = e.path().filename().string();
    if (name.empty() || name.find_first_not_of("0123456789") != std::string::npos) continue;
    std::ifstream in(e.path() / "stat");
    std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    const auto close = text.rfind(')');  // the command name may hold spaces; state and ppid follow it
    if (close == std::string::npos) continue;
    std::istringstream fields(text.substr(close + 2));
    std::string state;
    pid_t ppid = 0;
    if (fields >> state >> ppid) children[ppid].push_back(static_cast<pid_t>(std::atoi(name.c_str())));
  }
  double total = 0;
  std::vector<pid_t> todo{root};
  while (!todo.empty()) {
    const pid_t p = todo.back();
    todo.pop_back();
    total += cpu_seconds(p).value_or(0);
    for (pid_t c : children[p]) todo.push_back(c);
  }
  return total;
}

}  // namespace k3::bench
