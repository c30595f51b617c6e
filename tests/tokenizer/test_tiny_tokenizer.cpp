#include <catch2/catch.hpp>
#include <nlohmann/json.hpp>

#include "common/tokenizer/tiny_tokenizer.h"
#include "common/tokenizer/tokenizer.h"
#include "tests/support/scratch_dir.h"

using namespace k3;
using k3::testing::read_all;
using k3::testing::ScratchDir;

TEST_CASE("tiny tokenizer files are byte-identical across writes") {
  ScratchDir a("tiny_a"), b("tiny_b");
  const Result<int> va = write_tiny_tokenizer(a.str());
  const Result<int> vb = write_tiny_tokenizer(b.str());
  REQUIRE(va.is_ok());
  REQUIRE(vb.is_ok());
  REQUIRE(va.value() == 512);
  REQUIRE(vb.value() == 512);
  for (const char* name : {"tiktoken.model", "tokenizer_config.json"}) {
    INFO(name);
    const std::string fa = read_all(a.file(name));
    REQUIRE_FALSE(fa.empty());
    REQUIRE(fa == read_all(b.file(name)));
  }
  // Writing again over existing files gives the same bytes.
  REQUIRE(write_tiny_tokenizer(a.str()).is_ok());
  REQUIRE(read_all(a.file("tiktoken.model")) == read_all(b.file("tiktoken.model")));
}

TEST_CASE("tiny tokenizer has 256 bytes, learned merges, then the Kimi specials") {
  ScratchDir dir("tiny_layout");
  REQUIRE(write_tiny_tokenizer(dir.str()).is_ok());
  const std::string model = read_all(dir.file("tiktoken.model"));
  REQUIRE(std::count(model.begin(), model.end(), '\n') == 495);
  REQUIRE(model.rfind("AA== 0\n", 0) == 0);  // byte 0 first, rank 0

  const auto config = nlohmann::json::parse(read_all(dir.file("tokenizer_config.json")));
  REQUIRE(config["added_tokens_decoder"].size() == 17);
  REQUIRE(config["added_tokens_decoder"]["495"]["content"] == "[BOS]");
  REQUIRE(config["added_tokens_decoder"]["495"]["special"] == true);

  Result<Tokenizer> tok = Tokenizer::load(dir.str());
  REQUIRE(tok.is_ok());
  REQUIRE(tok->vocab_size() == 512);
  REQUIRE(tok->bos_id() == std::optional<int32_t>(495));
  REQUIRE(tok->special_id("[EOS]") == std::optional<int32_t>(496));
  REQUIRE(tok->special_id("<|im_end|>") == std::optional<int32_t>(497));
  REQUIRE(tok->special_id("<|im_user|>") == std::optional<int32_t>(498));
  REQUIRE(tok->special_id("<|im_assistant|>") == std::optional<int32_t>(499));
  REQUIRE(tok->special_id("<|im_system|>") == std::optional<int32_t>(503));
  REQUIRE(tok->special_id("<|im_middle|>") == std::optional<int32_t>(509));
  REQUIRE(tok->special_id("[PAD]") == std::optional<int32_t>(511));
  REQUIRE(tok->eos_ids() == std::vector<int32_t>{496, 497});
  for (int32_t id = 0; id < 495; ++id) REQUIRE_FALSE(tok->is_special(id));
  for (int32_t id = 495; id < 512; ++id) REQUIRE(tok->is_special(id));
  // Byte tokens are ids 0..255 in byte order.
  const std::vector<int32_t> one{65};
  REQUIRE(tok->decode_bytes(one).value() == "A");
}

TEST_CASE("tiny tokenizer compresses English and code below one token per byte") {
  ScratchDir dir("tiny_ratio");
  REQUIRE(write_tiny_tokenizer(dir.str()).is_ok());
  const Tokenizer tok = std::move(Tokenizer::load(dir.str()).value());
  const std::string text = "The user asks a question and the assistant writes the answer. return a + b;";
  const auto ids = tok.encode(text);
  REQUIRE(ids.size() * 2 < text.size());  // learned merges are actually used
}

TEST_CASE("write_tiny_tokenizer reports an unwritable directory") {
  ScratchDir dir("tiny_bad");
  dir.write("file", "x");
  const Result<int> r = write_tiny_tokenizer(dir.file("file") + "/sub");
  REQUIRE_FALSE(r.is_ok());
  REQUIRE_THAT(r.status().message(), Catch::Contains("file/sub"));
}
