#include "kernels/cpu/check.h"

#include <vector>

namespace k3::cpu {
namespace {

std::string expected_str(std::initializer_list<int64_t> shape) {
  std::string s = "[";
  bool first = true;
  for (int64_t d : shape) {
    s += first ? "" : ", ";
    s += d == kAny ? std::string("*") : std::to_string(d);
    first = false;
  }
  return s + "]";
}

}  // namespace

void check_arg(bool cond, const char* op, const std::string& what) {
  if (!cond) throw Error(std::string(op) + ": " + what);
}

void check_tensor(const char* op, const char* field, const Tensor& t, DType dtype,
                  std::initializer_list<int64_t> shape) {
  const std::string where = std::string(op) + ": " + field + ": ";
  if (!t.defined()) throw Error(where + "missing tensor (expected shape " + expected_str(shape) + ")");
  if (t.device() != Device::Cpu) throw Error(where + "expected a host tensor for the CPU backend");
  if (t.dtype() != dtype)
    throw Error(where + "expected dtype " + dtype_name(dtype) + ", got " + dtype_name(t.dtype()));
  bool ok = t.ndim() == static_cast<int>(shape.size());
  int i = 0;
  for (int64_t d : shape) {
    if (ok && d != kAny && t.dim(i) != d) ok = false;
    ++i;
  }
  if (!ok) throw Error(where + "expected shape " + expected_str(shape) + ", got " + shape_str(t.shape()));
}

bool check_optional(const char* op, const char* field, const Tensor& t, DType dtype,
                    std::initializer_list<int64_t> shape) {
  if (!t.defined()) return false;
  check_tensor(op, field, t, dtype, shape);
  return true;
}

int64_t check_varlen(const char* op, const Tensor& cu_seqlens, const Tensor& slots, int64_t total,
                     int64_t num_slots) {
  check_tensor(op, "slots", slots, DType::I32, {kAny});
  const int64_t n = slots.dim(0);
  check_tensor(op, "cu_seqlens", cu_seqlens, DType::I32, {n + 1});
  const int32_t* cu = cu_seqlens.i32();
  const int32_t* sl = slots.i32();
  check_arg(cu[0] == 0, op, "cu_seqlens: must start at 0, got " + std::to_string(cu[0]));
  check_arg(cu[n] == total, op,
            "cu_seqlens: last entry must equal the total token count " + std::to_string(total) + ", got " +
                std::to_string(cu[n]));
  std::vector<bool> used(static_cast<size_t>(num_slots), false);
  for (int64_t i = 0; i < n; ++i) {
    check_arg(cu[i + 1] >= cu[i], op, "cu_seqlens: must be non-decreasing (entry " + std::to_string(i + 1) + ")");
    check_arg(sl[i] >= 0 && sl[i] < num_slots, op,
              "slots[" + std::to_string(i) + "] = " + std::to_string(sl[i]) + " is outside [0, " +
                  std::to_string(num_slots) + ")");
    check_arg(!used[sl[i]], op, "slots: slot " + std::to_string(sl[i]) + " is used by two sequences");
    used[sl[i]] = true;
  }
  return n;
}

}  // namespace k3::cpu
