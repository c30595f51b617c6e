// The delta-rule step on the state rows one warp owns (docs/MODEL.md §2.3), written once for the fused
// decode kernel (kda_decode.cu: rows read from shared memory, written to global memory) and the
// recurrence (kda_recurrent.cu: rows held in registers across tokens), so both do the same arithmetic:
// per row r, s·k with the decays applied (a warp reduction), u = β (v_r - s·k), s <- s α + k u, and
// o_r = s·q (a second reduction). Lane l holds columns [NV l, NV l + NV) of every row.
// Every rounding is spelled out (__fmul_rn, __fmaf_rn): left to the compiler, a multiply and an add
// are fused into one FMA or not depending on the code around the step, and the two kernels then
// disagreed in the state's last bits (measured on the H200), which batch-invariant serving forbids.
#pragma once
#include "kernels/cuda/reduce.cuh"

namespace k3::cuda {

// elem(r, e): element e of this lane's part of row r (before the step); put(r, v): the row's new part.
// The s·k pass covers all R rows first so their reductions overlap. Returns, on lane r < R, o of row r.
template <int NV, int R, class Elem, class Put>
__device__ __forceinline__ float kda_rows_step(Elem elem, Put put, const float* vv, float beta, const float (&q)[NV],
                                               const float (&k)[NV], const float (&alpha)[NV], int lane) {
  static_assert(R <= 32, "one lane per row returns o");
  float kvr[R];
#pragma unroll
  for (int r = 0; r < R; ++r) {
    float acc = 0.f;
#pragma unroll
    for (int e = 0; e < NV; ++e) acc = __fmaf_rn(__fmul_rn(elem(r, e), alpha[e]), k[e], acc);
    kvr[r] = acc;
  }
#pragma unroll
  for (int r = 0; r < R; ++r) kvr[r] = warp_sum(kvr[r]);
  float ov[R];
#pragma unroll
  for (int r = 0; r < R; ++r) {
    const float u = __fmul_rn(beta, __fsub_rn(vv[r], kvr[r]));
    float v[NV];
    float acc = 0.f;
#pragma unroll
    for (int e = 0; e < NV; ++e) {
      v[e] = __fmaf_rn(k[e], u, __fmul_rn(elem(r, e), alpha[e]));
      acc = __fmaf_rn(v[e], q[e], acc);
    }
    ov[r] = acc;
    put(r, v);
  }
#pragma unroll
  for (int r = 0; r < R; ++r) ov[r] = warp_sum(ov[r]);
  float mine = ov[0];
#pragma unroll
  for (int r = 1; r < R; ++r)
    if (lane == r) mine = ov[r];
  return mine;
}

}  // namespace k3::cuda
