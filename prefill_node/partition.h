// The PP partition of a prefill instance: layers per stage, validated against the model.
#pragma once
#include <string>
#include <vector>

#include "common/core/status.h"

namespace k3::prefill {

// Parses "7,5,7" (empty text: `num_stages` stages with an even split, the first stages taking the
// remainder). Every entry > 0, length = num_stages, sum = num_layers; errors name the bad entry.
Result<std::vector<int>> parse_partition(const std::string& text, int num_stages, int num_layers);

// Even split of num_layers over num_stages (the first num_layers % num_stages stages get one more).
std::vector<int> even_partition(int num_layers, int num_stages);

// First global layer of `stage` (the stage owns [begin, begin + partition[stage])).
int stage_begin(const std::vector<int>& partition, int stage);

}  // namespace k3::prefill
