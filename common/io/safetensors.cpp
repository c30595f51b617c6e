#include "common/io/safetensors.h"

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>

#include <nlohmann/json.hpp>

namespace k3 {
namespace {

using Json = nlohmann::json;

uint64_t read_le_u64(const uint8_t* p) {
  uint64_t v = 0;
  for (int i = 7; i >= 0; --i) v = (v << 8) | p[i];
  return v;
}

Status bad(const std::string& path, const std::string& what) {
  return invalid_argument("safetensors '" + path + "': " + what);
}

// Parses one tensor's header record; `name` is used in every message.
Status parse_entry(const std::string& path, const std::string& name, const Json& rec, SafetensorsEntry& e) {
  const std::string where = "tensor '" + name + "'";
  if (!rec.is_object()) return bad(path, where + ": header record must be an object");
  for (auto it = rec.begin(); it != rec.end(); ++it)
    if (it.key() != "dtype" && it.key() != "shape" && it.key() != "data_offsets")
      return bad(path, where + ": unknown header field '" + it.key() + "'");
  if (!rec.contains("dtype") || !rec.at("dtype").is_string())
    return bad(path, where + ": field 'dtype' missing or not a string");
  auto dtype = dtype_from_name(rec.at("dtype").get<std::string>());
  if (!dtype.is_ok()) return bad(path, where + ": " + dtype.status().message());
  e.dtype = *dtype;

  if (!rec.contains("shape") || !rec.at("shape").is_array())
    return bad(path, where + ": field 'shape' missing or not a list");
  e.shape.clear();
  for (const Json& d : rec.at("shape")) {
    if (!d.is_number_unsigned()) return bad(path, where + ": field 'shape' must hold non-negative integers");
    e.shape.push_back(static_cast<int64_t>(d.get<uint64_t>()));
  }

  const Json* offs = rec.contains("data_offsets") ? &rec.at("data_offsets") : nullptr;
  if (!offs || !offs->is_array() || offs->size() != 2 || !(*offs)[0].is_number_unsigned() ||
      !(*offs)[1].is_number_unsigned())
    return bad(path, where + ": field 'data_offsets' must be [begin, end] with non-negative integers");
  e.begin = (*offs)[0].get<uint64_t>();
  e.end = (*offs)[1].get<uint64_t>();
  if (e.end < e.begin)
    return bad(path, where + ": data_offsets [" + std::to_string(e.begin) + ", " + std::to_string(e.end) +
                         "] end before begin");

  // numel * element size, refusing overflow (a hostile shape must not wrap to a small size).
  unsigned __int128 bytes = dtype_size(e.dtype);
  for (int64_t d : e.shape) {
    bytes *= static_cast<uint64_t>(d);
    if (bytes > (static_cast<unsigned __int128>(1) << 64)) return bad(path, where + ": shape too large");
  }
  if (bytes != e.end - e.begin)
    return bad(path, where + ": data_offsets span " + std::to_string(e.end - e.begin) + " bytes but shape " +
                         shape_str(e.shape) + " of " + dtype_name(e.dtype) + " needs " +
                         std::to_string(static_cast<uint64_t>(bytes)));
  return Status::ok();
}

}  // namespace

Result<SafetensorsFile> SafetensorsFile::open(const std::string& path) {
  SafetensorsFile f;
  K3_ASSIGN_OR_RETURN(f.file_, MappedFile::open(path));
  const uint8_t* base = f.file_->data();
  const uint64_t size = f.file_->size();
  if (size < 8) return bad(path, "truncated: " + std::to_string(size) + " bytes, shorter than the 8-byte header length");
  const uint64_t header_len = read_le_u64(base);
  if (header_len < 2 || header_len > kMaxSafetensorsHeaderBytes)
    return bad(path, "bad header length " + std::to_string(header_len) + " (must be in [2, " +
                         std::to_string(kMaxSafetensorsHeaderBytes) + "])");
  if (header_len > size - 8)
    return bad(path, "truncated: header length " + std::to_string(header_len) + " exceeds the " +
                         std::to_string(size - 8) + " bytes after the length field");
  f.data_start_ = 8 + header_len;
  const uint64_t data_size = size - f.data_start_;

  Json header;
  try {
    header = Json::parse(reinterpret_cast<const char*>(base + 8), reinterpret_cast<const char*>(base + 8 + header_len));
  } catch (const Json::exception& e) {
    return bad(path, std::string("header is not valid JSON: ") + e.what());
  }
  if (!header.is_object()) return bad(path, "header must be a JSON object");

  for (auto it = header.begin(); it != header.end(); ++it) {
    if (it.key() == "__metadata__") {
      if (!it.value().is_object()) return bad(path, "__metadata__ must be an object of strings");
      for (auto m = it.value().begin(); m != it.value().end(); ++m) {
        if (!m.value().is_string()) return bad(path, "__metadata__." + m.key() + " must be a string");
        f.metadata_[m.key()] = m.value().get<std::string>();
      }
      continue;
    }
    SafetensorsEntry e;
    e.name = it.key();
    K3_TRY(parse_entry(path, e.name, it.value(), e));
    if (e.end > data_size)
      return bad(path, "tensor '" + e.name + "': data_offsets [" + std::to_string(e.begin) + ", " +
                           std::to_string(e.end) + "] out of range (data section is " + std::to_string(data_size) +
                           " bytes; file truncated?)");
    f.entries_.push_back(std::move(e));
  }

  // Non-overlap: sorted by begin, every non-empty tensor must start at or after the previous end.
  std::vector<const SafetensorsEntry*> by_offset;
  for (const auto& e : f.entries_)
    if (e.end > e.begin) by_offset.push_back(&e);
  std::sort(by_offset.begin(), by_offset.end(),
            [](const SafetensorsEntry* a, const SafetensorsEntry* b) { return a->begin < b->begin; });
  for (size_t i = 1; i < by_offset.size(); ++i)
    if (by_offset[i]->begin < by_offset[i - 1]->end)
      return bad(path, "tensors '" + by_offset[i - 1]->name + "' and '" + by_offset[i]->name +
                           "' overlap in the data section");

  std::sort(f.entries_.begin(), f.entries_.end(),
            [](const SafetensorsEntry& a, const SafetensorsEntry& b) { return a.name < b.name; });
  for (size_t i = 0; i < f.entries_.size(); ++i) f.index_[f.entries_[i].name] = i;
  return f;
}

Result<Tensor> SafetensorsFile::tensor(const std::string& name) const {
  auto it = index_.find(name);
  if (it == index_.end()) return not_found("safetensors '" + path() + "': no tensor '" + name + "'");
  const SafetensorsEntry& e = entries_[it->second];
  auto* p = const_cast<uint8_t*>(file_->data() + data_start_ + e.begin);
  Tensor view = Tensor::view(p, e.shape, e.dtype, Device::Cpu, std::shared_ptr<void>(file_, p));
  // Element-misaligned data (possible in files from other writers) would be UB to read in place.
  if (reinterpret_cast<uintptr_t>(p) % dtype_size(e.dtype) != 0) return view.clone();
  return view;
}

namespace {

Result<Json> read_json_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return io_error("cannot open '" + path + "'");
  std::stringstream ss;
  ss << in.rdbuf();
  Json j = Json::parse(ss.str(), nullptr, false);
  if (j.is_discarded()) return invalid_argument("'" + path + "' is not valid JSON");
  return j;
}

Status add_file_tensors(SafetensorsDir& out, const SafetensorsFile& f) {
  for (const auto& e : f.entries()) {
    if (out.tensors.count(e.name))
      return invalid_argument("tensor '" + e.name + "' appears in more than one shard (again in '" + f.path() + "')");
    K3_ASSIGN_OR_RETURN(Tensor t, f.tensor(e.name));
    out.tensors.emplace(e.name, std::move(t));
  }
  return Status::ok();
}

}  // namespace

