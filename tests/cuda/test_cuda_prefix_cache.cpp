// The prefix cache on the GPU: the engine on CUDA with the cache on gives the tokens of the engine on
// CUDA with it off (greedy and seeded) over the randomized shared-prefix workload of the CPU test
// (tests/engine/prefix_workload.h): checkpoints taken inside the KDA pass, copy-on-write slot copies and
// shared pages all on the device, evictions under a tight budget, every byte back after a flush. With
// k3-tiny (KDA D = 16: the token recurrence), and with K3's head shapes (D = 128: the chunked kernel) in
// the batch-invariant mode that serving runs (whole aligned blocks chunked, the rest by the recurrence).
// Prints SKIPPED where no GPU is visible.
#include <catch2/catch.hpp>

#include "tests/cuda/cuda_test_util.h"
#include "tests/cuda/engine_rig.h"
#include "tests/engine/prefix_workload.h"

using namespace k3;

TEST_CASE("prefix cache on CUDA gives the cache-off tokens (randomized workload, 60 requests)", "[cuda][prefix]") {
  K3_GPU_OR_SKIP(bk);
  k3::test::run_prefix_workload(*bk.gpu, DType::BF16, 60);
}

TEST_CASE("prefix cache on CUDA with K3's head shapes in batch-invariant mode gives the cache-off tokens (30 requests)",
          "[cuda][prefix]") {
  // Only this mode promises a prompt's bits whatever its forwards: in the default mode the chunked KDA
  // kernel's form and the MLA prefill's tiles follow each call's rows, so a prompt resumed from a
  // checkpoint may sample other tokens than the same prompt computed whole.
  K3_GPU_OR_SKIP(bk);
  bk.gpu->set_batch_invariant(true);
  k3::test::run_prefix_workload(*bk.gpu, DType::BF16, 30, k3::cudatest::tiny_with_k3_heads());
  bk.gpu->set_batch_invariant(false);
}
