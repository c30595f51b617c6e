#include "bench/serve_workload.h"

#include <random>
#include <stdexcept>

namespace k3::bench {

std::vector<std::vector<int32_t>> make_workload(const WorkloadOptions& o) {
  if (o.kind != "random" && o.kind != "shared-prefix" && o.kind != "unique")
    throw std::invalid_argument("--workload '" + o.kind + "': expected random, shared-prefix or unique");
  if (o.turns < 1) throw std::invalid_argument("--turns must be >= 1");
  if (o.system_len < 0) throw std::invalid_argument("--system-len must be >= 0");
  // Lengths from their own stream: unique draws more ids than shared-prefix, yet gets the same lengths.
  std::mt19937_64 rng(o.seed), len_rng(o.seed + 0x9e3779b97f4a7c15ull);
  std::uniform_int_distribution<int32_t> id(0, o.token_id_max - 1);
  std::uniform_int_distribution<int> len_dist(o.input_min, o.input_max);
  auto len = [&] { return len_dist(len_rng); };
  auto fresh = [&](int n) {
    std::vector<int32_t> v(n);
    for (auto& t : v) t = id(rng);
    return v;
  };
  std::vector<std::vector<int32_t>> out;
  if (o.kind == "random") {
    for (int i = 0; i < o.requests; ++i) out.push_back(fresh(len()));
    return out;
  }
  // Chats advance together, one turn each per round, so a round's requests run concurrently.
  const int chats = std::max(1, (o.requests + o.turns - 1) / o.turns);
  const std::vector<int32_t> system = fresh(o.system_len);
  std::vector<std::vector<int32_t>> history(chats, system);
  for (int turn = 0; static_cast<int>(out.size()) < o.requests; ++turn)
    for (int c = 0; c < chats && static_cast<int>(out.size()) < o.requests; ++c) {
      auto user = fresh(len());
      history[c].insert(history[c].end(), user.begin(), user.end());
      out.push_back(o.kind == "unique" ? fresh(static_cast<int>(history[c].size())) : history[c]);
    }
  return out;
}

}  // namespace k3::bench
