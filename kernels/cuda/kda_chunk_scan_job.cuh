// What one block of a KDA chunk scan works on, shared by the three scan kernels (kda_chunk.cu's
// mma.sync scan, kda_chunk_scan_wg.cuh, kda_chunk_scan_wg32.cuh): block row n is sequence n from
// its slot, output written, back to its slot; or (split scan, kda_split_plan.h) job n. The pointers
// are to this block's tile of V rows v0.. of a [V][K] state.
#pragma once
#include "kernels/cuda/kda_chunk_layout.cuh"
#include "kernels/cuda/launch.h"
#include "kernels/cuda/mma.cuh"

namespace k3::cuda::kda_chunk {

struct ScanBlockJob {
  int c_begin = 0, c_end = 0, seq = 0;
  bool write_o = false, zero_u = false;
  bool identity = false;        // start from the identity when init is null (else zeros)
  const float* init = nullptr;  // the state to start from, or null
  float* final_state = nullptr; // where the state goes after the last chunk, or null
};

__device__ __forceinline__ ScanBlockJob scan_block_job(const KdaArgs& a, const int32_t* seq_chunk0,
                                                       const KdaScanJob* jobs, float* carry, int n, int h, int v0) {
  KdaScanJob job;
  if (jobs != nullptr) {
    job = jobs[n];
  } else {
    job.c_begin = seq_chunk0[n];
    job.c_end = seq_chunk0[n + 1];
    job.seq = n;
  }
  const int H = a.H, seq = job.seq;
  auto state_at = [&](int which, int slot) -> float* {
    if (which == KdaScanJob::kToSeq) return a.state + (int64_t(a.slots[seq]) * H + h) * kD * kD + int64_t(v0) * kD;
    if (which == KdaScanJob::kToCarry) return carry + (int64_t(slot) * H + h) * kD * kD + int64_t(v0) * kD;
    return nullptr;
  };
  ScanBlockJob b;
  b.c_begin = job.c_begin;
  b.c_end = job.c_end;
  b.seq = seq;
  b.write_o = (job.flags & KdaScanJob::kWriteO) != 0;
  b.zero_u = (job.flags & KdaScanJob::kZeroU) != 0;
  b.identity = job.init == KdaScanJob::kIdentity;
  b.init = job.init == KdaScanJob::kFromSeq     ? state_at(KdaScanJob::kToSeq, 0)
           : job.init == KdaScanJob::kFromCarry ? state_at(KdaScanJob::kToCarry, job.in_slot)
                                                : nullptr;
  b.final_state = state_at(job.out, job.out_slot);
  return b;
}

// The starting value of state element (row v of the tile, column k): from init, or the identity
// (row v0 + v has its one in column v0 + v), or zero.
__device__ __forceinline__ float scan_init_value(const ScanBlockJob& job, int v0, int v, int k) {
  if (job.init != nullptr) return job.init[v * kD + k];
  return job.identity && v0 + v == k ? 1.f : 0.f;
}

// Output row r of the chunk starting at token t0, columns col and col + 1 of head h.
__device__ __forceinline__ void store_o_pair(const KdaArgs& a, int t0, int r, int h, int col, float x0, float x1) {
  const int64_t o = ((int64_t(t0) + r) * a.H + h) * kD + col;
  if (a.o.bf16) *reinterpret_cast<uint32_t*>(static_cast<bf16*>(a.o.p) + o) = pack_bf16(x0, x1);
  else *reinterpret_cast<float2*>(static_cast<float*>(a.o.p) + o) = make_float2(x0, x1);
}

// Rows < len of a warpgroup's O accumulator [64 tok][8 J v] (wgmma layout: element 4j + e of warp
// `warp` is row 16 warp + g + 8 (e >> 1), column 8j + 2t + (e & 1)) to columns v0.. of head h.
template <int J>
__device__ __forceinline__ void store_o_rows(const KdaArgs& a, int t0, int len, int h, int v0, const float (&Oa)[4 * J],
                                             int warp, int g, int t) {
#pragma unroll
  for (int j = 0; j < J; ++j)
#pragma unroll
    for (int hf = 0; hf < 2; ++hf) {
      const int r = 16 * warp + g + 8 * hf, col = v0 + 8 * j + 2 * t;
      if (r < len) store_o_pair(a, t0, r, h, col, Oa[4 * j + 2 * hf], Oa[4 * j + 2 * hf + 1]);
    }
}

// The chunk table's entries (first token, length, chunk index in the sequence) of the next chunk,
// read one chunk ahead so that their global loads stay off the per-chunk chain.
struct ChunkAhead {
  int t0 = 0, len = 0, idx = 0;
  __device__ __forceinline__ void read(const int32_t* chunk_table, int c) {
    t0 = chunk_table[4 * c];
    len = chunk_table[4 * c + 1];
    idx = chunk_table[4 * c + 3];
  }
  // Before a block's loop over chunks [c_begin, c_end): the first chunk's entries, if any.
  static __device__ __forceinline__ ChunkAhead first(const int32_t* chunk_table, int c_begin, int c_end) {
    ChunkAhead n;
    if (c_begin < c_end) n.read(chunk_table, c_begin);
    return n;
  }
};

// One step of a wgmma scan's chunk loop: chunk c's first token, length and checkpoint slot (-1:
// none; looked up only when the block writes output, kO), and whether another chunk follows, whose
// entries `ahead` then reads.
struct ScanChunk {
  int t0, len, ck;
  bool has_next;
};
template <bool kO>
__device__ __forceinline__ ScanChunk scan_chunk(ChunkAhead& ahead, const KdaArgs& a, int seq,
                                                const int32_t* chunk_table, int c, int c_end) {
  const ScanChunk k{ahead.t0, ahead.len, kO ? kda_ckpt_slot(a, seq, 64 * ahead.idx + ahead.len) : -1, c + 1 < c_end};
  if (k.has_next) ahead.read(chunk_table, c + 1);
  return k;
}

}  // namespace k3::cuda::kda_chunk
