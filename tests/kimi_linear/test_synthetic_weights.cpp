// Synthetic Kimi Linear models (`--model synthetic:PRESET[:SEED]`): weights drawn where they are
// loaded, never written to disk. The same numbers come from three places, and these tests tie them:
//   - k3-genweights' files and a synthetic store give the same model (bit-identical logits);
//   - the PyTorch mirror of the generator (synthetic_weights.py) fills transformers'
//     KimiLinearForCausalLM with exactly k3-genweights' tensors (compared after save_pretrained);
//   - k3-generate --logits-out on synthetic:kimi-linear-tiny matches transformers filled by the mirror,
//     the pipeline the H200 comparison at kimi-linear-48b runs (docs/MODELS.md), here in fp32 on the CPU.
#include <catch2/catch.hpp>
#include <nlohmann/json.hpp>

#include <cstring>
#include <fstream>

#include "common/config/config.h"
#include "common/model/weights.h"
#include "engine/teacher_forced.h"
#include "kernels/backend.h"
#include "tests/support/run_command.h"

using namespace k3;
using k3::test::run_command;
using k3::test::TempDir;

namespace {

const std::string kBin = K3_BIN_DIR;
const std::string kScript = std::string(K3_SOURCE_DIR) + "/tests/kimi_linear/synthetic_kimi_linear.py";
const std::string kPython = kBin + "/../venv/bin/python3";

std::string genweights(const TempDir& tmp, const std::string& extra) {
  const std::string out = tmp.path() + "/kimi-linear-tiny";
  REQUIRE(run_command(kBin + "/k3-genweights --preset kimi-linear-tiny --seed 11 --quiet --force --out '" + out + "' " +
                      extra).exit_code == 0);
  return out;
}

}  // namespace

TEST_CASE("a synthetic Kimi Linear model is the model k3-genweights writes with the same seed", "[kimi_linear]") {
  TempDir tmp("synthetic-files");
  const std::string dir = genweights(tmp, "");
  const ModelConfig cfg = load_model_config_of("synthetic:kimi-linear-tiny:11").value();
  const ModelConfig file_cfg = load_model_config(dir + "/config.json").value();
  REQUIRE(cfg.vocab_size == file_cfg.vocab_size);
  const std::vector<std::vector<int32_t>> prompts = {{1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17}, {40, 41, 42}};
  auto backend = make_cpu_backend({.threads = 2});
  const WeightStore synthetic = load_weights("synthetic:kimi-linear-tiny:11", cfg).value();
  REQUIRE(synthetic.synthetic_source().has_value());
  const Tensor a = teacher_forced_logits(*backend, cfg, synthetic, prompts).value();
  const Tensor b = teacher_forced_logits(*backend, file_cfg, load_weights(dir, file_cfg).value(), prompts).value();
  REQUIRE(a.shape() == Shape{20, cfg.vocab_size});
  REQUIRE(a.shape() == b.shape());
  CHECK(std::memcmp(a.data(), b.data(), a.nbytes()) == 0);
  // A host-drawn tensor of the synthetic store equals the file's.
  CHECK(synthetic.get("model.layers.0.self_attn.dt_bias").to_f32().shape() == Shape{cfg.kda_proj_dim()});

  CHECK_FALSE(parse_synthetic_model("synthetic:no-such-preset").is_ok());
  CHECK_FALSE(parse_synthetic_model("synthetic:kimi-linear-tiny:12x").is_ok());
  CHECK(parse_synthetic_model("synthetic:kimi-linear-48b").value().seed == 0);
}

TEST_CASE("the PyTorch mirror of the weight generator fills transformers with k3-genweights' tensors bit for bit",
          "[kimi_linear]") {
  TempDir tmp("synthetic-mirror");
  const std::string dir = genweights(tmp, "--dtype bf16");
  const auto r = run_command("'" + kPython + "' " + kScript + " check-files --model '" + dir + "' --seed 11 --scratch '" +
                             tmp.path() + "/saved' 2>&1");
  if (r.exit_code == 77 || r.exit_code == 127) {
    WARN("skipped: the test venv has no torch/transformers (tools/test.sh installs tests/requirements.txt)");
    return;
  }
  INFO(r.out);
  REQUIRE(r.exit_code == 0);
  CHECK(r.out.find("OK: 325 tensors equal bit for bit") != std::string::npos);
}

TEST_CASE("synthetic:kimi-linear-tiny through k3-generate --logits-out matches transformers filled by the mirror",
          "[kimi_linear]") {
  TempDir tmp("synthetic-logits");
  const std::string cfg_dir = genweights(tmp, "--config-only");
  const std::string prompts = tmp.path() + "/prompts.json", hf = tmp.path() + "/hf.f32", k3 = tmp.path() + "/k3.f32",
                    report = tmp.path() + "/compare.json";
  const auto p = run_command("'" + kPython + "' " + kScript + " prompts --vocab 512 --count 4 --length 64 --seed 3 --out '" +
                             prompts + "' 2>&1");
  if (p.exit_code == 77 || p.exit_code == 127) {
    WARN("skipped: the test venv has no torch/transformers (tools/test.sh installs tests/requirements.txt)");
    return;
  }
  REQUIRE(p.exit_code == 0);
  // fp32 on both sides (the weights are the bf16-rounded draw either way): the difference left is
  // the order of floating-point sums.
  const auto h = run_command("'" + kPython + "' " + kScript + " hf-logits --config '" + cfg_dir + "' --seed 11 --prompts '" +
                             prompts + "' --out '" + hf + "' --device cpu --dtype f32 2>&1");
  INFO(h.out);
  REQUIRE(h.exit_code == 0);
  const auto g = run_command(kBin + "/k3-generate --model synthetic:kimi-linear-tiny:11 --threads 2 --prompts-file '" +
                             prompts + "' --logits-out '" + k3 + "' 2>&1");
  INFO(g.out);
  REQUIRE(g.exit_code == 0);
  const auto c = run_command("'" + kPython + "' " + kScript + " compare --ref '" + hf + "' --got '" + k3 +
                             "' --vocab 512 --json '" + report + "' 2>&1");
  INFO(c.out);
  REQUIRE(c.exit_code == 0);
  nlohmann::json j;
  std::ifstream(report) >> j;
  CHECK(j.at("positions").get<int>() == 256);
  CHECK(j.at("max_relative_logit_error").get<double>() <= 1e-4);
  CHECK(j.at("top1_agreement").get<double>() == 1.0);
  CHECK(j.at("ref_logit_rms").get<double>() > 0.3);  // logits that move: the comparison is not of zeros
}
