// The wgmma form of the fixed-order GEMM (gemm_fixed.h): y = alpha x w^T + beta y, every output element
// summed as parts of kFixedGemmPartK columns of K, each part one chain of wgmma m64n64k16 in increasing
// k from zero, the parts added left to right in fp32.
//
// A CTA is a producer warpgroup and 1 or 2 consumer warpgroups (64 rows each) over block_n columns. The
// producer's TMA loads stream 64-column steps of K of both operands (128B swizzle, zeros past K, M
// and N) through a ring of stages; each consumer warpgroup issues the step's four k16 products per 64
// columns, keeps one step's products in flight while it waits for the previous one, and at the end of
// a part waits for all of them and adds the part into its running sum. A part's accumulators and the
// running sum are separate registers (64 + 64 per thread at 128 columns), which caps block_n at 128.
// Split (small M): a CTA per part writes the part to the workspace, and gemm_fixed_add_parts adds
// the parts in the same order.
#include <algorithm>
#include <cstdint>

#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/gemm_fixed.h"
#include "kernels/cuda/gemm_fixed_epilogue.cuh"
#include "kernels/cuda/mbarrier.cuh"
#include "kernels/cuda/pdl.cuh"
#include "kernels/cuda/tensor_map.h"
#include "kernels/cuda/wgmma.cuh"

