// Safetensors reading: an 8-byte little-endian header length N, N bytes of JSON header
// ({name: {dtype, shape, data_offsets: [begin, end]}, optional "__metadata__": {str: str}}), then
// the data section. Files are mmap'ed; tensors are zero-copy views that keep the mapping alive.
// Every structural error names the file and the tensor (or header field) at fault.
#pragma once
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "common/core/tensor.h"
#include "common/io/mapped_file.h"

namespace k3 {

struct SafetensorsEntry {
  std::string name;
  DType dtype = DType::F32;
  Shape shape;
  uint64_t begin = 0;  // byte offsets into the data section, [begin, end)
  uint64_t end = 0;
};

class SafetensorsFile {
 public:
  // Maps and validates the whole header (offsets in range, non-overlapping, sizes match shapes).
  static Result<SafetensorsFile> open(const std::string& path);

  const std::string& path() const { return file_->path(); }
  const std::vector<SafetensorsEntry>& entries() const { return entries_; }  // sorted by name
  const std::map<std::string, std::string>& metadata() const { return metadata_; }
  bool has(const std::string& name) const { return index_.count(name) != 0; }

  // Zero-copy view (copied into an aligned buffer only if the file placed it misaligned). The
  // mapping is read-only: writing through the view's data() faults; clone() to modify.
  Result<Tensor> tensor(const std::string& name) const;

 private:
  std::shared_ptr<MappedFile> file_;
  uint64_t data_start_ = 0;
  std::vector<SafetensorsEntry> entries_;
  std::map<std::string, size_t> index_;  // name -> position in entries_
  std::map<std::string, std::string> metadata_;
};

// Upper bound on the header, as in the reference implementation: a larger value means a corrupt
// or hostile file, not a model with more tensors.
inline constexpr uint64_t kMaxSafetensorsHeaderBytes = 100ull << 20;

// All tensors of a model directory: <dir>/model.safetensors.index.json (its "weight_map" names the
// shard of every tensor) when present, else <dir>/model.safetensors. A tensor the index assigns to
// a shard that lacks it, or a tensor present in two shards, is an error naming it.
struct SafetensorsDir {
  std::vector<SafetensorsFile> files;
  std::map<std::string, Tensor> tensors;
};
Result<SafetensorsDir> open_safetensors_dir(const std::string& dir);

}  // namespace k3
