// Tool calls as constrained output: the spec's wire form round-trips and bad specs are refused by
// name; random walks over the tiny vocabulary that always pick an allowed token end in a tool-call
// section laid out as the chat template says, each call named "functions.NAME:INDEX" after a declared
// function with arguments that validate against its schema (an independent validator); "none" never
// draws a tool-call token, "auto" may go either way; the mask cache changes no mask.
#include <catch2/catch.hpp>
#include <nlohmann/json.hpp>

#include <random>

#include "common/grammar/token_constraint.h"
#include "common/tokenizer/chat_template.h"
#include "common/tokenizer/tiny_tokenizer.h"
#include "common/tokenizer/tokenizer.h"
#include "tests/grammar/schema_validator.h"
#include "tests/support/scratch_dir.h"

using namespace k3;
using namespace k3::grammar;
using nlohmann::json;

namespace {

const char* kWeather = R"({"type":"object","properties":{"city":{"type":"string","maxLength":6},
  "days":{"type":"integer"},"unit":{"enum":["c","f"]}},"required":["city","unit"],"additionalProperties":false})";
const char* kTime = R"({"properties":{"zone":{"type":"string","maxLength":4}},"required":["zone"]})";

ToolCallSpec spec(ToolCallMode mode, bool parallel, int first_index) {
  return {.mode = mode, .tools = {{"get_weather", kWeather}, {"get_time", kTime}}, .first_index = first_index,
          .parallel = parallel};
}

struct Walk {
  std::vector<int32_t> ids;  // without the final stop id
  bool stopped = false;
};

// Draws uniformly among the allowed ids until a stop id; checks that the cached masks equal fresh ones.
Walk random_walk(const std::shared_ptr<const ToolCallGrammar>& g, const std::shared_ptr<const TokenVocab>& vocab,
                 const std::vector<int32_t>& stops, int64_t V, std::mt19937_64& rng, int max_steps) {
  TokenConstraint c(g, vocab, stops);
  Walk w;
  for (int step = 0; step < max_steps && !w.stopped; ++step) {
    std::vector<uint32_t> words((V + 31) / 32, 0u);
    REQUIRE(c.fill_mask(words.data(), V) > 0);
    if (step % 5 == 0) {
      TokenConstraint fresh(g, vocab, stops);
      for (int32_t id : w.ids) REQUIRE(fresh.accept(id).is_ok());
      std::vector<uint32_t> again((V + 31) / 32, 0u);
      fresh.fill_mask(again.data(), V);
      REQUIRE(again == words);
    }
    std::vector<int32_t> ok;
    for (int32_t id = 0; id < V; ++id)
      if (words[id / 32] >> (id % 32) & 1) ok.push_back(id);
    const int32_t id = ok[std::uniform_int_distribution<size_t>(0, ok.size() - 1)(rng)];
    REQUIRE(c.accept(id).is_ok());
    if (std::find(stops.begin(), stops.end(), id) != stops.end()) w.stopped = true;
    else w.ids.push_back(id);
  }
  return w;
}

// Takes a walk apart as the chat template lays it out; fails the test on any deviation. Returns the calls.
std::vector<std::pair<std::string, std::string>> calls_of(const Walk& w, const TokenVocab& vocab, size_t from) {
  const ToolTokens& t = vocab.tools;
  std::vector<std::pair<std::string, std::string>> calls;
  size_t i = from;
  REQUIRE(w.ids.at(i++) == t.section_begin);
  for (;;) {
    const int32_t next = w.ids.at(i++);
    if (next == t.section_end) break;
    REQUIRE(next == t.call_begin);
    std::string name, args;
    while (w.ids.at(i) != t.arguments) name += vocab.bytes.at(static_cast<size_t>(w.ids.at(i++)));
    ++i;
    while (w.ids.at(i) != t.call_end) args += vocab.bytes.at(static_cast<size_t>(w.ids.at(i++)));
    ++i;
    calls.emplace_back(name, args);
  }
  REQUIRE(i == w.ids.size());  // nothing after the section but the stop id
  return calls;
}

