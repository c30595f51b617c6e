// Safetensors writing. The header (8-byte length + JSON padded with spaces to a multiple of 8, so
// the data section starts 8-aligned) is written first from the declared layout; tensor data is
// then streamed one tensor at a time, so a model larger than memory can be generated.
// The file appears under its final name only after finish() (written to "<path>.tmp", renamed).
#pragma once
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "common/core/tensor.h"

namespace k3 {

struct SafetensorsLayoutEntry {
  std::string name;
  DType dtype = DType::F32;
  Shape shape;
};

class SafetensorsWriter {
 public:
  // Tensors are stored in `layout` order with no gaps between them.
  static Result<SafetensorsWriter> create(const std::string& path, std::vector<SafetensorsLayoutEntry> layout,
                                          const std::map<std::string, std::string>& metadata = {});
  SafetensorsWriter(SafetensorsWriter&&) noexcept;
  SafetensorsWriter& operator=(SafetensorsWriter&&) noexcept;
  ~SafetensorsWriter();  // an unfinished file is removed

  // The next tensor of the layout; its name, dtype and shape must match the declaration.
  Status write(const std::string& name, const Tensor& t);
  // All tensors written: flush, close and move the file into place.
  Status finish();

  size_t num_written() const;
  const std::vector<SafetensorsLayoutEntry>& layout() const;
  uint64_t total_bytes() const;  // final file size

  struct State;

 private:
  explicit SafetensorsWriter(std::unique_ptr<State> s);
  std::unique_ptr<State> s_;
};

// Orders tensors so wider dtypes come first: with an 8-aligned data section every tensor then
// starts aligned to its element size, which keeps readers' views zero-copy. Stable otherwise.
void sort_layout_for_alignment(std::vector<SafetensorsLayoutEntry>& layout);

// Sum of the tensor data bytes of a layout (the file size less the header; an index's total_size).
uint64_t safetensors_data_bytes(const std::vector<SafetensorsLayoutEntry>& layout);

// Size of the file that `layout` + `metadata` would produce.
uint64_t safetensors_file_size(const std::vector<SafetensorsLayoutEntry>& layout,
                               const std::map<std::string, std::string>& metadata = {});

// Whole-file convenience: host tensors of any dtype (ordered by sort_layout_for_alignment).
Status write_safetensors(const std::string& path, const std::vector<std::pair<std::string, Tensor>>& tensors,
                         const std::map<std::string, std::string>& metadata = {});

}  // namespace k3
