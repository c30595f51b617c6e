#include "common/io/safetensors_shards.h"

#include <cstdio>

#include <nlohmann/json.hpp>

namespace k3 {

std::string safetensors_shard_name(size_t index, size_t count) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "model-%05zu-of-%05zu.safetensors", index + 1, count);
  return buf;
}

std::vector<SafetensorsShard> plan_safetensors_shards(const std::vector<SafetensorsLayoutEntry>& layout,
                                                      uint64_t max_shard_bytes) {
  std::vector<SafetensorsShard> shards;
  uint64_t current = 0;
  for (const auto& e : layout) {
    const uint64_t bytes = static_cast<uint64_t>(shape_numel(e.shape)) * dtype_size(e.dtype);
    if (shards.empty() || (!shards.back().layout.empty() && current + bytes > max_shard_bytes)) {
      shards.emplace_back();
      current = 0;
    }
    shards.back().layout.push_back(e);
    current += bytes;
  }
  if (shards.empty()) shards.emplace_back();  // a model with no tensors is still one (empty) file
  if (shards.size() == 1) {
    shards[0].file_name = kSingleSafetensorsName;
  } else {
    for (size_t i = 0; i < shards.size(); ++i) shards[i].file_name = safetensors_shard_name(i, shards.size());
  }
  return shards;
}

std::string safetensors_index_json(const std::vector<SafetensorsShard>& shards) {
  nlohmann::json weight_map = nlohmann::json::object();  // keys sorted, as Hugging Face writes them
  uint64_t total = 0;
  for (const auto& shard : shards) {
    total += safetensors_data_bytes(shard.layout);
    for (const auto& e : shard.layout) weight_map[e.name] = shard.file_name;
  }
  nlohmann::json index = {{"metadata", {{"total_size", total}}}, {"weight_map", weight_map}};
  return index.dump(2) + "\n";
}

}  // namespace k3
