#include <catch2/catch.hpp>
#include <chrono>
#include <nlohmann/json.hpp>
#include <random>
#include <set>
#include <string>

#include "common/tokenizer/base64.h"
#include "common/tokenizer/tiny_tokenizer.h"
#include "common/tokenizer/tokenizer.h"
#include "tests/support/scratch_dir.h"

using namespace k3;
using k3::testing::ScratchDir;

namespace {

const std::string kFffd = "\xEF\xBF\xBD";

// One tiny tokenizer for the whole file (writing it trains the merges).
const Tokenizer& tiny() {
  static const Tokenizer tok = [] {
    ScratchDir dir("tok");
    REQUIRE(write_tiny_tokenizer(dir.str()).is_ok());
    return std::move(Tokenizer::load(dir.str()).value());
  }();
  return tok;
}

std::string round_trip_bytes(const Tokenizer& tok, std::string_view text, bool allow_special = false) {
  const std::vector<int32_t> ids = tok.encode(text, allow_special);
  for (int32_t id : ids) REQUIRE((id >= 0 && id < tok.vocab_size()));
  return tok.decode_bytes(ids).value();
}

// A tiktoken.model with all 256 bytes, in base64, one line each, plus `extra` lines.
std::string byte_model(const std::string& extra = "") {
  std::string model;
  for (int b = 0; b < 256; ++b) model += base64::encode(std::string(1, char(b))) + " " + std::to_string(b) + "\n";
  return model + extra;
}

const std::string kMinimalConfig = R"({"added_tokens_decoder": {"300": {"content": "<|im_end|>", "special": true}}})";

}  // namespace

TEST_CASE("encode then decode returns the text") {
  const Tokenizer& tok = tiny();
  const std::vector<std::string> texts = {
      "",
      "Hello world",
      "The quick brown fox jumps over the lazy dog.",
      "你好，世界！我是一个人工智能助手。",
      "emoji \xF0\x9F\x91\x8B\xF0\x9F\x8F\xBD and flags \xF0\x9F\x87\xAB\xF0\x9F\x87\xB7",
      "mixed English 中文 Русский Ελληνικά 123 + code: for (int i = 0; i < n; ++i) {}",
      "whitespace   runs\t\t\tand    tabs   ",
      "new\nlines\r\n\r\n\n\nand  \n  spaces\n",
      "   leading and trailing   ",
      "it's IT'S we'll WE'LL they're",
      "<|im_end|> looks special but is text here",
  };
  for (const std::string& t : texts) {
    INFO(t);
    REQUIRE(round_trip_bytes(tok, t) == t);
    REQUIRE(tok.decode(tok.encode(t)).value() == t);
  }
}

TEST_CASE("very long input round trips and encodes a megabyte fast") {
  const Tokenizer& tok = tiny();
  std::string text;
  const std::string para =
      "Serving systems batch requests. 服务系统把请求合并成批次。 for (int i = 0; i < 16; ++i) x += i;\n";
  while (text.size() < (1u << 20)) text += para;
  const auto t0 = std::chrono::steady_clock::now();
  const std::vector<int32_t> ids = tok.encode(text);
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  WARN("encoded " << text.size() << " bytes into " << ids.size() << " tokens in " << secs << " s");
  REQUIRE(secs < 1.0);
  REQUIRE(tok.decode_bytes(ids).value() == text);

  const std::string no_spaces(1 << 20, 'a');  // a single megabyte pre-token piece
  const auto t1 = std::chrono::steady_clock::now();
  REQUIRE(round_trip_bytes(tok, no_spaces) == no_spaces);
  const double secs1 = std::chrono::duration<double>(std::chrono::steady_clock::now() - t1).count();
  WARN("one 1 MiB piece round trip in " << secs1 << " s");
  REQUIRE(secs1 < 1.0);
}

