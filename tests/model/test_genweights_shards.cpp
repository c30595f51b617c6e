// k3-genweights --shard-size: a k3-tiny split into several Hugging Face style shards loads through
// the normal loader bitwise equal to the single-file output, its index is right, k3-generate gives
// the same greedy tokens on both, bad sizes are refused naming the flag, and logs get progress lines.
#include <catch2/catch.hpp>
#include <nlohmann/json.hpp>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>

#include "common/config/config.h"
#include "common/core/parse.h"
#include "common/io/safetensors.h"
#include "common/io/safetensors_shards.h"
#include "common/model/weights.h"
#include "tests/support/run_command.h"
#include "tests/support/scratch_dir.h"

using namespace k3;
using k3::test::run_command;
using k3::testing::ScratchDir;
using nlohmann::json;
namespace fs = std::filesystem;

namespace {

const std::string kBin = K3_BIN_DIR;

// Runs k3-genweights with stderr folded into the captured output (a pipe: not a terminal).
k3::test::CommandResult genweights(const std::string& args) {
  return run_command(kBin + "/k3-genweights " + args + " 2>&1");
}

json read_json(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return json::parse(ss.str());
}

int count_lines_with(const std::string& text, const std::string& needle) {
  int n = 0;
  std::stringstream ss(text);
  for (std::string line; std::getline(ss, line);) n += line.find(needle) != std::string::npos;
  return n;
}

uint64_t byte_size(const std::string& text) {
  auto r = parse_byte_size(text, "--s");
  return r.is_ok() ? *r : 0;
}

json greedy_tokens(const std::string& model) {
  auto r = run_command(kBin + "/k3-generate --model " + model +
                       " --json --prompt 'The quick brown fox' --max-tokens 8 --ignore-eos --threads 1");
  INFO(r.out);
  REQUIRE(r.exit_code == 0);
  return json::parse(r.out)["tokens"];
}

}  // namespace

TEST_CASE("k3-genweights --shard-size writes shards that load bitwise like the single file", "[cli]") {
  ScratchDir scratch("genweights_shards");
  const std::string single = scratch.file("single"), sharded = scratch.file("sharded");
  auto a = genweights("--preset k3-tiny --seed 7 --out " + single);
  INFO(a.out);
  REQUIRE(a.exit_code == 0);
  auto b = genweights("--preset k3-tiny --seed 7 --shard-size 300KB --out " + sharded);
  INFO(b.out);
  REQUIRE(b.exit_code == 0);

  // The single-file layout is unchanged; the sharded one has no model.safetensors.
  REQUIRE(fs::exists(single + "/model.safetensors"));
  REQUIRE_FALSE(fs::exists(single + "/" + kSafetensorsIndexName));
  REQUIRE_FALSE(fs::exists(sharded + "/model.safetensors"));
  REQUIRE_FALSE(fs::exists(sharded + "/.k3-genweights-partial"));
  REQUIRE(fs::exists(sharded + "/config.json"));

  // The index: every tensor once, in a named shard that holds it; total_size is the data bytes.
  const json index = read_json(sharded + "/" + kSafetensorsIndexName);
  REQUIRE(index.size() == 2);
  const json& weight_map = index.at("weight_map");
  std::set<std::string> files;
  for (auto it = weight_map.begin(); it != weight_map.end(); ++it) files.insert(it.value().get<std::string>());
  REQUIRE(files.size() >= 3);
  for (size_t i = 0; i < files.size(); ++i) REQUIRE(files.count(safetensors_shard_name(i, files.size())) == 1);
  uint64_t data_bytes = 0;
  size_t tensors_in_shards = 0;
  for (const std::string& f : files) {
    REQUIRE(fs::file_size(sharded + "/" + f) <= 300000 + 64 * 1024);  // data limit + header
    auto shard = SafetensorsFile::open(sharded + "/" + f);
    REQUIRE(shard.is_ok());
    for (const SafetensorsEntry& e : shard->entries()) {
      INFO(e.name);
      REQUIRE(weight_map.at(e.name) == f);
      data_bytes += e.end - e.begin;
      ++tensors_in_shards;
    }
  }
  REQUIRE(tensors_in_shards == weight_map.size());
  REQUIRE(index.at("metadata").at("total_size").get<uint64_t>() == data_bytes);

  // Bitwise the same tensors through the normal loader.
  auto cfg = load_model_config(sharded + "/config.json");
  REQUIRE(cfg.is_ok());
  REQUIRE(read_json(sharded + "/config.json") == read_json(single + "/config.json"));
  auto w_single = load_weights(single, *cfg);
  auto w_sharded = load_weights(sharded, *cfg);
  REQUIRE(w_single.is_ok());
  REQUIRE(w_sharded.is_ok());
  REQUIRE(w_sharded->all().size() == w_single->all().size());
  REQUIRE(weight_map.size() == w_single->all().size());
  for (const auto& [name, t] : w_single->all()) {
    INFO(name);
    const Tensor& got = w_sharded->get(name);
    REQUIRE(got.dtype() == t.dtype());
    REQUIRE(got.shape() == t.shape());
    REQUIRE(std::memcmp(got.data(), t.data(), t.nbytes()) == 0);
  }

  SECTION("k3-generate gives the same greedy tokens on both") {
    const json tokens = greedy_tokens(single);
    REQUIRE(tokens.size() == 8);
    REQUIRE(greedy_tokens(sharded) == tokens);
  }
  SECTION("a run that fails after starting to write leaves no staging folder and no config.json") {
    json small_vocab = read_json(single + "/config.json");
    small_vocab["vocab_size"] = 16;  // below the generated tokenizer's vocabulary: refused after the
    small_vocab.erase("eos_token_id");  // tokenizer is written (the config itself stays valid)
    small_vocab.erase("bos_token_id");
    std::ofstream(scratch.file("small_vocab.json")) << small_vocab.dump();
    const std::string failed = scratch.file("failed");
    auto f = genweights("--config " + scratch.file("small_vocab.json") + " --shard-size 300KB --out " + failed);
    INFO(f.out);
    REQUIRE(f.exit_code != 0);
    REQUIRE(f.out.find("smaller than the generated tokenizer") != std::string::npos);
    REQUIRE_FALSE(fs::exists(failed + "/.k3-genweights-partial"));
    REQUIRE_FALSE(fs::exists(failed + "/config.json"));
  }
  SECTION("--force rewriting as one file removes the old shards, index and an interrupted run's staging") {
    fs::create_directories(sharded + "/.k3-genweights-partial");
    std::ofstream(sharded + "/.k3-genweights-partial/model-00001-of-00009.safetensors.tmp") << "partial";
    auto c = genweights("--preset k3-tiny --seed 7 --force --quiet --out " + sharded);
    INFO(c.out);
    REQUIRE(c.exit_code == 0);
    REQUIRE(c.out.empty());  // --quiet: no progress, no summary
    REQUIRE(fs::exists(sharded + "/model.safetensors"));
    REQUIRE_FALSE(fs::exists(sharded + "/.k3-genweights-partial"));
    REQUIRE_FALSE(fs::exists(sharded + "/" + kSafetensorsIndexName));
    for (size_t i = 0; i < files.size(); ++i) REQUIRE_FALSE(fs::exists(sharded + "/" + safetensors_shard_name(i, files.size())));
    auto again = load_weights(sharded, *cfg);
    REQUIRE(again.is_ok());
    const Tensor& x = again->get("lm_head.weight");
    REQUIRE(std::memcmp(x.data(), w_single->get("lm_head.weight").data(), x.nbytes()) == 0);
  }
}

