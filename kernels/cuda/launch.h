// Host-side launchers of the CUDA kernels: raw device pointers plus sizes, already validated by
// CudaBackend (the host boundary). Shapes are written beside each pointer.
#pragma once
#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/cuda/any_ptr.h"

namespace k3::cuda {

// ---- simple row / element-wise kernels (elementwise.cu) ----
void launch_rmsnorm(FIn x /*[M,D]*/, FIn w /*[D], p may be null*/, FOut y /*[M,D]*/, int64_t M, int D, float eps,
                    cudaStream_t s);
void launch_l2norm(FIn x, FOut y, int64_t M, int D, float eps, float scale, cudaStream_t s);
// y = act(g, u): SiTU, or SiLU(g) * u when silu.
void launch_situ(FIn g, FIn u, FOut y, int64_t n, float beta, float beta_linear, bool silu, cudaStream_t s);
void launch_add(FIn a, FIn b, FOut y, int64_t n, cudaStream_t s);
void launch_sigmoid_mul(FIn x, FIn gate, FOut y, int64_t n, cudaStream_t s);
void launch_sigmoid(FIn x, FOut y, int64_t n, cudaStream_t s);
void launch_embedding(FIn table /*[V,D]*/, const int32_t* ids /*[M]*/, FOut y /*[M,D]*/, int64_t M, int64_t D,
                      int64_t V, cudaStream_t s);
// g[t,h,i] = g_min * sigmoid(exp(a_log[h]) * (f[t,h*D+i] + dt_bias[h*D+i])), fp32 out [T,H,D];
// softplus: g = -exp(a_log[h]) * softplus(f + dt_bias) (Kimi Linear).
void launch_kda_gate(FIn f, const float* a_log, const float* dt_bias, float* g, int64_t T, int H, int D, float g_min,
                     bool softplus, cudaStream_t s);
// y[i] = counter_random::uniform(seed, i, scale), rounded to bf16 first when round_to_bf16 (weight_fill.cu).
void launch_fill_uniform(FOut y, int64_t n, int64_t first, uint64_t seed, float scale, bool round_to_bf16,
                         cudaStream_t s);
// dst[r, dst_col+j] = src[r / repeat, src_col+j], elements of `elem` bytes (2 or 4).
void launch_copy_cols(const void* src, int64_t src_rows, int64_t src_cols, void* dst, int64_t dst_rows,
                      int64_t dst_cols, int64_t src_col, int64_t dst_col, int64_t ncols, int repeat, int elem,
                      cudaStream_t s);
void launch_scatter_rows(const void* src /*[R,W]*/, const int32_t* ids /*[R]*/, void* dst /*[N,W]*/, int64_t R,
                         int64_t row_bytes, cudaStream_t s);

// ---- sampling.cu: out[b] = argmax of row b (lowest id on ties), logits [B, V] F32 ----
void launch_argmax_rows(const float* logits, int64_t B, int64_t V, int32_t* out, cudaStream_t s);

// ---- attnres_mix.cu ----
constexpr int kMaxAttnResCandidates = 16;
struct AttnResCandidates {
  FIn c[kMaxAttnResCandidates];  // each [M, D]
  int m = 0;
};
void launch_attnres_mix(const AttnResCandidates& c, const float* query /*[D]*/, FOut y /*[M,D]*/, int64_t M, int D,
                        float eps, cudaStream_t s);

// ---- router_topk.cu ----
void launch_router_topk(const float* logits /*[M,E]*/, const float* bias /*[E]*/, int32_t* ids /*[M,k]*/,
                        float* weights /*[M,k]*/, int64_t M, int E, int k, float scale, cudaStream_t s);

// ---- short_conv.cu ----
void launch_short_conv(FIn x /*[T,C]*/, FIn w /*[C,W]*/, FOut cache /*[slots,W-1,C]*/, const int32_t* slots /*[N]*/,
                       const int32_t* cu_seqlens /*[N+1]*/, FOut y /*[T,C]*/, int N, int C, int W, cudaStream_t s);

// ---- KDA (kda_recurrent.cu, kda_chunk.cu, kda_decode.cu) ----
struct KdaArgs {
  FIn q, k, v;                   // [T, H, K], [T, H, K], [T, H, V]
  const float* g = nullptr;      // [T, H, K] log-decay
  const float* beta = nullptr;   // [T, H]
  float* state = nullptr;        // [slots, H, V, K] in/out
  const int32_t* slots = nullptr;       // [N] device
  const int32_t* cu_seqlens = nullptr;  // [N+1] device
  // [N][2] device or null (ops::KdaParams::seq_rows): the token recurrence's rows of sequence n. The
  // chunked form takes its rows from the host-built chunk table instead.
  const int32_t* seq_rows = nullptr;
  FOut o;                        // [T, H, V]
  int N = 0, H = 0, K = 0, V = 0;
  // Chunked form only: some g may be below K3's bound of -5 (Kimi Linear's softplus gate), so the
  // prep launch forms every exponent as a sum of gates over a run (docs/MODEL.md §2.4).
  bool unbounded_gate = false;
  // Optional checkpoints (ops::KdaParams): after (j+1)·ckpt_interval tokens of sequence n the state
  // goes to ckpt + slot·H·V·K, slot = ckpt_slots[n·ckpt_m + j] when j < ckpt_m and slot >= 0.
  float* ckpt = nullptr;                 // [ckpt_num_slots, H, V, K]; null: none
  int64_t ckpt_num_slots = 0;
  const int32_t* ckpt_slots = nullptr;   // [N, ckpt_m] device
  int ckpt_m = 0, ckpt_interval = 0;
  // The scan's wide grid on wgmma instead of mma.sync, and the rows of V per wgmma block (64, 32,
  // or 0: by the grid); kda_scan_form.h picks the kernel. CudaBackend's switches, same defaults.
  bool scan_wgmma = true;
  int scan_wg_rows = 0;
  // Batch-invariant mode: every grid runs the 32-row wgmma scan, whatever its width, so a chunk's
  // arithmetic does not depend on the other sequences of the call (the forms differ in their bits).
  bool scan_one_form = false;
};
// Sequence n's rows in the call: its seq_rows range where given, else its cu_seqlens range (device).
__host__ __device__ inline int64_t kda_row_begin(const KdaArgs& a, int n) {
  return a.seq_rows ? a.seq_rows[2 * n] : a.cu_seqlens[n];
}
__host__ __device__ inline int64_t kda_row_end(const KdaArgs& a, int n) {
  return a.seq_rows ? a.seq_rows[2 * n + 1] : a.cu_seqlens[n + 1];
}
// The checkpoint slot for `done` tokens of sequence n, or -1 (device and host).
__host__ __device__ inline int kda_ckpt_slot(const KdaArgs& a, int n, int done) {
  if (a.ckpt == nullptr || done <= 0 || done % a.ckpt_interval != 0) return -1;
  const int j = done / a.ckpt_interval - 1;
  return j < a.ckpt_m ? a.ckpt_slots[int64_t(n) * a.ckpt_m + j] : -1;
}
void launch_kda_recurrent(const KdaArgs& a, cudaStream_t s);

// Chunked form, K = V = 128, chunk 64. `chunk_table` [num_chunks, 4] I32 on device: (first token,
// length, sequence, index of the chunk within its sequence); `seq_chunk0` [N+1] the first chunk of
// each sequence. `work` holds kda_chunk_workspace_floats(num_chunks, H) floats. `num_sms` (the
// device's multiprocessor count) picks the scan shape.
int64_t kda_chunk_workspace_floats(int64_t num_chunks, int H);
void launch_kda_chunk(const KdaArgs& a, const int32_t* chunk_table, const int32_t* seq_chunk0, int num_chunks,
                      float* work, int num_sms, cudaStream_t s);

// A long sequence's chunk chain cut into segments that scan at the same time (kda_chunk_split.cu,
// docs/MODEL.md §2.4): the scan's grid rows are then jobs instead of sequences. A job scans chunks
// [c_begin, c_end) of sequence `seq` from an initial state (the sequence's slot, zeros, the identity
// or a carry slot) and leaves its final state in the sequence's slot, a carry slot or nowhere;
// kZeroU scans with U = 0 (the segment's transition matrix from the identity), kWriteO writes the
// output and checkpoints.
struct KdaScanJob {
  enum Init : int32_t { kFromSeq = 0, kZeros = 1, kIdentity = 2, kFromCarry = 3 };
  enum Out : int32_t { kToSeq = 0, kToCarry = 1, kDiscard = 2 };
  enum Flags : int32_t { kZeroU = 1, kWriteO = 2 };
  int32_t c_begin = 0, c_end = 0, seq = 0, init = kFromSeq, in_slot = 0, out = kToSeq, out_slot = 0, flags = kWriteO;
};
static_assert(sizeof(KdaScanJob) == 32, "uploaded as 8 int32 per job");
// The carry slots of one split sequence of P segments, from `base`: S_start[1 .. P-1], then
// A[1 .. P-2], then B[1 .. P-2]. Written by the plan's jobs and the fix-up, read by both.
struct KdaSplitSlots {
  int P = 0, base = 0;
  __host__ __device__ int start(int p) const { return base + p - 1; }
  __host__ __device__ int a(int p) const { return base + (P - 1) + p - 1; }
  __host__ __device__ int b(int p) const { return base + 2 * (P - 1) + p - 2; }
  __host__ __device__ static int count(int P) { return 3 * P - 5; }
};
// The split chunked form: `split` from plan_kda_split (built by the caller from the same chunk
// table), its job tables on the device, `carry` holding kda_split_carry_floats(split, H) floats.
struct KdaSplitPlan;
void launch_kda_chunk_split(const KdaArgs& a, const int32_t* chunk_table, int num_chunks, float* work,
                            const KdaSplitPlan& split, const KdaScanJob* pass1, const KdaScanJob* pass3,
                            const int32_t* fixup, float* carry, int num_sms, cudaStream_t s);
// Step 2 alone (kda_chunk_split.cu): `fixup` [seqs, 2] = (segments, first carry slot) on the device.
void launch_kda_split_fixup(int H, int seqs, int max_segments, const int32_t* fixup, float* carry, cudaStream_t s);

struct KdaDecodeArgs {
  FIn qkv;                       // [B, 3*H*D]
  FIn conv_w;                    // [3*H*D, W]
  FOut conv_cache;               // [slots, W-1, 3*H*D] in/out
  FIn f;                         // [B, H*D]
  const float* a_log = nullptr;  // [>=H]
  const float* dt_bias = nullptr;  // [H*D]
  FIn b;                         // [B, H]
  float* state = nullptr;        // [slots, H, D, D] in/out
  const int32_t* slots = nullptr;  // [B] state rows
  const int32_t* conv_slots = nullptr;  // [B] conv_cache rows (the state rows unless given apart)
  FOut o;                        // [B, H, D]
  int B = 0, H = 0, D = 0, W = 0;
  float g_min = -5.f;
  bool softplus = false;  // Kimi Linear's gate form
  // The separate steps' rounding (batch-invariant mode): the conv outputs and the normalised q and k
  // rounded to bf16, the norms summed in block_sum's order and q scaled by q_scale, as short_conv,
  // l2norm, kda_gate, sigmoid and kda_recurrent with a bf16 compute dtype do, so that a token gives
  // the same bits through this kernel as through those steps.
  bool as_steps = false;
  float q_scale = 0.f;  // as_steps: the l2norm scale of q (1 / sqrt(D) in fp32, as the engine computes it)
};
void launch_kda_decode(const KdaDecodeArgs& a, cudaStream_t s);

// ---- MLA (mla_decode.cu, mla_prefill.cu) and the LSE merge (lse_merge.cu) ----
struct MlaDecodeArgs {
  const __nv_bfloat16* q_lat = nullptr;   // [B, H, R]
  const __nv_bfloat16* q_rope = nullptr;  // [B, H, Dr]
  const __nv_bfloat16* kv = nullptr;      // [pages, page_size, R+Dr]
  const int32_t* block_table = nullptr;   // [B, max_pages]
  const int32_t* seq_lens = nullptr;      // [B]
  FOut o;                                 // [B, H, R]
  float* lse = nullptr;                   // [B, H]
  int B = 0, H = 0, R = 0, Dr = 0, page_size = 0, max_pages = 0;
  float scale = 0.f;
  // The Hopper wgmma kernel (mla_decode_wgmma.cu) for R = 512, Dr = 64, H >= 64 (CudaBackend sets it
  // from set_mla_decode_wgmma, default on); otherwise the mma.sync kernel.
  bool use_wgmma = false;
  // wgmma kernel, S = Q Kᵀ: each warpgroup all 64 tokens over half the dims, partials summed through
  // shared memory (true), or half the tokens over all dims (false, the default):
  // CudaBackend::set_mla_decode_split_s.
  bool wgmma_split_s = false;
  // wgmma kernel: KV tiles this far ahead of the one being loaded into shared memory are bulk
  // prefetched into L2 (0: none, the default: 2 and 4 measured 5 % slower on the H200, docs/PERF.md;
  // CudaBackend::set_mla_decode_l2_prefetch).
  int l2_prefetch_tiles = 0;
  // wgmma kernel: KV tiles come in by the tensor memory accelerator (one bulk tensor copy per
  // 64-dim x box-row box, completion on an mbarrier) instead of per-thread cp.async; needs kv_rows
  // (rows of the whole cache, pages x page_size, < 2^31) and a page size that is a multiple of 8.
  // CudaBackend::set_mla_decode_tma; off (or another page size) takes the cp.async loads.
  bool wgmma_tma = true;
  // wgmma kernel: the running softmax max moves only when a tile's max passes it by more than 8 (log2
  // units), so the fp32 O rescale runs on few tiles (the default: 2-4 % faster on the H200, docs/PERF.md;
  // CudaBackend::set_mla_decode_lazy_rescale(false) gives the exact running max).
  bool wgmma_lazy_rescale = true;
  // wgmma kernel, blocks of 32 heads in transposed form (heads as the instruction's N, so no padded
  // rows; mla_decode_t32.cuh), TMA loads only: 0 = every block holds 64 heads (a last group of
  // fewer heads is padded), 1 = a last group of 1-32 heads is one 32-head block, 2 = every block
  // holds 32 heads. CudaBackend::set_mla_decode_t32.
  int wgmma_t32 = 0;
  // wgmma kernel, 64-head blocks: the two warpgroups in a seesaw over pairs of tiles (each computes
  // the scores of its own tile, one's softmax overlapping the other's products; mla_decode_seesaw.cuh)
  // instead of in lockstep on every tile. Applies with the TMA loads and S split over tokens;
  // wgmma_t32 is then ignored. CudaBackend::set_mla_decode_seesaw (default on).
  bool wgmma_seesaw = false;
  // With wgmma_seesaw: the seesaw block that keeps each warpgroup's P in registers for its own product,
  // waits for its tiles dim chunk by dim chunk and refills each half of a stage as soon as the
  // warpgroup reading it is done (mla_decode_halves.cuh): 0 = never, 1 = always, 2 = when the plan's
  // splits are kMlaHalvesMinTokens long or longer (the default: 3-5 % faster than the seesaw there,
  // 4-5 % slower on 2048- and 4096-token splits on the H200, docs/PERF.md).
  // CudaBackend::set_mla_decode_seesaw_halves.
  int wgmma_seesaw_halves = 2;
  // wgmma kernel, 48-head transposed seesaw blocks (mla_decode_t48.cuh: the heads are the N of each
  // instruction, so no padded rows; the warpgroups in a seesaw over pairs of tiles), with the TMA loads
  // and S split over tokens: 0 = never, 1 = every block holds 48 heads, 2 = when 48-head blocks pad
  // fewer rows than 64-head ones (H = 96: two blocks of 48 instead of two of 64, the second half
  // empty). Takes precedence over wgmma_seesaw and wgmma_t32. CudaBackend::set_mla_decode_t48.
  int wgmma_t48 = 0;
  // wgmma kernel: the head groups of one (request, split) launched as one thread-block cluster (up to
  // 8 groups), so they run at the same time on one processing cluster. CudaBackend::set_mla_decode_cluster.
  bool wgmma_cluster = false;
  // wgmma kernel, 64-head blocks of three warpgroups in fixed roles (mla_decode_roles.cu: one computes
  // the scores with Q in registers, two the products of their output halves, over three KV stages),
  // with the TMA loads and S split over tokens; takes precedence over every other block form.
  // CudaBackend::set_mla_decode_roles.
  bool wgmma_roles = false;
  int64_t kv_rows = 0;
};
// The wgmma kernel's head groups per request: g64 blocks of 64 heads, then g32 blocks of 32; or g48
// blocks of 48 heads only.
struct MlaHeadGroups {
  int g64 = 0, g32 = 0, g48 = 0;
};
// How the wgmma kernel groups heads into blocks: 0 = 64 heads (a last group padded), 1 = 64 and a last
// group of 1-32 heads as one 32-head block, 2 = 32 heads each (MlaDecodeArgs::wgmma_t32), or
// kMlaHeadForm48 = 48 heads each (MlaDecodeArgs::wgmma_t48).
constexpr int kMlaHeadForm48 = 3;
MlaHeadGroups mla_wgmma_head_groups(int H, int head_form);

// Whether the wgmma kernel runs 48-head blocks for these args (MlaDecodeArgs::wgmma_t48).
inline bool mla_wgmma_t48(const MlaDecodeArgs& a) {
  if (a.wgmma_split_s || a.wgmma_t48 == 0) return false;
  return a.wgmma_t48 == 1 || (a.H + 47) / 48 * 48 < (a.H + 63) / 64 * 64;
}
// The head form the wgmma kernel runs for these args: 0 with the fixed-role blocks, 48-head blocks as
// mla_wgmma_t48 says, else wgmma_t32, or 0 with the seesaw (one kernel holding both block forms would spill). The
// launch also needs TMA loads for any but 0.
inline int mla_wgmma_head_form(const MlaDecodeArgs& a) {
  if (a.wgmma_roles && !a.wgmma_split_s) return 0;
  return mla_wgmma_t48(a) ? kMlaHeadForm48 : a.wgmma_seesaw ? 0 : a.wgmma_t32;
}
// Split-KV plan: fixed from shapes only (not from seq_lens), so a decode step graph-captures.
struct MlaDecodePlan {
  int splits = 1;
  int tokens_per_split = 0;
  // The mma.sync kernel's blocks, the wgmma kernel's 64-head seesaw blocks (mla_decode_seesaw.cuh) and
  // its fixed-role blocks (mla_decode_roles.cu) take this many consecutive splits each, in turn, and write each split's
  // partial exactly as a block of its own would: the same tiles in the same order from the same start, so the result
  // does not depend on it. Batch-invariant mode cuts contexts into short splits of a fixed size; taking several per
  // block pays one block start (Q staged, pipeline filled) for many. The other wgmma forms take one split a block.
  int splits_per_block = 1;
};
// wgmma_kernel: the call will run the wgmma kernel (MlaDecodeArgs::use_wgmma with R = 512, Dr = 64),
// whose blocks hold the heads head_form says (mla_wgmma_head_form).
MlaDecodePlan plan_mla_decode(int B, int H, int max_context, int num_sms, bool wgmma_kernel, int head_form = 0);
// Whether the wgmma kernel's 64-head seesaw blocks run in the form refilled by halves
// (MlaDecodeArgs::wgmma_seesaw_halves): always, never, or when each split is kMlaHalvesMinTokens long
// or longer. The launch also needs the TMA loads and S split over tokens for any seesaw form.
constexpr int kMlaHalvesMinTokens = 8192;
inline bool mla_wgmma_seesaw_halves(const MlaDecodeArgs& a, const MlaDecodePlan& plan) {
  return a.wgmma_seesaw && (a.wgmma_seesaw_halves == 1 ||
                            (a.wgmma_seesaw_halves == 2 && plan.tokens_per_split >= kMlaHalvesMinTokens));
}
int64_t mla_decode_workspace_floats(const MlaDecodePlan& plan, int B, int H, int R);
void launch_mla_decode(const MlaDecodeArgs& a, const MlaDecodePlan& plan, float* work, cudaStream_t s);
// The wgmma kernel alone (called by launch_mla_decode): one split -> a.o, a.lse; several -> the fp32
// partials part_o [splits, B, H, R] and part_lse [splits, B, H], merged by the caller.
void launch_mla_decode_wgmma(const MlaDecodeArgs& a, const MlaDecodePlan& plan, float* part_o, float* part_lse,
                             cudaStream_t s);

struct MlaPrefillArgs {
  FIn q;  // [T, H, Dqk]
  FIn k;  // [S, H, Dqk]
  FIn v;  // [S, H, Dv]
  FOut o;  // [T, H, Dv]
  float* lse = nullptr;  // [T, H] or null
  int T = 0, S = 0, H = 0, Dqk = 0, Dv = 0;
  int64_t past = 0;
  float scale = 0.f;
};
void launch_mla_prefill(const MlaPrefillArgs& a, cudaStream_t s);
// The GEMM form's middle step (CudaBackend::mla_prefill): for heads h0 .. h0+heads-1, rows
// (head, t) of scores [heads, T, S] F32 (already scaled) -> probs bf16 (0 past the causal limit
// past + t), lse [T, H] F32 at column h0 + head (lse may be null).
void launch_causal_softmax(const float* scores, __nv_bfloat16* probs, float* lse, int heads, int T, int S, int H,
                           int h0, int64_t past, cudaStream_t s);

// o[r, :] = merge over n of (o_parts[n, r, :], lse_parts[n, r]); rows r = B*H; lse may be null.
void launch_lse_merge(FIn o_parts /*[N, rows, D]*/, const float* lse_parts /*[N, rows]*/, FOut o /*[rows, D]*/,
                      float* lse /*[rows]*/, int N, int64_t rows, int D, cudaStream_t s);

// ---- moe_experts.cu (simple reference-shaped kernel) ----
struct MoeArgs {
  FIn z;                        // [M, Dl]
  const int32_t* ids = nullptr;      // [M, k]
  const float* weights = nullptr;    // [M, k]
  FIn w1, w3;                   // [E, F, Dl]
  FIn w2;                       // [E, Dl, F]
  FOut y;                       // [M, Dl]
  int M = 0, k = 0, E = 0, F = 0, Dl = 0;
  float beta = 4.f, beta_linear = 25.f;
  bool silu = false;  // SiLU-gated experts (Kimi Linear) instead of SiTU
};
void launch_moe_experts(const MoeArgs& a, cudaStream_t s);
// ---- moe_grouped.cu: pairs sorted by expert on the device, one grouped tensor-core GEMM per
// projection (W1 and W3 together, then W2). Needs bf16 z and weights and E <= 4096.
bool moe_grouped_supported(const MoeArgs& a);
// Bytes of device workspace launch_moe_grouped needs for these sizes (routing tables, hidden rows,
// expert outputs); the caller owns it, so a MoE layer allocates nothing and can be graph-captured.
size_t moe_grouped_workspace_bytes(const MoeArgs& a);
// ---- moe_gemv.cu: few pairs (decode), one warp per output row; not batch-invariant against the
// grouped path (other summation order), so used only when invariance is off. Needs bf16, F and Dl
// multiples of 8 (<= 8192), 16-byte aligned weights and at most kMoeGemvMaxPairs = M*k pairs.
inline constexpr int kMoeGemvMaxPairs = 32;
bool moe_gemv_supported(const MoeArgs& a);
size_t moe_gemv_workspace_bytes(const MoeArgs& a);
void launch_moe_gemv(const MoeArgs& a, void* workspace, cudaStream_t s);
// The grouped GEMMs' form (moe_grouped.cu; the same bits in each): form 0 picks by the grid, the
// narrow, deep one where the wide tiles of N columns would give fewer blocks than num_sms; 1 wide, 2 narrow.
bool moe_grouped_narrow(int tiles_max, int N, int num_sms, int form);
void launch_moe_grouped(const MoeArgs& a, void* workspace, int num_sms, int form, cudaStream_t s);

}  // namespace k3::cuda
