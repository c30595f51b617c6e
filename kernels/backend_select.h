// Which backend a process runs on, chosen by its --backend / --device flags (or a cluster spec's
// "backend" field), and the one place that turns that choice into a Backend.
#pragma once
#include <memory>
#include <string>

#include "common/core/status.h"
#include "kernels/backend.h"

namespace k3 {

struct BackendChoice {
  std::string kind = "cpu";  // "cpu" | "cuda"
  int device = 0;            // CUDA device ordinal (cuda only)
  int threads = 0;           // CPU threads (cpu only; 0 = all cores or K3_THREADS)
  // cuda: fixed-order GEMMs and fixed attention splits, so a request's tokens do not depend on the
  // batch it shares (what lets the disaggregated cluster promise k3-generate's tokens). The serving
  // default; it costs GEMM speed (docs/PERF.md), k3-bench turns it off to measure the fast path.
  bool batch_invariant = true;
};

// Help text for the flags, shared by every role's command line.
inline constexpr const char* kBackendFlagHelp = "compute backend: cpu (fp32 reference) or cuda (bf16 on one GPU)";
inline constexpr const char* kDeviceFlagHelp = "CUDA device ordinal for --backend cuda";
inline constexpr const char* kKernelsFlagHelp =
    "cuda kernels: invariant (default: a request's tokens depend neither on the batch it shares nor on how "
    "its prompt was cut at multiples of 64, so a cluster gives k3-generate's tokens) or fast (cuBLASLt GEMMs "
    "and the kernel forms picked per call: about 1.25x the prefill and 1.2x the large-batch decode speed, tokens that "
    "may change with the batch); the cpu backend's kernels are invariant either way";

// "invariant" | "fast" -> BackendChoice::batch_invariant; names the value otherwise.
Status set_kernels(BackendChoice& c, const std::string& kernels);

// Checks the kind's spelling and the device ordinal; names the field.
Status validate(const BackendChoice& c);
// Creates the backend. For cuda, an error names why it is unavailable (no CUDA in this build, no GPU
// visible, device out of range), as make_cuda_backend reports it.
Result<std::unique_ptr<Backend>> make_backend(const BackendChoice& c);

}  // namespace k3
