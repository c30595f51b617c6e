// The prefix cache on the GPU: the engine on CUDA with the cache on gives the tokens of the engine on
// CUDA with it off (greedy and seeded) over the randomized shared-prefix workload of the CPU test
// (tests/engine/prefix_workload.h): checkpoints taken inside the chunked KDA pass, copy-on-write slot
// copies and shared pages all on the device, evictions under a tight budget, every byte back after a
// flush. Prints SKIPPED where no GPU is visible.
#include <catch2/catch.hpp>

#include "tests/cuda/cuda_test_util.h"
#include "tests/engine/prefix_workload.h"

using namespace k3;

TEST_CASE("prefix cache on CUDA gives the cache-off tokens (randomized workload, 60 requests)", "[cuda][prefix]") {
  K3_GPU_OR_SKIP(bk);
  k3::test::run_prefix_workload(*bk.gpu, DType::BF16, 60);
}
