#include "kernels/cuda/kda_scan_form.h"

namespace k3::cuda {

// Thresholds in blocks of 32 rows (4 per sequence and head). The mma.sync shapes come from an H200
// sweep (2026-11-29); the wgmma split from 2026-12-03: at T = 8192, H = 96, 384 blocks of 32 rows fill
// 0.97 of a wave where 192 of 64 rows fill 0.73 (2.4 % less prefill time), while past a wave the
// 64-row blocks win because each workspace tile is read by two blocks instead of four (10 % at
// 256 x 100 tokens, H = 96). docs/PERF.md, "Kernels, tenth pass". Since the scans take their tiles
// by bulk copies and overlap each product's two groups (eleventh pass), the two forms are level at
// T = 8192, H = 96 (1083-1089 µs in 64-row blocks, 1093-1118 in 32-row ones, three calls); the
// 32-row form still wins with checkpoints every 64 tokens in two of three and at 2 x 8192, H = 64
// loses by 24 %, so the boundary stays where the wave arithmetic puts it.
//
// A head per block (four 32-row warpgroups sharing two stages of tiles) uses only H·rows SMs, and
// without checkpoints it is 4 % slower than 32-row blocks at T = 8192, H = 96 (1134 against 1088 µs).
// With a checkpoint after every chunk it is 8 % faster (1280 against 1384 µs, two calls), whether its
// warpgroups write their quarters of the state from registers (now) or stage them for bulk stores
// (1265-1275 µs either way, one call): its copies of the tiles are shared, so more of the bandwidth is
// left to the checkpoints. With checkpoints every 256 tokens it is slower again (1152 against 1105). Hence the form for calls with
// a checkpoint after every chunk, where its grid fits one wave (H·rows <= SMs).
KdaScanForm pick_kda_scan_form(int64_t H, int64_t rows, int num_sms, bool wgmma, int wg_rows,
                               bool ckpt_every_chunk) {
  const int64_t sms = num_sms, blocks32 = 4 * H * rows;
  if (blocks32 >= 2 * sms) {
    if (!wgmma) return KdaScanForm::kMma64;
    if (wg_rows == 128 || (wg_rows == 0 && ckpt_every_chunk && H * rows <= sms)) return KdaScanForm::kWgHead;
    const bool wg32 = wg_rows == 32 || (wg_rows == 0 && blocks32 <= 3 * sms);
    return wg32 ? KdaScanForm::kWg32 : KdaScanForm::kWg64;
  }
  return blocks32 <= sms ? KdaScanForm::kMma32x3 : KdaScanForm::kMma32x2;
}

const char* kda_scan_form_name(KdaScanForm f) {
  switch (f) {
    case KdaScanForm::kMma32x3: return "mma.sync 32-row, 3 stages";
    case KdaScanForm::kMma32x2: return "mma.sync 32-row, 2 stages";
    case KdaScanForm::kMma64: return "mma.sync 64-row";
    case KdaScanForm::kWg64: return "wgmma 64-row";
    case KdaScanForm::kWg32: return "wgmma 32-row";
    case KdaScanForm::kWgHead: return "wgmma, a head per block";
  }
  return "?";
}

}  // namespace k3::cuda
