#include "common/core/tensor.h"

#include <cstring>
#include <sstream>

namespace k3 {

size_t dtype_size(DType t) {
  switch (t) {
    case DType::F32: return 4;
    case DType::BF16: return 2;
    case DType::F16: return 2;
    case DType::I32: return 4;
    case DType::I64: return 8;
    case DType::U8: return 1;
  }
  return 0;
}

const char* dtype_name(DType t) {
  switch (t) {
    case DType::F32: return "F32";
    case DType::BF16: return "BF16";
    case DType::F16: return "F16";
    case DType::I32: return "I32";
    case DType::I64: return "I64";
    case DType::U8: return "U8";
  }
  return "?";
}

Result<DType> dtype_from_name(const std::string& name) {
  for (DType t : {DType::F32, DType::BF16, DType::F16, DType::I32, DType::I64, DType::U8})
    if (name == dtype_name(t)) return t;
  return invalid_argument("unsupported dtype '" + name + "' (supported: F32, BF16, F16, I32, I64, U8)");
}

std::string shape_str(const Shape& s) {
  std::ostringstream o;
  o << '[';
  for (size_t i = 0; i < s.size(); ++i) o << (i ? ", " : "") << s[i];
  o << ']';
  return o.str();
}

int64_t shape_numel(const Shape& s) {
  int64_t n = 1;
  for (int64_t d : s) n *= d;
  return n;
}

Tensor Tensor::zeros(Shape shape, DType dtype) {
  Tensor t;
  t.shape_ = std::move(shape);
  t.dtype_ = dtype;
  for (int64_t d : t.shape_) K3_CHECK(d >= 0, "negative dimension in " + shape_str(t.shape_));
  size_t bytes = t.nbytes();
  // Keep a valid pointer even for zero-size tensors so defined() can tell them from "no tensor".
  auto buf = std::shared_ptr<uint8_t[]>(new uint8_t[bytes ? bytes : 1]());
  t.data_ = buf.get();
  t.owner_ = std::shared_ptr<void>(buf, buf.get());
  return t;
}

Tensor Tensor::from_f32(Shape shape, std::span<const float> values) {
  Tensor t = zeros(std::move(shape), DType::F32);
  K3_CHECK(static_cast<int64_t>(values.size()) == t.numel(), "from_f32: value count does not match shape");
  std::memcpy(t.data_, values.data(), t.nbytes());
  return t;
}

Tensor Tensor::from_i32(Shape shape, std::span<const int32_t> values) {
  Tensor t = zeros(std::move(shape), DType::I32);
  K3_CHECK(static_cast<int64_t>(values.size()) == t.numel(), "from_i32: value count does not match shape");
  std::memcpy(t.data_, values.data(), t.nbytes());
  return t;
}

Tensor Tensor::view(void* data, Shape shape, DType dtype, Device device, std::shared_ptr<void> owner) {
  Tensor t;
  t.data_ = data;
  t.shape_ = std::move(shape);
  t.dtype_ = dtype;
  t.device_ = device;
  t.owner_ = std::move(owner);
  return t;
}

float* Tensor::f32() const {
  K3_CHECK(dtype_ == DType::F32, std::string("expected F32 tensor, got ") + dtype_name(dtype_));
  K3_CHECK(device_ == Device::Cpu, "expected a host tensor");
  return static_cast<float*>(data_);
}

int32_t* Tensor::i32() const {
  K3_CHECK(dtype_ == DType::I32, std::string("expected I32 tensor, got ") + dtype_name(dtype_));
  K3_CHECK(device_ == Device::Cpu, "expected a host tensor");
  return static_cast<int32_t*>(data_);
}

Tensor Tensor::reshape(Shape shape) const {
  K3_CHECK(shape_numel(shape) == numel(), "reshape " + shape_str(shape_) + " -> " + shape_str(shape));
  Tensor t = *this;
  t.shape_ = std::move(shape);
  return t;
}

Tensor Tensor::slice_rows(int64_t begin, int64_t end) const {
  K3_CHECK(ndim() >= 1 && 0 <= begin && begin <= end && end <= shape_[0],
           "slice_rows [" + std::to_string(begin) + ", " + std::to_string(end) + ") of " + shape_str(shape_));
  Tensor t = *this;
  size_t row_bytes = shape_[0] ? nbytes() / shape_[0] : 0;
  t.data_ = static_cast<uint8_t*>(data_) + begin * row_bytes;
  t.shape_[0] = end - begin;
  return t;
}

Tensor Tensor::clone() const {
  K3_CHECK(device_ == Device::Cpu, "clone: host tensors only");
  Tensor t = zeros(shape_, dtype_);
  if (nbytes()) std::memcpy(t.data_, data_, nbytes());
  return t;
}

Tensor Tensor::to_f32() const {
  K3_CHECK(device_ == Device::Cpu, "to_f32: host tensors only");
  if (dtype_ == DType::F32) return clone();
  Tensor t = zeros(shape_, DType::F32);
  float* out = t.f32();
  const int64_t n = numel();
  if (dtype_ == DType::BF16) {
    auto* in = static_cast<const uint16_t*>(data_);
    for (int64_t i = 0; i < n; ++i) out[i] = bf16_to_f32(in[i]);
  } else if (dtype_ == DType::F16) {
    auto* in = static_cast<const uint16_t*>(data_);
    for (int64_t i = 0; i < n; ++i) out[i] = f16_to_f32(in[i]);
  } else {
    throw Error(std::string("to_f32: cannot convert ") + dtype_name(dtype_));
  }
  return t;
}

float bf16_to_f32(uint16_t v) {
  uint32_t bits = static_cast<uint32_t>(v) << 16;
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

uint16_t f32_to_bf16(float v) {
  uint32_t bits;
  std::memcpy(&bits, &v, 4);
  if ((bits & 0x7f800000u) == 0x7f800000u && (bits & 0x7fffffu)) return static_cast<uint16_t>((bits >> 16) | 0x40);  // NaN stays NaN
  uint32_t rounding = 0x7fffu + ((bits >> 16) & 1u);
  return static_cast<uint16_t>((bits + rounding) >> 16);
}

float f16_to_f32(uint16_t h) {
  uint32_t sign = (h & 0x8000u) << 16, exp = (h >> 10) & 0x1f, mant = h & 0x3ff, bits;
  if (exp == 0) {
    if (mant == 0) {
      bits = sign;
    } else {  // subnormal: normalise
      exp = 127 - 15 + 1;
      while (!(mant & 0x400)) { mant <<= 1; --exp; }
      mant &= 0x3ff;
      bits = sign | (exp << 23) | (mant << 13);
    }
  } else if (exp == 31) {
    bits = sign | 0x7f800000u | (mant << 13);
  } else {
    bits = sign | ((exp + 127 - 15) << 23) | (mant << 13);
  }
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

uint16_t f32_to_f16(float v) {
  uint32_t bits;
  std::memcpy(&bits, &v, 4);
  uint32_t sign = (bits >> 16) & 0x8000u;
  int32_t exp = static_cast<int32_t>((bits >> 23) & 0xff) - 127 + 15;
  uint32_t mant = bits & 0x7fffffu;
  if (((bits >> 23) & 0xff) == 0xff) return static_cast<uint16_t>(sign | 0x7c00u | (mant ? 0x200u : 0));
  if (exp >= 31) return static_cast<uint16_t>(sign | 0x7c00u);
  if (exp <= 0) {
    if (exp < -10) return static_cast<uint16_t>(sign);
    mant |= 0x800000u;
    uint32_t shift = static_cast<uint32_t>(14 - exp);
    uint32_t half = mant >> shift;
    uint32_t rem = mant & ((1u << shift) - 1), mid = 1u << (shift - 1);
    if (rem > mid || (rem == mid && (half & 1))) ++half;
    return static_cast<uint16_t>(sign | half);
  }
  uint32_t half = sign | (static_cast<uint32_t>(exp) << 10) | (mant >> 13);
  uint32_t rem = mant & 0x1fffu;
  if (rem > 0x1000u || (rem == 0x1000u && (half & 1))) ++half;
  return static_cast<uint16_t>(half);
}

}  // namespace k3