TEST_CASE("invalid UTF-8 encodes byte-exactly and decodes with U+FFFD") {
  const Tokenizer& tok = tiny();
  struct Case {
    std::string bytes;
    std::string decoded;
  };
  const std::vector<Case> cases = {
      {"\x80", kFffd},                                      // lone continuation byte
      {"ab\x80\x80" "cd", "ab" + kFffd + kFffd + "cd"},
      {"\xE4\xBD", kFffd},                                  // truncated 你
      {"x\xE4\xBD", "x" + kFffd},
      {"\xC0\xAF", kFffd + kFffd},                          // overlong '/'
      {"\xE0\x80\xAF", kFffd + kFffd + kFffd},              // overlong 3-byte
      {"\xFF", kFffd},
      {"\xFF\xFE hi", kFffd + kFffd + " hi"},
      {"\xED\xA0\x80", kFffd + kFffd + kFffd},              // encoded surrogate
      {"ok \xF0\x9F\x91 ok", "ok " + kFffd + " ok"},        // truncated emoji
  };
  for (const Case& c : cases) {
    INFO("case of " << c.bytes.size() << " bytes");
    const std::vector<int32_t> ids = tok.encode(c.bytes);
    REQUIRE(tok.decode_bytes(ids).value() == c.bytes);
    REQUIRE(tok.decode(ids).value() == c.decoded);
  }
  std::mt19937 rng(21);
  for (int trial = 0; trial < 500; ++trial) {
    std::string s(rng() % 64, '\0');
    for (char& ch : s) ch = char(rng());
    REQUIRE(round_trip_bytes(tok, s) == s);
    REQUIRE(round_trip_bytes(tok, s, /*allow_special=*/true) == s);
    const std::string d = tok.decode(tok.encode(s)).value();
    REQUIRE(is_valid_utf8(d));
  }
}

TEST_CASE("decode of a token that ends inside a character") {
  const Tokenizer& tok = tiny();
  const std::vector<int32_t> ids = tok.encode("你");
  std::vector<int32_t> byte_ids;  // the three single-byte tokens of 你
  for (unsigned char c : std::string("你")) byte_ids.push_back(c);
  REQUIRE(tok.decode(byte_ids).value() == "你");
  const std::vector<int32_t> first_two(byte_ids.begin(), byte_ids.begin() + 2);
  REQUIRE(tok.decode_bytes(first_two).value() == "\xE4\xBD");
  REQUIRE(tok.decode(first_two).value() == kFffd);
  REQUIRE(tok.decode(ids).value() == "你");
}

TEST_CASE("special tokens map to their ids only when allowed") {
  const Tokenizer& tok = tiny();
  const int32_t im_end = *tok.special_id("<|im_end|>");
  const int32_t im_user = *tok.special_id("<|im_user|>");
  const int32_t im_middle = *tok.special_id("<|im_middle|>");
  const std::string text = "<|im_user|>user<|im_middle|>hi<|im_end|>";

  const std::vector<int32_t> with = tok.encode(text, /*allow_special=*/true);
  REQUIRE(with.front() == im_user);
  REQUIRE(with.back() == im_end);
  REQUIRE(std::count(with.begin(), with.end(), im_middle) == 1);
  std::vector<int32_t> expected{im_user};
  for (int32_t id : tok.encode("user")) expected.push_back(id);
  expected.push_back(im_middle);
  for (int32_t id : tok.encode("hi")) expected.push_back(id);
  expected.push_back(im_end);
  REQUIRE(with == expected);
  REQUIRE(tok.decode(with).value() == text);

  const std::vector<int32_t> without = tok.encode(text, /*allow_special=*/false);
  for (int32_t id : without) REQUIRE_FALSE(tok.is_special(id));
  REQUIRE(tok.decode(without).value() == text);

  // Adjacent specials, a special at the very end, and a near miss.
  const std::vector<int32_t> adj = tok.encode("<|im_end|><|im_end|>", true);
  REQUIRE(adj == std::vector<int32_t>{im_end, im_end});
  const std::vector<int32_t> miss = tok.encode("<|im_en|>", true);
  for (int32_t id : miss) REQUIRE_FALSE(tok.is_special(id));
  REQUIRE(tok.encode("[BOS]", true) == std::vector<int32_t>{*tok.bos_id()});
}

TEST_CASE("specials match longest first") {
  ScratchDir dir("longest");
  dir.write("tiktoken.model", byte_model());
  dir.write("tokenizer_config.json", R"({"added_tokens_decoder": {
      "256": {"content": "<|a|>", "special": true},
      "257": {"content": "<|a|><|b|>", "special": true},
      "258": {"content": "<|b|>", "special": true}}})");
  const Tokenizer tok = std::move(Tokenizer::load(dir.str()).value());
  REQUIRE(tok.encode("<|a|><|b|>", true) == std::vector<int32_t>{257});
  REQUIRE(tok.encode("<|a|> <|b|>", true) == std::vector<int32_t>{256, ' ', 258});
  REQUIRE(tok.vocab_size() == 259);
  REQUIRE(tok.eos_ids().empty());
  REQUIRE_FALSE(tok.bos_id());
}

