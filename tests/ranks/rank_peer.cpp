// One rank process of the rank-group tests: joins the group's UCX communicator, runs the rank_scenario.h
// workload on its slice and prints one line per (step, request) it serves: "L <step> <request> <digest>",
// then "DONE". Rank 0 prints "BOUND <endpoint>" first.
//   k3-test-rank-peer <rank> <size> <endpoint> <heads> <seed> <dcp> <ep> <kv_partitions>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "tests/ranks/rank_scenario.h"
#include "transfer/comm_ucx.h"

using namespace k3;
using namespace k3::test::ranks;

int main(int argc, char** argv) {
  if (argc != 9) {
    std::fprintf(stderr, "usage: %s rank size endpoint heads seed dcp ep kv_partitions\n", argv[0]);
    return 2;
  }
  const int rank = std::atoi(argv[1]), size = std::atoi(argv[2]);
  const RankLayout g{.dcp = std::atoi(argv[6]), .ep = std::atoi(argv[7]), .kv_partitions = std::atoi(argv[8]), .rank = rank};
  auto comm = transfer::UcxComm::create(rank, size, argv[3], {}, [](const std::string& ep) {
    std::printf("BOUND %s\n", ep.c_str());
    std::fflush(stdout);
  });
  if (!comm.is_ok()) {
    std::fprintf(stderr, "comm: %s\n", comm.status().to_string().c_str());
    return 1;
  }
  const Scenario sc = make_scenario(std::atoi(argv[4]), std::strtoull(argv[5], nullptr, 10));
  auto out = run_group(sc, g, **comm);
  if (!out.is_ok()) {
    std::fprintf(stderr, "rank %d: %s\n", rank, out.status().to_string().c_str());
    return 1;
  }
  for (size_t s = 0; s < out->size(); ++s)
    for (auto& [req, lg] : (*out)[s]) std::printf("L %zu %d %016llx\n", s, req, static_cast<unsigned long long>(fnv(lg.data(), lg.size() * 4)));
  std::printf("DONE\n");
  std::fflush(stdout);
  return 0;
}
