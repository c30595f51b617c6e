// Warpgroup-level bf16 tensor-core pieces (sm_90a only): wgmma.mma_async with both operands in
// shared memory, their 64-bit matrix descriptors, the 128-byte swizzled layout they read, and the
// fences around them. References are to the PTX ISA, section 9.7.15 ("Asynchronous Warpgroup Level
// Matrix Multiply-Accumulate Instructions").
//
// ---- Shared-memory layout: 128B-swizzle atoms (PTX 9.7.15.5.1.2, "Shared Memory Matrix Layout",
// Table "swizzle atom layout": 128B mode is 8 x 8 128-bit elements = 8 rows x 64 bf16) ----
// Every operand here is stored as atoms of 8 rows x 128 bytes (64 bf16), each atom 1024 bytes,
// 1024-byte aligned. Inside an atom, row r (0..7) occupies bytes [128 r, 128 r + 128), and its
// logical 16-byte chunk q (elements 8q..8q+7 of the row) sits at physical chunk q ^ r
// (sw128_offset below). That is the 128B swizzle as an address function: byte-address bits [4:6]
// XOR bits [7:9], which is why atoms must start on a 1024-byte boundary (then the descriptor's
// "matrix base offset" is 0: PTX 9.7.15.5.1.2.2, "the repeating pattern starts at a 1024-byte
// boundary" for 128B swizzle).
//
// The same physical atom serves two roles:
//  * K-major operand (imm-trans = 0): an atom row is one M/N index (a head, a token) and holds 64
//    consecutive K elements. One k16 step reads 32 bytes of each row; steps 0..3 of an atom are
//    start addresses +0, +32, +64, +96 (bits [7:9] of the start stay 0, so base offset stays 0 and
//    the hardware's XOR puts each 16-byte chunk where sw128_offset stored it). M/N rows 8..15,
//    16..23, ... are further atoms at the "stride dimension" distance (8-row groups).
//  * MN-major operand (imm-trans = 1, bf16 only): an atom row is one K index (a token) and holds
//    64 consecutive N elements (dims). A k16 step covers two atoms along K (tokens 0-7, 8-15).
//    With N = 64 per instruction exactly one atom lies along N.
//
// ---- Descriptor (PTX 9.7.15.5.1.2.2, "Matrix Descriptor Format") ----
//   bits  0-13: (start address & 0x3FFFF) >> 4
//   bits 16-29: leading dimension byte offset >> 4  (LBO)
//   bits 32-45: stride dimension byte offset >> 4   (SBO)
//   bits 49-51: matrix base offset (0: every atom is 1024-byte aligned, see above)
//   bits 62-63: swizzle mode, 1 = 128-byte swizzle
// Which of LBO/SBO a given access uses depends on the major-ness and swizzle (PTX 9.7.15.5.1.2.1,
// "Major-ness supported by Strides"): for K-major swizzled operands the 8-row-group stride along
// M/N is SBO and LBO is not used; for MN-major swizzled operands one of them is the stride between atoms along MN and the
// other the stride between 8-row groups along K. Every use in this project is arranged so that
// only ONE stride is ever exercised -- the distance between consecutive 8-row groups, always
// 1024 bytes (atoms of one operand are stacked contiguously) -- and both LBO and SBO are set to
// that value. K-major: a k16 step never leaves one atom along K (32 of 128 bytes), so only the
// M/N group stride is used. MN-major: N = 64 per instruction is one atom along N, so only the
// K-direction group stride is used. The layouts are therefore right whichever field the hardware
// reads for that direction. The one exception is mma_m64n256_kt (MN-major B over 4 atoms along
// N), whose two strides differ: LBO = N-atom stride, SBO = K group stride, as measured.
#pragma once
#include <cuda_runtime.h>


#include <cstdint>

