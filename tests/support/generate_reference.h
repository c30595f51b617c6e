// The user-facing reference every distributed path is compared with: greedy tokens of the `k3-generate`
// CLI (--json, 1 thread, EOS ignored) for a prompt of token ids; with a temperature, the tokens sampled with
// that temperature and seed.
#pragma once
#include <catch2/catch.hpp>
#include <nlohmann/json.hpp>

#include <string>
#include <vector>

#include "tests/support/run_command.h"

namespace k3::test {

// `extra`: more k3-generate flags (e.g. "--backend cuda --temperature 0.8 --seed 3 --prefill-chunk 64").
inline std::vector<int32_t> k3_generate_tokens(const std::string& model, const std::vector<int32_t>& prompt,
                                               int max_tokens, const std::string& extra = "") {
  std::string ids;
  for (int32_t t : prompt) ids += (ids.empty() ? "" : ",") + std::to_string(t);
  auto r = run_command(std::string(K3_BIN_DIR) + "/k3-generate --model '" + model + "' --prompt-ids " + ids +
                       " --max-tokens " + std::to_string(max_tokens) + " --ignore-eos --threads 1 --json " + extra);
  REQUIRE(r.exit_code == 0);
  return nlohmann::json::parse(r.out).at("tokens").get<std::vector<int32_t>>();
}

// Sampled with `temperature` and `seed` (greedy when temperature is 0).
inline std::vector<int32_t> k3_generate_tokens(const std::string& model, const std::vector<int32_t>& prompt,
                                               int max_tokens, float temperature, uint64_t seed) {
  std::string sampling;
  if (temperature > 0.f) sampling = "--temperature " + std::to_string(temperature) + " --seed " + std::to_string(seed);
  return k3_generate_tokens(model, prompt, max_tokens, sampling);
}

}  // namespace k3::test