Result<SafetensorsDir> open_safetensors_dir(const std::string& dir) {
  namespace fs = std::filesystem;
  SafetensorsDir out;
  const fs::path index_path = fs::path(dir) / "model.safetensors.index.json";
  if (!fs::exists(index_path)) {
    K3_ASSIGN_OR_RETURN(SafetensorsFile f, SafetensorsFile::open((fs::path(dir) / "model.safetensors").string()));
    K3_TRY(add_file_tensors(out, f));
    out.files.push_back(std::move(f));
    return out;
  }

  K3_ASSIGN_OR_RETURN(Json index, read_json_file(index_path.string()));
  const std::string where = index_path.string();
  if (!index.is_object() || !index.contains("weight_map") || !index.at("weight_map").is_object())
    return invalid_argument(where + ": 'weight_map' missing or not an object");
  std::map<std::string, std::string> weight_map;  // tensor -> shard file name
  for (auto it = index.at("weight_map").begin(); it != index.at("weight_map").end(); ++it) {
    if (!it.value().is_string()) return invalid_argument(where + ": weight_map['" + it.key() + "'] must be a string");
    const std::string shard = it.value().get<std::string>();
    // Shards live next to the index; anything else would read outside the model directory.
    if (shard.empty() || shard.find('/') != std::string::npos || shard == "." || shard == "..")
      return invalid_argument(where + ": weight_map['" + it.key() + "'] = '" + shard + "' is not a file name");
    weight_map[it.key()] = shard;
  }
  std::map<std::string, size_t> shard_index;  // shard file name -> position in out.files
  for (const auto& [name, shard] : weight_map) {
    if (shard_index.count(shard)) continue;
    K3_ASSIGN_OR_RETURN(SafetensorsFile f, SafetensorsFile::open((fs::path(dir) / shard).string()));
    K3_TRY(add_file_tensors(out, f));
    shard_index[shard] = out.files.size();
    out.files.push_back(std::move(f));
  }
  for (const auto& [name, shard] : weight_map)
    if (!out.files[shard_index.at(shard)].has(name))
      return invalid_argument(where + ": tensor '" + name + "' is mapped to shard '" + shard + "', which lacks it");
  return out;
}

}  // namespace k3
