// One rank process of the rank-group tests: joins the group's UCX communicator, runs the rank_scenario.h
// workload on its slice and prints one line per (step, request) it serves: "L <step> <request> <digest>",
// then "DONE". Rank 0 prints "BOUND <endpoint>" first.
//   k3-test-rank-peer <rank> <size> <endpoint> <heads> <seed> <dcp> <ep> <kv_partitions> [<step_deadline_ms>]
//                     [--backend cuda [--gpus N] [--collectives nccl]]
// With a step deadline the rank runs a long scenario for the rank-death tests (on its backend, over its
// collectives): after start-up it shortens the communicators' deadline, prints "STEP <n>" after each step and, when a step fails (a peer
// died), closes every request and prints "FAILED <steady clock µs> <status>" and "FREE <free pages> <pages> <free slots>
// <slots>" (what the pools hold once everything is released).
// --backend cuda runs the rank on GPU <rank> modulo N (--gpus, default 1: every rank on GPU 0), on the
// scenario with K3's head shapes (rank_scenario.h), and also prints each logits row as hex floats, "V <step> <request> <v0> <v1> ...", for
// comparisons within a tolerance; --collectives nccl runs the forward's collectives over NCCL (bootstrapped
// over the UCX communicator; one GPU per rank).
#include <cstdio>
#include <cstdlib>
#include <chrono>
#include <algorithm>
#include <string>

#include "tests/ranks/rank_scenario.h"
#include "decode_node/group_collectives.h"
#include "transfer/comm_ucx.h"

using namespace k3;
using namespace k3::test::ranks;

namespace {

// `forward`: the communicator of the rank's forward (the UCX one, or NCCL's over it); both get the deadline.
int run_until_failure(const RankLayout& g, transfer::UcxComm& comm, Comm& forward, int heads, uint64_t seed,
                      std::chrono::milliseconds deadline, const std::string& backend, int device) {
  // ~35 s of steps on the CPU: the kill comes long before the end.
  const Scenario sc = make_scenario(heads, seed, 3, 1000, backend == "cuda");
  auto run = setup_rank(sc, g, forward, 1, reference_options().cache, backend, device);
  if (!run.is_ok()) {
    std::fprintf(stderr, "rank %d: %s\n", g.rank, run.status().to_string().c_str());
    return 1;
  }
  if (auto s = comm.barrier(); !s.is_ok()) return 1;  // every rank is set up: steps are quick from here
  comm.set_timeout(deadline);
  forward.set_timeout(deadline);
  for (size_t st = 0; st < sc.steps.size(); ++st) {
    auto out = (*run)->step(sc, st);
    if (!out.is_ok()) {
      (*run)->close();
      CachePools& pools = (*run)->model->caches();
      const auto now = std::chrono::steady_clock::now().time_since_epoch();  // CLOCK_MONOTONIC: machine-wide
      std::printf("FAILED %lld %s\n", static_cast<long long>(std::chrono::duration_cast<std::chrono::microseconds>(now).count()),
                  out.status().to_string().c_str());
      std::printf("FREE %d %d %d %d\n", pools.free_pages(), pools.options().num_pages, pools.free_slots(),
                  pools.options().max_seqs);
      std::fflush(stdout);
      return 0;
    }
    std::printf("STEP %zu\n", st);
    std::fflush(stdout);
  }
  std::printf("DONE\n");
  std::fflush(stdout);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  std::string backend = "cpu", collectives = "ucx";
  int gpus = 1;
  while (argc > 3 && std::string(argv[argc - 2]).rfind("--", 0) == 0) {  // trailing options
    const std::string flag = argv[argc - 2], value = argv[argc - 1];
    if (flag == "--backend") backend = value;
    else if (flag == "--collectives") collectives = value;
    else if (flag == "--gpus") gpus = std::max(1, std::atoi(value.c_str()));
    else {
      std::fprintf(stderr, "unknown option %s\n", flag.c_str());
      return 2;
    }
    argc -= 2;
  }
  if (argc != 9 && argc != 10) {
    std::fprintf(stderr, "usage: %s rank size endpoint heads seed dcp ep kv_partitions [step_deadline_ms] "
                 "[--backend cpu|cuda] [--gpus N] [--collectives ucx|nccl]\n", argv[0]);
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
  const int device = backend == "cuda" ? rank % gpus : 0;
  auto kind = decode::parse_group_collectives(collectives);
  if (!kind.is_ok()) {
    std::fprintf(stderr, "%s\n", kind.status().to_string().c_str());
    return 2;
  }
  auto nccl = decode::make_group_collectives(*kind, **comm, device, std::chrono::seconds(60));
  if (!nccl.is_ok()) {
    std::fprintf(stderr, "rank %d: collectives: %s\n", rank, nccl.status().to_string().c_str());
    return 1;
  }
  Comm& forward = *nccl ? **nccl : static_cast<Comm&>(**comm);
  if (argc == 10)
    return run_until_failure(g, **comm, forward, std::atoi(argv[4]), std::strtoull(argv[5], nullptr, 10),
                             std::chrono::milliseconds(std::atoi(argv[9])), backend, device);
  const Scenario sc = make_scenario(std::atoi(argv[4]), std::strtoull(argv[5], nullptr, 10), 3, 4, backend == "cuda");
  auto out = run_group(sc, g, forward, 1, backend, device);
  if (!out.is_ok()) {
    std::fprintf(stderr, "rank %d: %s\n", rank, out.status().to_string().c_str());
    return 1;
  }
  for (size_t s = 0; s < out->size(); ++s)
    for (auto& [req, lg] : (*out)[s]) {
      std::printf("L %zu %d %016llx\n", s, req, static_cast<unsigned long long>(fnv(lg.data(), lg.size() * 4)));
      if (backend == "cpu") continue;
      std::string line = "V " + std::to_string(s) + " " + std::to_string(req);
      char v[32];
      for (float x : lg) {
        std::snprintf(v, sizeof v, " %a", static_cast<double>(x));
        line += v;
      }
      std::printf("%s\n", line.c_str());
    }
  std::printf("DONE\n");
  std::fflush(stdout);
  return 0;
}
