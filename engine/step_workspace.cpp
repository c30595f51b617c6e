#include "engine/step_workspace.h"

namespace k3 {

void StepWorkspace::begin_step() {
  const size_t need = used_ + overflow_bytes_;
  if (need > capacity()) {
    // Headroom: a batch that grows by a few requests does not move the arena (and its graphs) again.
    const size_t grown = need + need / 4;
    buffer_ = backend_.alloc({static_cast<int64_t>(grown)}, DType::U8);  // zeroed
    ++epoch_;
  } else if (used_ > 0) {
    Tensor dirty = buffer_.slice_rows(0, static_cast<int64_t>(used_));
    backend_.zero(dirty);
  }
  used_ = 0;
  overflow_bytes_ = 0;
}

void StepWorkspace::replayed(size_t bytes) { used_ = bytes; }

Tensor StepWorkspace::take(const Shape& shape, DType dtype) {
  const size_t bytes = static_cast<size_t>(shape_numel(shape)) * dtype_size(dtype);
  const size_t rounded = (bytes + kAlign - 1) / kAlign * kAlign;
  if (used_ + rounded > capacity()) {
    overflow_bytes_ += rounded;
    return backend_.alloc(shape, dtype);
  }
  void* p = static_cast<uint8_t*>(buffer_.data()) + used_;
  used_ += rounded;
  return Tensor::view(p, shape, dtype, buffer_.device(), buffer_.owner());
}

}  // namespace k3
