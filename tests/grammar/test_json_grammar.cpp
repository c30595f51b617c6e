// The structured-output grammar: schema keywords outside the subset are refused by name and path, the
// byte matcher accepts compact JSON of the schema and rejects the rest, and random walks over a real
// (tiny) vocabulary that always pick an allowed token end in a document that parses and validates
// against the schema under an independent validator; the mask cache changes no mask.
#include <catch2/catch.hpp>
#include <nlohmann/json.hpp>

#include <random>

#include "common/grammar/token_constraint.h"
#include "common/tokenizer/tiny_tokenizer.h"
#include "common/tokenizer/tokenizer.h"
#include "tests/grammar/schema_validator.h"
#include "tests/support/scratch_dir.h"

using namespace k3;
using namespace k3::grammar;
using nlohmann::json;
using k3::testing::validates;

namespace {

const nlohmann::ordered_json kPerson = nlohmann::ordered_json::parse(R"({
  "type": "object",
  "properties": {
    "name": {"type": "string", "maxLength": 12},
    "age": {"type": "integer"},
    "height": {"type": "number"},
    "tags": {"type": "array", "items": {"type": "string", "maxLength": 6}, "maxItems": 3},
    "kind": {"enum": ["cat", "dog", 12, 123, null]},
    "ok": {"type": "boolean"},
    "note": {"type": ["string", "null"], "maxLength": 8},
    "pos": {"type": "object", "properties": {"x": {"type": "integer"}, "y": {"type": "integer"}},
            "required": ["x", "y"], "additionalProperties": false}
  },
  "required": ["name", "age", "kind", "pos"],
  "additionalProperties": false})");

JsonGrammar compile(const nlohmann::ordered_json& s) {
  std::string path;
  auto g = JsonGrammar::from_schema(s, &path);
  INFO(g.status().message());
  REQUIRE(g.is_ok());
  return std::move(g).value();
}

std::string refused_path(const nlohmann::ordered_json& s, std::string* message = nullptr) {
  std::string path;
  auto g = JsonGrammar::from_schema(s, &path);
  REQUIRE_FALSE(g.is_ok());
  if (message) *message = g.status().message();
  return path;
}

}  // namespace

