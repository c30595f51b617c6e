// What the chat-template engine refuses, and how it says so: the construct and its line and column,
// at parse time for what the subset lacks, at render time for what the data makes impossible.
// Outputs are checked against transformers in test_chat_template_oracle.cpp; this file is errors.
#include <catch2/catch.hpp>

#include <nlohmann/json.hpp>

#include "common/jinja/template.h"
#include "common/tokenizer/chat_format.h"

namespace {

std::string parse_error(const std::string& source) {
  auto t = k3::jinja::Template::parse(source);
  REQUIRE_FALSE(t.is_ok());
  return t.status().message();
}

std::string render_error(const std::string& source, const k3::jinja::Dict& ctx = {}) {
  auto t = k3::jinja::Template::parse(source);
  REQUIRE(t.is_ok());
  auto r = t->render(ctx);
  REQUIRE_FALSE(r.is_ok());
  return r.status().message();
}

using Catch::Matchers::Contains;

}  // namespace

TEST_CASE("constructs outside the subset are refused at parse time with their position") {
  CHECK_THAT(parse_error("hello\n  {% include 'other.jinja' %}"),
             Contains("line 2, column 3") && Contains("unsupported tag 'include'"));
  CHECK_THAT(parse_error("{{ x | wordcount }}"), Contains("line 1, column 8") && Contains("unsupported filter 'wordcount'"));
  CHECK_THAT(parse_error("{% if x is prime %}{% endif %}"), Contains("unsupported test 'prime'"));
  CHECK_THAT(parse_error("{% for m in messages recursive %}{% endfor %}"), Contains("recursive for loops"));
  CHECK_THAT(parse_error("{{ f(*args) }}"), Contains("*args"));
}

TEST_CASE("malformed templates name what is missing") {
  CHECK_THAT(parse_error("a\n{% if x %}never closed"), Contains("line 2, column 1") && Contains("'if' is never closed"));
  CHECK_THAT(parse_error("{% endfor %}"), Contains("'endfor' without an open block"));
  CHECK_THAT(parse_error("{{ x "), Contains("unclosed tag"));
  CHECK_THAT(parse_error("{# note"), Contains("unclosed comment"));
  CHECK_THAT(parse_error("{{ 'abc }}"), Contains("unclosed string literal"));
  CHECK_THAT(parse_error("{{ x $ y }}"), Contains("unexpected character '$'"));
  CHECK_THAT(parse_error("{% set %}"), Contains("expected a name"));
  // Hostile nesting is an error, not a stack overflow.
  CHECK_THAT(parse_error("{{ " + std::string(5000, '(') + "1" + std::string(5000, ')') + " }}"),
             Contains("nested deeper than 200 levels"));
  std::string ifs;
  for (int i = 0; i < 300; ++i) ifs += "{% if x %}";
  CHECK_THAT(parse_error(ifs), Contains("nested deeper than 200 levels"));
}

TEST_CASE("render errors name the problem and where the template hit it") {
  CHECK_THAT(render_error("{{ raise_exception('only user and assistant roles') }}"),
             Contains("line 1, column 4") && Contains("the template raised an exception: only user and assistant roles"));
  CHECK_THAT(render_error("\n{{ foo.bar }}"), Contains("line 2") && Contains("cannot read 'bar' of an undefined value"));
  CHECK_THAT(render_error("{% set d = {} %}{% set d.x = 1 %}"), Contains("only a namespace() takes attributes"));
  CHECK_THAT(render_error("{{ 1 + 'a' }}"), Contains("unsupported operand types for +: integer and string"));
  CHECK_THAT(render_error("{{ 1 // 0 }}"), Contains("division by zero"));
  CHECK_THAT(render_error("{{ [1] | tojson(bogus=1) }}"), Contains("filter 'tojson': got an unexpected keyword argument"));
  CHECK_THAT(render_error("{% for i in range(1000000) %}{% endfor %}"), Contains("more than 100000 items"));
  CHECK_THAT(render_error("{% macro m() %}{{ m() }}{% endmacro %}{{ m() }}"), Contains("nested deeper than 64"));
  CHECK_THAT(render_error("{% break %}"), Contains("outside a for loop"));
}

TEST_CASE("a tokenizer config without a chat_template keeps the built-in renderer") {
  auto f = k3::ChatFormat::from_tokenizer_config(nlohmann::json{{"eos_token", "[EOS]"}}, "cfg");
  REQUIRE(f.is_ok());
  CHECK_FALSE(f->has_template());
  const std::vector<k3::ChatMessage> msgs = {{.role = "user", .content = "hi"}};
  auto got = f->render(msgs, true, "");
  auto want = k3::render_chat(msgs, true, "");
  REQUIRE(got.is_ok());
  REQUIRE(want.is_ok());
  CHECK(*got == *want);
}

TEST_CASE("a tokenizer config whose chat_template is outside the subset refuses the model, naming the file") {
  auto f = k3::ChatFormat::from_tokenizer_config(nlohmann::json{{"chat_template", "{% filter upper %}x{% endfilter %}"}},
                                                 "/models/m/tokenizer_config.json");
  REQUIRE_FALSE(f.is_ok());
  CHECK_THAT(f.status().message(), Contains("/models/m/tokenizer_config.json") && Contains("unsupported tag 'filter'"));
  auto g = k3::ChatFormat::from_tokenizer_config(nlohmann::json{{"chat_template", 3}}, "cfg");
  REQUIRE_FALSE(g.is_ok());
  CHECK_THAT(g.status().message(), Contains("chat_template must be a string"));
}

TEST_CASE("a named template list uses the one named default") {
  const nlohmann::json cfg = {{"chat_template", nlohmann::json::array({{{"name", "tool_use"}, {"template", "T"}},
                                                                        {{"name", "default"}, {"template", "D{{ messages | length }}"}}})}};
  auto f = k3::ChatFormat::from_tokenizer_config(cfg, "cfg");
  REQUIRE(f.is_ok());
  auto r = f->render({{.role = "user", .content = "hi"}}, false, "");
  REQUIRE(r.is_ok());
  CHECK(*r == "D1");
  CHECK_FALSE(f->render({}, false, "").is_ok());  // no messages
}

TEST_CASE("the template sees the roles' text and the request's tools; bad tools JSON is refused") {
  auto f = k3::ChatFormat::from_tokenizer_config(
      nlohmann::json{{"chat_template", "{% for m in messages %}{{ m.role }}:{{ m.content }};{% endfor %}{{ tools | tojson }}"}},
      "cfg");
  REQUIRE(f.is_ok());
  auto r = f->render({{.role = "user", .content = "a"}, {.role = "assistant", .content = "b"}}, false, R"([{"z":1,"a":2}])");
  REQUIRE(r.is_ok());
  CHECK(*r == R"(user:a;assistant:b;[{"z": 1, "a": 2}])");
  auto bad = f->render({{.role = "user", .content = "a"}}, false, "{not json");
  REQUIRE_FALSE(bad.is_ok());
  CHECK_THAT(bad.status().message(), Contains("tools"));
}
