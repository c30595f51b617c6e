// The chat-template engine against an independent renderer: transformers' chat-template rendering
// (Jinja2 under Hugging Face's settings) of the same templates over random conversations (system
// turns, multi-turn, tools, tool calls with string or object arguments, tool results, unicode,
// template-looking text, bad roles). Every output must be byte-identical, every template error an
// error here too. Templates: the one the generated tiny checkpoints carry, and three written to
// exercise the supported subset (tests/jinja/templates).
#include <catch2/catch.hpp>

#include <nlohmann/json.hpp>
#include <sstream>

#include "common/jinja/template.h"
#include "common/tokenizer/chat_format.h"
#include "common/tokenizer/tiny_tokenizer.h"
#include "common/tokenizer/tokenizer.h"
#include "tests/support/run_command.h"
#include "tests/support/scratch_dir.h"

namespace {

using k3::testing::read_all;
using ojson = nlohmann::ordered_json;

const char* const kTemplates[] = {"header_turns", "macros_and_blocks", "whitespace_and_values"};

std::string template_path(const std::string& name) {
  return std::string(K3_SOURCE_DIR) + "/tests/jinja/templates/" + name + ".jinja";
}

// Where two renderings first differ, with context, for the failure message.
std::string first_difference(const std::string& got, const std::string& want) {
  size_t i = 0;
  while (i < got.size() && i < want.size() && got[i] == want[i]) ++i;
  const size_t from = i > 40 ? i - 40 : 0;
  return "first difference at byte " + std::to_string(i) + "\n  got:  " + ojson(got.substr(from, 100)).dump() +
         "\n  want: " + ojson(want.substr(from, 100)).dump();
}

struct Counts {
  int engine = 0, engine_errors = 0, chat_format = 0, builtin = 0;
};

}  // namespace

TEST_CASE("chat templates render byte-identically to transformers over random conversations") {
  k3::testing::ScratchDir dir("jinja_oracle");
  REQUIRE(k3::write_tiny_tokenizer(dir.str()).is_ok());
  auto tok = k3::Tokenizer::load(dir.str());
  REQUIRE(tok.is_ok());
  REQUIRE(tok->chat_format().has_template());

  const std::string cases = dir.file("cases.jsonl");
  const std::string python = std::string(K3_BIN_DIR) + "/../venv/bin/python3";
  std::string cmd = "'" + python + "' " + K3_SOURCE_DIR + "/tests/jinja/chat_template_oracle.py --seed 11 --count 250" +
                    " --out '" + cases + "' --template kimi='" + dir.file("tokenizer_config.json") + "'";
  for (const char* t : kTemplates) cmd += std::string(" --template ") + t + "='" + template_path(t) + "'";
  const k3::test::CommandResult r = k3::test::run_command(cmd);
  if (r.exit_code == 77) {
    WARN("skipped: the test venv (" << python << ") has no transformers; run tools/test.sh");
    return;
  }
  REQUIRE(r.exit_code == 0);

  // The server's chat formats: the tiny checkpoint's (loaded with its tokenizer) and one per test template.
  std::map<std::string, k3::ChatFormat> formats;
  std::map<std::string, std::string> sources;
  sources["kimi"] = nlohmann::json::parse(read_all(dir.file("tokenizer_config.json")))["chat_template"];
  for (const char* t : kTemplates) {
    sources[t] = read_all(template_path(t));
    const nlohmann::json config = {{"chat_template", sources[t]}, {"bos_token", "[BOS]"}, {"eos_token", "[EOS]"},
                                   {"pad_token", "[PAD]"},        {"unk_token", "[UNK]"}};
    auto f = k3::ChatFormat::from_tokenizer_config(config, t);
    REQUIRE(f.is_ok());
    formats.emplace(t, std::move(f).value());
  }

  Counts n;
  std::istringstream lines(read_all(cases));
  for (std::string line; std::getline(lines, line);) {
    const ojson c = ojson::parse(line);
    const std::string name = c["template"];
    const bool want_error = c.contains("error");
    const std::string want = want_error ? "" : c["expected"].get<std::string>();
    INFO("template " << name << ", context " << c["context"].dump());

    // The engine itself, on exactly the variables transformers passed.
    auto tmpl = k3::jinja::Template::parse(sources[name]);
    REQUIRE(tmpl.is_ok());
    const k3::jinja::Value ctx = k3::jinja::Value::from_json(c["context"]);
    auto got = tmpl->render(ctx.dict());
    if (want_error) {
      INFO("transformers raised " << c["error"].get<std::string>());
      CHECK_FALSE(got.is_ok());
      ++n.engine_errors;
      continue;
    }
    if (!got.is_ok()) FAIL(got.status().message());
    if (*got != want) FAIL(first_difference(*got, want));
    ++n.engine;

    // The serving path: OpenAI messages parsed as the server parses them, rendered by the chat format.
    if (!c["openai"].get<bool>()) continue;
    auto messages = k3::parse_chat_messages(c["context"]["messages"].dump());
    if (!messages.is_ok()) continue;  // a role the server refuses before any template runs
    const std::string tools_json = c["context"]["tools"].is_null() ? "" : c["context"]["tools"].dump();
    const bool agp = c["context"]["add_generation_prompt"];
    const k3::ChatFormat& format = name == "kimi" ? tok->chat_format() : formats.at(name);
    auto served = format.render(*messages, agp, tools_json);
    if (!served.is_ok()) FAIL(served.status().message());
    if (*served != want) FAIL(first_difference(*served, want));
    ++n.chat_format;

    // The built-in renderer lays out the same turns as the tiny checkpoint's template.
    if (name == "kimi") {
      auto builtin = k3::render_chat(*messages, agp, tools_json);
      REQUIRE(builtin.is_ok());
      if (*builtin != want) FAIL(first_difference(*builtin, want));
      ++n.builtin;
    }
  }
  INFO("engine " << n.engine << ", errors " << n.engine_errors << ", chat format " << n.chat_format << ", built-in "
                 << n.builtin);
  CHECK(n.engine >= 900);
  CHECK(n.engine_errors >= 5);
  CHECK(n.chat_format >= 600);
  CHECK(n.builtin >= 150);
}