namespace k3::cuda::wg {

constexpr int kAtomBytes = 1024;  // 8 rows x 128 bytes
constexpr int kRowBytes = 128;
constexpr int kGroupStride = kAtomBytes;  // distance between consecutive 8-row groups (LBO = SBO)

// Byte offset, inside a 1024-byte aligned atom, of logical 16-byte chunk `chunk` (0..7) of row
// `row` (0..7).
__host__ __device__ constexpr uint32_t sw128_offset(int row, int chunk) {
  return uint32_t(row * kRowBytes + ((chunk ^ row) & 7) * 16);
}

// Byte offset of 16-byte chunk `chunk` (elements 8 chunk..8 chunk+7 along the contiguous
// dimension) of row `row` (0..63) in a 64-row operand stored as atoms [chunk / 8][row / 8]: the 8
// atoms of one 64-element column block are consecutive (8-row group stride 1024 bytes), column
// blocks follow each other at 8192 bytes.
__host__ __device__ constexpr uint32_t op_offset(int row, int chunk) {
  return uint32_t(((chunk >> 3) * 8 + (row >> 3)) * kAtomBytes) + sw128_offset(row & 7, chunk & 7);
}

// Descriptor of the operand starting at shared byte address `saddr` (128B swizzle, LBO = SBO =
// kGroupStride, base offset 0).
__host__ __device__ constexpr uint64_t make_desc(uint32_t saddr, uint32_t lbo = kGroupStride,
                                                 uint32_t sbo = kGroupStride) {
  return uint64_t((saddr & 0x3FFFF) >> 4) | (uint64_t((lbo & 0x3FFFF) >> 4) << 16) |
         (uint64_t((sbo & 0x3FFFF) >> 4) << 32) | (uint64_t(1) << 62);
}

// The descriptors of operands at byte offsets from one base: the base's descriptor is built once and
// an offset (a multiple of 16) is added to its 14-bit address field, one integer add per descriptor
// where make_desc of a run-time address costs five. Shared addresses stay below 2^18, so the field
// does not overflow.
struct DescBase {
  uint32_t lo, hi;
  __host__ __device__ constexpr explicit DescBase(uint32_t saddr, uint32_t lbo = kGroupStride, uint32_t sbo = kGroupStride)
      : lo(uint32_t(make_desc(saddr, lbo, sbo))), hi(uint32_t(make_desc(saddr, lbo, sbo) >> 32)) {}
  __host__ __device__ constexpr uint64_t at(uint32_t off) const { return (uint64_t(hi) << 32) | (lo + (off >> 4)); }
};
static_assert(DescBase(0x1400).at(0x2A20) == make_desc(0x3E20) && DescBase(0x37000).at(0x8000) == make_desc(0x3F000),
              "an offset added to a base descriptor gives the offset address's descriptor");

#if defined(__CUDACC__)
// Orders this thread's earlier register accesses before the following wgmma.mma_async (PTX ISA,
// instruction "wgmma.fence"): needed before the first wgmma of a batch and whenever its accumulator
// registers were touched by ordinary instructions since the last wgmma.
__device__ __forceinline__ void fence() { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void commit() { asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory"); }
template <int N>
__device__ __forceinline__ void wait() {
  asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory");
}
// Ordinary (generic proxy) shared-memory writes -- st.shared, cp.async -- become visible to the
// async proxy that wgmma reads through only after this fence (PTX ISA: wgmma "Async Proxy" section
// and membar/fence, "fence.proxy.async").
// Each writing thread issues it after its writes; a barrier then publishes them to the warpgroup.
__device__ __forceinline__ void fence_proxy_async() { asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory"); }
// Keeps the compiler from moving reads of accumulator registers above wgmma.wait_group (the wait
// names no registers): every accumulator passes through this empty volatile asm after the wait.
__device__ __forceinline__ void reg_fence(float& r) { asm volatile("" : "+f"(r)::"memory"); }

// D[64 x 32] (+)= A[64 x 16] * B[16 x 32]. kTransA / kTransB = 0: the operand is K-major in shared
// memory; 1 (bf16 only): MN-major, i.e. stored [k][m] or [k][n] with m or n contiguous -- as an A of
// M = 64 that is one atom along M, two along K per k16 step (the same placement as an MN-major B of
// N = 64, see above). scale_d = 0 overwrites D.
// Accumulator layout (PTX 9.7.15.5.1.1.1, "Matrix Fragments for wgmma.mma_async.m64nNk16",
// accumulator D figure): warp w of the warpgroup holds rows 16w..16w+15; with g = lane / 4,
// t = lane % 4, register d[4j + e] is row 16w + g + 8 (e >> 1), column 8j + 2t + (e & 1) -- the
// mma.sync m16n8 C fragment repeated over n8 tiles j.
template <int kTransA, int kTransB>
__device__ __forceinline__ void mma_m64n32(float (&d)[16], uint64_t da, uint64_t db, int scale_d = 1) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %18, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n32k16.f32.bf16.bf16 "
      "{%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15}, %16, %17, p, 1, 1, %19, %20;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
        "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15])
      : "l"(da), "l"(db), "r"(scale_d), "n"(kTransA), "n"(kTransB));
}
// Both operands K-major.
__device__ __forceinline__ void mma_m64n32_kk(float (&d)[16], uint64_t da, uint64_t db, int scale_d) {
  mma_m64n32<0, 0>(d, da, db, scale_d);
}

// D[64 x 48] (+)= A[64 x 16] * B[16 x 48]: as mma_m64n32 with j = 0..5 (the 48-head transposed MLA
// decode block, mla_decode_t48.cuh, where the heads are the N).
template <int kTransA, int kTransB>
__device__ __forceinline__ void mma_m64n48(float (&d)[24], uint64_t da, uint64_t db, int scale_d = 1) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %26, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n48k16.f32.bf16.bf16 "
      "{%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,%16,%17,%18,%19,%20,%21,%22,%23}, "
      "%24, %25, p, 1, 1, %27, %28;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
        "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),
        "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23])
      : "l"(da), "l"(db), "r"(scale_d), "n"(kTransA), "n"(kTransB));
}

