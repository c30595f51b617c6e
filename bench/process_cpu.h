// CPU time a process has used (utime + stime in /proc/<pid>/stat), for figures that must hold on a
// shared machine: wall time moves with other people's load, the CPU seconds a request costs much less.
#pragma once
#include <sys/types.h>
#include <unistd.h>

#include <fstream>
#include <optional>
#include <sstream>
#include <string>

namespace k3::bench {

// Seconds; nullopt when the process is gone.
inline std::optional<double> cpu_seconds(pid_t pid) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/stat");
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  const auto close = text.rfind(')');   // the command name may hold spaces; fields follow its ')'
  if (close == std::string::npos) return std::nullopt;
  std::istringstream fields(text.substr(close + 2));
  std::string f;
  unsigned long long utime = 0, stime = 0;
  for (int i = 3; i <= 15 && fields >> f; ++i) {
    if (i == 14) utime = std::stoull(f);
    if (i == 15) stime = std::stoull(f);
  }
  return double(utime + stime) / double(sysconf(_SC_CLK_TCK));
}

}  // namespace k3::bench
