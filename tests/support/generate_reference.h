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

inline std::vector<int32_t> k3_generate_tokens(const std::string& model, const std::vector<int32_t>& prompt,
                                               int max_tokens, float temperature = 0.f, uint64_t seed = 0) {
  std::string ids;
  for (int32_t t : prompt) ids += (ids.empty() ? "" : ",") + std::to_string(t);
  std::string sampling;
  if (temperature > 0.f) sampling = " --temperature " + std::to_string(temperature) + " --seed " + std::to_string(seed);
  auto r = run_command(std::string(K3_BIN_DIR) + "/k3-generate --model '" + model + "' --prompt-ids " + ids +
                       " --max-tokens " + std::to_string(max_tokens) + sampling + " --ignore-eos --threads 1 --json");
  REQUIRE(r.exit_code == 0);
  return nlohmann::json::parse(r.out).at("tokens").get<std::vector<int32_t>>();
}

}  // namespace k3::test
