#include "prefill_node/partition.h"

#include <sstream>

namespace k3::prefill {

std::vector<int> even_partition(int num_layers, int num_stages) {
  std::vector<int> p;
  for (int s = 0; s < num_stages; ++s) p.push_back(num_layers / num_stages + (s < num_layers % num_stages ? 1 : 0));
  return p;
}

Result<std::vector<int>> parse_partition(const std::string& text, int num_stages, int num_layers) {
  if (num_layers <= 0) return invalid_argument("model has no layers");
  if (num_stages <= 0) return invalid_argument("--stages must be > 0 (got " + std::to_string(num_stages) + ")");
  if (text.empty()) {
    if (num_stages > num_layers)
      return invalid_argument("--stages " + std::to_string(num_stages) + " exceeds the model's " +
                              std::to_string(num_layers) + " layers");
    return even_partition(num_layers, num_stages);
  }
  std::vector<int> p;
  std::stringstream ss(text);
  std::string item;
  while (std::getline(ss, item, ',')) {
    size_t used = 0;
    long v = 0;
    try {
      v = std::stol(item, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    if (used == 0 || used != item.size() || v <= 0 || v > num_layers)
      return invalid_argument("--partition entry " + std::to_string(p.size()) + " '" + item +
                              "' is not a layer count in 1.." + std::to_string(num_layers));
    p.push_back(static_cast<int>(v));
  }
  if (static_cast<int>(p.size()) != num_stages)
    return invalid_argument("--partition has " + std::to_string(p.size()) + " entries but there are " +
                            std::to_string(num_stages) + " stages");
  int sum = 0;
  for (int n : p) sum += n;
  if (sum != num_layers)
    return invalid_argument("--partition sums to " + std::to_string(sum) + " layers but the model has " +
                            std::to_string(num_layers));
  return p;
}

int stage_begin(const std::vector<int>& partition, int stage) {
  int at = 0;
  for (int s = 0; s < stage; ++s) at += partition.at(s);
  return at;
}

}  // namespace k3::prefill
