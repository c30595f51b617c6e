// The op interface: every op the model needs, once, as a params struct filled by name.
// Shapes are written beside every tensor; all tensors are contiguous row-major.
// CPU backend: F32 host tensors (I32 for indices). CUDA backend: BF16 activations/weights,
// F32 for KDA state, gates, beta, softmax statistics and router scores (stated per field).
// Outputs are preallocated by the caller (Backend::alloc); ops never allocate their outputs, so a
// decode step can be graph-captured.
#pragma once
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "common/core/counter_random.h"
#include "common/core/tensor.h"

namespace k3::ops {

// The KDA decay gate's form (docs/MODEL.md §2.2): K3's lower-bounded sigmoid or Kimi Linear's
// unbounded softplus, g = -exp(A_log[h]) * softplus(f + dt_bias).
enum class GateForm { LowerBoundedSigmoid, Softplus };
// The gated MLP activation act(g, u): K3's SiTU or SiLU(g) * u.
enum class GluAct { Situ, Silu };

// y = alpha * x @ w^T + beta * y.
struct GemmParams {
  Tensor x;  // [M, K]
  Tensor w;  // [N, K]  (HF weight layout: out x in)
  Tensor y;  // [M, N]  output
  float alpha = 1.f;
  float beta = 0.f;  // 0: y is overwritten (its old content is never read, NaN-safe)
};

// y = w * x / sqrt(mean(x^2) + eps), row-wise over the last dim.
struct RmsNormParams {
  Tensor x;  // [M, D]
  Tensor w;  // [D] (may be empty: no scale)
  Tensor y;  // [M, D] output (may alias x)
  float eps = 1e-5f;
};

// Per row of D: y = scale * x / sqrt(sum(x^2) + eps)  (eps inside the sqrt, as fla's l2norm).
struct L2NormParams {
  Tensor x;  // [M, D]
  Tensor y;  // [M, D] output (may alias x)
  float eps = 1e-6f;
  float scale = 1.f;
};

// Depthwise causal conv (kernel W) + SiLU over a varlen batch, updating each sequence's cache.
// Token t of sequence n sees [cache rows (W-1) ; new rows] and the cache becomes the last W-1
// pre-conv rows. Used for KDA q/k/v (fused channel dim C = 3P).
struct ShortConvParams {
  Tensor x;           // [T_total, C] pre-conv rows, sequences concatenated
  Tensor w;           // [C, W] taps; w[c, W-1] multiplies the current token
  Tensor cache;       // [num_slots, W-1, C] conv caches (read, then updated in place)
  Tensor slots;       // [N] I32: cache slot of each sequence
  Tensor cu_seqlens;  // [N+1] I32: sequence n owns rows [cu[n], cu[n+1])
  Tensor y;           // [T_total, C] output (must not alias x)
};

// Lower-bounded ("safe") KDA decay gate, fp32 out:
// g[t,h,i] = g_min * sigmoid(exp(A_log[h]) * (f[t,h*D+i] + dt_bias[h*D+i])).
struct KdaGateParams {
  Tensor f;        // [T, H*D] decay logits
  Tensor a_log;    // [>=H] F32 (the K3 file stores 128 values; the first H are used)
  Tensor dt_bias;  // [H*D] F32
  Tensor g;        // [T, H, D] F32 output (log-decay, in (g_min, 0); Softplus: any value < 0)
  int heads = 0;
  float g_min = -5.f;  // LowerBoundedSigmoid only
  GateForm form = GateForm::LowerBoundedSigmoid;
};

// KDA over a varlen batch. q, k are already L2-normalised (q also scaled by D^-1/2).
// state: per-slot recurrent state S stored [V][K] (K contiguous), read as the initial state and
// overwritten with the final state. o is the raw recurrence output (before the gated RMSNorm).
struct KdaParams {
  Tensor q;           // [T_total, H, K]
  Tensor k;           // [T_total, H, K]
  Tensor v;           // [T_total, H, V]
  Tensor g;           // [T_total, H, K] F32 log-decay
  Tensor beta;        // [T_total, H] F32 in (0,1)
  Tensor state;       // [num_slots, H, V, K] F32, in/out
  Tensor slots;       // [N] I32 state slot per sequence
  Tensor cu_seqlens;  // [N+1] I32
  // Optional [N, 2] I32: sequence n's rows in this call are [seq_rows[n][0], seq_rows[n][1]) instead of
  // [cu_seqlens[n], cu_seqlens[n+1]); rows outside every range are neither read nor written. It lets a
  // caller run one sequence's rows in pieces by different forms (the chunk-invariant rule,
  // engine/kda_heads.h). Checkpoint positions then count from the range's first row.
  Tensor seq_rows;
  Tensor o;           // [T_total, H, V] output
  int chunk_size = 64;  // chunked form only
  // Optional state checkpoints (for a prefix cache): with checkpoint_interval = I > 0, the state
  // sequence n reaches after (j+1)·I of its tokens in this call is also written, in fp32, to
  // checkpoints[checkpoint_slots[n, j]]. Entries < 0 are skipped, and so are checkpoints past the
  // table's width M (size M to the longest sequence / I). Positions count from the sequence's first
  // token in this call, so a caller resuming from a cached state at an aligned position keeps the
  // checkpoints aligned. kda_chunk needs I to be a multiple of chunk_size.
  Tensor checkpoints;       // [num_ckpt_slots, H, V, K] F32, written only (empty when I = 0)
  Tensor checkpoint_slots;  // [N, M] I32
  int checkpoint_interval = 0;
  bool bounded_gate = true;  // every g >= -5 (K3's gate); false for Kimi Linear's softplus gate
};

// One decode token per request, fused: conv update on q/k/v, L2 norm, gate, beta, delta rule.
struct KdaDecodeParams {
  Tensor qkv;         // [B, 3*H*D] pre-conv projections (q | k | v)
  Tensor conv_w;      // [3*H*D, W]
  Tensor conv_cache;  // [num_slots, W-1, 3*H*D] in/out
  Tensor f;           // [B, H*D] decay logits
  Tensor a_log;       // [>=H] F32
  Tensor dt_bias;     // [H*D] F32
  Tensor b;           // [B, H] beta logits (sigmoid applied inside)
  Tensor state;       // [num_slots, H, D, D] F32 in/out ([V][K])
  Tensor slots;       // [B] I32 state row of each request (and its conv_cache row unless conv_slots is set)
  // [B] I32 conv_cache row of each request, when it differs from its state row (a unified cache region
  // lays conv windows and states out at different strides: engine/cache_region.h). Empty: slots.
  Tensor conv_slots;
  Tensor o;           // [B, H, D] output (before gated norm)
  int heads = 0;
  float g_min = -5.f;
  GateForm form = GateForm::LowerBoundedSigmoid;
};

// Causal attention with materialised K/V (MLA prefill, NoPE). The T query rows sit at absolute
// positions [past, past+T); key row j is at position j. Query t attends to keys j <= past + t.
struct MlaPrefillParams {
  Tensor q;       // [T, H, Dqk]     Dqk = d_n + d_r
  Tensor k;       // [S, H, Dqk]     S = past + T
  Tensor v;       // [S, H, Dv]
  Tensor o;       // [T, H, Dv] output
  Tensor lse;     // [T, H] F32 output, natural log (may be empty)
  int64_t past = 0;
  float scale = 0.f;  // softmax scale, usually (d_n+d_r)^-1/2
};

// Absorbed MLA decode over a paged latent cache (MQA, 1 KV head of width r_kv + d_r).
// Score s[b,h,t] = (q_lat[b,h]·c_t + q_rope[b,h]·kr_t) * scale; o[b,h] = sum softmax(s) c_t.
struct MlaDecodeParams {
  Tensor q_lat;        // [B, H, R]  R = r_kv (q^N absorbed through W^UK)
  Tensor q_rope;       // [B, H, Dr]
  Tensor kv_cache;     // [num_pages, page_size, R + Dr]  row = [c (R) | kr (Dr)]
  Tensor block_table;  // [B, max_pages] I32 page ids
  Tensor seq_lens;     // [B] I32 cached tokens per request (0 allowed: o = 0, lse = -inf)
  Tensor o;            // [B, H, R] output (latent; caller applies W^UV)
  Tensor lse;          // [B, H] F32 output, natural log
  float scale = 0.f;
};

// Merge N partial attention results over disjoint key sets (split-KV / DCP):
// lse = log sum_n exp(lse_n), o = sum_n exp(lse_n - lse) o_n. A partition with lse = -inf
// (no keys) contributes nothing; if all are empty, o = 0 and lse = -inf.
struct LseMergeParams {
  Tensor o_parts;    // [N, B, H, D]
  Tensor lse_parts;  // [N, B, H] F32
  Tensor o;          // [B, H, D] output
  Tensor lse;        // [B, H] F32 output (may be empty)
};

// Block AttnRes mix (fp32 math): p = softmax_j( (w ⊙ γ)·V_j / sqrt(mean(V_j²)+eps) ),
// y = sum_j p_j V_j, per row.
struct AttnResMixParams {
  std::vector<Tensor> candidates;  // m tensors of [M, D]
  Tensor query;                    // [D] F32: w ⊙ γ (precomputed at load)
  Tensor y;                        // [M, D] output
  float eps = 1e-5f;
};

// SiTU(g, u) = beta*tanh(g/beta)*sigmoid(g) * beta_l*tanh(u/beta_l), element-wise.
struct SituParams {
  Tensor g;  // [M, F]
  Tensor u;  // [M, F]
  Tensor y;  // [M, F] output (may alias g)
  float beta = 4.f;         // Situ only
  float beta_linear = 25.f;
  GluAct act = GluAct::Situ;
};

// noaux_tc router: s = sigmoid(logits) (fp32); pick top-k of s + bias; weights = rho * s / sum(s_sel).
// Ties break toward the lower expert id. Selected ids are written in descending (s+bias) order.
struct RouterTopkParams {
  Tensor logits;   // [M, E] F32
  Tensor bias;     // [E] F32 e_score_correction_bias
  Tensor ids;      // [M, k] I32 output
  Tensor weights;  // [M, k] F32 output
  int k = 0;
  float scale = 1.f;  // routed_scaling_factor
};

// LatentMoE routed experts: y[m] = sum_j weights[m,j] * W2_e SiTU(W1_e z[m], W3_e z[m]), e = ids[m,j].
struct MoeExpertsParams {
  Tensor z;        // [M, Dl] latent input
  Tensor ids;      // [M, k] I32
  Tensor weights;  // [M, k] F32
  Tensor w1;       // [E, F, Dl]
  Tensor w3;       // [E, F, Dl]
  Tensor w2;       // [E, Dl, F]
  Tensor y;        // [M, Dl] output
  float beta = 4.f;         // Situ only
  float beta_linear = 25.f;
  GluAct act = GluAct::Situ;  // Silu: the experts are SiLU-gated MLPs (Kimi Linear)
};

// Element-wise helpers the model composes.
struct AddParams { Tensor a, b, y; };                 // y = a + b, all [M, D] (y may alias a)
struct SigmoidMulParams { Tensor x, gate, y; };       // y = x * sigmoid(gate), all [M, D]
struct EmbeddingParams { Tensor table, ids, y; };     // table [V, D], ids [M] I32, y [M, D]

// Data movement the model composes (host defaults in kernels/backend.cpp; device backends override).
// dst[r, dst_col + j] = src[r / src_row_repeat, src_col + j] for j < ncols (ncols -1: all src columns
// from src_col). src_row_repeat broadcasts one src row to consecutive dst rows (e.g. MLA's shared k^R
// to every head). Same dtype both sides.
struct CopyColsParams {
  Tensor src;  // [Ms, Ns]
  Tensor dst;  // [Ms * src_row_repeat, Nd]
  int64_t src_col = 0;
  int64_t dst_col = 0;
  int64_t ncols = -1;
  int src_row_repeat = 1;
};
// dst[ids[r]] = src[r] (rows); used to write new MLA cache rows into pages (ids = page*page_size + offset).
struct ScatterRowsParams {
  Tensor src;  // [R, W]
  Tensor ids;  // [R] I32, distinct, < dst rows
  Tensor dst;  // [N, W] in/out
};
// Per-head GEMM: y[m, h, :] = x[m, h, :] @ w[h]^T. MLA absorb (q^N -> latent) and un-absorb (latent -> v).
struct HeadGemmParams {
  Tensor x;  // [M, H, K]
  Tensor w;  // [H, N, K]
  Tensor y;  // [M, H, N] output
};

// Generated weights filled in place (common/core/counter_random.h): y[i] = uniform(seed, first + i,
// scale), rounded to bf16 first when round_to_bf16 (what a bf16 file of the same draw holds), then
// stored in y's dtype. `first` > 0 draws a part of a larger tensor (a rank's rows of it) alone.
struct FillUniformParams {
  Tensor y;  // any shape, F32 or BF16, contiguous
  uint64_t seed = 0;
  float scale = 0.f;
  bool round_to_bf16 = false;
  int64_t first = 0;  // the draw's index of y's first element
};

// OpenAI's logit_bias: added to one token's logit before the draw.
struct LogitBias {
  int32_t token = 0;
  float bias = 0.f;  // in [-100, 100]
  bool operator==(const LogitBias&) const = default;
};

// Sampling, one row per request. First the logit biases (each added to its token's logit), then the
// penalties (OpenAI's presence and frequency penalties, over the tokens the request generated so far:
// the prompt's do not count): token t's logit minus frequency_penalty * (times t was generated) +
// presence_penalty (when it was). Then temperature 0 = greedy (argmax, lowest id on ties); otherwise
// logits/temperature -> top_k (0 = off) -> top_p (1 = off) -> draw with the row's RNG.
struct SamplingRow {
  float temperature = 0.f;
  int top_k = 0;
  float top_p = 1.f;
  uint64_t seed = 0;   // the row's stream
  uint64_t step = 0;   // the request's decode step: (seed, step) fixes the draw
  float presence_penalty = 0.f;   // in [-2, 2]
  float frequency_penalty = 0.f;  // in [-2, 2]
  std::span<const int32_t> generated;  // the request's tokens so far (penalties only; not owned)
  std::span<const LogitBias> logit_bias;  // not owned
};
// Whether the biases or the penalties change the row's logits.
inline bool adjusted(const SamplingRow& r) {
  return !r.logit_bias.empty() || ((r.presence_penalty != 0.f || r.frequency_penalty != 0.f) && !r.generated.empty());
}

// The seed stream of choice `choice` of a request asking for n samples of one prompt (OpenAI `n`):
// choice 0 keeps the request's seed, so n = 1 draws exactly what it always drew; choice i > 0 draws
// from splitmix64(seed + i). Local mode, the last prefill stage (first tokens) and decode all use this
// one rule, so every topology gives every choice the same tokens.
inline uint64_t choice_seed(uint64_t seed, uint32_t choice) {
  return choice == 0 ? seed : counter_random::splitmix64(seed + choice);
}
struct SampleParams {
  Tensor logits;                  // [B, V] F32 (host for the CPU backend)
  std::vector<SamplingRow> rows;  // B
  std::vector<int32_t>* out = nullptr;  // B token ids
};

}  // namespace k3::ops
