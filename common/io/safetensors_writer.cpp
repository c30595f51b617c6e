#include "common/io/safetensors_writer.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>

#include <nlohmann/json.hpp>

namespace k3 {
namespace {

// Header text for a layout: offsets are consecutive in layout order; padded with spaces so the
// data section starts at a multiple of 8 (the format allows trailing whitespace in the header).
std::string make_header(const std::vector<SafetensorsLayoutEntry>& layout,
                        const std::map<std::string, std::string>& metadata) {
  nlohmann::json h = nlohmann::json::object();
  if (!metadata.empty()) h["__metadata__"] = metadata;
  uint64_t offset = 0;
  for (const auto& e : layout) {
    const uint64_t bytes = static_cast<uint64_t>(shape_numel(e.shape)) * dtype_size(e.dtype);
    h[e.name] = {{"dtype", dtype_name(e.dtype)}, {"shape", e.shape}, {"data_offsets", {offset, offset + bytes}}};
    offset += bytes;
  }
  std::string text = h.dump();
  text.append((8 - text.size() % 8) % 8, ' ');
  return text;
}

Status write_all(int fd, const void* data, size_t n, const std::string& path) {
  auto* p = static_cast<const uint8_t*>(data);
  while (n > 0) {
    ssize_t w = ::write(fd, p, std::min<size_t>(n, 1u << 30));
    if (w < 0) {
      if (errno == EINTR) continue;
      return io_error("write to '" + path + "' failed: " + std::strerror(errno));
    }
    p += w;
    n -= static_cast<size_t>(w);
  }
  return Status::ok();
}

}  // namespace

struct SafetensorsWriter::State {
  std::string path;      // final name
  std::string tmp_path;  // written here until finish()
  int fd = -1;
  std::vector<SafetensorsLayoutEntry> layout;
  size_t next = 0;
  uint64_t total = 0;
  bool finished = false;

