// The routed experts at decode and small-prefill batch sizes (`k3-bench engine`'s MoE table): the
// default mode's kernels against the batch-invariant grouped GEMM in each of its forms (the same bits,
// tests/cuda/test_cuda_ops.cpp), beside the time the expert weights they touch take at copy rate.
#pragma once
#include "common/config/config.h"
#include "kernels/backend.h"

namespace k3::bench {

// Prints one table for the preset's routed experts (nothing without CUDA, or without routed experts).
void print_moe_table(Backend& be, const ModelConfig& cfg, double copy_bytes_per_us);

}  // namespace k3::bench
