// Warp-level bf16 tensor-core pieces (sm_80+, used on sm_90a): mma.sync m16n8k16 with fp32
// accumulate and the ldmatrix loads that feed it from shared memory. Fragment layout (PTX ISA,
// "mma.m16n8k16"), with g = lane / 4 and t = lane % 4:
//   A 16x16 (row major): a[0] = (g, 2t..2t+1), a[1] = (g+8, 2t..), a[2] = (g, 2t+8..), a[3] = (g+8, 2t+8..)
//   B 16x8:              b[0] = (k 2t..2t+1, n g), b[1] = (k 2t+8..2t+9, n g)
//   C 16x8 (fp32):       c[0], c[1] = (g, 2t..2t+1), c[2], c[3] = (g+8, 2t..2t+1)
// A C tile pair (two n8 tiles side by side) is therefore an A fragment once packed to bf16
// (pack_a_from_c), the usual way to feed softmax probabilities into the next product.
#pragma once
#include <cuda_bf16.h>

#include <cstdint>

namespace k3::cuda {

__device__ __forceinline__ uint32_t smem_u32(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// Two floats -> one register of two bf16 (lo in the low half: the lower column index).
__device__ __forceinline__ uint32_t pack_bf16(float lo, float hi) {
  const __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
  return *reinterpret_cast<const uint32_t*>(&v);
}

// One register of two bf16 (as pack_bf16 makes it) -> two floats, lo first.
__device__ __forceinline__ float2 bf2_to_f2(uint32_t u) {
  return __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&u));
}

// Two bf16 pairs multiplied elementwise (one instruction), rounded to bf16.
__device__ __forceinline__ uint32_t mul_bf16x2(uint32_t x, uint32_t y) {
  const __nv_bfloat162 r =
      __hmul2(*reinterpret_cast<const __nv_bfloat162*>(&x), *reinterpret_cast<const __nv_bfloat162*>(&y));
  return *reinterpret_cast<const uint32_t*>(&r);
}

// c += a * b
__device__ __forceinline__ void mma_bf16(float c[4], const uint32_t a[4], const uint32_t b[2]) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
      "{%0,%1,%2,%3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}

// fp32 -> tf32 (round to nearest, ties away), the operand form of mma_tf32.
__device__ __forceinline__ uint32_t to_tf32(float x) {
  uint32_t r;
  asm("cvt.rna.tf32.f32 %0, %1;\n" : "=r"(r) : "f"(x));
  return r;
}

