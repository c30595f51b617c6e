// The fixed-order GEMM's plan and dispatch (gemm_fixed.h): which form, tile and split one call runs.
#include "kernels/cuda/gemm_fixed.h"

#include <cstdint>

#include "kernels/cuda/align.h"

namespace k3::cuda {
namespace {

// Above this the split's partials would cost more memory than its extra CTAs are worth.
constexpr size_t kMaxSplitWorkspace = size_t(256) << 20;

}  // namespace

FixedGemmPlan plan_gemm_fixed(const FixedGemmArgs& a, int num_sms) {
  FixedGemmPlan p;
  // By K, the pitches and the bases only. A row slice of x keeps its base's alignment when ldx is a
  // multiple of 8, so a row computed alone and inside a batch take the same form.
  p.wgmma = a.K >= 64 && a.ldx % 8 == 0 && a.ldw % 8 == 0 && a.ldx >= a.K && a.ldw >= a.K &&
            (a.batch == 1 || (a.stride_x % 8 == 0 && a.stride_w % 8 == 0)) && aligned16(a.x) && aligned16(a.w);
  if (!p.wgmma) return p;
  p.parts = int((a.K + kFixedGemmPartK - 1) / kFixedGemmPartK);
  p.warpgroups = a.M <= 64 ? 1 : 2;
  p.block_n = a.M <= 64 ? 64 : 128;
  const int64_t ctas = (a.N + p.block_n - 1) / p.block_n * ((a.M + 64 * p.warpgroups - 1) / (64 * p.warpgroups)) * a.batch;
  const size_t work = size_t(a.batch) * size_t(p.parts) * size_t(a.M) * size_t(a.N) * sizeof(float);
  // (The split's grid has batch x parts CTAs along z, at most 65535.)
  if (p.parts > 1 && ctas * 2 <= num_sms && work <= kMaxSplitWorkspace && a.batch * p.parts <= 65535) {
    p.split = true;
    p.workspace_bytes = work;
  }
  return p;
}

void launch_gemm_fixed(const FixedGemmArgs& a, const FixedGemmPlan& plan, void* work, cudaStream_t s) {
  if (a.M == 0 || a.N == 0 || a.batch == 0) return;
  if (plan.wgmma) launch_gemm_fixed_wgmma(a, plan, static_cast<float*>(work), s);
  else launch_gemm_fixed_mma(a, s);
}

}  // namespace k3::cuda