void check_call(const std::pair<std::string, std::string>& call, int index) {
  INFO(call.first << " " << call.second);
  const bool weather = call.first == tool_call_id("get_weather", index);
  REQUIRE((weather || call.first == tool_call_id("get_time", index)));
  json schema = json::parse(weather ? kWeather : kTime);
  schema["type"] = "object";
  REQUIRE(testing::validates(json::parse(call.second), schema));
}

}  // namespace

TEST_CASE("a tool-call spec round-trips through the wire form and bad ones are refused by name") {
  const ToolCallSpec s = spec(ToolCallMode::Required, false, 3);
  const OutputFormat f{.kind = OutputFormat::Kind::ToolCalls, .schema = s.to_json()};
  auto parsed = OutputFormat::parse(f.encode());
  REQUIRE(parsed.is_ok());
  REQUIRE(parsed->kind == OutputFormat::Kind::ToolCalls);
  auto back = ToolCallSpec::from_json(parsed->schema);
  REQUIRE(back.is_ok());
  CHECK(back->mode == ToolCallMode::Required);
  CHECK(back->first_index == 3);
  CHECK_FALSE(back->parallel);
  REQUIRE(back->tools.size() == 2);
  CHECK(back->tools[1].name == "get_time");
  CHECK(back->tools[1].parameters == kTime);
  auto compiled = parsed->compile();
  REQUIRE(compiled.is_ok());
  REQUIRE(compiled->tool_calls);
  CHECK_FALSE(compiled->document);

  std::string path;
  auto not_object = compile_parameters(R"({"type":"array"})", &path);
  CHECK_FALSE(not_object.is_ok());
  CHECK(path == "type");
  auto keyword = compile_parameters(R"({"properties":{"a":{"type":"string","format":"date"}}})", &path);
  CHECK_FALSE(keyword.is_ok());
  CHECK(path == "properties.a.format");
  CHECK(compile_parameters("{}").is_ok());  // no parameters: any object

  ToolCallSpec bad = s;
  bad.tools[0].name = "get weather";
  auto e = ToolCallGrammar::compile(bad);
  REQUIRE_FALSE(e.is_ok());
  CHECK_THAT(e.status().message(), Catch::Contains("tools[0].name"));
  CHECK_FALSE(ToolCallGrammar::compile({.mode = ToolCallMode::Required}).is_ok());
  CHECK_FALSE(ToolCallSpec::from_json(R"({"mode":"sometimes","first_index":0,"parallel":true,"tools":[]})").is_ok());
  CHECK_FALSE(OutputFormat::parse("tools:{}").is_ok());
}

TEST_CASE("random constrained walks give tool-call sections whose calls validate") {
  testing::ScratchDir dir("grammar_tools");
  REQUIRE(write_tiny_tokenizer(dir.str()).is_ok());
  auto tok = Tokenizer::load(dir.str());
  REQUIRE(tok.is_ok());
  const auto vocab = TokenVocab::from_tokenizer(*tok);
  REQUIRE(vocab->tools.present());
  const std::vector<int32_t> stops = tok->eos_ids();
  const int64_t V = tok->vocab_size();
  std::mt19937_64 rng(11);
  int multi = 0;
  for (bool parallel : {false, true}) {
    auto g = std::make_shared<const ToolCallGrammar>(ToolCallGrammar::compile(spec(ToolCallMode::Required, parallel, 2)).value());
    for (int w = 0; w < 10; ++w) {
      const Walk walk = random_walk(g, vocab, stops, V, rng, 6000);
      REQUIRE(walk.stopped);
      const auto calls = calls_of(walk, *vocab, 0);
      REQUIRE(!calls.empty());
      if (!parallel) REQUIRE(calls.size() == 1);
      multi += calls.size() > 1;
      for (size_t k = 0; k < calls.size(); ++k) check_call(calls[k], 2 + static_cast<int>(k));
    }
  }
  CHECK(multi > 0);  // parallel sections do hold several calls

  // A named function: only it is ever called.
  ToolCallSpec named = spec(ToolCallMode::Required, false, 0);
  named.tools.erase(named.tools.begin());
  auto g = std::make_shared<const ToolCallGrammar>(ToolCallGrammar::compile(named).value());
  for (int w = 0; w < 5; ++w) {
    const auto calls = calls_of(random_walk(g, vocab, stops, V, rng, 6000), *vocab, 0);
    REQUIRE(calls.size() == 1);
    CHECK(calls[0].first == "functions.get_time:0");
  }
}

