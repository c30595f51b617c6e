// bf16 GEMMs through cuBLASLt: y[M,N] = alpha x[M,K] w[N,K]^T + beta y (or x w with w [K,N]), optionally batched over
// heads with strides (MLA absorb / un-absorb). Owns the handle and a workspace; algorithms are
// chosen once per shape and cached, so repeated calls (and graph capture) skip the heuristic.
#pragma once
#include <cublasLt.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <map>
#include <tuple>

namespace k3::cuda {

struct GemmShape {
  int64_t M = 0, N = 0, K = 0;
  int64_t ldx = 0, ldw = 0, ldy = 0;                  // row pitches in elements
  int64_t batch = 1, stride_x = 0, stride_w = 0, stride_y = 0;
  bool y_f32 = false;                                 // y in F32 (router logits) or BF16
  bool w_kn = false;                                  // w stored [K, N] (row pitch ldw) instead of [N, K]
  auto key() const {
    return std::make_tuple(M, N, K, ldx, ldw, ldy, batch, stride_x, stride_w, stride_y, y_f32, w_kn);
  }
};

class CublasLtGemm {
 public:
  CublasLtGemm();
  ~CublasLtGemm();
  CublasLtGemm(const CublasLtGemm&) = delete;
  CublasLtGemm& operator=(const CublasLtGemm&) = delete;

  void run(const GemmShape& s, const void* x, const void* w, void* y, float alpha, float beta, cudaStream_t stream);

 private:
  struct Plan;
  const Plan& plan_for(const GemmShape& s);

  cublasLtHandle_t handle_ = nullptr;
  void* workspace_ = nullptr;
  size_t workspace_bytes_ = 64u << 20;
  std::map<decltype(GemmShape{}.key()), Plan*> plans_;
};

}  // namespace k3::cuda
