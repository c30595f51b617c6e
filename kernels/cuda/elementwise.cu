// Row kernels (RMSNorm, L2 norm) and element-wise kernels: one thread block per row or a
// grid-stride loop; fp32 math, one rounding at the store.
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/launch.h"
#include "kernels/cuda/pdl.cuh"
#include "kernels/cuda/reduce.cuh"

namespace k3::cuda {
namespace {

constexpr int kRowThreads = 256;

__global__ void rmsnorm_kernel(FIn x, FIn w, FOut y, int D, float eps) {
  pdl_enter();
  __shared__ float scratch[32];
  const int64_t row = blockIdx.x;
  float ss = 0.f;
  for (int i = threadIdx.x; i < D; i += blockDim.x) {
    const float v = x[row * D + i];
    ss += v * v;
  }
  const float inv = rsqrtf(block_sum(ss, scratch) / D + eps);
  for (int i = threadIdx.x; i < D; i += blockDim.x) {
    const float scale = w.p ? w[i] : 1.f;
    y.set(row * D + i, x[row * D + i] * inv * scale);  // same thread reads then writes: y may alias x
  }
}

__global__ void l2norm_kernel(FIn x, FOut y, int D, float eps, float scale) {
  pdl_enter();
  __shared__ float scratch[32];
  const int64_t row = blockIdx.x;
  float ss = 0.f;
  for (int i = threadIdx.x; i < D; i += blockDim.x) {
    const float v = x[row * D + i];
    ss += v * v;
  }
  const float inv = scale * rsqrtf(block_sum(ss, scratch) + eps);  // eps inside the sqrt, as fla
  for (int i = threadIdx.x; i < D; i += blockDim.x) y.set(row * D + i, x[row * D + i] * inv);
}

__global__ void situ_kernel(FIn g, FIn u, FOut y, int64_t n, float beta, float beta_l, bool silu) {
  pdl_enter();
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    const float gv = g[i], uv = u[i];
    y.set(i, glu_act(silu, gv, uv, beta, beta_l));
  }
}

__global__ void add_kernel(FIn a, FIn b, FOut y, int64_t n) {
  pdl_enter();
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x)
    y.set(i, a[i] + b[i]);
}

__global__ void sigmoid_mul_kernel(FIn x, FIn gate, FOut y, int64_t n) {
  pdl_enter();
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x)
    y.set(i, x[i] * sigmoidf(gate[i]));
}

__global__ void sigmoid_kernel(FIn x, FOut y, int64_t n) {
  pdl_enter();
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x)
    y.set(i, sigmoidf(x[i]));
}

__global__ void embedding_kernel(FIn table, const int32_t* ids, FOut y, int64_t D, int64_t V) {
  pdl_enter();
  const int64_t row = blockIdx.x;
  const int64_t id = ids[row];
  if (id < 0 || id >= V) {  // validated on the host when ids are host-visible; NaN marks a bad id here
    for (int64_t i = threadIdx.x; i < D; i += blockDim.x) y.set(row * D + i, __int_as_float(0x7fc00000));
    return;
  }
  for (int64_t i = threadIdx.x; i < D; i += blockDim.x) y.set(row * D + i, table[id * D + i]);
}

__global__ void kda_gate_kernel(FIn f, const float* a_log, const float* dt_bias, float* g, int64_t n, int H, int D,
                                float g_min, bool softplus) {
  pdl_enter();
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    const int c = int(i % (int64_t(H) * D));
    const int h = c / D;
    g[i] = kda_log_decay(softplus, a_log[h], f[i] + dt_bias[c], g_min);
  }
}

template <class T>
__global__ void copy_cols_kernel(const T* src, int64_t src_cols, T* dst, int64_t dst_rows, int64_t dst_cols,
                                 int64_t src_col, int64_t dst_col, int64_t ncols, int repeat) {
  pdl_enter();
  const int64_t n = dst_rows * ncols;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t r = i / ncols, j = i % ncols;
    dst[r * dst_cols + dst_col + j] = src[(r / repeat) * src_cols + src_col + j];
  }
}

__global__ void scatter_rows_kernel(const uint8_t* src, const int32_t* ids, uint8_t* dst, int64_t row_bytes) {
  pdl_enter();
  const int64_t r = blockIdx.x;
  const uint8_t* s = src + r * row_bytes;
  uint8_t* d = dst + int64_t(ids[r]) * row_bytes;
  for (int64_t i = threadIdx.x; i < row_bytes; i += blockDim.x) d[i] = s[i];
}