// c += a * b, tf32 m16n8k8: a (rows g, g + 8; cols t, t + 4), b (k rows t, t + 4; n col g), c as
// for mma_bf16 (rows g, g + 8; cols 2t, 2t + 1), g = lane / 4, t = lane % 4.
__device__ __forceinline__ void mma_tf32(float c[4], const uint32_t a[4], const uint32_t b[2]) {
  asm volatile(
      "mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
      "{%0,%1,%2,%3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}

// Four 8x8 b16 matrices; lanes 8i..8i+7 give the row addresses of matrix i (16-byte aligned).
__device__ __forceinline__ void ldmatrix_x4(uint32_t r[4], const void* row_addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(smem_u32(row_addr)));
}
__device__ __forceinline__ void ldmatrix_x4_trans(uint32_t r[4], const void* row_addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(smem_u32(row_addr)));
}
// Four 8x8 b16 matrices held as mma fragments (lane l: row l / 4, columns 2 (l % 4) and 2 (l % 4) + 1
// of each r[i]) stored as they are: lanes 8i..8i+7 give the addresses of the 16-byte rows of matrix i.
__device__ __forceinline__ void stmatrix_x4(uint32_t row_addr, const uint32_t (&r)[4]) {
  asm volatile("stmatrix.sync.aligned.m8n8.x4.shared.b16 [%0], {%1,%2,%3,%4};\n" ::"r"(row_addr), "r"(r[0]), "r"(r[1]),
               "r"(r[2]), "r"(r[3])
               : "memory");
}
// The store: four 8x8 b16 matrices held as mma fragments (lane l: row l / 4, columns 2 (l % 4) and
// 2 (l % 4) + 1 of each r[i]) written transposed, so that lanes 8i..8i+7 give the addresses of the
// 16-byte rows of matrix i's transpose (its columns).
__device__ __forceinline__ void stmatrix_x4_trans(uint32_t row_addr, const uint32_t (&r)[4]) {
  asm volatile("stmatrix.sync.aligned.m8n8.x4.trans.shared.b16 [%0], {%1,%2,%3,%4};\n" ::"r"(row_addr), "r"(r[0]),
               "r"(r[1]), "r"(r[2]), "r"(r[3])
               : "memory");
}
// Two matrices; lanes 0..15 give the addresses (lanes 16..31 are ignored but must be valid).
__device__ __forceinline__ void ldmatrix_x2(uint32_t r[2], const void* row_addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x2.shared.b16 {%0,%1}, [%2];\n"
               : "=r"(r[0]), "=r"(r[1])
               : "r"(smem_u32(row_addr)));
}
__device__ __forceinline__ void ldmatrix_x2_trans(uint32_t r[2], const void* row_addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x2.trans.shared.b16 {%0,%1}, [%2];\n"
               : "=r"(r[0]), "=r"(r[1])
               : "r"(smem_u32(row_addr)));
}

// A fragment of the 16x16 tile at `tile` (bf16, row major, `ld` elements per row).
__device__ __forceinline__ void load_a(uint32_t a[4], const __nv_bfloat16* tile, int ld) {
  const int l = threadIdx.x & 31;
  ldmatrix_x4(a, tile + (l & 15) * ld + (l >> 4) * 8);
}
// A fragment of the 16x16 tile whose TRANSPOSE is stored at `tile` (tile[k][m], row major).
__device__ __forceinline__ void load_a_trans(uint32_t a[4], const __nv_bfloat16* tile, int ld) {
  const int l = threadIdx.x & 31;
  // matrices: (m0-7,k0-7), (m8-15,k0-7), (m0-7,k8-15), (m8-15,k8-15), each read transposed
  ldmatrix_x4_trans(a, tile + ((l & 7) + (l >> 4) * 8) * ld + ((l >> 3) & 1) * 8);
}
// B fragments of two adjacent n8 tiles (n 0-7 -> b[0..1], n 8-15 -> b[2..3]) for a k16 step,
// from storage [n][k] (k contiguous, e.g. K rows when computing Q Kᵀ).
__device__ __forceinline__ void load_b_nk(uint32_t b[4], const __nv_bfloat16* tile, int ld) {
  const int l = threadIdx.x & 31;
  ldmatrix_x4(b, tile + ((l & 7) + (l >> 4) * 8) * ld + ((l >> 3) & 1) * 8);
}
// The same from storage [k][n] (n contiguous, e.g. V rows when computing P V).
__device__ __forceinline__ void load_b_kn(uint32_t b[4], const __nv_bfloat16* tile, int ld) {
  const int l = threadIdx.x & 31;
  ldmatrix_x4_trans(b, tile + ((l & 7) + ((l >> 3) & 1) * 8) * ld + (l >> 4) * 8);
}

// Two adjacent 16x8 fp32 C tiles (columns 0-7 and 8-15) -> the bf16 A fragment of that 16x16 tile.
__device__ __forceinline__ void pack_a_from_c(uint32_t a[4], const float c0[4], const float c1[4]) {
  a[0] = pack_bf16(c0[0], c0[1]);
  a[1] = pack_bf16(c0[2], c0[3]);
  a[2] = pack_bf16(c1[0], c1[1]);
  a[3] = pack_bf16(c1[2], c1[3]);
}

}  // namespace k3::cuda