TEST_CASE("schema keywords outside the subset are refused by name and where they are") {
  std::string msg;
  CHECK(refused_path(nlohmann::ordered_json::parse(R"({"type":"object","properties":{"a":{"type":"string","pattern":"x"}}})"), &msg) ==
        "properties.a.pattern");
  CHECK(msg.find("\"pattern\" is not supported") != std::string::npos);
  CHECK(refused_path(nlohmann::ordered_json::parse(R"({"anyOf":[{"type":"string"}]})")) == "anyOf");
  CHECK(refused_path(nlohmann::ordered_json::parse(R"({"type":"array","items":{"$ref":"#/x"}})")) == "items.$ref");
  CHECK(refused_path(nlohmann::ordered_json::parse(R"({"type":"integer","minimum":0})")) == "minimum");
  CHECK(refused_path(nlohmann::ordered_json::parse(R"({"type":"object","additionalProperties":{"type":"string"}})")) ==
        "additionalProperties");
  CHECK(refused_path(nlohmann::ordered_json::parse(R"({"type":"object","required":["b"],"properties":{"a":{}}})")) == "required");
  CHECK(refused_path(nlohmann::ordered_json::parse(R"({"type":"text"})")) == "type");
  CHECK(refused_path(nlohmann::ordered_json::parse(R"({"enum":[]})")) == "enum");
  CHECK(JsonGrammar::from_schema(kPerson).is_ok());
}

TEST_CASE("the matcher accepts compact JSON of the schema and rejects the rest") {
  const JsonGrammar person = compile(kPerson);
  auto accepts = [](const JsonGrammar& g, const std::string& text) {
    JsonMatcher m(g);
    return m.advance(text) && m.complete();
  };
  CHECK(accepts(person, R"({"name":"Al","age":-3,"kind":"cat","pos":{"x":1,"y":2}})"));
  CHECK(accepts(person, R"({"name":"\u00e9\n","age":0,"height":1.5e+3,"tags":[],"kind":12,"ok":true,"note":null,"pos":{"x":0,"y":0}})"));
  CHECK(accepts(person, R"({"name":"","age":7,"kind":123,"pos":{"x":1,"y":-1}})"));
  CHECK_FALSE(accepts(person, R"({"age":1,"name":"a","kind":"cat","pos":{"x":1,"y":2}})"));   // order
  CHECK_FALSE(accepts(person, R"({"name":"a","kind":"cat","pos":{"x":1,"y":2}})"));           // age required
  CHECK_FALSE(accepts(person, R"({"name":"a","age":1.5,"kind":"cat","pos":{"x":1,"y":2}})")); // integer
  CHECK_FALSE(accepts(person, R"({"name":"a","age":01,"kind":"cat","pos":{"x":1,"y":2}})"));  // leading zero
  CHECK_FALSE(accepts(person, R"({"name":"a","age":1,"kind":"cow","pos":{"x":1,"y":2}})"));   // enum
  CHECK_FALSE(accepts(person, R"({"name":"a","age":1,"kind":1,"pos":{"x":1,"y":2}})"));       // enum prefix
  CHECK_FALSE(accepts(person, R"({"name":"abcdefghijklm","age":1,"kind":null,"pos":{"x":1,"y":2}})"));  // maxLength
  CHECK_FALSE(accepts(person, R"({"name":"a","age":1,"kind":null,"pos":{"x":1,"y":2},"z":1})"));  // closed
  CHECK_FALSE(accepts(person, R"({"name":"a", "age":1,"kind":null,"pos":{"x":1,"y":2}})"));   // whitespace
  CHECK_FALSE(accepts(person, "{\"name\":\"a\xC0\xAF\",\"age\":1,\"kind\":null,\"pos\":{\"x\":1,\"y\":2}}"));  // overlong UTF-8
  CHECK_FALSE(accepts(person, R"({"name":"a","age":1,"kind":null)"));                        // incomplete
  const JsonGrammar object = JsonGrammar::any_object();
  CHECK(accepts(object, R"({})"));
  CHECK(accepts(object, R"({"a":[1,{"b":null}],"c":"d","e":-0.5E-2,"f":false})"));
  CHECK_FALSE(accepts(object, R"([1])"));
  CHECK_FALSE(accepts(object, R"({"a":tru})"));
  CHECK_FALSE(accepts(object, R"({"a":1}{})"));
  JsonMatcher m(object);
  CHECK_FALSE(m.advance(std::string("{\"a\":[[[[[[1]]]]]]}")));  // deeper than any-value nesting allows
  CHECK(m.advance(std::string("{\"a\":[[[1]]]}")));
  CHECK(m.closed());
}

TEST_CASE("random constrained walks over the tiny vocabulary end in documents that validate") {
  testing::ScratchDir dir("grammar_vocab");
  REQUIRE(write_tiny_tokenizer(dir.str()).is_ok());
  auto tok = Tokenizer::load(dir.str());
  REQUIRE(tok.is_ok());
  const auto vocab = TokenVocab::from_tokenizer(*tok);
  const std::vector<int32_t> stops = tok->eos_ids();
  const int64_t V = tok->vocab_size();
  const std::vector<nlohmann::ordered_json> schemas = {
      kPerson,
      nlohmann::ordered_json::parse(R"({"type":"array","items":{"type":"number"},"minItems":2,"maxItems":4})"),
      nlohmann::ordered_json::parse(R"({"type":"object","properties":{"a":{"type":"array","items":{"enum":["x","yz"]}},
                      "b":{"type":"boolean"}},"required":["b"]})"),
      nlohmann::ordered_json::parse(R"({"type":"string","minLength":3,"maxLength":5})"),
  };
  std::mt19937_64 rng(7);
  int walks = 0;
  for (size_t si = 0; si <= schemas.size(); ++si) {
    const bool object_mode = si == schemas.size();
    auto grammar = std::make_shared<const JsonGrammar>(object_mode ? JsonGrammar::any_object() : compile(schemas[si]));
    for (int w = 0; w < 12; ++w, ++walks) {
      TokenConstraint c(grammar, vocab, stops);
      std::vector<int32_t> ids;
      std::string text;
      bool stopped = false;
      for (int step = 0; step < 4000 && !stopped && !c.closed(); ++step) {
        std::vector<uint32_t> words((V + 31) / 32, 0u);
        const int64_t allowed = c.fill_mask(words.data(), V);
        REQUIRE(allowed > 0);  // no dead end
        // The cached mask equals one computed from scratch for the same state.
        if (step % 7 == 0) {
          TokenConstraint fresh(grammar, vocab, stops);
          for (int32_t id : ids) REQUIRE(fresh.accept(id).is_ok());
          std::vector<uint32_t> again((V + 31) / 32, 0u);
          fresh.fill_mask(again.data(), V);
          REQUIRE(again == words);
        }
        std::vector<int32_t> ok;
        for (int32_t id = 0; id < V; ++id)
          if (words[id / 32] >> (id % 32) & 1) ok.push_back(id);
        // Lean toward short tokens' neighbours of a close: uniform over the allowed ids.
        const int32_t id = ok[std::uniform_int_distribution<size_t>(0, ok.size() - 1)(rng)];
        REQUIRE(c.accept(id).is_ok());
        if (std::find(stops.begin(), stops.end(), id) != stops.end()) stopped = true;
        else {
          ids.push_back(id);
          text += vocab->bytes[static_cast<size_t>(id)];
        }
      }
      INFO(text);
      REQUIRE((stopped || c.closed()));
      const json doc = json::parse(text);
      if (object_mode) CHECK(doc.is_object());
      else CHECK(validates(doc, json::parse(schemas[si].dump())));
    }
  }
  CHECK(walks == 60);
}
