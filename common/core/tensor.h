// A contiguous, row-major tensor: dtype + shape + a pointer into storage owned elsewhere
// (a host vector, an mmap'ed file, a device allocation). Copies share the storage.
#pragma once
#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "common/core/status.h"

namespace k3 {

enum class DType : uint8_t { F32, BF16, F16, I32, I64, U8 };
enum class Device : uint8_t { Cpu, Cuda };

size_t dtype_size(DType t);
const char* dtype_name(DType t);              // safetensors spelling: "F32", "BF16", ...
Result<DType> dtype_from_name(const std::string& name);

using Shape = std::vector<int64_t>;
std::string shape_str(const Shape& s);        // "[2, 3]"
int64_t shape_numel(const Shape& s);

class Tensor {
 public:
  Tensor() = default;
  // Host tensor with fresh zeroed storage.
  static Tensor zeros(Shape shape, DType dtype = DType::F32);
  // Host f32 tensor holding a copy of `values` (numel must match).
  static Tensor from_f32(Shape shape, std::span<const float> values);
  static Tensor from_i32(Shape shape, std::span<const int32_t> values);
  // Non-owning view over memory kept alive by `owner` (may be null when the caller guarantees lifetime).
  static Tensor view(void* data, Shape shape, DType dtype, Device device = Device::Cpu,
                     std::shared_ptr<void> owner = nullptr);

  bool defined() const { return data_ != nullptr; }
  bool empty() const { return data_ == nullptr; }
  DType dtype() const { return dtype_; }
  Device device() const { return device_; }
  const Shape& shape() const { return shape_; }
  int64_t dim(int i) const { return shape_.at(i < 0 ? shape_.size() + i : i); }
  int ndim() const { return static_cast<int>(shape_.size()); }
  int64_t numel() const { return shape_numel(shape_); }
  size_t nbytes() const { return static_cast<size_t>(numel()) * dtype_size(dtype_); }
  void* data() const { return data_; }
  const std::shared_ptr<void>& owner() const { return owner_; }

  template <class T> T* ptr() const { return static_cast<T*>(data_); }
  float* f32() const;      // checks dtype F32 and host
  int32_t* i32() const;    // checks dtype I32 and host

  // Same storage, new shape with equal numel.
  Tensor reshape(Shape shape) const;
  // Rows [begin, end) of the leading dimension (shares storage).
  Tensor slice_rows(int64_t begin, int64_t end) const;
  // Deep copy on the host (f32 stays f32).
  Tensor clone() const;
  // Host copy converted to f32 (bf16/f16/f32 in).
  Tensor to_f32() const;

 private:
  void* data_ = nullptr;
  Shape shape_;
  DType dtype_ = DType::F32;
  Device device_ = Device::Cpu;
  std::shared_ptr<void> owner_;
};

// bf16/f16 <-> f32 scalar conversions (round to nearest even).
float bf16_to_f32(uint16_t v);
uint16_t f32_to_bf16(float v);
float f16_to_f32(uint16_t v);
uint16_t f32_to_f16(float v);

}  // namespace k3
