// Device side of test_cuda_mma: one warp multiplies 16x16 bf16 tiles through each loader of
// kernels/cuda/mma.cuh, so a fragment-layout mistake shows up here, not as a wrong attention output.
#include <cuda_runtime.h>

#include "kernels/cuda/mma.cuh"
#include "tests/cuda/mma_probe.h"

namespace k3::cudatest {
namespace {

constexpr int kLd = 24;  // padded row pitch (16-byte multiple), as the kernels use

// out[0] = A·B with A from [m][k], B from [n][k]; out[1] = A·B with A from [k][m], B from [k][n];
// out[2] = (A·B)·B using pack_a_from_c for the second product's A.
__global__ void mma_probe_kernel(const __nv_bfloat16* a_mk, const __nv_bfloat16* b_kn, float* out) {
  using namespace k3::cuda;
  __shared__ __align__(16) __nv_bfloat16 A[16 * kLd], At[16 * kLd], B[16 * kLd], Bt[16 * kLd];
  const int l = threadIdx.x;
  for (int i = l; i < 256; i += 32) {
    const int r = i / 16, c = i % 16;
    A[r * kLd + c] = a_mk[i];   // A[m][k]
    At[c * kLd + r] = a_mk[i];  // At[k][m]
    Bt[r * kLd + c] = b_kn[i];  // Bt[k][n]
    B[c * kLd + r] = b_kn[i];   // B[n][k]
  }
  __syncwarp();
  const int g = l >> 2, t = l & 3;
  auto store = [&](float* dst, const float c0[4], const float c1[4]) {
    dst[g * 16 + 2 * t] = c0[0];
    dst[g * 16 + 2 * t + 1] = c0[1];
    dst[(g + 8) * 16 + 2 * t] = c0[2];
    dst[(g + 8) * 16 + 2 * t + 1] = c0[3];
    dst[g * 16 + 8 + 2 * t] = c1[0];
    dst[g * 16 + 8 + 2 * t + 1] = c1[1];
    dst[(g + 8) * 16 + 8 + 2 * t] = c1[2];
    dst[(g + 8) * 16 + 8 + 2 * t + 1] = c1[3];
  };
  uint32_t a[4], b[4];
  {
    float c0[4] = {}, c1[4] = {};
    load_a(a, A, kLd);
    load_b_nk(b, B, kLd);
    mma_bf16(c0, a, b);
    mma_bf16(c1, a, b + 2);
    store(out, c0, c1);
  }
  float c0[4] = {}, c1[4] = {};
  load_a_trans(a, At, kLd);
  load_b_kn(b, Bt, kLd);
  mma_bf16(c0, a, b);
  mma_bf16(c1, a, b + 2);
  store(out + 256, c0, c1);
  uint32_t p[4];
  pack_a_from_c(p, c0, c1);
  float d0[4] = {}, d1[4] = {};
  mma_bf16(d0, p, b);
  mma_bf16(d1, p, b + 2);
  store(out + 512, d0, d1);
}

}  // namespace

std::string run_mma_probe(const std::vector<uint16_t>& a_mk, const std::vector<uint16_t>& b_kn, std::vector<float>& out) {
  void *da = nullptr, *db = nullptr, *dout = nullptr;
  std::string err;
  auto check = [&](cudaError_t e) {
    if (e != cudaSuccess && err.empty()) err = cudaGetErrorString(e);
    return e == cudaSuccess;
  };
  out.assign(3 * 256, 0.f);
  if (check(cudaMalloc(&da, 512)) && check(cudaMalloc(&db, 512)) && check(cudaMalloc(&dout, 3 * 256 * 4)) &&
      check(cudaMemcpy(da, a_mk.data(), 512, cudaMemcpyHostToDevice)) &&
      check(cudaMemcpy(db, b_kn.data(), 512, cudaMemcpyHostToDevice))) {
    mma_probe_kernel<<<1, 32>>>(static_cast<const __nv_bfloat16*>(da), static_cast<const __nv_bfloat16*>(db),
                                static_cast<float*>(dout));
    if (check(cudaGetLastError()) && check(cudaDeviceSynchronize()))
      check(cudaMemcpy(out.data(), dout, out.size() * 4, cudaMemcpyDeviceToHost));
  }
  cudaFree(da);
  cudaFree(db);
  cudaFree(dout);
  return err;
}

}  // namespace k3::cudatest