TEST_CASE("tool_choice none never draws a tool-call token; auto allows one section after text") {
  testing::ScratchDir dir("grammar_tools_modes");
  REQUIRE(write_tiny_tokenizer(dir.str()).is_ok());
  auto tok = Tokenizer::load(dir.str());
  REQUIRE(tok.is_ok());
  const auto vocab = TokenVocab::from_tokenizer(*tok);
  const std::vector<int32_t> stops = tok->eos_ids();
  const int64_t V = tok->vocab_size();
  const ToolTokens& t = vocab->tools;
  auto bit = [](const std::vector<uint32_t>& w, int32_t id) { return (w[id / 32] >> (id % 32) & 1) != 0; };

  auto none = std::make_shared<const ToolCallGrammar>(ToolCallGrammar::compile(spec(ToolCallMode::None, true, 0)).value());
  TokenConstraint c(none, vocab, stops);
  std::vector<uint32_t> words((V + 31) / 32, 0u);
  c.fill_mask(words.data(), V);
  for (int32_t id : {t.section_begin, t.section_end, t.call_begin, t.arguments, t.call_end}) CHECK_FALSE(bit(words, id));
  for (int32_t id : stops) CHECK(bit(words, id));
  CHECK(bit(words, *tok->special_id("<|im_user|>")));  // free text is otherwise unconstrained
  CHECK_FALSE(c.accept(t.section_begin).is_ok());

  // Auto: text, then the section opens and is constrained from there on.
  auto autog = std::make_shared<const ToolCallGrammar>(ToolCallGrammar::compile(spec(ToolCallMode::Auto, false, 0)).value());
  TokenConstraint a(autog, vocab, stops);
  const std::vector<int32_t> text = tok->encode("Let me check.", false);
  for (int32_t id : text) REQUIRE(a.accept(id).is_ok());
  std::fill(words.begin(), words.end(), 0u);
  a.fill_mask(words.data(), V);
  CHECK(bit(words, t.section_begin));
  CHECK_FALSE(bit(words, t.call_begin));
  REQUIRE(a.accept(t.section_begin).is_ok());
  std::fill(words.begin(), words.end(), 0u);
  CHECK(a.fill_mask(words.data(), V) == 1);  // only <|tool_call_begin|>
  CHECK(bit(words, t.call_begin));
  CHECK_FALSE(a.complete());
  REQUIRE(a.accept(t.call_begin).is_ok());
  for (int32_t id : tok->encode("functions.get_time:0", false)) REQUIRE(a.accept(id).is_ok());
  REQUIRE(a.accept(t.arguments).is_ok());
  for (int32_t id : tok->encode(R"({"zone":"UTC"})", false)) REQUIRE(a.accept(id).is_ok());
  REQUIRE(a.accept(t.call_end).is_ok());
  CHECK_FALSE(a.accept(t.call_begin).is_ok());  // not parallel: one call only
  REQUIRE(a.accept(t.section_end).is_ok());
  CHECK(a.closed());
  REQUIRE(a.accept(stops.front()).is_ok());

  // Once the section is open, a stop before its end is refused.
  TokenConstraint b(autog, vocab, stops);
  REQUIRE(b.accept(t.section_begin).is_ok());
  CHECK_FALSE(b.accept(stops.front()).is_ok());
}