namespace k3::cuda {
namespace {

constexpr int kStepK = 64;                              // K columns per ring stage: one 128-byte TMA box row
constexpr int kStepsPerPart = kFixedGemmPartK / kStepK;  // 8
static_assert(kFixedGemmPartK % kStepK == 0);

struct WgArgs {
  FOut y;
  float* work = nullptr;  // split: [batch][parts][M][N] fp32
  int64_t M = 0, N = 0, ldy = 0, stride_y = 0;
  int k_steps = 0, parts = 0;
  int split = 0;  // 1: a CTA per part
  bool x_rows_inner = true, w_rows_inner = true;
  float alpha = 1.f, beta = 0.f;
};

template <int kWG, int kBN>
struct WgCfg {
  static constexpr int kBM = 64 * kWG;
  static constexpr int kNSets = kBN / 64;  // m64n64 accumulator sets per warpgroup
  static constexpr int kABytes = kBM * 128;
  static constexpr int kBBytes = kBN * 128;
  static constexpr int kStageBytes = kABytes + kBBytes;
  static constexpr int kStages = std::min(8, (192 * 1024) / kStageBytes);
  static constexpr int kThreads = 128 * (kWG + 1);  // consumer warpgroups, then the producer's
  static constexpr size_t kSmem = size_t(kStages) * kStageBytes + 2 * kStages * sizeof(uint64_t) + 1024;
};

__device__ __forceinline__ void load_box(uint32_t dst, const CUtensorMap* map, bool rows_inner, int k, int row, int entry,
                                         uint32_t bar) {
  if (rows_inner) tma_load_3d(dst, map, k, row, entry, bar);
  else tma_load_3d(dst, map, k, entry, row, bar);
}
__device__ __forceinline__ void prefetch_box(const CUtensorMap* map, bool rows_inner, int k, int row, int entry) {
  if (rows_inner) tma_prefetch_3d(map, k, row, entry);
  else tma_prefetch_3d(map, k, entry, row);
}

template <int kWG, int kBN>
__global__ void __launch_bounds__(WgCfg<kWG, kBN>::kThreads, 1)
    gemm_fixed_wg_kernel(const __grid_constant__ CUtensorMap x_map, const __grid_constant__ CUtensorMap w_map,
                         const WgArgs a) {
  using C = WgCfg<kWG, kBN>;
  const int n0 = blockIdx.x * kBN, m0 = blockIdx.y * C::kBM;
  const int entry = a.split ? blockIdx.z / a.parts : blockIdx.z;
  const int part_lo = a.split ? blockIdx.z % a.parts : 0;
  const int part_hi = a.split ? part_lo + 1 : a.parts;
  const int step_lo = part_lo * kStepsPerPart, step_hi = min(part_hi * kStepsPerPart, a.k_steps);
  const int warp = threadIdx.x >> 5;
  // The weight boxes of the ring's first round go to L2 while the kernel before may still run (with
  // programmatic launch): at decode sizes the weights are nearly all of the bytes, and the activations
  // this GEMM waits for are few.
  if (kPdlLaunches && threadIdx.x == 128 * kWG)
    for (int s = step_lo; s < min(step_hi, step_lo + C::kStages); ++s)
      prefetch_box(&w_map, a.w_rows_inner, s * kStepK, n0, entry);
  pdl_enter();
  extern __shared__ unsigned char smem_raw[];
  unsigned char* smem = reinterpret_cast<unsigned char*>((reinterpret_cast<uintptr_t>(smem_raw) + 1023) & ~uintptr_t(1023));
  const uint32_t ring = smem_u32(smem);
  const uint32_t full0 = ring + C::kStages * C::kStageBytes;  // mbarriers: full[kStages], then empty[kStages]
  const uint32_t empty0 = full0 + C::kStages * 8;

  if (threadIdx.x == 0) {
    for (int i = 0; i < C::kStages; ++i) {
      mbar_init(full0 + 8 * i, 1);
      mbar_init(empty0 + 8 * i, 128 * kWG);
    }
  }
  __syncthreads();

  if (warp >= 4 * kWG) {  // the producer warpgroup: one thread issues every load
    // Its registers go to the consumers, whose part and running sum take 128 at 128 columns (the
    // launch gives 168 a thread; 40 here and 232 there fit the same register file).
    if constexpr (kWG == 2) asm volatile("setmaxnreg.dec.sync.aligned.u32 40;\n");
    if (threadIdx.x == 128 * kWG) {
      for (int s = step_lo, i = 0; s < step_hi; ++s, ++i) {
        const int slot = i % C::kStages;
        if (i >= C::kStages) mbar_wait(empty0 + 8 * slot, ((i / C::kStages) - 1) & 1);
        const uint32_t dst = ring + slot * C::kStageBytes, bar = full0 + 8 * slot;
        mbar_expect_tx(bar, C::kStageBytes);
        load_box(dst, &x_map, a.x_rows_inner, s * kStepK, m0, entry, bar);
        load_box(dst + C::kABytes, &w_map, a.w_rows_inner, s * kStepK, n0, entry, bar);
      }
    }
    return;
  }

  if constexpr (kWG == 2) asm volatile("setmaxnreg.inc.sync.aligned.u32 232;\n");
  const int wg = warp >> 2;
  float total[C::kNSets][32], part[C::kNSets][32];
  int i = 0;  // ring position of step s
  for (int p = part_lo; p < part_hi; ++p) {
    const int s_end = min((p + 1) * kStepsPerPart, a.k_steps);
    int prev_slot = -1;
    for (int s = p * kStepsPerPart; s < s_end; ++s, ++i) {
      const int slot = i % C::kStages;
      mbar_wait(full0 + 8 * slot, (i / C::kStages) & 1);
      const uint32_t a_base = ring + slot * C::kStageBytes + wg * 8192;
      const uint32_t b_base = ring + slot * C::kStageBytes + C::kABytes;
      const int fresh = s == p * kStepsPerPart;  // the part's chain starts from zero
      wg::fence();
#pragma unroll
      for (int kk = 0; kk < 4; ++kk)
#pragma unroll
        for (int j = 0; j < C::kNSets; ++j)
          wg::mma_m64n64<0>(part[j], wg::make_desc(a_base + 32 * kk), wg::make_desc(b_base + j * 8192 + 32 * kk),
                            fresh && kk == 0 ? 0 : 1);
      wg::commit();
      wg::wait<1>();  // the previous step's products are done: its stage may be refilled
      if (prev_slot >= 0) mbar_arrive(empty0 + 8 * prev_slot);
      prev_slot = slot;
    }
    wg::wait<0>();
    mbar_arrive(empty0 + 8 * prev_slot);
#pragma unroll
    for (int j = 0; j < C::kNSets; ++j)
#pragma unroll
      for (int e = 0; e < 32; ++e) {
        wg::reg_fence(part[j][e]);
        total[j][e] = p == part_lo ? part[j][e] : __fadd_rn(total[j][e], part[j][e]);
      }
  }

  // Accumulator layout (wgmma.cuh): warp w of the warpgroup holds rows 16 w + g (+ 8), register
  // 4 q + e of set j is column 64 j + 8 q + 2 t + (e & 1), row + 8 (e >> 1).
  const int lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
  const int64_t row0 = int64_t(m0) + 64 * wg + 16 * (warp & 3) + g;
#pragma unroll
  for (int j = 0; j < C::kNSets; ++j)
#pragma unroll
    for (int e = 0; e < 32; ++e) {
      const int64_t row = row0 + 8 * ((e & 3) >> 1);
      const int64_t col = int64_t(n0) + 64 * j + 8 * (e >> 2) + 2 * t + (e & 1);
      if (row >= a.M || col >= a.N) continue;
      if (a.split) {
        a.work[((int64_t(entry) * a.parts + part_lo) * a.M + row) * a.N + col] = total[j][e];
        continue;
      }
      store_fixed_gemm(a.y, entry * a.stride_y + row * a.ldy + col, total[j][e], a.alpha, a.beta);
    }
}

// The split form's second step: the parts of each element added left to right, as a CTA adds them.
__global__ void gemm_fixed_add_parts(const WgArgs a, int64_t batch) {
  pdl_enter();
  const int64_t mn = a.M * a.N, total = batch * mn;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < total; i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t b = i / mn, r = (i % mn) / a.N, c = i % a.N;
    const float* p = a.work + b * a.parts * mn + r * a.N + c;
    float sum = p[0];
    for (int q = 1; q < a.parts; ++q) sum = __fadd_rn(sum, p[q * mn]);
    store_fixed_gemm(a.y, b * a.stride_y + r * a.ldy + c, sum, a.alpha, a.beta);
  }
}

template <int kWG, int kBN>
void launch_form(const FixedGemmArgs& f, const FixedGemmPlan& plan, float* work, cudaStream_t s) {
  using C = WgCfg<kWG, kBN>;
  const RowsTensorMap xm = make_bf16_rows_map_sw128(f.x, f.M, f.K, f.ldx, f.batch, f.stride_x, C::kBM);
  const RowsTensorMap wm = make_bf16_rows_map_sw128(f.w, f.N, f.K, f.ldw, f.batch, f.stride_w, kBN);
  WgArgs a{.y = f.y, .work = work, .M = f.M, .N = f.N, .ldy = f.ldy, .stride_y = f.stride_y,
           .k_steps = int((f.K + kStepK - 1) / kStepK), .parts = plan.parts, .split = plan.split ? 1 : 0,
           .x_rows_inner = xm.rows_inner, .w_rows_inner = wm.rows_inner, .alpha = f.alpha, .beta = f.beta};
  K3_CUDA_OK(cudaFuncSetAttribute(gemm_fixed_wg_kernel<kWG, kBN>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                  int(C::kSmem)));
  const dim3 grid(unsigned((f.N + kBN - 1) / kBN), unsigned((f.M + C::kBM - 1) / C::kBM),
                  unsigned(f.batch * (plan.split ? plan.parts : 1)));
  launch_pdl("gemm_fixed_wg_kernel", gemm_fixed_wg_kernel<kWG, kBN>, grid, C::kThreads, C::kSmem, s, xm.map, wm.map, a);
  if (!plan.split) return;
  const int64_t n = f.batch * f.M * f.N;
  launch_pdl("gemm_fixed_add_parts", gemm_fixed_add_parts, unsigned(std::min<int64_t>((n + 255) / 256, 4096)), 256, 0,
             s, a, f.batch);
}

}  // namespace

void launch_gemm_fixed_wgmma(const FixedGemmArgs& a, const FixedGemmPlan& plan, float* work, cudaStream_t s) {
  if (plan.warpgroups == 1 && plan.block_n == 64) launch_form<1, 64>(a, plan, work, s);
  else if (plan.warpgroups == 2 && plan.block_n == 128) launch_form<2, 128>(a, plan, work, s);
  else throw Error("gemm_fixed: no wgmma form of " + std::to_string(plan.warpgroups) + " warpgroups x " +
                   std::to_string(plan.block_n) + " columns");
}

}  // namespace k3::cuda
