// Host implementations of the data-movement ops and the weight fill. They are exact (no arithmetic
// but head_gemm, which sums in a fixed order, and the fill's one multiply), so every backend that
// keeps tensors on the host can use them.
#include "kernels/backend.h"

#include <algorithm>
#include <cstring>

#include "common/core/counter_random.h"

namespace k3 {

namespace {
void require_host(const Tensor& t, const char* op, const char* field) {
  K3_CHECK(t.device() == Device::Cpu, std::string(op) + ": " + field + " must be a host tensor for the host implementation");
}
}  // namespace

void Backend::zero(Tensor& t) {
  require_host(t, "zero", "t");
  if (t.nbytes()) std::memset(t.data(), 0, t.nbytes());
}

std::unique_ptr<StepGraph> Backend::capture(const std::function<void()>& body, bool strict) {
  if (!begin_capture(strict)) return nullptr;
  try {
    body();
  } catch (...) {
    abandon_capture();
    throw;
  }
  return end_capture();
}

void Backend::copy_cols(const ops::CopyColsParams& p) {
  require_host(p.src, "copy_cols", "src");
  require_host(p.dst, "copy_cols", "dst");
  K3_CHECK(p.src.ndim() == 2 && p.dst.ndim() == 2, "copy_cols: src and dst must be 2-D, got " +
           shape_str(p.src.shape()) + " and " + shape_str(p.dst.shape()));
  K3_CHECK(p.src.dtype() == p.dst.dtype(), "copy_cols: src and dst dtypes differ");
  const int64_t ms = p.src.dim(0), ns = p.src.dim(1), md = p.dst.dim(0), nd = p.dst.dim(1);
  const int64_t n = p.ncols < 0 ? ns - p.src_col : p.ncols;
  K3_CHECK(p.src_row_repeat >= 1 && md == ms * p.src_row_repeat,
           "copy_cols: dst rows " + std::to_string(md) + " != src rows " + std::to_string(ms) + " x repeat " +
           std::to_string(p.src_row_repeat));
  K3_CHECK(p.src_col >= 0 && p.src_col + n <= ns && p.dst_col >= 0 && p.dst_col + n <= nd,
           "copy_cols: column range out of bounds");
  const size_t es = dtype_size(p.src.dtype());
  auto* s = static_cast<const uint8_t*>(p.src.data());
  auto* d = static_cast<uint8_t*>(p.dst.data());
  for (int64_t r = 0; r < md; ++r)
    std::memcpy(d + (r * nd + p.dst_col) * es, s + ((r / p.src_row_repeat) * ns + p.src_col) * es, n * es);
}

void Backend::fill_uniform(const ops::FillUniformParams& p) {
  require_host(p.y, "fill_uniform", "y");
  check_fill_uniform(p);
  fill_uniform_range(p, 0, p.y.numel());
}

void Backend::check_fill_uniform(const ops::FillUniformParams& p) {
  K3_CHECK(p.y.dtype() == DType::F32 || p.y.dtype() == DType::BF16,
           std::string("fill_uniform: y must be F32 or BF16, got ") + dtype_name(p.y.dtype()));
  K3_CHECK(p.first >= 0, "fill_uniform: first must be >= 0, got " + std::to_string(p.first));
}

void Backend::fill_uniform_range(const ops::FillUniformParams& p, int64_t begin, int64_t end) {
  float* f32 = p.y.dtype() == DType::F32 ? p.y.f32() : nullptr;
  uint16_t* b16 = f32 ? nullptr : p.y.ptr<uint16_t>();
  for (int64_t i = begin; i < end; ++i) {
    float v = counter_random::uniform(p.seed, static_cast<uint64_t>(p.first + i), p.scale);
    if (p.round_to_bf16) v = bf16_to_f32(f32_to_bf16(v));
    if (f32) f32[i] = v;
    else b16[i] = f32_to_bf16(v);
  }
}

void Backend::scatter_rows(const ops::ScatterRowsParams& p) {
  require_host(p.src, "scatter_rows", "src");
  require_host(p.dst, "scatter_rows", "dst");
  K3_CHECK(p.src.ndim() == 2 && p.dst.ndim() == 2 && p.src.dim(1) == p.dst.dim(1) && p.src.dtype() == p.dst.dtype(),
           "scatter_rows: src " + shape_str(p.src.shape()) + " and dst " + shape_str(p.dst.shape()) + " must agree in width and dtype");
  K3_CHECK(p.ids.numel() == p.src.dim(0), "scatter_rows: ids must have one entry per src row");
  const int32_t* ids = p.ids.i32();
  const size_t row = p.src.nbytes() / std::max<int64_t>(p.src.dim(0), 1);
  for (int64_t r = 0; r < p.src.dim(0); ++r) {
    K3_CHECK(ids[r] >= 0 && ids[r] < p.dst.dim(0), "scatter_rows: id " + std::to_string(ids[r]) + " out of range");
    std::memcpy(static_cast<uint8_t*>(p.dst.data()) + ids[r] * row, static_cast<const uint8_t*>(p.src.data()) + r * row, row);
  }
}

void Backend::head_gemm(const ops::HeadGemmParams& p) {
  K3_CHECK(p.x.ndim() == 3 && p.w.ndim() == 3 && p.y.ndim() == 3, "head_gemm: x, w, y must be 3-D");
  const int64_t m = p.x.dim(0), h = p.x.dim(1), k = p.x.dim(2), n = p.w.dim(1);
  K3_CHECK(p.w.dim(0) == h && p.w.dim(2) == k, "head_gemm: w " + shape_str(p.w.shape()) + " does not match x " + shape_str(p.x.shape()));
  K3_CHECK(p.y.dim(0) == m && p.y.dim(1) == h && p.y.dim(2) == n, "head_gemm: y shape " + shape_str(p.y.shape()));
  const float* x = p.x.f32();
  const float* w = p.w.f32();
  float* y = p.y.f32();
  for (int64_t i = 0; i < m; ++i)
    for (int64_t hh = 0; hh < h; ++hh) {
      const float* xr = x + (i * h + hh) * k;
      for (int64_t j = 0; j < n; ++j) {
        const float* wr = w + (hh * n + j) * k;
        float acc = 0.f;
        for (int64_t t = 0; t < k; ++t) acc += xr[t] * wr[t];
        y[(i * h + hh) * n + j] = acc;
      }
    }
}

}  // namespace k3