TEST_CASE("k3-genweights prints a progress line every 5 % when stderr is not a terminal", "[cli]") {
  ScratchDir scratch("genweights_shards");
  auto r = genweights("--preset k3-tiny --shard-size 256KiB --out " + scratch.file("model"));
  INFO(r.out);
  REQUIRE(r.exit_code == 0);
  REQUIRE(r.out.find('\r') == std::string::npos);  // no terminal bar in a log
  REQUIRE(count_lines_with(r.out, "k3-genweights: 100% ") == 1);
  const int lines = count_lines_with(r.out, "MB/s");
  REQUIRE(lines >= 5);   // k3-tiny has hundreds of tensors: most 5 % steps are crossed
  REQUIRE(lines <= 20);  // at most one line per step
}

TEST_CASE("k3-genweights refuses a bad --shard-size, naming the flag", "[cli]") {
  ScratchDir scratch("genweights_shards");
  const std::string out = scratch.file("model");
  for (const char* bad : {"0", "abc", "5XB", "-1", "1.5GB", "99999999999999999999", "20000000000GB", "''"}) {
    INFO(bad);
    auto r = genweights("--preset k3-tiny --shard-size " + std::string(bad) + " --out " + out);
    INFO(r.out);
    REQUIRE(r.exit_code != 0);
    REQUIRE(r.out.find("--shard-size") != std::string::npos);
    REQUIRE_FALSE(fs::exists(out));
  }
}

TEST_CASE("parse_byte_size and the shard plan") {
  REQUIRE(byte_size("5GB") == 5000000000ull);
  REQUIRE(byte_size("500mb") == 500000000ull);
  REQUIRE(byte_size("2GiB") == (2ull << 30));
  REQUIRE(byte_size("123") == 123);
  REQUIRE(byte_size("64B") == 64);
  REQUIRE_FALSE(parse_byte_size("", "--s").is_ok());
  REQUIRE_FALSE(parse_byte_size("GB", "--s").is_ok());

  // 4-byte floats: 40, 40, 100 (alone, over the limit), 8 bytes -> three shards with a limit of 96.
  std::vector<SafetensorsLayoutEntry> layout = {
      {"a", DType::F32, {10}}, {"b", DType::F32, {10}}, {"c", DType::F32, {25}}, {"d", DType::F32, {2}}};
  auto shards = plan_safetensors_shards(layout, 96);
  REQUIRE(shards.size() == 3);
  REQUIRE(shards[0].layout.size() == 2);
  REQUIRE(shards[1].layout.size() == 1);
  REQUIRE(shards[2].layout.size() == 1);
  REQUIRE(shards[2].file_name == "model-00003-of-00003.safetensors");
  const json index = json::parse(safetensors_index_json(shards));
  REQUIRE(index["metadata"]["total_size"] == 188);
  REQUIRE(index["weight_map"]["c"] == "model-00002-of-00003.safetensors");
  auto one = plan_safetensors_shards(layout, 1000);
  REQUIRE(one.size() == 1);
  REQUIRE(one[0].file_name == "model.safetensors");
}
