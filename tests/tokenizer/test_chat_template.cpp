#include <catch2/catch.hpp>

#include "common/tokenizer/chat_template.h"

using namespace k3;

namespace {
const std::string kDefaultSystem =
    "<|im_system|>system<|im_middle|>You are Kimi, an AI assistant created by Moonshot AI.<|im_end|>";

std::string render(const std::vector<ChatMessage>& m, bool gen = true) { return render_chat(m, gen).value(); }
}  // namespace

TEST_CASE("chat template renders every role exactly") {
  const std::vector<ChatMessage> messages = {
      {"system", "Be brief.", ""},
      {"user", "What is 1+1?", ""},
      {"assistant", "2", ""},
      {"tool", "{\"result\": 2}", ""},
      {"user", "Thanks", ""},
  };
  REQUIRE(render(messages) ==
          "<|im_system|>system<|im_middle|>Be brief.<|im_end|>"
          "<|im_user|>user<|im_middle|>What is 1+1?<|im_end|>"
          "<|im_assistant|>assistant<|im_middle|>2<|im_end|>"
          "<|im_system|>tool<|im_middle|>{\"result\": 2}<|im_end|>"
          "<|im_user|>user<|im_middle|>Thanks<|im_end|>"
          "<|im_assistant|>assistant<|im_middle|>");
  REQUIRE(render(messages, /*gen=*/false) ==
          "<|im_system|>system<|im_middle|>Be brief.<|im_end|>"
          "<|im_user|>user<|im_middle|>What is 1+1?<|im_end|>"
          "<|im_assistant|>assistant<|im_middle|>2<|im_end|>"
          "<|im_system|>tool<|im_middle|>{\"result\": 2}<|im_end|>"
          "<|im_user|>user<|im_middle|>Thanks<|im_end|>");
}

TEST_CASE("chat template injects Kimi's default system prompt when none leads") {
  REQUIRE(render({{"user", "What is 1+1?", ""}}) ==
          kDefaultSystem + "<|im_user|>user<|im_middle|>What is 1+1?<|im_end|><|im_assistant|>assistant<|im_middle|>");
  // A system message later in the conversation does not count as the leading one.
  REQUIRE(render({{"user", "a", ""}, {"system", "b", ""}}, false) ==
          kDefaultSystem + "<|im_user|>user<|im_middle|>a<|im_end|><|im_system|>system<|im_middle|>b<|im_end|>");
}

TEST_CASE("a message name replaces the role label") {
  REQUIRE(render({{"system", "s", ""}, {"tool", "42", "calculator"}}, false) ==
          "<|im_system|>system<|im_middle|>s<|im_end|><|im_system|>calculator<|im_middle|>42<|im_end|>");
}

TEST_CASE("render_chat rejects an empty list and unknown roles") {
  const Result<std::string> empty = render_chat({});
  REQUIRE_FALSE(empty.is_ok());
  REQUIRE_THAT(empty.status().message(), Catch::Contains("empty"));
  const Result<std::string> bad = render_chat({{"user", "a", ""}, {"robot", "b", ""}});
  REQUIRE_FALSE(bad.is_ok());
  REQUIRE(bad.status().code() == Code::InvalidArgument);
  REQUIRE_THAT(bad.status().message(), Catch::Contains("messages[1].role") && Catch::Contains("robot"));
}

TEST_CASE("parse_chat_messages reads strings, text parts, null assistant content and names") {
  const auto parsed = parse_chat_messages(R"([
      {"role": "system", "content": "sys"},
      {"role": "user", "content": [{"type": "text", "text": "hello "}, {"type": "text", "text": "there"}]},
      {"role": "assistant", "content": null, "tool_calls": []},
      {"role": "assistant"},
      {"role": "tool", "content": "7", "name": "calc", "tool_call_id": "x"}
  ])");
  REQUIRE(parsed.is_ok());
  const std::vector<ChatMessage>& messages = parsed.value();
  REQUIRE(messages.size() == 5);
  REQUIRE(messages[0].role == "system");
  REQUIRE(messages[0].content == "sys");
  REQUIRE(messages[1].content == "hello there");
  REQUIRE(messages[2].content.empty());
  REQUIRE(messages[3].content.empty());
  REQUIRE(messages[4].name == "calc");
  REQUIRE(messages[4].role == "tool");
  REQUIRE(render_chat(messages).value() ==
          "<|im_system|>system<|im_middle|>sys<|im_end|>"
          "<|im_user|>user<|im_middle|>hello there<|im_end|>"
          "<|im_assistant|>assistant<|im_middle|><|im_end|>"
          "<|im_assistant|>assistant<|im_middle|><|im_end|>"
          "<|im_system|>calc<|im_middle|>## Return of x\n7<|im_end|>"
          "<|im_assistant|>assistant<|im_middle|>");
  REQUIRE(parse_chat_messages("[]").value().empty());
  const auto with_call = parse_chat_messages(R"([{"role": "assistant", "content": null, "tool_calls":
      [{"id": "functions.f:0", "type": "function", "function": {"name": "f", "arguments": "{}"}}]}])");
  REQUIRE(with_call.is_ok());
  REQUIRE(with_call->at(0).tool_calls.size() == 1);
  CHECK(with_call->at(0).tool_calls[0].id == "functions.f:0");
  CHECK(with_call->at(0).tool_calls[0].arguments == "{}");
}

