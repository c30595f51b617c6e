// A read-only memory mapping of a whole file. The mapping lives as long as the object; share it
// (std::shared_ptr) to keep zero-copy tensor views into the file valid.
#pragma once
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "common/core/status.h"

namespace k3 {

class MappedFile {
 public:
  static Result<std::shared_ptr<MappedFile>> open(const std::string& path);
  ~MappedFile();
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;

  const uint8_t* data() const { return data_; }
  size_t size() const { return size_; }
  const std::string& path() const { return path_; }

 private:
  MappedFile(std::string path, const uint8_t* data, size_t size) : path_(std::move(path)), data_(data), size_(size) {}
  std::string path_;
  const uint8_t* data_ = nullptr;  // nullptr for an empty file (mmap of 0 bytes is an error)
  size_t size_ = 0;
};

}  // namespace k3
