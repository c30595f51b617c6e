#include "common/tokenizer/chat_format.h"

#include "common/tokenizer/tokenizer_config.h"

namespace k3 {
namespace {

jinja::Value message_value(const ChatMessage& m) {
  jinja::Dict d;
  d.set("role", jinja::Value(m.role));
  d.set("content", jinja::Value(m.content));
  if (!m.name.empty()) d.set("name", jinja::Value(m.name));
  if (!m.tool_calls.empty()) {
    jinja::List calls;
    for (const ChatToolCall& c : m.tool_calls) {
      jinja::Dict fn;
      fn.set("name", jinja::Value(c.name));
      fn.set("arguments", jinja::Value(c.arguments));
      jinja::Dict call;
      call.set("id", jinja::Value(c.id));
      call.set("type", jinja::Value("function"));
      call.set("function", jinja::Value(std::move(fn)));
      calls.emplace_back(std::move(call));
    }
    d.set("tool_calls", jinja::Value(std::move(calls)));
  }
  if (!m.tool_call_id.empty()) d.set("tool_call_id", jinja::Value(m.tool_call_id));
  return jinja::Value(std::move(d));
}

}  // namespace

Result<jinja::Dict> chat_template_context(const std::vector<ChatMessage>& messages, bool add_generation_prompt,
                                          std::string_view tools_json) {
  jinja::Dict ctx;
  jinja::List list;
  for (const ChatMessage& m : messages) list.push_back(message_value(m));
  ctx.set("messages", jinja::Value(std::move(list)));
  jinja::Value tools = jinja::Value::none();
  if (!tools_json.empty()) {
    // Ordered, so the template lays the tools out in the order the request gave them.
    const auto parsed = nlohmann::ordered_json::parse(tools_json, nullptr, /*allow_exceptions=*/false);
    if (parsed.is_discarded() || !parsed.is_array()) return invalid_argument("tools: expected a JSON array");
    tools = jinja::Value::from_json(parsed);
  }
  ctx.set("tools", tools);
  ctx.set("documents", jinja::Value::none());
  ctx.set("add_generation_prompt", jinja::Value(add_generation_prompt));
  return ctx;
}

Result<ChatFormat> ChatFormat::from_tokenizer_config(const nlohmann::json& config, const std::string& path) {
  ChatFormat f;
  for (const char* key : {"bos_token", "eos_token", "pad_token", "unk_token"})
    if (auto t = config_token_text(config, key)) f.special_tokens_.set(key, jinja::Value(*t));
  const auto it = config.find("chat_template");
  if (it == config.end() || it->is_null()) return f;
  std::string source;
  if (it->is_string()) {
    source = it->get<std::string>();
  } else if (it->is_array()) {
    // Hugging Face's form for several templates: [{"name": ..., "template": ...}]; chat uses "default".
    for (const auto& entry : *it)
      if (entry.is_object() && entry.value("name", "") == "default" && entry.contains("template") && entry["template"].is_string())
        source = entry["template"].get<std::string>();
    if (source.empty()) return invalid_argument(path + ": chat_template lists no template named \"default\"");
  } else {
    return invalid_argument(path + ": chat_template must be a string or a list of {name, template}");
  }
  auto tmpl = jinja::Template::parse(source);
  if (!tmpl.is_ok()) return invalid_argument(path + ": " + tmpl.status().message());
  f.tmpl_ = std::move(tmpl).value();
  return f;
}

Result<std::string> ChatFormat::render(const std::vector<ChatMessage>& messages, bool add_generation_prompt,
                                       std::string_view tools_json) const {
  if (!tmpl_) return render_chat(messages, add_generation_prompt, tools_json);
  if (messages.empty()) return invalid_argument("messages: the list is empty");
  K3_ASSIGN_OR_RETURN(jinja::Dict ctx, chat_template_context(messages, add_generation_prompt, tools_json));
  for (const auto& [k, v] : special_tokens_.items) ctx.set(k, v);
  return tmpl_->render(ctx);
}

}  // namespace k3
