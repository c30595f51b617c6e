// Token-exact: the engine with the prefix cache on gives the tokens of the engine with it off (greedy and
// seeded sampling) over a randomized workload: shared system prompts of random lengths, branches,
// multi-turn chats that resend the previous answer, batches of several requests, and evictions under a
// tight budget. Afterwards a flush gives the pools every byte back.
// The default run is 120 requests; the 2,000-request run is the opt-in CTest entry
// engine.prefix_exact_2000 (label "soak": K3_SOAK=1 bash tools/test.sh -L soak; ~18 min on 2 loaded cores).
#include <catch2/catch.hpp>

#include <cstdlib>

#include "tests/engine/prefix_workload.h"

using namespace k3;
using namespace k3::test;

TEST_CASE("prefix cache on gives the cache-off tokens (randomized workload, 120 requests)", "[prefix]") {
  auto backend = make_cpu_backend({.threads = 2});
  run_prefix_workload(*backend, DType::F32, 120);
}

// The chunk-invariant paths with K3's KDA heads (D = 128): whole 64-token blocks through the chunked form,
// checkpoints written by it, the rows of partial blocks by the recurrence (engine/kda_heads.h).
TEST_CASE("prefix cache on gives the cache-off tokens on the chunk-invariant paths with K3's KDA heads", "[prefix]") {
  auto backend = make_cpu_backend({.threads = 2, .chunk_invariant = true});
  ModelConfig cfg = tiny_config("k3-tiny");
  cfg.kda.num_heads = 2;
  cfg.kda.head_dim = 128;
  run_prefix_workload(*backend, DType::F32, 40, cfg);
}

TEST_CASE("prefix cache on gives the cache-off tokens (2,000 requests)", "[.long]") {
  auto backend = make_cpu_backend({.threads = 2});
  run_prefix_workload(*backend, DType::F32, 2000);
}
