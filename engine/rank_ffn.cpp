// The FFN of one rank (engine/rank_step.h): dense and shared experts as Model::ffn_layer computes them;
// routed experts local, or dispatched to their EP ranks and combined back (docs/RANKS.md §EP):
//   1. counts: all_to_all of how many (token, slot) pairs this rank sends each rank;
//   2. dispatch: all_to_allv of records [local expert id | z row], in (token, slot) order per destination;
//   3. each rank runs its experts on what it received (moe_experts with one slot of weight 1: the bare
//      expert output, row-independent);
//   4. combine: all_to_allv back in the same order; the token's rank sums its k slots in slot order.
#include <cstring>
#include <string>
#include <vector>

#include "engine/rank_step.h"

namespace k3::rank {
namespace {

// Routed experts over EP ranks; ids/weights [R, k] from the router, z [R, Dl]; y [R, Dl] out.
Status ep_experts(Step& s, const LayerWeights& lw, const Tensor& z, const int32_t* ids, const float* wts, int64_t R,
                  int64_t k, Tensor& y) {
  const int N = s.g.ep;
  const int64_t El = s.cfg.num_experts / N, Dl = s.cfg.routed_expert_hidden_size;
  const size_t rec = sizeof(int32_t) + Dl * sizeof(float);  // one dispatched pair
  std::vector<std::vector<int64_t>> to(N);                 // pair indices m*k + j per destination
  for (int64_t i = 0; i < R * k; ++i) to[ids[i] / El].push_back(i);
  std::vector<uint64_t> send_pairs(N), recv_pairs(N);
  for (int q = 0; q < N; ++q) send_pairs[q] = to[q].size();
  K3_TRY(s.all_to_all(std::as_bytes(std::span<const uint64_t>(send_pairs)),
                      std::as_writable_bytes(std::span<uint64_t>(recv_pairs))));

  std::vector<std::byte> out(R * k * rec);
  std::vector<size_t> send_bytes(N), recv_bytes(N);
  std::vector<int64_t> order;  // the pair behind each dispatched record, in send order
  order.reserve(R * k);
  size_t off = 0;
  const float* zp = R > 0 ? z.f32() : nullptr;
  for (int q = 0; q < N; ++q) {
    for (int64_t i : to[q]) {
      const int32_t local = ids[i] % El;
      std::memcpy(out.data() + off, &local, sizeof local);
      std::memcpy(out.data() + off + sizeof local, zp + (i / k) * Dl, Dl * sizeof(float));
      off += rec;
      order.push_back(i);
    }
    send_bytes[q] = to[q].size() * rec;
  }
  int64_t n_in = 0;
  for (int q = 0; q < N; ++q) {
    recv_bytes[q] = recv_pairs[q] * rec;
    n_in += static_cast<int64_t>(recv_pairs[q]);
  }
  std::vector<std::byte> in(n_in * rec);
  K3_TRY(s.all_to_allv(out, send_bytes, in, recv_bytes));

  // This rank's experts on the received rows.
  std::vector<float> h_in(n_in * Dl);
  if (n_in > 0) {
    std::vector<int32_t> local_ids(n_in);
    std::vector<float> zin(n_in * Dl), ones(n_in, 1.f);
    for (int64_t t = 0; t < n_in; ++t) {
      std::memcpy(&local_ids[t], in.data() + t * rec, sizeof(int32_t));
      std::memcpy(zin.data() + t * Dl, in.data() + t * rec + sizeof(int32_t), Dl * sizeof(float));
    }
    Tensor h = s.alloc({n_in, Dl});
    s.be.moe_experts({.z = Tensor::view(zin.data(), {n_in, Dl}, DType::F32),
                      .ids = Tensor::view(local_ids.data(), {n_in, 1}, DType::I32),
                      .weights = Tensor::view(ones.data(), {n_in, 1}, DType::F32), .w1 = lw.w1, .w3 = lw.w3,
                      .w2 = lw.w2, .y = h, .beta = s.cfg.activation_situ_beta,
                      .beta_linear = s.cfg.activation_situ_linear_beta});
    std::memcpy(h_in.data(), h.f32(), h_in.size() * sizeof(float));
  }

  // Back to the tokens' ranks, in the order they were sent.
  std::vector<size_t> back_send(N), back_recv(N);
  for (int q = 0; q < N; ++q) {
    back_send[q] = recv_pairs[q] * Dl * sizeof(float);
    back_recv[q] = send_pairs[q] * Dl * sizeof(float);
  }
  std::vector<float> h_back(R * k * Dl);
  K3_TRY(s.all_to_allv(std::as_bytes(std::span<const float>(h_in)), back_send,
                       std::as_writable_bytes(std::span<float>(h_back)), back_recv));
  if (R == 0) return Status::ok();
  std::vector<float> expert_out(R * k * Dl);
  for (size_t t = 0; t < order.size(); ++t)
    std::memcpy(expert_out.data() + order[t] * Dl, h_back.data() + t * Dl, Dl * sizeof(float));
  combine_slots(expert_out.data(), wts, R, k, Dl, y.f32());
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
    K3_TRY(ep_experts(s, lw, z, R > 0 ? ids.i32() : nullptr, R > 0 ? weights.f32() : nullptr, R, k, y));
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
