#include "router/open_file_limit.h"

#include <sys/resource.h>

#include <cerrno>
#include <cstring>

namespace k3::router {

OpenFileLimit raise_open_file_limit(uint64_t wanted) {
  OpenFileLimit out;
  rlimit rl{};
  if (::getrlimit(RLIMIT_NOFILE, &rl) != 0) {
    out.error = std::string("getrlimit(RLIMIT_NOFILE): ") + std::strerror(errno);
    return out;
  }
  out.before = out.soft = rl.rlim_cur;
  out.hard = rl.rlim_max;
  if (rl.rlim_cur >= wanted || rl.rlim_cur == rl.rlim_max) return out;
  rl.rlim_cur = rl.rlim_max;
  if (::setrlimit(RLIMIT_NOFILE, &rl) != 0) {
    out.error = std::string("setrlimit(RLIMIT_NOFILE): ") + std::strerror(errno);
    return out;
  }
  out.soft = rl.rlim_cur;
  return out;
}

std::string describe_open_file_limit(const OpenFileLimit& l, uint64_t wanted) {
  std::string s;
  if (!l.error.empty()) s = "cannot raise the open-file limit (" + l.error + "); ";
  else if (l.soft != l.before)
    s = "raised the open-file limit (RLIMIT_NOFILE) from " + std::to_string(l.before) + " to " + std::to_string(l.soft) + "; ";
  if (l.soft < wanted)
    s += "the open-file limit " + std::to_string(l.soft) + " (hard " + std::to_string(l.hard) + ") is below the " +
         std::to_string(wanted) + " descriptors that --max-connections needs: at that limit the oldest idle connections " +
         "are closed to admit new ones (raise it with ulimit -n)";
  else if (!s.empty())
    s.resize(s.size() - 2);
  return s;
}

}  // namespace k3::router