int grid_for(int64_t n) {
  const int64_t blocks = (n + 255) / 256;
  return int(blocks < 65536 ? (blocks > 0 ? blocks : 1) : 65536);
}

}  // namespace

void launch_rmsnorm(FIn x, FIn w, FOut y, int64_t M, int D, float eps, cudaStream_t s) {
  if (M == 0) return;
  launch_pdl("rmsnorm_kernel", rmsnorm_kernel, unsigned(M), kRowThreads, 0, s, x, w, y, D, eps);
}
void launch_l2norm(FIn x, FOut y, int64_t M, int D, float eps, float scale, cudaStream_t s) {
  if (M == 0) return;
  launch_pdl("l2norm_kernel", l2norm_kernel, unsigned(M), 128, 0, s, x, y, D, eps, scale);
}
void launch_situ(FIn g, FIn u, FOut y, int64_t n, float beta, float beta_linear, bool silu, cudaStream_t s) {
  if (n == 0) return;
  launch_pdl("situ_kernel", situ_kernel, grid_for(n), 256, 0, s, g, u, y, n, beta, beta_linear, silu);
}
void launch_add(FIn a, FIn b, FOut y, int64_t n, cudaStream_t s) {
  if (n == 0) return;
  launch_pdl("add_kernel", add_kernel, grid_for(n), 256, 0, s, a, b, y, n);
}
void launch_sigmoid_mul(FIn x, FIn gate, FOut y, int64_t n, cudaStream_t s) {
  if (n == 0) return;
  launch_pdl("sigmoid_mul_kernel", sigmoid_mul_kernel, grid_for(n), 256, 0, s, x, gate, y, n);
}
void launch_sigmoid(FIn x, FOut y, int64_t n, cudaStream_t s) {
  if (n == 0) return;
  launch_pdl("sigmoid_kernel", sigmoid_kernel, grid_for(n), 256, 0, s, x, y, n);
}
void launch_embedding(FIn table, const int32_t* ids, FOut y, int64_t M, int64_t D, int64_t V, cudaStream_t s) {
  if (M == 0) return;
  launch_pdl("embedding_kernel", embedding_kernel, unsigned(M), 256, 0, s, table, ids, y, D, V);
}
void launch_kda_gate(FIn f, const float* a_log, const float* dt_bias, float* g, int64_t T, int H, int D, float g_min,
                     bool softplus, cudaStream_t s) {
  const int64_t n = T * H * D;
  if (n == 0) return;
  launch_pdl("kda_gate_kernel", kda_gate_kernel, grid_for(n), 256, 0, s, f, a_log, dt_bias, g, n, H, D, g_min,
             softplus);
}
void launch_copy_cols(const void* src, int64_t src_rows, int64_t src_cols, void* dst, int64_t dst_rows,
                      int64_t dst_cols, int64_t src_col, int64_t dst_col, int64_t ncols, int repeat, int elem,
                      cudaStream_t s) {
  const int64_t n = dst_rows * ncols;
  if (n == 0) return;
  if (elem == 2)
    launch_pdl("copy_cols_kernel", copy_cols_kernel<uint16_t>, grid_for(n), 256, 0, s,
               static_cast<const uint16_t*>(src), src_cols, static_cast<uint16_t*>(dst), dst_rows, dst_cols, src_col,
               dst_col, ncols, repeat);
  else
    launch_pdl("copy_cols_kernel", copy_cols_kernel<uint32_t>, grid_for(n), 256, 0, s,
               static_cast<const uint32_t*>(src), src_cols, static_cast<uint32_t*>(dst), dst_rows, dst_cols, src_col,
               dst_col, ncols, repeat);
}
void launch_scatter_rows(const void* src, const int32_t* ids, void* dst, int64_t R, int64_t row_bytes, cudaStream_t s) {
  if (R == 0) return;
  launch_pdl("scatter_rows_kernel", scatter_rows_kernel, unsigned(R), 256, 0, s, static_cast<const uint8_t*>(src), ids,
             static_cast<uint8_t*>(dst), row_bytes);
}

}  // namespace k3::cuda
