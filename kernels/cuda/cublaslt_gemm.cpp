#include "kernels/cuda/cublaslt_gemm.h"

#include <string>

#include "kernels/cuda/cuda_check.h"

namespace k3::cuda {

// Row-major y = x wᵀ is column-major yᵀ = (w as K×N)ᵀ · (x as K×M): A = w (transposed), B = x.
struct CublasLtGemm::Plan {
  cublasLtMatmulDesc_t desc = nullptr;
  cublasLtMatrixLayout_t a = nullptr, b = nullptr, c = nullptr;
  cublasLtMatmulAlgo_t algo{};
  ~Plan() {
    if (a) cublasLtMatrixLayoutDestroy(a);
    if (b) cublasLtMatrixLayoutDestroy(b);
    if (c) cublasLtMatrixLayoutDestroy(c);
    if (desc) cublasLtMatmulDescDestroy(desc);
  }
};

CublasLtGemm::CublasLtGemm() {
  K3_CUBLAS_OK(cublasLtCreate(&handle_));
  K3_CUDA_OK(cudaMalloc(&workspace_, workspace_bytes_));
}

CublasLtGemm::~CublasLtGemm() {
  for (auto& [k, p] : plans_) delete p;
  if (workspace_) cudaFree(workspace_);
  if (handle_) cublasLtDestroy(handle_);
}

namespace {
void set_batch(cublasLtMatrixLayout_t l, int64_t batch, int64_t stride) {
  if (batch <= 1) return;
  const int32_t count = int32_t(batch);
  K3_CUBLAS_OK(cublasLtMatrixLayoutSetAttribute(l, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &count, sizeof(count)));
  K3_CUBLAS_OK(cublasLtMatrixLayoutSetAttribute(l, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET, &stride, sizeof(stride)));
}
}  // namespace

const CublasLtGemm::Plan& CublasLtGemm::plan_for(const GemmShape& s) {
  auto it = plans_.find(s.key());
  if (it != plans_.end()) return *it->second;
  auto* p = new Plan();
  try {
    K3_CUBLAS_OK(cublasLtMatmulDescCreate(&p->desc, CUBLAS_COMPUTE_32F, CUDA_R_32F));
    // w [N, K] row-major is column-major K x N (transposed in); w [K, N] row-major is column-major N x K.
    const cublasOperation_t ta = s.w_kn ? CUBLAS_OP_N : CUBLAS_OP_T, tb = CUBLAS_OP_N;
    K3_CUBLAS_OK(cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof(ta)));
    K3_CUBLAS_OK(cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof(tb)));
    K3_CUBLAS_OK(s.w_kn ? cublasLtMatrixLayoutCreate(&p->a, CUDA_R_16BF, s.N, s.K, s.ldw)
                        : cublasLtMatrixLayoutCreate(&p->a, CUDA_R_16BF, s.K, s.N, s.ldw));
    K3_CUBLAS_OK(cublasLtMatrixLayoutCreate(&p->b, CUDA_R_16BF, s.K, s.M, s.ldx));
    K3_CUBLAS_OK(cublasLtMatrixLayoutCreate(&p->c, s.y_f32 ? CUDA_R_32F : CUDA_R_16BF, s.N, s.M, s.ldy));
    set_batch(p->a, s.batch, s.stride_w);
    set_batch(p->b, s.batch, s.stride_x);
    set_batch(p->c, s.batch, s.stride_y);
    cublasLtMatmulPreference_t pref = nullptr;
    K3_CUBLAS_OK(cublasLtMatmulPreferenceCreate(&pref));
    K3_CUBLAS_OK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                                                      &workspace_bytes_, sizeof(workspace_bytes_)));
    cublasLtMatmulHeuristicResult_t result{};
    int found = 0;
    const cublasStatus_t st =
        cublasLtMatmulAlgoGetHeuristic(handle_, p->desc, p->a, p->b, p->c, p->c, pref, 1, &result, &found);
    cublasLtMatmulPreferenceDestroy(pref);
    K3_CUBLAS_OK(st);
    if (found == 0)
      throw Error("gemm: cuBLASLt has no algorithm for M=" + std::to_string(s.M) + " N=" + std::to_string(s.N) +
                  " K=" + std::to_string(s.K));
    p->algo = result.algo;
  } catch (...) {
    delete p;
    throw;
  }
  plans_[s.key()] = p;
  return *p;
}

void CublasLtGemm::run(const GemmShape& s, const void* x, const void* w, void* y, float alpha, float beta,
                       cudaStream_t stream) {
  if (s.M == 0 || s.N == 0) return;
  const Plan& p = plan_for(s);
  K3_CUBLAS_OK(cublasLtMatmul(handle_, p.desc, &alpha, w, p.a, x, p.b, &beta, y, p.c, y, p.c, &p.algo, workspace_,
                              workspace_bytes_, stream));
}

}  // namespace k3::cuda
