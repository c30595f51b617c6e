// Tiny random Kimi Linear models built and saved by the `transformers` package, with its logits and
// greedy tokens (tests/kimi_linear/hf_kimi_linear_oracle.py), for the tests that compare k3serve with it.
// The models live in a temp dir under the build tree for the life of the object.
#pragma once
#include <catch2/catch.hpp>
#include <nlohmann/json.hpp>

#include <cstdlib>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include "common/tokenizer/tiny_tokenizer.h"
#include "tests/support/run_command.h"

namespace k3::test {

struct HfKimiLinearModel {
  std::string name, dir;
  nlohmann::json oracle;  // prompts, gen_prompts, greedy (see the script)
  std::vector<float> logits;  // [prompts, 64, vocab]
};

class HfKimiLinearModels {
 public:
  // variants: comma-separated names from the script, empty for all. available() is false (and the
  // reason is in skip_reason()) only when the test venv lacks torch/transformers (exit 77).
  // load_dirs: existing model directories (e.g. k3-genweights output) that transformers loads with
  // from_pretrained and computes the same reference outputs for (written into those directories).
  // K3_HF_KIMI_LINEAR_DIR: reuse the output of an earlier run of the script (its --out folder) instead
  // of running it (it imports torch: about a minute on a quiet 2-core machine).
  explicit HfKimiLinearModels(const std::string& variants = "", const std::vector<std::string>& load_dirs = {})
      : tmp_("hf-kimi-linear") {
    if (const char* reuse = std::getenv("K3_HF_KIMI_LINEAR_DIR")) {
      for (const std::string name : {"qnull_dense1", "qlora_dense2"})
        if (variants.empty() || variants.find(name) != std::string::npos) load(std::string(reuse) + "/" + name);
      for (const std::string& d : load_dirs)
        if (std::ifstream(d + "/oracle.json")) load(d);
      REQUIRE_FALSE(models_.empty());
      return;
    }
    const std::string tok = tmp_.path() + "/tokenizer";
    REQUIRE(run_command("mkdir -p '" + tok + "'").exit_code == 0);
    const int vocab = write_tiny_tokenizer(tok).value();
    const std::string python = std::string(K3_BIN_DIR) + "/../venv/bin/python3";
    std::string cmd = "'" + python + "' " + std::string(K3_SOURCE_DIR) +
                            "/tests/kimi_linear/hf_kimi_linear_oracle.py --out '" + tmp_.path() +
                            "' --tokenizer-dir '" + tok + "' --vocab " + std::to_string(vocab) +
                            (variants.empty() ? "" : " --variants " + variants);
    for (const std::string& d : load_dirs) cmd += " --load '" + d + "'";
    const CommandResult r = run_command(cmd);
    if (r.exit_code == 77 || r.exit_code == 127) {
      skip_ = "the test venv (" + python + ") has no torch/transformers: run tools/test.sh, which installs "
              "tests/requirements.txt";
      return;
    }
    INFO(r.out);
    REQUIRE(r.exit_code == 0);
    for (const std::string& line : split_lines(r.out))
      if (line.rfind("wrote ", 0) == 0) load(line.substr(6));
    REQUIRE_FALSE(models_.empty());
  }

  bool available() const { return skip_.empty(); }
  const std::string& skip_reason() const { return skip_; }
  const std::vector<HfKimiLinearModel>& models() const { return models_; }

 private:
  void load(const std::string& dir) {
    HfKimiLinearModel m;
    m.dir = dir;
    m.name = dir.substr(dir.rfind('/') + 1);
    std::ifstream(dir + "/oracle.json") >> m.oracle;
    std::ifstream bin(dir + "/logits.f32", std::ios::binary);
    const size_t n = m.oracle.at("prompts").size() * m.oracle.at("prompts").at(0).size() *
                     m.oracle.at("vocab").get<size_t>();
    m.logits.resize(n);
    bin.read(reinterpret_cast<char*>(m.logits.data()), std::streamsize(n * sizeof(float)));
    REQUIRE(bin.gcount() == std::streamsize(n * sizeof(float)));
    models_.push_back(std::move(m));
  }

  static std::vector<std::string> split_lines(const std::string& s) {
    std::vector<std::string> out;
    size_t pos = 0;
    while (pos < s.size()) {
      size_t eol = s.find('\n', pos);
      if (eol == std::string::npos) eol = s.size();
      out.push_back(s.substr(pos, eol - pos));
      pos = eol + 1;
    }
    return out;
  }

  TempDir tmp_;
  std::string skip_;
  std::vector<HfKimiLinearModel> models_;
};

}  // namespace k3::test
