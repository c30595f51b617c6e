// Timing and inputs of `k3-bench kernels` (kernels_bench.cpp): a table line with its references,
// random device inputs, and the two ways a kernel is timed: eager calls (median of device times
// between events) and CUDA-graph replays of one or more captured variants. CUDA builds only.
#pragma once
#ifdef K3_HAVE_CUDA
#include <cuda_runtime.h>

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "kernels/cuda/cuda_backend.h"

namespace k3::bench {

// A public kernel timed on the same card by bench/fla_reference.py: its label and JSON key.
struct Ref {
  std::string label, key;
  double us = 0;  // filled from the reference JSON (0: not measured)
};

struct Line {
  std::string name;     // our key (also the key of the first reference unless it names another)
  double us = 0, bytes = 0, flops = 0;
  double floor_us = 0;
  std::vector<Ref> refs;  // first = the table's main reference column; the rest get rows of their own
};

// Random device inputs without a device RNG: a 4 Mi-element host pattern (seeded), copied over the
// buffer at a seed-dependent rotation. Never zeros (they hide bugs and run faster than real data).
void fill_uniform(void* p, int64_t n, bool bf16, float lo, float hi, uint64_t seed, cudaStream_t s);
// fill_uniform over a whole tensor of `be` (bf16 or 4-byte elements).
void fill(cuda::CudaBackend& be, const Tensor& t, float lo, float hi, uint64_t seed);
// A device I32 vector.
Tensor dev_ints(cuda::CudaBackend& be, const std::vector<int32_t>& v);

double median(std::vector<double> v);
// Median device time (us) of `iters` eager runs of what `f` enqueues on `s`, after `warm` runs.
double time_eager(cudaStream_t s, int warm, int iters, const std::function<void()>& f);
// Each variant is run once eagerly (sizing workspaces), captured, then replayed round robin; the
// median device time (us) of `replays` replays.
double time_graphs(cudaStream_t s, int replays, const std::vector<std::function<void()>>& variants);

}  // namespace k3::bench
#endif  // K3_HAVE_CUDA
