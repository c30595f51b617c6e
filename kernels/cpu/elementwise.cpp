// Element-wise helpers and the embedding gather.
#include <cstring>

#include "kernels/cpu/check.h"
#include "kernels/cpu/cpu_ops.h"

namespace k3::cpu {
namespace {
constexpr int64_t kGrain = 4096;  // elements per chunk: below this threading costs more than it saves
}

void add(ThreadPool& pool, const ops::AddParams& p) {
  check_tensor("add", "a", p.a, DType::F32, {kAny, kAny});
  check_tensor("add", "b", p.b, DType::F32, {p.a.dim(0), p.a.dim(1)});
  check_tensor("add", "y", p.y, DType::F32, {p.a.dim(0), p.a.dim(1)});
  const float *a = p.a.f32(), *b = p.b.f32();
  float* y = p.y.f32();
  pool.parallel_for(p.a.numel(), [&](int64_t i0, int64_t i1) {
    for (int64_t i = i0; i < i1; ++i) y[i] = a[i] + b[i];
  }, kGrain);
}

void sigmoid_mul(ThreadPool& pool, const ops::SigmoidMulParams& p) {
  check_tensor("sigmoid_mul", "x", p.x, DType::F32, {kAny, kAny});
  check_tensor("sigmoid_mul", "gate", p.gate, DType::F32, {p.x.dim(0), p.x.dim(1)});
  check_tensor("sigmoid_mul", "y", p.y, DType::F32, {p.x.dim(0), p.x.dim(1)});
  const float *x = p.x.f32(), *g = p.gate.f32();
  float* y = p.y.f32();
  pool.parallel_for(p.x.numel(), [&](int64_t i0, int64_t i1) {
    for (int64_t i = i0; i < i1; ++i) y[i] = x[i] * sigmoidf(g[i]);
  }, kGrain);
}

void sigmoid(ThreadPool& pool, const Tensor& x, Tensor& y) {
  check_arg(x.defined() && x.dtype() == DType::F32 && x.device() == Device::Cpu, "sigmoid",
            "x: expected a host F32 tensor");
  check_arg(y.defined() && y.dtype() == DType::F32 && y.device() == Device::Cpu, "sigmoid",
            "y: expected a host F32 tensor");
  check_arg(y.numel() == x.numel(), "sigmoid",
            "y: expected " + std::to_string(x.numel()) + " elements (x is " + shape_str(x.shape()) + "), got " +
                shape_str(y.shape()));
  const float* xp = x.f32();
  float* yp = y.f32();
  pool.parallel_for(x.numel(), [&](int64_t i0, int64_t i1) {
    for (int64_t i = i0; i < i1; ++i) yp[i] = sigmoidf(xp[i]);
  }, kGrain);
}

void embedding(ThreadPool& pool, const ops::EmbeddingParams& p) {
  check_tensor("embedding", "table", p.table, DType::F32, {kAny, kAny});
  const int64_t V = p.table.dim(0), D = p.table.dim(1);
  check_tensor("embedding", "ids", p.ids, DType::I32, {kAny});
  const int64_t M = p.ids.dim(0);
  check_tensor("embedding", "y", p.y, DType::F32, {M, D});
  const int32_t* ids = p.ids.i32();
  for (int64_t m = 0; m < M; ++m)
    check_arg(ids[m] >= 0 && ids[m] < V, "embedding",
              "ids[" + std::to_string(m) + "] = " + std::to_string(ids[m]) + " is outside the table [0, " +
                  std::to_string(V) + ")");
  const float* table = p.table.f32();
  float* y = p.y.f32();
  pool.parallel_for(M, [&](int64_t m0, int64_t m1) {
    for (int64_t m = m0; m < m1; ++m) std::memcpy(y + m * D, table + ids[m] * D, D * sizeof(float));
  }, 16);
}

}  // namespace k3::cpu
