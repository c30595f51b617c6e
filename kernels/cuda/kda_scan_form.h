// Which kernel runs the KDA chunk scan for a grid of `rows` sequences or jobs and H heads (host side,
// no device code). The scan's parallelism is rows x heads x row tiles of V; each block walks its
// chunks in order, so a grid below one wave leaves SMs idle for the whole scan, and the choice is
// about filling the GPU once with as few redundant workspace reads as possible.
#pragma once
#include <cstdint>

namespace k3::cuda {

enum class KdaScanForm {
  kMma32x3,  // mma.sync, 32-row tiles, three cp.async stages (at most one block per SM)
  kMma32x2,  // mma.sync, 32-row tiles, two stages
  kMma64,    // mma.sync, 64-row tiles, eight warps (wide grid, wgmma off)
  kWg64,     // wgmma, 64-row blocks, two per SM (kda_chunk_scan_wg.cuh)
  kWg32,     // wgmma, 32-row blocks, three per SM (kda_chunk_scan_wg32.cuh)
  kWgHead,   // wgmma, a head per block: four 32-row warpgroups sharing two stages (kda_chunk_scan_head.cuh)
};

// wgmma: CudaBackend::set_kda_chunk_scan_wgmma; wg_rows: set_kda_chunk_scan_wg_rows (0 = by the grid:
// 32-row blocks where their grid fits one wave, 4·H·rows <= 3·SMs, else 64-row blocks; 128: a head
// per block). ckpt_every_chunk: the call writes a checkpoint after every chunk (interval 64); where
// a head per block fits one wave, such calls run that form (wg_rows 0).
KdaScanForm pick_kda_scan_form(int64_t H, int64_t rows, int num_sms, bool wgmma, int wg_rows,
                               bool ckpt_every_chunk = false);

const char* kda_scan_form_name(KdaScanForm f);

}  // namespace k3::cuda
