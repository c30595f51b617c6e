// CudaBackend's attention-family ops (KDA gate / recurrence / chunked prefill / decode step, MLA
// prefill and decode, the LSE merge): argument checks, workspaces, then the launchers.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <set>
#include <string>

#include "kernels/cuda/arg_checks.h"
#include "kernels/cuda/cuda_backend.h"
#include "kernels/cuda/kda_split_plan.h"
#include "kernels/cuda/launch.h"

namespace k3::cuda {

using namespace args;

void CudaBackend::kda_gate(const ops::KdaGateParams& p) {
  const char* op = "kda_gate";
  const FIn f = fin(op, "f", p.f, 2);
  const int H = p.heads;
  K3_CHECK(H > 0 && p.f.dim(1) % H == 0, "kda_gate: heads " + std::to_string(H) + " does not divide f width");
  const int64_t T = p.f.dim(0), D = p.f.dim(1) / H;
  K3_CHECK(p.a_log.numel() >= H, "kda_gate: a_log needs at least heads entries");
  need_shape(op, "dt_bias", p.dt_bias, {H * D});
  need_shape(op, "g", p.g, {T, H, D});
  launch_kda_gate(f, f32(op, "a_log", p.a_log), f32(op, "dt_bias", p.dt_bias), f32(op, "g", p.g), T, H, int(D),
                  p.g_min, p.form == ops::GateForm::Softplus, stream_);
}

namespace {
struct KdaCheck {
  KdaArgs args;
  int64_t T = 0, num_slots = 0;
};
KdaCheck check_kda(const char* op, const ops::KdaParams& p) {
  KdaCheck c;
  KdaArgs& a = c.args;
  a.q = fin(op, "q", p.q, 3);
  c.T = p.q.dim(0);
  a.H = int(p.q.dim(1));
  a.K = int(p.q.dim(2));
  a.k = fin(op, "k", p.k, 3);
  need_shape(op, "k", p.k, p.q.shape());
  a.v = fin(op, "v", p.v, 3);
  a.V = int(p.v.dim(2));
  need_shape(op, "v", p.v, {c.T, a.H, a.V});
  need_shape(op, "g", p.g, p.q.shape());
  a.g = f32(op, "g", p.g);
  need_shape(op, "beta", p.beta, {c.T, a.H});
  a.beta = f32(op, "beta", p.beta);
  a.state = f32(op, "state", p.state);
  K3_CHECK(p.state.ndim() == 4 && p.state.dim(1) == a.H && p.state.dim(2) == a.V && p.state.dim(3) == a.K,
           std::string(op) + ": state: expected [slots, H, V, K], got " + shape_str(p.state.shape()));
  c.num_slots = p.state.dim(0);
  a.o = fout(op, "o", p.o);
  need_shape(op, "o", p.o, {c.T, a.H, a.V});
  a.N = int(p.slots.numel());
  need_i32(op, "slots", p.slots, a.N);
  need_i32(op, "cu_seqlens", p.cu_seqlens, a.N + 1);
  K3_CHECK(a.K <= 256 && a.V <= 1024, std::string(op) + ": K must be <= 256 and V <= 1024");
  return c;
}

// The optional checkpoint output (ops::KdaParams): interval a multiple of `multiple_of`, table
// [N, M] I32, slots distinct and inside the checkpoint tensor (read on the host: a prefill call).
// Sets a.ckpt / ckpt_num_slots / ckpt_m / ckpt_interval; a.ckpt_slots is set by the caller from device_ints.
void check_kda_checkpoints(const char* op, const ops::KdaParams& p, KdaArgs& a, int multiple_of, cudaStream_t s) {
  if (p.checkpoint_interval == 0) return;
  const int I = p.checkpoint_interval;
  K3_CHECK(I > 0 && I % multiple_of == 0, std::string(op) + ": checkpoint_interval must be a positive multiple of " +
                                              std::to_string(multiple_of) + ", got " + std::to_string(I));
  float* ck = f32(op, "checkpoints", p.checkpoints);
  K3_CHECK(p.checkpoints.ndim() == 4 && p.checkpoints.dim(1) == a.H && p.checkpoints.dim(2) == a.V &&
               p.checkpoints.dim(3) == a.K,
           std::string(op) + ": checkpoints: expected [slots, H, V, K], got " + shape_str(p.checkpoints.shape()));
  need_i32(op, "checkpoint_slots", p.checkpoint_slots, -1);
  K3_CHECK(p.checkpoint_slots.ndim() == 2 && p.checkpoint_slots.dim(0) == a.N,
           std::string(op) + ": checkpoint_slots: expected [N = " + std::to_string(a.N) + ", M], got " +
               shape_str(p.checkpoint_slots.shape()));
  const int64_t num = p.checkpoints.dim(0);
  std::vector<bool> used(size_t(num), false);
  const std::vector<int32_t> tbl = host_ints(p.checkpoint_slots, s);
  for (size_t i = 0; i < tbl.size(); ++i) {
    if (tbl[i] < 0) continue;
    K3_CHECK(tbl[i] < num, std::string(op) + ": checkpoint_slots entry " + std::to_string(i) + " = " +
                               std::to_string(tbl[i]) + " is outside [0, " + std::to_string(num) + ")");
    K3_CHECK(!used[size_t(tbl[i])], std::string(op) + ": checkpoint_slots: slot " + std::to_string(tbl[i]) +
                                        " appears twice");
    used[size_t(tbl[i])] = true;
  }
  a.ckpt = ck;
  a.ckpt_num_slots = num;
  a.ckpt_m = int(p.checkpoint_slots.dim(1));
  a.ckpt_interval = I;
}

// Sequence n's rows of the call, [begin, end) pairs: ops::KdaParams::seq_rows where given (checked to lie
// inside the sequence), else cu_seqlens' (read on the host: a prefill call).
std::vector<int32_t> kda_row_ranges(const char* op, const ops::KdaParams& p, int N, int64_t T, cudaStream_t s) {
  const std::vector<int32_t> cu = host_ints(p.cu_seqlens, s);
  K3_CHECK(!cu.empty() && cu.front() == 0 && cu.back() == T, std::string(op) + ": cu_seqlens must run from 0 to T");
  std::vector<int32_t> rows(size_t(2 * N));
  for (int n = 0; n < N; ++n) {
    K3_CHECK(cu[n + 1] >= cu[n], std::string(op) + ": cu_seqlens must be non-decreasing");
    rows[2 * n] = cu[n];
    rows[2 * n + 1] = cu[n + 1];
  }
  if (p.seq_rows.empty()) return rows;
  need_i32(op, "seq_rows", p.seq_rows, 2 * int64_t(N));
  const std::vector<int32_t> given = host_ints(p.seq_rows, s);
  for (int n = 0; n < N; ++n)
    K3_CHECK(cu[n] <= given[2 * n] && given[2 * n] <= given[2 * n + 1] && given[2 * n + 1] <= cu[n + 1],
             std::string(op) + ": seq_rows[" + std::to_string(n) + "] = [" + std::to_string(given[2 * n]) + ", " +
                 std::to_string(given[2 * n + 1]) + ") is not an ordered range inside the sequence's rows [" +
                 std::to_string(cu[n]) + ", " + std::to_string(cu[n + 1]) + ")");
  return given;
}
}  // namespace

void CudaBackend::kda_recurrent(const ops::KdaParams& p) {
  KdaCheck c = check_kda("kda_recurrent", p);
  check_kda_checkpoints("kda_recurrent", p, c.args, 1, stream_);
  if (!p.seq_rows.empty()) (void)kda_row_ranges("kda_recurrent", p, c.args.N, c.T, stream_);  // checks them
  // Absent tables (checkpoints, row ranges) are default (0-d) tensors: staged only when given.
  std::vector<const Tensor*> ints = {&p.slots, &p.cu_seqlens};
  if (c.args.ckpt) ints.push_back(&p.checkpoint_slots);
  if (!p.seq_rows.empty()) ints.push_back(&p.seq_rows);
  const auto ptrs = device_ints(ints);
  c.args.slots = ptrs[0];
  c.args.cu_seqlens = ptrs[1];
  if (c.args.ckpt) c.args.ckpt_slots = ptrs[2];
  if (!p.seq_rows.empty()) c.args.seq_rows = ptrs.back();
  launch_kda_recurrent(c.args, stream_);
}

void CudaBackend::kda_chunk(const ops::KdaParams& p) {
  KdaCheck c = check_kda("kda_chunk", p);
  KdaArgs& a = c.args;
  K3_CHECK(p.chunk_size >= 1, "kda_chunk: chunk_size must be >= 1, got " + std::to_string(p.chunk_size));
  K3_CHECK(p.checkpoint_interval == 0 || (p.checkpoint_interval > 0 && p.checkpoint_interval % p.chunk_size == 0),
           "kda_chunk: checkpoint_interval must be a positive multiple of " + std::to_string(p.chunk_size) +
               ", got " + std::to_string(p.checkpoint_interval));
  // Same function, token by token, where the chunked kernel's head shape does not fit. A gate without
  // K3's lower bound (Kimi Linear's softplus) takes the chunked kernel's run-sum variant, whose
  // exponents stay exact and finite for any g <= 0 (docs/MODEL.md §2.4).
  if (!kda_chunk_kernel_fits(a.K, a.V, p.chunk_size)) {
    kda_recurrent(p);
    return;
  }
  a.unbounded_gate = !p.bounded_gate;
  a.scan_wgmma = kda_scan_wgmma_;
  a.scan_wg_rows = kda_scan_wg_rows_;
  // Batch-invariant mode: one scan form for every grid and no split scan, so a chunk's bits depend on
  // its state and its own rows alone (the caller cuts calls at absolute multiples of 64 tokens for
  // them to match: engine/kda_heads.h).
  a.scan_one_form = batch_invariant_;
  check_kda_checkpoints("kda_chunk", p, a, 64, stream_);
  const std::vector<int32_t> rows = kda_row_ranges("kda_chunk", p, a.N, c.T, stream_);
  // Chunk table: (first token, length, sequence, index in sequence) and each sequence's first chunk.
  std::vector<int32_t> table, seq0;
  for (int n = 0; n < a.N; ++n) {
    seq0.push_back(int32_t(table.size() / 4));
    for (int32_t t = rows[2 * n], i = 0; t < rows[2 * n + 1]; t += 64, ++i) {
      table.insert(table.end(), {t, std::min<int32_t>(64, rows[2 * n + 1] - t), n, i});
    }
  }
  seq0.push_back(int32_t(table.size() / 4));
  const int num_chunks = int(table.size() / 4);
  // Long sequences with few heads: segments scanned at once and fixed up (kda_split_plan.h).
  const KdaSplitPlan split = kda_split_ && !batch_invariant_ ? plan_kda_split(seq0, a.H, num_sms_) : KdaSplitPlan{};
  auto job_ints = [](const std::vector<KdaScanJob>& jobs) {
    std::vector<int32_t> v(jobs.size() * 8);
    if (!jobs.empty()) std::memcpy(v.data(), jobs.data(), v.size() * 4);
    return Tensor::from_i32({int64_t(v.size())}, v);
  };
  Tensor table_t = Tensor::from_i32({int64_t(table.size())}, table);
  Tensor seq0_t = Tensor::from_i32({int64_t(seq0.size())}, seq0);
  Tensor pass1_t = job_ints(split.pass1), pass3_t = job_ints(split.pass3);
  Tensor fixup_t = Tensor::from_i32({int64_t(split.fixup.size())}, split.fixup);
  const Tensor no_ckpt = Tensor::from_i32({0}, {});  // staged as nothing
  const auto ptrs = device_ints({&p.slots, &p.cu_seqlens, &table_t, &seq0_t, &pass1_t, &pass3_t, &fixup_t,
                                 a.ckpt ? &p.checkpoint_slots : &no_ckpt});
  a.slots = ptrs[0];
  a.cu_seqlens = ptrs[1];
  if (a.ckpt) a.ckpt_slots = ptrs[7];
  const int64_t work_floats = kda_chunk_workspace_floats(num_chunks, a.H);
  const int64_t carry_floats = kda_split_carry_floats(split, a.H);
  auto* work = static_cast<float*>(work_.ensure(size_t(work_floats + carry_floats) * 4 + 256));
  if (!split.split()) {
    launch_kda_chunk(a, ptrs[2], ptrs[3], num_chunks, work, num_sms_, stream_);
    return;
  }
  launch_kda_chunk_split(a, ptrs[2], num_chunks, work, split, reinterpret_cast<const KdaScanJob*>(ptrs[4]),
                         reinterpret_cast<const KdaScanJob*>(ptrs[5]), ptrs[6], work + work_floats, num_sms_, stream_);
}

void CudaBackend::kda_decode(const ops::KdaDecodeParams& p) {
  const char* op = "kda_decode";
  KdaDecodeArgs a;
  a.H = p.heads;
  a.qkv = fin(op, "qkv", p.qkv, 2);
  a.B = int(p.qkv.dim(0));
  K3_CHECK(a.H > 0 && p.qkv.dim(1) % (3 * a.H) == 0, "kda_decode: qkv width must be 3*heads*D");
  a.D = int(p.qkv.dim(1) / (3 * a.H));
  K3_CHECK(a.D == 64 || a.D == 128, "kda_decode: head dim " + std::to_string(a.D) + " not supported (64 or 128)");
  const int64_t P = int64_t(a.H) * a.D;
  a.conv_w = fin(op, "conv_w", p.conv_w, 2);
  a.W = int(p.conv_w.dim(1));
  need_shape(op, "conv_w", p.conv_w, {3 * P, a.W});
  a.conv_cache = fout(op, "conv_cache", p.conv_cache, 3);
  K3_CHECK(p.conv_cache.dim(1) == a.W - 1 && p.conv_cache.dim(2) == 3 * P,
           "kda_decode: conv_cache: expected [slots, W-1, 3P], got " + shape_str(p.conv_cache.shape()));
  a.f = fin(op, "f", p.f);
  need_shape(op, "f", p.f, {a.B, P});
  K3_CHECK(p.a_log.numel() >= a.H, "kda_decode: a_log needs at least heads entries");
  a.a_log = f32(op, "a_log", p.a_log);
  need_shape(op, "dt_bias", p.dt_bias, {P});
  a.dt_bias = f32(op, "dt_bias", p.dt_bias);
  a.b = fin(op, "b", p.b);
  need_shape(op, "b", p.b, {a.B, a.H});
  a.state = f32(op, "state", p.state);
  const bool own_conv_rows = p.conv_slots.defined();   // a unified region: conv rows apart from state rows
  K3_CHECK(p.state.ndim() == 4 && (own_conv_rows || p.state.dim(0) == p.conv_cache.dim(0)) && p.state.dim(1) == a.H &&
               p.state.dim(2) == a.D && p.state.dim(3) == a.D,
           "kda_decode: state: expected [slots, H, D, D] with the conv cache's slots, got " + shape_str(p.state.shape()));
  need_i32(op, "slots", p.slots, a.B);
  if (own_conv_rows) need_i32(op, "conv_slots", p.conv_slots, a.B);
  a.o = fout(op, "o", p.o);
  need_shape(op, "o", p.o, {a.B, a.H, a.D});
  a.g_min = p.g_min;
  a.softplus = p.form == ops::GateForm::Softplus;
  a.as_steps = batch_invariant_;
  a.q_scale = 1.f / std::sqrt(static_cast<float>(a.D));  // the engine's l2norm scale of q, the same expression
  const auto rows = device_ints({&p.slots, own_conv_rows ? &p.conv_slots : &p.slots});
  a.slots = rows[0];
  a.conv_slots = rows[1];
  launch_kda_decode(a, stream_);
}

void CudaBackend::mla_prefill(const ops::MlaPrefillParams& p) {
  const char* op = "mla_prefill";
  MlaPrefillArgs a;
  a.q = fin(op, "q", p.q, 3);
  a.T = int(p.q.dim(0));
  a.H = int(p.q.dim(1));
  a.Dqk = int(p.q.dim(2));
  a.k = fin(op, "k", p.k, 3);
  a.S = int(p.k.dim(0));
  need_shape(op, "k", p.k, {a.S, a.H, a.Dqk});
  a.v = fin(op, "v", p.v, 3);
  a.Dv = int(p.v.dim(2));
  need_shape(op, "v", p.v, {a.S, a.H, a.Dv});
  a.o = fout(op, "o", p.o);
  need_shape(op, "o", p.o, {a.T, a.H, a.Dv});
  if (!p.lse.empty()) {
    need_shape(op, "lse", p.lse, {a.T, a.H});
    a.lse = f32(op, "lse", p.lse);
  }
  K3_CHECK(p.past >= 0 && p.past + a.T <= a.S, "mla_prefill: past + T must be <= S");
  a.past = p.past;
  a.scale = p.scale != 0.f ? p.scale : 1.f / std::sqrt(float(a.Dqk));
  if (!(a.q.bf16 && a.k.bf16 && a.v.bf16) || a.T < 16) {
    launch_mla_prefill(a, stream_);  // the simple kernel: any dtype, short chunks
    return;
  }
  // GEMM form on the tensor cores, a group of heads at a time (scores bounded to ~2 GiB):
  // S_h = scale Q_h K_h^T (F32), P_h = causal softmax (bf16), O_h = P_h V_h.
  const int64_t T = a.T, S = a.S, H = a.H, Dqk = a.Dqk, Dv = a.Dv;
  const int64_t per_head = T * S;
  const int64_t group = std::clamp<int64_t>((int64_t(2) << 30) / std::max<int64_t>(per_head * 6, 1), 1, H);
  void* raw = nullptr;
  K3_CUDA_OK(cudaMallocAsync(&raw, size_t(group * per_head) * 6, stream_));
  auto* scores = static_cast<float*>(raw);
  auto* probs = reinterpret_cast<__nv_bfloat16*>(scores + group * per_head);
  const auto* q = static_cast<const __nv_bfloat16*>(p.q.data());
  const auto* k = static_cast<const __nv_bfloat16*>(p.k.data());
  const auto* v = static_cast<const __nv_bfloat16*>(p.v.data());
  for (int64_t h0 = 0; h0 < H; h0 += group) {
    const int64_t g = std::min(group, H - h0);
    GemmShape qk{.M = T, .N = S, .K = Dqk, .ldx = H * Dqk, .ldw = H * Dqk, .ldy = S, .batch = g, .stride_x = Dqk,
                 .stride_w = Dqk, .stride_y = per_head, .y_f32 = true};
    gemm_->run(qk, q + h0 * Dqk, k + h0 * Dqk, scores, a.scale, 0.f, stream_);
    launch_causal_softmax(scores, probs, a.lse, int(g), int(T), int(S), int(H), int(h0), a.past, stream_);
    GemmShape pv{.M = T, .N = Dv, .K = S, .ldx = S, .ldw = H * Dv, .ldy = H * Dv, .batch = g, .stride_x = per_head,
                 .stride_w = Dv, .stride_y = Dv, .y_f32 = p.o.dtype() == DType::F32, .w_kn = true};
    const size_t esz = dtype_size(p.o.dtype());
    gemm_->run(pv, probs, v + h0 * Dv, static_cast<char*>(p.o.data()) + h0 * Dv * esz, 1.f, 0.f, stream_);
  }
  K3_CUDA_OK(cudaFreeAsync(raw, stream_));
}

void CudaBackend::mla_decode(const ops::MlaDecodeParams& p) {
  const char* op = "mla_decode";
  MlaDecodeArgs a;
  a.q_lat = bf16(op, "q_lat", p.q_lat);
  K3_CHECK(p.q_lat.ndim() == 3, "mla_decode: q_lat must be [B, H, R]");
  a.B = int(p.q_lat.dim(0));
  a.H = int(p.q_lat.dim(1));
  a.R = int(p.q_lat.dim(2));
  a.q_rope = bf16(op, "q_rope", p.q_rope);
  K3_CHECK(p.q_rope.ndim() == 3 && p.q_rope.dim(0) == a.B && p.q_rope.dim(1) == a.H,
           "mla_decode: q_rope: expected [B, H, Dr], got " + shape_str(p.q_rope.shape()));
  a.Dr = int(p.q_rope.dim(2));
  a.kv = bf16(op, "kv_cache", p.kv_cache);
  K3_CHECK(p.kv_cache.ndim() == 3 && p.kv_cache.dim(2) == a.R + a.Dr,
           "mla_decode: kv_cache: expected [pages, page_size, R+Dr], got " + shape_str(p.kv_cache.shape()));
  a.page_size = int(p.kv_cache.dim(1));
  K3_CHECK(p.block_table.ndim() == 2 && p.block_table.dim(0) == a.B,
           "mla_decode: block_table: expected [B, max_pages], got " + shape_str(p.block_table.shape()));
  need_i32(op, "block_table", p.block_table, -1);
  a.max_pages = int(p.block_table.dim(1));
  need_i32(op, "seq_lens", p.seq_lens, a.B);
  a.o = fout(op, "o", p.o);
  need_shape(op, "o", p.o, {a.B, a.H, a.R});
  need_shape(op, "lse", p.lse, {a.B, a.H});
  a.lse = f32(op, "lse", p.lse);
  a.scale = p.scale;
  a.use_wgmma = mla_wgmma_;
  a.wgmma_split_s = mla_split_s_;
  a.l2_prefetch_tiles = std::max(0, mla_l2_prefetch_);
  a.wgmma_tma = mla_tma_;
  a.wgmma_lazy_rescale = mla_lazy_;
  a.wgmma_seesaw = mla_seesaw_;
  a.wgmma_seesaw_halves = mla_seesaw_halves_;
  a.wgmma_cluster = mla_cluster_;
  a.wgmma_t32 = mla_t32_;
  a.wgmma_t48 = mla_t48_;
  a.wgmma_roles = mla_roles_;
  a.kv_rows = p.kv_cache.dim(0) * p.kv_cache.dim(1);
  const auto ptrs = device_ints({&p.block_table, &p.seq_lens});
  a.block_table = ptrs[0];
  a.seq_lens = ptrs[1];
  MlaDecodePlan plan =
      plan_mla_decode(a.B, a.H, a.max_pages * a.page_size, num_sms_, a.use_wgmma && a.R == 512 && a.Dr == 64,
                      mla_wgmma_head_form(a));
  if (batch_invariant_) {
    // Splits of a fixed size, so a request's partials do not depend on the batch (up to 64 splits,
    // the merge's limit; past 64 x kInvariantSplitTokens tokens the size grows in whole multiples).
    const int ctx = std::max(a.max_pages * a.page_size, 1);
    const int units = (ctx + mla_invariant_split_ - 1) / mla_invariant_split_;
    const int plan_splits = plan.splits;
    plan.tokens_per_split = mla_invariant_split_ * ((units + 63) / 64);
    plan.splits = (ctx + plan.tokens_per_split - 1) / plan.tokens_per_split;
    // As many blocks per request as the plan would run: each takes its share of the fixed splits in
    // turn (MlaDecodePlan::splits_per_block; the result is the same however many it takes).
    plan.splits_per_block = mla_splits_per_block_ > 0 ? mla_splits_per_block_
                                                      : (plan.splits + plan_splits - 1) / std::max(plan_splits, 1);
  }
  if (mla_splits_ > 0) {  // held by set_mla_decode_splits: equal whole 64-token tiles
    const int tiles = std::max(1, (a.max_pages * a.page_size + 63) / 64);
    const int per = (tiles + mla_splits_ - 1) / mla_splits_;
    plan.tokens_per_split = per * 64;
    plan.splits = (tiles + per - 1) / per;
  }
  auto* work = static_cast<float*>(grow(mla_work_, size_t(mla_decode_workspace_floats(plan, a.B, a.H, a.R)) * 4 + 256));
  launch_mla_decode(a, plan, work, stream_);
}

void CudaBackend::lse_merge(const ops::LseMergeParams& p) {
  const char* op = "lse_merge";
  const FIn parts = fin(op, "o_parts", p.o_parts, 4);
  const int64_t N = p.o_parts.dim(0), B = p.o_parts.dim(1), H = p.o_parts.dim(2), D = p.o_parts.dim(3);
  need_shape(op, "lse_parts", p.lse_parts, {N, B, H});
  need_shape(op, "o", p.o, {B, H, D});
  float* lse = nullptr;
  if (!p.lse.empty()) {
    need_shape(op, "lse", p.lse, {B, H});
    lse = f32(op, "lse", p.lse);
  }
  launch_lse_merge(parts, f32(op, "lse_parts", p.lse_parts), fout(op, "o", p.o), lse, int(N), B * H, int(D), stream_);
}

}  // namespace k3::cuda