  ~State() {
    if (fd >= 0) ::close(fd);
    if (!finished && !tmp_path.empty()) std::remove(tmp_path.c_str());
  }
};

SafetensorsWriter::SafetensorsWriter(std::unique_ptr<State> s) : s_(std::move(s)) {}
SafetensorsWriter::SafetensorsWriter(SafetensorsWriter&&) noexcept = default;
SafetensorsWriter& SafetensorsWriter::operator=(SafetensorsWriter&&) noexcept = default;
SafetensorsWriter::~SafetensorsWriter() = default;

void sort_layout_for_alignment(std::vector<SafetensorsLayoutEntry>& layout) {
  std::stable_sort(layout.begin(), layout.end(), [](const SafetensorsLayoutEntry& a, const SafetensorsLayoutEntry& b) {
    return dtype_size(a.dtype) > dtype_size(b.dtype);
  });
}

uint64_t safetensors_data_bytes(const std::vector<SafetensorsLayoutEntry>& layout) {
  uint64_t n = 0;
  for (const auto& e : layout) n += static_cast<uint64_t>(shape_numel(e.shape)) * dtype_size(e.dtype);
  return n;
}

uint64_t safetensors_file_size(const std::vector<SafetensorsLayoutEntry>& layout,
                               const std::map<std::string, std::string>& metadata) {
  return 8 + make_header(layout, metadata).size() + safetensors_data_bytes(layout);
}

Result<SafetensorsWriter> SafetensorsWriter::create(const std::string& path, std::vector<SafetensorsLayoutEntry> layout,
                                                    const std::map<std::string, std::string>& metadata) {
  std::map<std::string, int> seen;
  for (const auto& e : layout) {
    if (e.name.empty() || e.name == "__metadata__")
      return invalid_argument("safetensors writer: invalid tensor name '" + e.name + "'");
    if (seen[e.name]++) return invalid_argument("safetensors writer: tensor '" + e.name + "' declared twice");
    for (int64_t d : e.shape)
      if (d < 0) return invalid_argument("safetensors writer: tensor '" + e.name + "' has a negative dimension");
  }
  auto s = std::make_unique<State>();
  s->path = path;
  s->tmp_path = path + ".tmp";
  s->layout = std::move(layout);
  const std::string header = make_header(s->layout, metadata);
  s->total = 8 + header.size() + safetensors_data_bytes(s->layout);

  s->fd = ::open(s->tmp_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (s->fd < 0) return io_error("cannot create '" + s->tmp_path + "': " + std::strerror(errno));
  uint8_t len[8];
  for (int i = 0; i < 8; ++i) len[i] = static_cast<uint8_t>(static_cast<uint64_t>(header.size()) >> (8 * i));
  K3_TRY(write_all(s->fd, len, 8, s->tmp_path));
  K3_TRY(write_all(s->fd, header.data(), header.size(), s->tmp_path));
  return SafetensorsWriter(std::move(s));
}

Status SafetensorsWriter::write(const std::string& name, const Tensor& t) {
  if (s_->finished) return internal_error("safetensors writer: write('" + name + "') after finish()");
  if (s_->next >= s_->layout.size())
    return invalid_argument("safetensors writer: tensor '" + name + "' is beyond the declared layout");
  const SafetensorsLayoutEntry& e = s_->layout[s_->next];
  if (name != e.name)
    return invalid_argument("safetensors writer: expected tensor '" + e.name + "' next, got '" + name + "'");
  if (t.dtype() != e.dtype || t.shape() != e.shape)
    return invalid_argument("safetensors writer: tensor '" + name + "' declared " + dtype_name(e.dtype) + " " +
                            shape_str(e.shape) + ", got " + dtype_name(t.dtype()) + " " + shape_str(t.shape()));
  if (t.device() != Device::Cpu) return invalid_argument("safetensors writer: tensor '" + name + "' is not on the host");
  if (t.nbytes() > 0) K3_TRY(write_all(s_->fd, t.data(), t.nbytes(), s_->tmp_path));
  ++s_->next;
  return Status::ok();
}

Status SafetensorsWriter::finish() {
  if (s_->finished) return Status::ok();
  if (s_->next != s_->layout.size())
    return invalid_argument("safetensors writer: finish() with " + std::to_string(s_->layout.size() - s_->next) +
                            " tensors unwritten (next: '" + s_->layout[s_->next].name + "')");
  if (::fsync(s_->fd) != 0) return io_error("fsync '" + s_->tmp_path + "': " + std::strerror(errno));
  const int fd = s_->fd;
  s_->fd = -1;
  if (::close(fd) != 0) return io_error("close '" + s_->tmp_path + "': " + std::strerror(errno));
  if (std::rename(s_->tmp_path.c_str(), s_->path.c_str()) != 0)
    return io_error("rename '" + s_->tmp_path + "' -> '" + s_->path + "': " + std::strerror(errno));
  s_->finished = true;
  return Status::ok();
}

size_t SafetensorsWriter::num_written() const { return s_->next; }
const std::vector<SafetensorsLayoutEntry>& SafetensorsWriter::layout() const { return s_->layout; }
uint64_t SafetensorsWriter::total_bytes() const { return s_->total; }

Status write_safetensors(const std::string& path, const std::vector<std::pair<std::string, Tensor>>& tensors,
                         const std::map<std::string, std::string>& metadata) {
  std::vector<SafetensorsLayoutEntry> layout;
  std::map<std::string, const Tensor*> by_name;
  for (const auto& [name, t] : tensors) {
    layout.push_back({name, t.dtype(), t.shape()});
    by_name[name] = &t;
  }
  sort_layout_for_alignment(layout);
  K3_ASSIGN_OR_RETURN(SafetensorsWriter w, SafetensorsWriter::create(path, layout, metadata));
  for (const auto& e : w.layout()) K3_TRY(w.write(e.name, *by_name.at(e.name)));
  return w.finish();
}

}  // namespace k3