// D[64 x 64] (+)= A[64 x 16] * B[16 x 64]. As mma_m64n32: kTransA / kTransB = 1 (bf16 only) read
// the operand MN-major (stored [k][m] or [k][n], m or n contiguous; an A of M = 64 is one atom along
// M, two along K per k16 step, the placement of an MN-major B of N = 64), 0 K-major. Same
// accumulator layout as above with j = 0..7. scale_d = 0 overwrites D.
template <int kTransA, int kTransB>
__device__ __forceinline__ void mma_m64n64_ab(float (&d)[32], uint64_t da, uint64_t db, int scale_d = 1) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %34, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 "
      "{%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,"
      "%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31}, %32, %33, p, 1, 1, %35, %36;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
        "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),
        "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]),
        "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
      : "l"(da), "l"(db), "r"(scale_d), "n"(kTransA), "n"(kTransB));
}

// A K-major; B MN-major when kTransB, else K-major like mma_m64n32_kk.
template <int kTransB>
__device__ __forceinline__ void mma_m64n64(float (&d)[32], uint64_t da, uint64_t db, int scale_d = 1) {
  mma_m64n64_ab<0, kTransB>(d, da, db, scale_d);
}

__device__ __forceinline__ void mma_m64n64_kt(float (&d)[32], uint64_t da, uint64_t db) { mma_m64n64<1>(d, da, db); }

// D[64 x 64] (+)= A[64 x 16] * B[16 x 64] with A from registers (the "RS" form, A in the mma.sync
// m16n8k16 A-fragment order described at mma_m64n256_rs_kt below) and B K-major in shared memory.
// scale_d = 0 overwrites D. The registers of `a` must not change until the instruction has completed.
__device__ __forceinline__ void mma_m64n64_rs(float (&d)[32], const uint32_t (&a)[4], uint64_t db, int scale_d = 1) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %37, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 "
      "{%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,"
      "%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31}, {%32, %33, %34, %35}, %36, p, 1, 1, 0;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]),
        "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]),
        "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]),
        "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db), "r"(scale_d));
}

// D[64 x 32] (+)= A[64 x 16] * B[16 x 32], A from registers as mma_m64n64_rs, B K-major in shared memory.
__device__ __forceinline__ void mma_m64n32_rs(float (&d)[16], const uint32_t (&a)[4], uint64_t db, int scale_d = 1) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %21, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n32k16.f32.bf16.bf16 "
      "{%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15}, {%16, %17, %18, %19}, %20, p, 1, 1, 0;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]),
        "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db), "r"(scale_d));
}

// Per-warpgroup register budgets of a warp-specialised kernel (PTX "setmaxnreg"): every warp of the
// warpgroup executes the same one; the released registers go back to the SM's pool, and an increase
// waits until the pool has them. kRegs: a multiple of 8 in 24..256.
template <int kRegs>
__device__ __forceinline__ void setmaxnreg_inc() {
  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(kRegs));
}
template <int kRegs>
__device__ __forceinline__ void setmaxnreg_dec() {
  asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(kRegs));
}

// The 128 fp32 accumulator registers of an m64n256 wgmma: the operand list in the instruction text
// (%0..%127) and the matching read-write constraints on d[0..127], shared by its two forms below.
#define K3_WG_D128_TEXT \
  "%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15," \
  "%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31," \
  "%32,%33,%34,%35,%36,%37,%38,%39,%40,%41,%42,%43,%44,%45,%46,%47," \
  "%48,%49,%50,%51,%52,%53,%54,%55,%56,%57,%58,%59,%60,%61,%62,%63," \
  "%64,%65,%66,%67,%68,%69,%70,%71,%72,%73,%74,%75,%76,%77,%78,%79," \
  "%80,%81,%82,%83,%84,%85,%86,%87,%88,%89,%90,%91,%92,%93,%94,%95," \
  "%96,%97,%98,%99,%100,%101,%102,%103,%104,%105,%106,%107,%108,%109,%110,%111," \
  "%112,%113,%114,%115,%116,%117,%118,%119,%120,%121,%122,%123,%124,%125,%126,%127"
