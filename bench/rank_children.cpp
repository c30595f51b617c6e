#include "bench/rank_children.h"

#include <unistd.h>

#include <chrono>
#include <optional>

namespace k3::bench {

Result<std::vector<std::unique_ptr<deploy::ChildProcess>>> start_rank_children(int size, const RankArgs& args) {
  char self[4096];
  const ssize_t len = ::readlink("/proc/self/exe", self, sizeof self - 1);
  if (len <= 0) return internal_error("cannot find this executable (/proc/self/exe)");
  self[len] = 0;
  std::vector<std::unique_ptr<deploy::ChildProcess>> ranks;
  K3_ASSIGN_OR_RETURN(auto first, deploy::ChildProcess::start("rank/0", self, args(0, "tcp://127.0.0.1:*")));
  ranks.push_back(std::move(first));
  std::optional<std::string> bound;
  while (!bound) {
    auto line = ranks[0]->read_line(std::chrono::seconds(60));
    if (!line) return Status(Code::DeadlineExceeded, "rank 0 did not bind its communicator within 60 s");
    if (line->rfind("BOUND ", 0) == 0) bound = line->substr(6);
  }
  for (int r = 1; r < size; ++r) {
    K3_ASSIGN_OR_RETURN(auto c, deploy::ChildProcess::start("rank/" + std::to_string(r), self, args(r, *bound)));
    ranks.push_back(std::move(c));
  }
  return ranks;
}

}  // namespace k3::bench
