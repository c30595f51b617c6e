// Device side of test_cuda_wgmma: the operand staging (128B-swizzled atoms), descriptors and wgmma
// calls of mla_decode_wgmma_kernel without the softmax, paging and pipelining around them, so a
// layout or descriptor mistake shows up here as a wrong product, not as a wrong attention output.
#include <cuda_runtime.h>

#include "kernels/cuda/mla_wgmma_layout.cuh"
#include "kernels/cuda/mma.cuh"
#include "kernels/cuda/wgmma.cuh"
#include "tests/cuda/wgmma_probe.h"

namespace k3::cudatest {
namespace {

using namespace k3::cuda;
constexpr int kSmem = wg::kAtomBytes + 2 * mlawg::kOperandBytes + mlawg::kPBytes;

__global__ void __launch_bounds__(256, 1)
    wgmma_probe_kernel(const uint16_t* q, const uint16_t* kv, const uint16_t* p, float* s_out, float* o_out,
                       float* o_wide) {
  extern __shared__ __align__(16) unsigned char smem_raw[];  // aligned to 1024 at run time below
  const uint32_t raw_addr = smem_u32(smem_raw);
  const uint32_t pad = (wg::kAtomBytes - (raw_addr & (wg::kAtomBytes - 1))) & (wg::kAtomBytes - 1);
  unsigned char* q_s = smem_raw + pad;
  unsigned char* kv_s = q_s + mlawg::kOperandBytes;
  unsigned char* p_s = kv_s + mlawg::kOperandBytes;
  const uint32_t q_addr = raw_addr + pad, kv_addr = q_addr + mlawg::kOperandBytes, p_addr = kv_addr + mlawg::kOperandBytes;
  const int tid = threadIdx.x;
  constexpr int kChunks = mlawg::kDk / 8;
  for (int idx = tid; idx < 64 * kChunks; idx += 256) {
    const int r = idx / kChunks, c = idx % kChunks;
    *reinterpret_cast<uint4*>(q_s + wg::op_offset(r, c)) = *reinterpret_cast<const uint4*>(q + r * mlawg::kDk + c * 8);
    *reinterpret_cast<uint4*>(kv_s + wg::op_offset(r, c)) = *reinterpret_cast<const uint4*>(kv + r * mlawg::kDk + c * 8);
  }
  for (int idx = tid; idx < 64 * 8; idx += 256) {
    const int r = idx / 8, c = idx % 8;
    *reinterpret_cast<uint4*>(p_s + wg::op_offset(r, c)) = *reinterpret_cast<const uint4*>(p + r * 64 + c * 8);
  }
  wg::fence_proxy_async();
  __syncthreads();

  const int w = tid >> 7, wq = (tid >> 5) & 3, lane = tid & 31, g = lane >> 2, t4 = lane & 3;
  const int r0 = 16 * wq + g;
  float s[16];
#pragma unroll
  for (int i = 0; i < 16; ++i) s[i] = 0.f;
  wg::fence();
#pragma unroll
  for (int ks = 0; ks < mlawg::kDk / 16; ++ks)
    wg::mma_m64n32_kk(s, wg::make_desc(q_addr + mlawg::s_a_off(ks)), wg::make_desc(kv_addr + mlawg::s_b_off(ks, w)),
                      ks > 0);
  wg::commit();
  wg::wait<0>();
#pragma unroll
  for (int i = 0; i < 16; ++i) wg::reg_fence(s[i]);
#pragma unroll
  for (int j = 0; j < 4; ++j)
#pragma unroll
    for (int e = 0; e < 4; ++e) s_out[(r0 + 8 * (e >> 1)) * 64 + 32 * w + 8 * j + 2 * t4 + (e & 1)] = s[4 * j + e];

  float o[4][32];
#pragma unroll
  for (int j = 0; j < 4; ++j)
#pragma unroll
    for (int i = 0; i < 32; ++i) o[j][i] = 0.f;
  wg::fence();
#pragma unroll
  for (int kk = 0; kk < 4; ++kk) {
    const uint64_t da = wg::make_desc(p_addr + mlawg::pv_a_off(kk));
#pragma unroll
    for (int j = 0; j < 4; ++j) wg::mma_m64n64_kt(o[j], da, wg::make_desc(kv_addr + mlawg::pv_b_off(kk, w, j)));
  }
  wg::commit();
  wg::wait<0>();
#pragma unroll
  for (int j = 0; j < 4; ++j)
#pragma unroll
    for (int i = 0; i < 32; ++i) wg::reg_fence(o[j][i]);
#pragma unroll
  for (int j = 0; j < 4; ++j)
#pragma unroll
    for (int jj = 0; jj < 8; ++jj)
#pragma unroll
      for (int e = 0; e < 4; ++e)
        o_out[(r0 + 8 * (e >> 1)) * 512 + 256 * w + 64 * j + 8 * jj + 2 * t4 + (e & 1)] = o[j][4 * jj + e];

  // The same O with one m64n256k16 per k step and warpgroup. The B operand spans 4 atoms along N
  // (8192 bytes apart) and 2 along K (1024 apart); variant v puts the N stride in LBO (v = 0) or
  // SBO (v = 1). Only one can be right; the test reports which (information for a faster kernel).
  for (int v = 0; v < 2; ++v) {
    float d[128];
#pragma unroll
    for (int i = 0; i < 128; ++i) d[i] = 0.f;
    const uint32_t lbo = v == 0 ? 8 * wg::kAtomBytes : wg::kAtomBytes, sbo = v == 0 ? wg::kAtomBytes : 8 * wg::kAtomBytes;
    wg::fence();
#pragma unroll
    for (int kk = 0; kk < 4; ++kk)
      wg::mma_m64n256_kt(d, wg::make_desc(p_addr + mlawg::pv_a_off(kk)),
                     wg::make_desc(kv_addr + mlawg::pv_b_off(kk, w, 0), lbo, sbo));
    wg::commit();
    wg::wait<0>();
#pragma unroll
    for (int i = 0; i < 128; ++i) wg::reg_fence(d[i]);
#pragma unroll
    for (int jj = 0; jj < 32; ++jj)
#pragma unroll
      for (int e = 0; e < 4; ++e)
        o_wide[v * 64 * 512 + (r0 + 8 * (e >> 1)) * 512 + 256 * w + 8 * jj + 2 * t4 + (e & 1)] = d[4 * jj + e];
  }
}

}  // namespace

std::string run_wgmma_probe(const std::vector<uint16_t>& q, const std::vector<uint16_t>& kv,
                            const std::vector<uint16_t>& p, std::vector<float>& s, std::vector<float>& o,
                            std::vector<float>& o_wide) {
  if (q.size() != 64 * 576 || kv.size() != 64 * 576 || p.size() != 64 * 64) return "wgmma probe: bad input sizes";
  uint16_t *dq = nullptr, *dkv = nullptr, *dp = nullptr;
  float *ds = nullptr, *dout = nullptr, *dwide = nullptr;
  std::string err;
  auto ok = [&](cudaError_t e) {
    if (e != cudaSuccess && err.empty()) err = cudaGetErrorString(e);
    return err.empty();
  };
  if (ok(cudaMalloc(&dq, q.size() * 2)) && ok(cudaMalloc(&dkv, kv.size() * 2)) && ok(cudaMalloc(&dp, p.size() * 2)) &&
      ok(cudaMalloc(&ds, 64 * 64 * 4)) && ok(cudaMalloc(&dout, 64 * 512 * 4)) && ok(cudaMalloc(&dwide, 2 * 64 * 512 * 4)) &&
      ok(cudaMemcpy(dq, q.data(), q.size() * 2, cudaMemcpyHostToDevice)) &&
      ok(cudaMemcpy(dkv, kv.data(), kv.size() * 2, cudaMemcpyHostToDevice)) &&
      ok(cudaMemcpy(dp, p.data(), p.size() * 2, cudaMemcpyHostToDevice)) &&
      ok(cudaFuncSetAttribute(wgmma_probe_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmem))) {
    wgmma_probe_kernel<<<1, 256, kSmem>>>(dq, dkv, dp, ds, dout, dwide);
    s.assign(64 * 64, 0.f);
    o.assign(64 * 512, 0.f);
    o_wide.assign(2 * 64 * 512, 0.f);
    if (ok(cudaGetLastError()) && ok(cudaDeviceSynchronize())) {
      ok(cudaMemcpy(s.data(), ds, s.size() * 4, cudaMemcpyDeviceToHost));
      ok(cudaMemcpy(o.data(), dout, o.size() * 4, cudaMemcpyDeviceToHost));
      ok(cudaMemcpy(o_wide.data(), dwide, o_wide.size() * 4, cudaMemcpyDeviceToHost));
    }
  }
  cudaFree(dq);
  cudaFree(dkv);
  cudaFree(dp);
  cudaFree(ds);
  cudaFree(dout);
  cudaFree(dwide);
  return err;
}

}  // namespace k3::cudatest
