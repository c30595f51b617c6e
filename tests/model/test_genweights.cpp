// Runs the k3-genweights binary and checks the directory it writes against the library.
#include <catch2/catch.hpp>

#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <filesystem>

#include "common/config/config.h"
#include "common/model/weights.h"
#include "common/tokenizer/tokenizer.h"
#include "tests/support/scratch_dir.h"

using namespace k3;
using k3::testing::ScratchDir;
namespace fs = std::filesystem;

namespace {

int run_tool(const std::string& args) {
  const std::string cmd = std::string(K3_BIN_DIR) + "/k3-genweights " + args + " 2>/dev/null";
  int rc = std::system(cmd.c_str());
  return WIFEXITED(rc) ? WEXITSTATUS(rc) : -1;
}

}  // namespace

TEST_CASE("k3-genweights writes a k3-tiny directory that loads and matches random_weights") {
  ScratchDir scratch("genweights_test");
  const std::string out = scratch.file("model");  // k3-genweights creates it
  REQUIRE(run_tool("--preset k3-tiny --seed 11 --out " + out) == 0);

  auto cfg = load_model_config(out + "/config.json");
  REQUIRE(cfg.is_ok());
  auto tok = Tokenizer::load(out);
  REQUIRE(tok.is_ok());
  REQUIRE(cfg->vocab_size == tok->vocab_size());
  REQUIRE(!cfg->eos_token_ids.empty());
  const std::vector<int32_t> eos_ids = tok->eos_ids();
  std::vector<int> eos(eos_ids.begin(), eos_ids.end());
  REQUIRE(cfg->eos_token_ids == eos);
  REQUIRE(cfg->bos_token_id == tok->bos_id().value_or(-1));

  auto loaded = load_weights(out, *cfg);
  REQUIRE(loaded.is_ok());
  WeightStore expect = random_weights(*cfg, 11, DType::BF16);
  REQUIRE(loaded->all().size() == expect.all().size());
  for (const auto& [name, t] : expect.all()) {
    INFO(name);
    const Tensor& got = loaded->get(name);
    REQUIRE(got.dtype() == t.dtype());
    REQUIRE(got.shape() == t.shape());
    REQUIRE(std::memcmp(got.data(), t.data(), t.nbytes()) == 0);
  }

  SECTION("a non-empty directory is only overwritten with --force") {
    REQUIRE(run_tool("--preset k3-tiny --seed 12 --out " + out) != 0);
    REQUIRE(run_tool("--preset k3-tiny --seed 12 --dtype f32 --force --out " + out) == 0);
    auto again = load_weights(out, *cfg);
    REQUIRE(again.is_ok());
    REQUIRE(again->get("lm_head.weight").dtype() == DType::F32);
  }
  SECTION("--config reproduces the same model from the written config.json") {
    const std::string second = scratch.file("second");
    REQUIRE(run_tool("--config " + out + "/config.json --seed 11 --out " + second) == 0);
    auto cfg2 = load_model_config(second + "/config.json");
    REQUIRE(cfg2.is_ok());
    REQUIRE(model_config_to_json(*cfg2) == model_config_to_json(*cfg));
    auto w2 = load_weights(second, *cfg2);
    REQUIRE(w2.is_ok());
    const Tensor& a = w2->get("model.layers.3.self_attn.kv_b_proj.weight");
    const Tensor& b = loaded->get("model.layers.3.self_attn.kv_b_proj.weight");
    REQUIRE(std::memcmp(a.data(), b.data(), a.nbytes()) == 0);
  }
}

TEST_CASE("k3-genweights refuses large presets without --allow-large and bad arguments") {
  ScratchDir scratch("genweights_test");
  const std::string out = scratch.file("model");
  REQUIRE(run_tool("--preset k3-small --out " + out) != 0);
  REQUIRE_FALSE(fs::exists(out));
  REQUIRE(run_tool("--out " + out) != 0);
  REQUIRE(run_tool("--preset k3-nano --out " + out) != 0);
  REQUIRE(run_tool("--preset k3-tiny --dtype f8 --out " + out) != 0);
}
