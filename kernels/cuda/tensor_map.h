// Tensor maps for the Hopper tensor memory accelerator (TMA, cp.async.bulk.tensor): the descriptor
// a kernel hands to one bulk instruction to copy a whole 2-D box of a global array into shared
// memory (or back out of it), already in the 128-byte swizzled layout that wgmma reads (wgmma.cuh). Encoding goes
// through the driver (cuTensorMapEncodeTiled), reached via the runtime's entry-point lookup so the
// library does not link libcuda itself.
#pragma once
#include <cuda.h>

#include <cstdint>

namespace k3::cuda {

// Row-major bf16 array [rows][cols] (row pitch = cols elements, a multiple of 8), copied in boxes
// of box_rows x 64 elements (128 bytes: one swizzle atom row) with the 128B swizzle. Throws
// k3::Error naming the argument the driver refused.
CUtensorMap make_bf16_tensor_map_sw128(const void* base, int64_t rows, int64_t cols, int box_rows);

// The same with boxes of box_cols x box_rows, with the 128B swizzle (box_cols = 64) or without it
// (box_cols a multiple of 8 up to 256: rows land row-major, box_cols elements each).
CUtensorMap make_bf16_tensor_map(const void* base, int64_t rows, int64_t cols, int box_cols, int box_rows,
                                 bool swizzle128);

// Row-major fp32 array [rows][cols] (cols a multiple of 4) in boxes of box_rows x 32 elements (128
// bytes) with the 128B swizzle: for bulk stores of fp32 tiles that threads wrote into shared memory
// in the swizzled layout (which keeps their 4-byte writes free of bank conflicts).
CUtensorMap make_f32_tensor_map_sw128(void* base, int64_t rows, int64_t cols, int box_rows);

// A bf16 matrix of `rows` rows of `cols` elements at a row pitch of row_pitch elements, repeated
// `batch` times batch_pitch elements apart (both pitches multiples of 8), copied in boxes of 64
// columns x box_rows rows of one batch entry with the 128B swizzle; reads past `cols` or `rows` land
// as zeros. The driver is given the two outer dimensions in increasing pitch, so a batch nested
// inside the rows (head_gemm's x, [M][H][K]) is as valid as one outside them; a kernel names a box as
// (column, row, entry) when rows_inner, else (column, entry, row).
struct RowsTensorMap {
  CUtensorMap map;
  bool rows_inner;
};
RowsTensorMap make_bf16_rows_map_sw128(const void* base, int64_t rows, int64_t cols, int64_t row_pitch, int64_t batch,
                                       int64_t batch_pitch, int box_rows);

// Looks the driver's encoder up now (once per process; CudaBackend does it at construction, so the
// lookup never happens inside a CUDA graph capture). Throws k3::Error if the driver lacks it.
void load_tensor_map_encoder();

}  // namespace k3::cuda
