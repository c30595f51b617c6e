// Caller-owned memory for the tensors of one decode step: a bump arena on the backend, rewound at the
// start of every step. A step takes its activations from it instead of allocating, and the same
// sequence of takes lands on the same addresses every step, which is what a recorded graph replays.
//
// Sized by use: a step that needs more than the arena holds gets the rest from Backend::alloc (that
// step is then not recordable) and the arena grows to that step's need at the next rewind, bumping
// epoch() so that graphs recorded over the old arena are recorded again.
#pragma once
#include <cstddef>
#include <cstdint>

#include "kernels/backend.h"

namespace k3 {

class StepWorkspace {
 public:
  explicit StepWorkspace(Backend& backend) : backend_(backend) {}

  // Starts a step: grows the arena if the last step overflowed it, then zeroes what the last step
  // used (one memset), so every take() returns zeroed memory like Backend::alloc.
  void begin_step();
  // `bytes` of the arena were used by work replayed instead of run (a graph recorded at this epoch).
  void replayed(size_t bytes);
  Tensor take(const Shape& shape, DType dtype);

  size_t used() const { return used_; }
  size_t capacity() const { return buffer_.nbytes(); }
  bool overflowed() const { return overflow_bytes_ > 0; }  // this step took memory outside the arena
  uint64_t epoch() const { return epoch_; }

 private:
  static constexpr size_t kAlign = 256;
  Backend& backend_;
  Tensor buffer_;              // U8 [capacity]
  size_t used_ = 0;            // bytes taken this step from the arena
  size_t overflow_bytes_ = 0;  // bytes this step took from Backend::alloc
  uint64_t epoch_ = 0;
};

}  // namespace k3
