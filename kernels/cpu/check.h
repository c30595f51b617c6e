// Entry validation for the CPU ops: every failure names the op, the field, what was expected and
// what was got ("gemm: w: expected shape [N, 64], got [8, 32]").
#pragma once
#include <cstdint>
#include <initializer_list>
#include <string>

#include "common/core/tensor.h"

namespace k3::cpu {

// One expected dimension: a size, or kAny (any size; binds nothing).
inline constexpr int64_t kAny = -1;

// Checks dtype, host residency and shape (kAny matches any size). Throws k3::Error.
void check_tensor(const char* op, const char* field, const Tensor& t, DType dtype,
                  std::initializer_list<int64_t> shape);
// Same for tensors that may be empty (no data); returns whether it is present.
bool check_optional(const char* op, const char* field, const Tensor& t, DType dtype,
                    std::initializer_list<int64_t> shape);
// Throws "op: what" unless cond.
void check_arg(bool cond, const char* op, const std::string& what);
// cu_seqlens [N+1] I32: starts at 0, non-decreasing, ends at total. slots [N] I32: distinct, in
// [0, num_slots). Returns N.
int64_t check_varlen(const char* op, const Tensor& cu_seqlens, const Tensor& slots, int64_t total,
                     int64_t num_slots);

}  // namespace k3::cpu