TEST_CASE("decode rejects ids outside the vocabulary or unassigned") {
  const Tokenizer& tok = tiny();
  const std::vector<int32_t> too_big{1, tok.vocab_size()};
  const Result<std::string> r = tok.decode_bytes(too_big);
  REQUIRE_FALSE(r.is_ok());
  REQUIRE_THAT(r.status().message(), Catch::Contains("ids[1]"));
  const std::vector<int32_t> negative{-1};
  REQUIRE_FALSE(tok.decode(negative).is_ok());

  ScratchDir dir("gap");
  dir.write("tiktoken.model", byte_model("YWI= 280\n"));  // ranks 256..279 are missing
  dir.write("tokenizer_config.json", kMinimalConfig);
  const Tokenizer gap = std::move(Tokenizer::load(dir.str()).value());
  REQUIRE(gap.vocab_size() == 301);
  const std::vector<int32_t> hole{270};
  REQUIRE_THAT(gap.decode_bytes(hole).status().message(), Catch::Contains("ids[0] = 270 is not assigned"));
  const std::vector<int32_t> reserved{290};  // after the last rank: a reserved special
  REQUIRE(gap.decode_bytes(reserved).value() == "<|reserved_token_290|>");
}

TEST_CASE("load errors name the file and line") {
  ScratchDir dir("load_errors");
  const auto load_error = [&](const std::string& model, const std::string& config) {
    dir.write("tiktoken.model", model);
    dir.write("tokenizer_config.json", config);
    const Result<Tokenizer> r = Tokenizer::load(dir.str());
    REQUIRE_FALSE(r.is_ok());
    return r.status().message();
  };
  {
    const Result<Tokenizer> r = Tokenizer::load(dir.file("missing"));
    REQUIRE_FALSE(r.is_ok());
    REQUIRE(r.status().code() == Code::NotFound);
    REQUIRE_THAT(r.status().message(), Catch::Contains("missing/tiktoken.model"));
  }
  // The fixture itself loads; each case below breaks one thing.
  dir.write("tiktoken.model", byte_model());
  dir.write("tokenizer_config.json", kMinimalConfig);
  REQUIRE(Tokenizer::load(dir.str()).is_ok());

  const std::string model_path = dir.file("tiktoken.model");
  const std::string config_path = dir.file("tokenizer_config.json");
  // Lines 1..256 are the bytes, so an extra line is line 257.
  REQUIRE_THAT(load_error(byte_model("!!!! 256\n"), kMinimalConfig),
               Catch::Contains(model_path + ":257") && Catch::Contains("bad base64"));
  REQUIRE_THAT(load_error(byte_model("YWI= 5\n"), kMinimalConfig),
               Catch::Contains(model_path + ":257") && Catch::Contains("duplicate rank 5"));
  REQUIRE_THAT(load_error(byte_model("YQ== 256\n"), kMinimalConfig),
               Catch::Contains(model_path + ":257") && Catch::Contains("duplicate token bytes"));
  REQUIRE_THAT(load_error(byte_model("YWI= x\n"), kMinimalConfig),
               Catch::Contains(model_path + ":257") && Catch::Contains("bad rank"));
  REQUIRE_THAT(load_error(byte_model("YWI=\n"), kMinimalConfig), Catch::Contains(model_path + ":257"));
  REQUIRE_THAT(load_error("YQ== 0\n", kMinimalConfig),
               Catch::Contains(model_path) && Catch::Contains("single byte"));
  REQUIRE_THAT(load_error("", kMinimalConfig), Catch::Contains("no tokens"));

  REQUIRE_THAT(load_error(byte_model(), "{not json"), Catch::Contains(config_path));
  REQUIRE_THAT(load_error(byte_model(), "{}"), Catch::Contains("added_tokens_decoder"));
  REQUIRE_THAT(load_error(byte_model(), R"({"added_tokens_decoder": {"x1": {"content": "<|a|>"}}})"),
               Catch::Contains("added_tokens_decoder[\"x1\"]"));
  REQUIRE_THAT(load_error(byte_model(), R"({"added_tokens_decoder": {"300": {"special": true}}})"),
               Catch::Contains("added_tokens_decoder[\"300\"].content"));
  REQUIRE_THAT(load_error(byte_model(), R"({"added_tokens_decoder": {"65": {"content": "<|a|>"}}})"),
               Catch::Contains("also a tiktoken.model rank"));
  REQUIRE_THAT(load_error(byte_model(), R"({"added_tokens_decoder": {"300": {"content": "<|a|>"},
                                                                      "301": {"content": "<|a|>"}}})"),
               Catch::Contains("listed twice"));

  dir.write("tiktoken.model", byte_model());
  std::filesystem::remove(config_path);
  const Result<Tokenizer> no_config = Tokenizer::load(dir.str());
  REQUIRE_FALSE(no_config.is_ok());
  REQUIRE_THAT(no_config.status().message(), Catch::Contains(config_path));
}

