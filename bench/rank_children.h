// The rank processes of a bench's group: copies of this executable, rank 0 first; its "BOUND <endpoint>"
// line (the group communicator's bootstrap) is what the others are started with.
#pragma once
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "common/core/status.h"
#include "deploy/child_process.h"

namespace k3::bench {

using RankArgs = std::function<std::vector<std::string>(int rank, const std::string& endpoint)>;

Result<std::vector<std::unique_ptr<deploy::ChildProcess>>> start_rank_children(int size, const RankArgs& args);

}  // namespace k3::bench
