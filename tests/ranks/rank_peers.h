// Starts the rank processes of one group (k3-test-rank-peer): rank 0 binds the communicator and prints
// BOUND, the others join it; returns what each rank printed up to DONE, and checks every rank exits 0.
#pragma once
#include <catch2/catch.hpp>

#include <chrono>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "tests/transfer/process_guard.h"

namespace k3::test::ranks {

// args(rank, endpoint): the peer's command line.
inline std::vector<std::vector<std::string>> run_rank_peers(
    int size, const std::function<std::vector<std::string>(int, const std::string&)>& args,
    std::chrono::seconds line_timeout) {
  using namespace std::chrono_literals;
  const auto exe = k3::test::helper_path("k3-test-rank-peer");
  std::vector<std::unique_ptr<ProcessGuard>> ranks;
  ranks.push_back(std::make_unique<ProcessGuard>(exe, args(0, "tcp://127.0.0.1:*")));
  auto ep = ranks[0]->wait_for("BOUND ", line_timeout);
  REQUIRE(ep);
  for (int r = 1; r < size; ++r) ranks.push_back(std::make_unique<ProcessGuard>(exe, args(r, *ep)));
  std::vector<std::vector<std::string>> lines(size);
  for (int r = 0; r < size; ++r) {
    for (;;) {
      auto line = ranks[r]->read_line(line_timeout);
      INFO("rank " << r << " of " << size << " printed nothing more");
      REQUIRE(line);
      if (*line == "DONE") break;
      lines[r].push_back(*line);
    }
  }
  for (int r = 0; r < size; ++r) CHECK(ranks[r]->wait_exit(60s) == 0);
  return lines;
}

}  // namespace k3::test::ranks