#define K3_WG_D128_OPERANDS(d) \
  "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), \
  "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), \
  "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), \
  "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), \
  "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), \
  "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), \
  "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), \
  "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63]), \
  "+f"(d[64]), "+f"(d[65]), "+f"(d[66]), "+f"(d[67]), "+f"(d[68]), "+f"(d[69]), "+f"(d[70]), "+f"(d[71]), \
  "+f"(d[72]), "+f"(d[73]), "+f"(d[74]), "+f"(d[75]), "+f"(d[76]), "+f"(d[77]), "+f"(d[78]), "+f"(d[79]), \
  "+f"(d[80]), "+f"(d[81]), "+f"(d[82]), "+f"(d[83]), "+f"(d[84]), "+f"(d[85]), "+f"(d[86]), "+f"(d[87]), \
  "+f"(d[88]), "+f"(d[89]), "+f"(d[90]), "+f"(d[91]), "+f"(d[92]), "+f"(d[93]), "+f"(d[94]), "+f"(d[95]), \
  "+f"(d[96]), "+f"(d[97]), "+f"(d[98]), "+f"(d[99]), "+f"(d[100]), "+f"(d[101]), "+f"(d[102]), "+f"(d[103]), \
  "+f"(d[104]), "+f"(d[105]), "+f"(d[106]), "+f"(d[107]), "+f"(d[108]), "+f"(d[109]), "+f"(d[110]), "+f"(d[111]), \
  "+f"(d[112]), "+f"(d[113]), "+f"(d[114]), "+f"(d[115]), "+f"(d[116]), "+f"(d[117]), "+f"(d[118]), "+f"(d[119]), \
  "+f"(d[120]), "+f"(d[121]), "+f"(d[122]), "+f"(d[123]), "+f"(d[124]), "+f"(d[125]), "+f"(d[126]), "+f"(d[127])

// D[64 x 256] += A[64 x 16] * B[16 x 256]; A K-major, B MN-major spanning 4 atoms along N. B's
// descriptor must carry the stride between its N atoms in LBO and the 8-row group stride along K
// in SBO (found by tests/cuda/wgmma_probe.cu on the H200: the other assignment gives wrong
// columns). Registers d[4j + e] as above with j = 0..31, i.e. four m64n64 accumulator sets back to back.
__device__ __forceinline__ void mma_m64n256_kt(float (&d)[128], uint64_t da, uint64_t db) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %130, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n256k16.f32.bf16.bf16 {"
      K3_WG_D128_TEXT "}, "
      "%128, %129, p, 1, 1, 0, 1;\n}\n"
      :
        K3_WG_D128_OPERANDS(d)
      : "l"(da), "l"(db), "r"(1));
}
// D[64 x 256] += A[64 x 16] * B[16 x 256] with A from registers (the "RS" form): a[0..3] hold this
// thread's bf16 pairs of A in the layout of the mma.sync m16n8k16 A fragment for rows 16 w..16 w+15
// of warp w (a[0]: row g, columns 2 t, 2 t + 1; a[1]: row g + 8; a[2]: row g, columns 8 + 2 t..;
// a[3]: row g + 8, columns 8 + 2 t..). With an m64nN accumulator s of scores over 16 k columns
// 16 kk.., that is pack(s[8 kk], s[8 kk + 1]), pack(s[8 kk + 2], ..), pack(s[8 kk + 4], ..),
// pack(s[8 kk + 6], ..): the scores' registers become the product's A without leaving the thread.
// B as mma_m64n256_kt (MN-major over 4 atoms along N, LBO = N-atom stride). The registers of `a`
// must not change until the instruction has completed (wgmma.wait_group).
__device__ __forceinline__ void mma_m64n256_rs_kt(float (&d)[128], const uint32_t (&a)[4], uint64_t db) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %133, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n256k16.f32.bf16.bf16 {"
      K3_WG_D128_TEXT "}, "
      "{%128, %129, %130, %131}, %132, p, 1, 1, 1;\n}\n"
      :
        K3_WG_D128_OPERANDS(d)
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db), "r"(1));
}
#undef K3_WG_D128_TEXT
#undef K3_WG_D128_OPERANDS
// Keeps the compiler from reusing or moving the registers of an RS operand across the wait.
__device__ __forceinline__ void reg_fence(uint32_t& r) { asm volatile("" : "+r"(r)::"memory"); }
#endif  // __CUDACC__

}  // namespace k3::cuda::wg
