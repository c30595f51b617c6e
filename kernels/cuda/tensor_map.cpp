#include "kernels/cuda/tensor_map.h"

#include <cudaTypedefs.h>

#include <string>

#include "kernels/cuda/align.h"
#include "kernels/cuda/cuda_check.h"

namespace k3::cuda {
namespace {

// The driver's encoder, looked up once per process (a constant after that, never written again).
PFN_cuTensorMapEncodeTiled_v12000 encoder() {
  static const PFN_cuTensorMapEncodeTiled_v12000 fn = [] {
    void* p = nullptr;
    cudaDriverEntryPointQueryResult q{};
    K3_CUDA_OK(cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &p, 12000, cudaEnableDefault, &q));
    if (q != cudaDriverEntryPointSuccess || p == nullptr)
      throw Error("tensor map: the driver has no cuTensorMapEncodeTiled (needs CUDA 12 driver or newer)");
    return reinterpret_cast<PFN_cuTensorMapEncodeTiled_v12000>(p);
  }();
  return fn;
}

}  // namespace

void load_tensor_map_encoder() { (void)encoder(); }

CUtensorMap make_bf16_tensor_map_sw128(const void* base, int64_t rows, int64_t cols, int box_rows) {
  return make_bf16_tensor_map(base, rows, cols, 64, box_rows, true);
}

namespace {

// One 2-D map over a row-major [rows][cols] array of elem_bytes-wide elements, boxes of box_cols x
// box_rows; with the 128B swizzle a box row is exactly 128 bytes (one swizzle atom row).
CUtensorMap encode(CUtensorMapDataType type, int elem_bytes, const void* base, int64_t rows, int64_t cols,
                   int box_cols, int box_rows, bool swizzle128) {
  const int align = 16 / elem_bytes;  // elements per 16 bytes: the row pitch's and a plain box row's unit
  if (!aligned16(base)) throw Error("tensor map: base address is not 16-byte aligned");
  if (cols % align != 0 || cols < box_cols)
    throw Error("tensor map: cols " + std::to_string(cols) + " is not a multiple of " + std::to_string(align) +
                " >= the box's " + std::to_string(box_cols));
  if (rows <= 0 || rows > (int64_t(1) << 32)) throw Error("tensor map: rows " + std::to_string(rows) + " out of range");
  if (box_rows < 1 || box_rows > 256) throw Error("tensor map: box_rows " + std::to_string(box_rows) + " not in 1..256");
  if (swizzle128 ? box_cols * elem_bytes != 128 : (box_cols % align != 0 || box_cols < align || box_cols > 256))
    throw Error("tensor map: box_cols " + std::to_string(box_cols) +
                (swizzle128 ? " is not 128 bytes, as the 128B swizzle needs" : " is not a multiple of 16 bytes up to 256 elements"));
  CUtensorMap map{};
  const cuuint64_t dims[2] = {cuuint64_t(cols), cuuint64_t(rows)};  // innermost first
  const cuuint64_t strides[1] = {cuuint64_t(cols) * elem_bytes};     // bytes between rows
  const cuuint32_t box[2] = {cuuint32_t(box_cols), cuuint32_t(box_rows)};
  const cuuint32_t elem_strides[2] = {1, 1};
  const CUresult r = encoder()(&map, type, 2, const_cast<void*>(base), dims, strides, box, elem_strides,
                               CU_TENSOR_MAP_INTERLEAVE_NONE,
                               swizzle128 ? CU_TENSOR_MAP_SWIZZLE_128B : CU_TENSOR_MAP_SWIZZLE_NONE,
                               CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  if (r != CUDA_SUCCESS) throw Error("tensor map: cuTensorMapEncodeTiled failed with CUresult " + std::to_string(int(r)));
  return map;
}

}  // namespace

CUtensorMap make_bf16_tensor_map(const void* base, int64_t rows, int64_t cols, int box_cols, int box_rows,
                                 bool swizzle128) {
  return encode(CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 2, base, rows, cols, box_cols, box_rows, swizzle128);
}

CUtensorMap make_f32_tensor_map_sw128(void* base, int64_t rows, int64_t cols, int box_rows) {
  return encode(CU_TENSOR_MAP_DATA_TYPE_FLOAT32, 4, base, rows, cols, 32, box_rows, true);
}

RowsTensorMap make_bf16_rows_map_sw128(const void* base, int64_t rows, int64_t cols, int64_t row_pitch, int64_t batch,
                                       int64_t batch_pitch, int box_rows) {
  if (!aligned16(base)) throw Error("tensor map: base address is not 16-byte aligned");
  if (rows <= 0 || cols <= 0 || batch <= 0 || rows > (int64_t(1) << 31) || batch > (int64_t(1) << 31))
    throw Error("tensor map: rows " + std::to_string(rows) + ", cols " + std::to_string(cols) + ", batch " +
                std::to_string(batch) + " out of range");
  if (batch == 1) batch_pitch = rows * row_pitch;  // never stepped; any valid pitch
  if (row_pitch % 8 != 0 || batch_pitch % 8 != 0 || row_pitch < cols)
    throw Error("tensor map: row pitch " + std::to_string(row_pitch) + " and batch pitch " + std::to_string(batch_pitch) +
                " must be multiples of 8 elements, the row pitch >= cols " + std::to_string(cols));
  if (box_rows < 1 || box_rows > 256) throw Error("tensor map: box_rows " + std::to_string(box_rows) + " not in 1..256");
  const bool rows_inner = row_pitch <= batch_pitch;
  const cuuint64_t dims[3] = {cuuint64_t(cols), cuuint64_t(rows_inner ? rows : batch),
                              cuuint64_t(rows_inner ? batch : rows)};
  const cuuint64_t strides[2] = {cuuint64_t(rows_inner ? row_pitch : batch_pitch) * 2,
                                 cuuint64_t(rows_inner ? batch_pitch : row_pitch) * 2};
  const cuuint32_t box[3] = {64, cuuint32_t(rows_inner ? box_rows : 1), cuuint32_t(rows_inner ? 1 : box_rows)};
  const cuuint32_t elem_strides[3] = {1, 1, 1};
  RowsTensorMap out{{}, rows_inner};
  const CUresult r = encoder()(&out.map, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 3, const_cast<void*>(base), dims, strides, box,
                               elem_strides, CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
                               CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  if (r != CUDA_SUCCESS) throw Error("tensor map: cuTensorMapEncodeTiled (3-D) failed with CUresult " + std::to_string(int(r)));
  return out;
}

}  // namespace k3::cuda
