// The FFN of one rank (engine/rank_step.h): dense and shared experts as Model::ffn_layer computes them;
// routed experts local, or dispatched to their EP ranks and combined back (docs/RANKS.md §EP):
//   1. counts: all_to_all of how many (token, slot) pairs this rank sends each rank;
//   2. dispatch: all_to_allv of records [local expert id | z row], in (token, slot) order per destination;
//   3. each rank runs its experts on what it received (moe_experts with one slot of weight 1: the bare
//      expert output, row-independent);
//   4. combine: all_to_allv back in the same order; the token's rank sums its k slots in slot order.
#include <string>
#include <vector>

#include "engine/rank_step.h"

namespace k3::rank {
namespace {

// Routed experts over EP ranks; ids/weights [R, k] from the router (host copies), z [R, Dl]; y [R, Dl] out.
// The routing (who sends which pair where) is decided on the host from the router's small output; the
// rows move as backend tensors (device memory on a GPU), the local expert ids beside them.
Status ep_experts(Step& s, const LayerWeights& lw, const Tensor& z, const int32_t* ids, const float* wts, int64_t R,
                  int64_t k, Tensor& y) {
  const int N = s.g.ep;
  const int64_t El = s.cfg.num_experts / N, Dl = s.cfg.routed_expert_hidden_size;
  const DType zt = s.be.compute_dtype();
  const size_t row = static_cast<size_t>(Dl) * dtype_size(zt);
  std::vector<std::vector<int64_t>> to(N);  // pair indices m*k + j per destination
  for (int64_t i = 0; i < R * k; ++i) to[ids[i] / El].push_back(i);
  std::vector<int64_t> send_pairs(N), recv_pairs(N);
  for (int q = 0; q < N; ++q) send_pairs[q] = static_cast<int64_t>(to[q].size());
  {
    Tensor sp = Tensor::view(send_pairs.data(), {N}, DType::I64), rp = Tensor::view(recv_pairs.data(), {N}, DType::I64);
    K3_TRY(s.all_to_all(sp, rp));
  }

  // Dispatch, in (destination, token, slot) order: the z row of each pair's token, and its local expert id.
  std::vector<int32_t> src_row, local_id;
  std::vector<int32_t> place;  // the pair (m*k + j) behind each dispatched row, in send order
  for (int q = 0; q < N; ++q)
    for (int64_t i : to[q]) {
      src_row.push_back(static_cast<int32_t>(i / k));
      local_id.push_back(ids[i] % El);
      place.push_back(static_cast<int32_t>(i));
    }
  const int64_t n_out = R * k;
  int64_t n_in = 0;
  std::vector<size_t> send_rows(N), recv_rows(N), send_ids(N), recv_ids(N);
  for (int q = 0; q < N; ++q) {
    n_in += recv_pairs[q];
    send_rows[q] = static_cast<size_t>(send_pairs[q]) * row;
    recv_rows[q] = static_cast<size_t>(recv_pairs[q]) * row;
    send_ids[q] = static_cast<size_t>(send_pairs[q]) * sizeof(int32_t);
    recv_ids[q] = static_cast<size_t>(recv_pairs[q]) * sizeof(int32_t);
  }
  Tensor z_out = s.alloc({n_out, Dl}, zt), z_in = s.alloc({n_in, Dl}, zt);
  if (n_out > 0)
    s.be.embedding({.table = z, .ids = s.be.from_host(Tensor::from_i32({n_out}, src_row), DType::I32), .y = z_out});
  Tensor ids_out = s.be.from_host(Tensor::from_i32({n_out}, local_id), DType::I32);
  Tensor ids_in = s.alloc({n_in}, DType::I32);
  K3_TRY(s.all_to_allv(z_out, send_rows, z_in, recv_rows));
  K3_TRY(s.all_to_allv(ids_out, send_ids, ids_in, recv_ids));

  // This rank's experts on the received rows: one slot of weight 1, the bare expert output, kept F32 (on a
  // GPU the slot sum then rounds once, as moe_experts' own sum does).
  Tensor h_in = s.alloc({n_in, Dl}, DType::F32);
  if (n_in > 0) {
    const std::vector<float> ones(static_cast<size_t>(n_in), 1.f);
    s.be.moe_experts({.z = z_in, .ids = ids_in.reshape({n_in, 1}),
                      .weights = s.be.from_host(Tensor::from_f32({n_in, 1}, ones), DType::F32), .w1 = lw.w1,
                      .w3 = lw.w3, .w2 = lw.w2, .y = h_in, .beta = s.cfg.activation_situ_beta,
                      .beta_linear = s.cfg.activation_situ_linear_beta});
  }

  // Back to the tokens' ranks, in the order they were sent; then each row to its pair's place.
  std::vector<size_t> back_send(N), back_recv(N);
  const size_t h_row = static_cast<size_t>(Dl) * sizeof(float);
  for (int q = 0; q < N; ++q) {
    back_send[q] = static_cast<size_t>(recv_pairs[q]) * h_row;
    back_recv[q] = static_cast<size_t>(send_pairs[q]) * h_row;
  }
  Tensor h_back = s.alloc({n_out, Dl}, DType::F32);
  K3_TRY(s.all_to_allv(h_in, back_send, h_back, back_recv));
  if (R == 0) return Status::ok();
  Tensor expert_out = s.alloc({n_out, Dl}, DType::F32);
  s.be.scatter_rows({.src = h_back, .ids = s.be.from_host(Tensor::from_i32({n_out}, place), DType::I32),
                     .dst = expert_out});
  // The slot sum in slot order on the host, rounding as the backend's moe_experts sums (rank_combine.cpp).
  const Tensor h = s.host_bytes(expert_out);
  Tensor yh = Tensor::zeros({R, Dl}, DType::F32);
  combine_slots(h.f32(), wts, R, k, Dl, yh.f32(), s.be.kind() == BackendKind::Cuda);
  s.be.copy(s.be.from_host(yh, y.dtype()), y);
  return Status::ok();
}

}  // namespace

Status ffn(Step& s, int l, const LayerWeights& lw, const Tensor& x, Tensor& out) {
  const ModelConfig& cfg = s.cfg;
  const float beta = cfg.activation_situ_beta, beta_l = cfg.activation_situ_linear_beta;
  const int64_t R = x.dim(0);
  auto situ_mlp = [&](const Tensor& wg, const Tensor& wu, const Tensor& wd, Tensor& y) {
    Tensor g = s.gemm(x, wg), u = s.gemm(x, wu);
    s.be.situ({.g = g, .u = u, .y = g, .beta = beta, .beta_linear = beta_l});
    s.be.gemm({.x = g, .w = wd, .y = y});
  };
  if (cfg.is_dense_ffn(l)) {
    if (R > 0) situ_mlp(lw.dense_gate, lw.dense_up, lw.dense_down, out);
    return Status::ok();
  }
  const int64_t E = cfg.num_experts, k = cfg.num_experts_per_token;
  Tensor ids = s.alloc({R, k}, DType::I32), weights = s.alloc({R, k}, DType::F32);
  Tensor z, y = s.alloc({R, cfg.routed_expert_hidden_size});
  if (R > 0) {
    Tensor logits = s.alloc({R, E}, DType::F32);
    s.be.gemm({.x = x, .w = lw.router, .y = logits});
    s.be.router_topk({.logits = logits, .bias = lw.router_bias, .ids = ids, .weights = weights,
                      .k = static_cast<int>(k), .scale = cfg.routed_scaling_factor});
    z = s.gemm(x, lw.lat_down);
  }
  if (s.g.ep > 1) {
    const Tensor hid = s.host_bytes(ids), hw = s.host_bytes(weights);
    K3_TRY(ep_experts(s, lw, z, R > 0 ? hid.i32() : nullptr, R > 0 ? hw.f32() : nullptr, R, k, y));
  } else if (R > 0) {
    s.be.moe_experts({.z = z, .ids = ids, .weights = weights, .w1 = lw.w1, .w3 = lw.w3, .w2 = lw.w2, .y = y,
                      .beta = beta, .beta_linear = beta_l});
  }
  if (R == 0) return Status::ok();
  Tensor yn = s.rmsnorm(y, lw.lat_norm, cfg.rms_norm_eps);
  s.be.gemm({.x = yn, .w = lw.lat_up, .y = out});
  if (cfg.num_shared_experts > 0) {
    Tensor ys = s.alloc(out.shape());
    situ_mlp(lw.shared_gate, lw.shared_up, lw.shared_down, ys);
    s.be.add({.a = out, .b = ys, .y = out});
  }
  return Status::ok();
}

}  // namespace k3::rank
