// Resident memory of a process as the kernel reports it (VmRSS in /proc/<pid>/status).
#pragma once
#include <sys/types.h>

#include <fstream>
#include <optional>
#include <string>

namespace k3::bench {

// KiB; nullopt when the process is gone or the field is missing.
inline std::optional<long> rss_kib(pid_t pid) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/status");
  for (std::string line; std::getline(in, line);)
    if (line.rfind("VmRSS:", 0) == 0) return std::atol(line.c_str() + 6);
  return std::nullopt;
}

}  // namespace k3::bench