TEST_CASE("CRLF line endings and blank lines in tiktoken.model are accepted") {
  ScratchDir dir("crlf");
  std::string model = byte_model("YWI= 256\n\n");
  std::string crlf;
  for (char c : model) {
    if (c == '\n') crlf += '\r';
    crlf += c;
  }
  dir.write("tiktoken.model", crlf);
  dir.write("tokenizer_config.json", kMinimalConfig);
  const Tokenizer tok = std::move(Tokenizer::load(dir.str()).value());
  REQUIRE(tok.encode("ab") == std::vector<int32_t>{256});
}

TEST_CASE("a Kimi-sized vocabulary with the real special ids loads fast") {
  ScratchDir dir("kimi_sized");
  // 163,584 mergeable tokens (as in Kimi's tiktoken.model): the bytes, then random distinct strings.
  std::string model = byte_model();
  std::set<std::string> seen;
  std::mt19937 rng(17);
  for (int32_t id = 256; id < 163584; ++id) {
    std::string s;
    do {
      s.assign(2 + rng() % 10, '\0');
      for (char& c : s) c = char('a' + rng() % 26);
    } while (!seen.insert(s).second);
    model += base64::encode(s) + " " + std::to_string(id) + "\n";
  }
  dir.write("tiktoken.model", model);
  nlohmann::json added = nlohmann::json::object();
  const std::pair<int, const char*> kimi_specials[] = {
      {163584, "[BOS]"}, {163585, "[EOS]"}, {163586, "<|im_end|>"}, {163587, "<|im_user|>"},
      {163588, "<|im_assistant|>"}, {163590, "<|start_header_id|>"}, {163591, "<|end_header_id|>"},
      {163593, "[EOT]"}, {163594, "<|im_system|>"}, {163601, "<|im_middle|>"}, {163838, "[UNK]"},
      {163839, "[PAD]"}};
  for (const auto& [id, text] : kimi_specials) added[std::to_string(id)] = {{"content", text}, {"special", true}};
  dir.write("tokenizer_config.json", nlohmann::json{{"added_tokens_decoder", added}, {"eos_token", "[EOS]"}}.dump());

  const auto t0 = std::chrono::steady_clock::now();
  Result<Tokenizer> loaded = Tokenizer::load(dir.str());
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  WARN("loaded " << model.size() << " bytes of tiktoken.model in " << secs << " s");
  REQUIRE(loaded.is_ok());
  REQUIRE(secs < 1.0);
  const Tokenizer& tok = loaded.value();
  REQUIRE(tok.vocab_size() == 163840);
  REQUIRE(tok.bos_id() == std::optional<int32_t>(163584));
  REQUIRE(tok.eos_ids() == std::vector<int32_t>{163585, 163586});
  REQUIRE(tok.special_id("<|im_middle|>") == std::optional<int32_t>(163601));
  const std::string text = "<|im_user|>user<|im_middle|>hello world<|im_end|>";
  const std::vector<int32_t> ids = tok.encode(text, true);
  REQUIRE(ids.front() == 163587);
  REQUIRE(ids.back() == 163586);
  REQUIRE(tok.decode(ids).value() == text);
  // Ids the config leaves out between the ranks and [PAD] get Kimi's reserved names.
  const std::vector<int32_t> reserved{163589, 163837};
  REQUIRE(tok.decode(reserved).value() == "<|reserved_token_163589|><|reserved_token_163837|>");
  REQUIRE(tok.is_special(163589));
  REQUIRE(tok.special_id("<|reserved_token_163600|>") == std::optional<int32_t>(163600));
  REQUIRE_FALSE(tok.is_special(163583));
}
