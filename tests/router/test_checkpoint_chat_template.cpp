// A model directory whose tokenizer_config.json carries its own chat_template: the router renders
// chat requests through that template (prompt ids are the template's text, tokenized), a
// raise_exception in the template is a 400 on messages, and a template outside the supported subset
// stops the model from loading with the file and the construct named.
#include <catch2/catch.hpp>

#include <fstream>
#include <nlohmann/json.hpp>

#include "tests/router/router_fixture.h"

using namespace k3;
using nlohmann::json;

namespace {

// The tiny tokenizer in `dir` with its chat_template replaced by `tmpl`.
void set_chat_template(const std::string& dir, const std::string& tmpl) {
  const std::string path = dir + "/tokenizer_config.json";
  json cfg = json::parse(std::ifstream(path));
  cfg["chat_template"] = tmpl;
  std::ofstream(path) << cfg.dump(2);
}

// A template unlike the built-in Kimi layout, so its use is visible in the prompt ids.
constexpr const char* kTemplate =
    "{%- if tools %}[tools:{{ tools | map(attribute='function.name') | join(',') }}]{% endif -%}"
    "{%- for m in messages -%}"
    "{%- if m.role == 'system' %}{{ raise_exception('this model takes no system messages') }}{% endif -%}"
    "<|im_user|>{{ m.role | upper }}:{{ m.content }}"
    "{%- for c in m.tool_calls | default([]) %}(call {{ c.function.name }} {{ c.function.arguments }}){% endfor -%}"
    "{%- if m.tool_call_id is defined %}(result of {{ m.tool_call_id }}){% endif -%}"
    "<|im_end|>"
    "{%- endfor -%}"
    "{%- if add_generation_prompt %}<|im_assistant|>{% endif -%}";

struct TemplatedServer {
  test::TempDir dir;
  std::shared_ptr<const Tokenizer> tok;
  std::unique_ptr<router::LocalEngineService> service;
  std::unique_ptr<router::ApiHandlers> api;

  TemplatedServer() {
    const int vocab = write_tiny_tokenizer(dir.path).value();
    set_chat_template(dir.path, kTemplate);
    tok = std::make_shared<const Tokenizer>(Tokenizer::load(dir.path).value());
    ModelConfig cfg = preset_config("k3-tiny").value();
    cfg.vocab_size = vocab;
    cfg.max_position_embeddings = 512;
    service = router::LocalEngineService::create(cfg, random_weights(cfg, 7, DType::F32), tok, {.backend = {.threads = 2}}).value();
    api = std::make_unique<router::ApiHandlers>(*service, tok, cfg,
                                                router::ApiOptions{.served_model = "k3-tiny", .default_max_tokens = 2});
  }
  router::HttpResponse chat(const json& body) {
    return api->handle({.method = "POST", .target = "/v1/chat/completions",
                        .headers = {{"content-type", "application/json"}}, .body = body.dump()});
  }
};

}  // namespace

TEST_CASE("the router renders chat requests through the checkpoint's own chat template") {
  TemplatedServer s;
  const json messages = json::parse(R"([
    {"role": "user", "content": "Wie ist das Wetter in Köln?"},
    {"role": "assistant", "content": null, "tool_calls": [{"id": "functions.get_weather:0", "type": "function",
      "function": {"name": "get_weather", "arguments": "{\"city\":\"Köln\"}"}}]},
    {"role": "tool", "tool_call_id": "functions.get_weather:0", "content": "12 °C"}])");
  const json tools = json::parse(R"([{"type": "function", "function": {"name": "get_weather",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}}])");
  router::HttpResponse r = s.chat({{"model", "k3-tiny"}, {"messages", messages}, {"tools", tools}, {"tool_choice", "none"},
                                   {"max_tokens", 1}, {"return_token_ids", true}});
  INFO(r.body);
  REQUIRE(r.status == 200);
  const std::string want =
      "[tools:get_weather]<|im_user|>USER:Wie ist das Wetter in Köln?<|im_end|>"
      "<|im_user|>ASSISTANT:(call get_weather {\"city\":\"Köln\"})<|im_end|>"
      "<|im_user|>TOOL:12 °C(result of functions.get_weather:0)<|im_end|><|im_assistant|>";
  CHECK(json::parse(r.body)["prompt_token_ids"] == json(s.tok->encode(want, /*allow_special=*/true)));
}

TEST_CASE("raise_exception in the checkpoint's template answers 400 on messages with its message") {
  TemplatedServer s;
  router::HttpResponse r = s.chat({{"model", "k3-tiny"},
                                   {"messages", json::array({{{"role", "system"}, {"content", "be brief"}},
                                                             {{"role", "user"}, {"content", "hi"}}})}});
  REQUIRE(r.status == 400);
  const json err = json::parse(r.body)["error"];
  CHECK(err["param"] == "messages");
  CHECK(err["message"].get<std::string>().find("this model takes no system messages") != std::string::npos);
  CHECK(err["message"].get<std::string>().find("line 1, column") != std::string::npos);
}

TEST_CASE("a checkpoint whose chat template is outside the supported subset does not load") {
  test::TempDir dir;
  REQUIRE(write_tiny_tokenizer(dir.path).is_ok());
  set_chat_template(dir.path, "{% for m in messages %}\n{% include 'turn.jinja' %}{% endfor %}");
  auto tok = Tokenizer::load(dir.path);
  REQUIRE_FALSE(tok.is_ok());
  const std::string msg = tok.status().message();
  CHECK(msg.find("tokenizer_config.json") != std::string::npos);
  CHECK(msg.find("line 2, column 1") != std::string::npos);
  CHECK(msg.find("unsupported tag 'include'") != std::string::npos);
}