TEST_CASE("parse_chat_messages errors name the bad field") {
  struct Case {
    std::string json, field;
  };
  const std::vector<Case> cases = {
      {"not json", "not valid JSON"},
      {R"({"role": "user"})", "JSON array"},
      {R"(["hi"])", "messages[0]"},
      {R"([{"content": "x"}])", "messages[0].role"},
      {R"([{"role": 5, "content": "x"}])", "messages[0].role"},
      {R"([{"role": "user", "content": "x"}, {"role": "wizard", "content": "x"}])", "messages[1].role"},
      {R"([{"role": "user"}])", "messages[0].content"},
      {R"([{"role": "user", "content": null}])", "messages[0].content"},
      {R"([{"role": "user", "content": 3}])", "messages[0].content"},
      {R"([{"role": "user", "content": ["x"]}])", "messages[0].content[0]"},
      {R"([{"role": "user", "content": [{"type": "image_url", "image_url": {}}]}])", "messages[0].content[0].type"},
      {R"([{"role": "user", "content": [{"type": "text"}]}])", "messages[0].content[0].text"},
      {R"([{"role": "user", "content": "x", "name": 3}])", "messages[0].name"},
      {R"([{"role": "tool", "content": "x", "tool_call_id": 3}])", "messages[0].tool_call_id"},
      {R"([{"role": "assistant", "tool_calls": [{"id": "a"}]}])", "messages[0].tool_calls"},
  };
  for (const Case& c : cases) {
    INFO(c.json);
    const auto r = parse_chat_messages(c.json);
    REQUIRE_FALSE(r.is_ok());
    REQUIRE(r.status().code() == Code::InvalidArgument);
    REQUIRE_THAT(r.status().message(), Catch::Contains(c.field));
  }
}

TEST_CASE("tools, assistant tool calls and tool results render as Kimi's template lays them out") {
  ChatMessage call{.role = "assistant", .content = ""};
  call.tool_calls = {{.id = "functions.get_weather:0", .name = "get_weather", .arguments = "{\"city\":\"Oslo\"}"},
                     {.id = "functions.get_time:1", .name = "get_time", .arguments = "{}"}};
  ChatMessage result{.role = "tool", .content = "{\"temp\":21}"};
  result.tool_call_id = "functions.get_weather:0";
  const std::string tools = R"([{"type":"function","function":{"name":"get_weather"}}])";
  REQUIRE(render_chat({{"user", "weather?", ""}, call, result}, true, tools).value() ==
          "<|im_system|>tool_declare<|im_middle|>" + tools + "<|im_end|>" + kDefaultSystem +
              "<|im_user|>user<|im_middle|>weather?<|im_end|>"
              "<|im_assistant|>assistant<|im_middle|><|tool_calls_section_begin|>"
              "<|tool_call_begin|>functions.get_weather:0<|tool_call_argument_begin|>{\"city\":\"Oslo\"}<|tool_call_end|>"
              "<|tool_call_begin|>functions.get_time:1<|tool_call_argument_begin|>{}<|tool_call_end|>"
              "<|tool_calls_section_end|><|im_end|>"
              "<|im_system|>tool<|im_middle|>## Return of functions.get_weather:0\n{\"temp\":21}<|im_end|>"
              "<|im_assistant|>assistant<|im_middle|>");
  // Content before the calls stays; no tools declared: no tool_declare turn.
  call.content = "Checking.";
  call.tool_calls.resize(1);
  REQUIRE(render_chat({{"system", "s", ""}, call}, false).value() ==
          "<|im_system|>system<|im_middle|>s<|im_end|><|im_assistant|>assistant<|im_middle|>Checking."
          "<|tool_calls_section_begin|><|tool_call_begin|>functions.get_weather:0<|tool_call_argument_begin|>"
          "{\"city\":\"Oslo\"}<|tool_call_end|><|tool_calls_section_end|><|im_end|>");
  REQUIRE(tool_call_id("f", 12) == "functions.f:12");
}
