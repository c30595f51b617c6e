// Hugging Face style sharding of a safetensors model: tensors are split, in layout order, into
// "model-00001-of-0000N.safetensors" files of at most a given size, and
// "model.safetensors.index.json" maps every tensor to its file. The plan is made from the layout
// alone (sizes are known before any data exists), so N is known before the first file is named.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "common/core/status.h"
#include "common/io/safetensors_writer.h"

namespace k3 {

inline constexpr const char* kSafetensorsIndexName = "model.safetensors.index.json";
inline constexpr const char* kSingleSafetensorsName = "model.safetensors";

struct SafetensorsShard {
  std::string file_name;  // "model.safetensors" when there is only one shard
  std::vector<SafetensorsLayoutEntry> layout;
};

// Greedy split in layout order, as Hugging Face does: a tensor starts a new shard when adding its
// data would push the current shard's tensor bytes above `max_shard_bytes`; a tensor larger than
// the limit gets a shard of its own. One shard keeps the single-file name.
std::vector<SafetensorsShard> plan_safetensors_shards(const std::vector<SafetensorsLayoutEntry>& layout,
                                                      uint64_t max_shard_bytes);

// "model-00002-of-00005.safetensors" for index 1 of 5.
std::string safetensors_shard_name(size_t index, size_t count);

// The text of model.safetensors.index.json for `shards`:
// {"metadata": {"total_size": N}, "weight_map": {name: file}}, keys sorted, 2-space indent.
std::string safetensors_index_json(const std::vector<SafetensorsShard>& shards);

}  // namespace k3
