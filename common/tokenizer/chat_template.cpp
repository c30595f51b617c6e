// The Kimi (K2) chat template, matching what its chat_template.jinja renders for plain messages:
//   <|im_system|>system<|im_middle|>{content}<|im_end|>     (system, and tool results)
//   <|im_user|>user<|im_middle|>{content}<|im_end|>
//   <|im_assistant|>assistant<|im_middle|>{content}<|im_end|>
// The text between the role token and <|im_middle|> is the message's name when it has one,
// otherwise its role. Like the real template, a conversation that does not start with a system
// message gets Kimi's default system prompt first (after the tool declaration, when there is one).
// Assistant tool calls and tool results render as chat_template.h says; thinking blocks are not
// rendered (the serving path does not use them).
#include "common/tokenizer/chat_template.h"

#include <nlohmann/json.hpp>

namespace k3 {
namespace {

constexpr std::string_view kDefaultSystemPrompt = "You are Kimi, an AI assistant created by Moonshot AI.";

// The role's start token; empty for an unknown role.
std::string_view start_token(std::string_view role) {
  if (role == "user") return "<|im_user|>";
  if (role == "assistant") return "<|im_assistant|>";
  if (role == "system" || role == "tool") return "<|im_system|>";
  return {};
}

void append_turn(std::string& out, std::string_view role, std::string_view header, std::string_view content) {
  out.append(start_token(role));
  out.append(header);
  out.append("<|im_middle|>");
  out.append(content);
  out.append("<|im_end|>");
}

std::string field(size_t i, const char* name) { return "messages[" + std::to_string(i) + "]." + name; }

// OpenAI content: a string, null (assistant only), or parts [{"type": "text", "text": "..."}].
Result<std::string> content_text(const nlohmann::json& message, size_t i, const std::string& role) {
  const auto it = message.find("content");
  if (it == message.end() || it->is_null()) {
    if (role == "assistant") return std::string();
    return invalid_argument(field(i, "content") + " is required for role \"" + role + "\"");
  }
  if (it->is_string()) return it->get<std::string>();
  if (!it->is_array()) return invalid_argument(field(i, "content") + " must be a string or an array of parts");
  std::string text;
  for (size_t j = 0; j < it->size(); ++j) {
    const nlohmann::json& part = (*it)[j];
    const std::string where = field(i, "content") + "[" + std::to_string(j) + "]";
    if (!part.is_object()) return invalid_argument(where + " must be an object");
    const auto type = part.find("type");
    if (type == part.end() || !type->is_string()) return invalid_argument(where + ".type must be a string");
    if (*type != "text") {
      return invalid_argument(where + ".type \"" + type->get<std::string>() + "\" is not supported (only \"text\")");
    }
    const auto t = part.find("text");
    if (t == part.end() || !t->is_string()) return invalid_argument(where + ".text must be a string");
    text += t->get<std::string>();
  }
  return text;
}

// What goes between <|im_middle|> and <|im_end|>.
std::string turn_body(const ChatMessage& m) {
  if (m.role == "tool" && !m.tool_call_id.empty()) return "## Return of " + m.tool_call_id + "\n" + m.content;
  if (m.role != "assistant" || m.tool_calls.empty()) return m.content;
  std::string out = m.content;
  out.append(kToolCallsBegin);
  for (const ChatToolCall& c : m.tool_calls) {
    out.append(kToolCallBegin).append(c.id).append(kToolCallArguments).append(c.arguments).append(kToolCallEnd);
  }
  out.append(kToolCallsEnd);
  return out;
}

}  // namespace

std::string tool_call_id(std::string_view name, int index) {
  return "functions." + std::string(name) + ":" + std::to_string(index);
}

Result<std::string> render_chat(const std::vector<ChatMessage>& messages, bool add_generation_prompt,
                                std::string_view tools_json) {
  if (messages.empty()) return invalid_argument("messages: the list is empty");
  for (size_t i = 0; i < messages.size(); ++i) {
    if (start_token(messages[i].role).empty()) {
      return invalid_argument(field(i, "role") + ": unknown role \"" + messages[i].role +
                              "\" (expected system, user, assistant or tool)");
    }
  }
  std::string out;
  if (!tools_json.empty()) append_turn(out, "system", "tool_declare", tools_json);
  if (messages.front().role != "system") append_turn(out, "system", "system", kDefaultSystemPrompt);
  for (const ChatMessage& m : messages) {
    append_turn(out, m.role, m.name.empty() ? m.role : m.name, turn_body(m));
  }
  if (add_generation_prompt) out.append("<|im_assistant|>assistant<|im_middle|>");
  return out;
}

Result<std::vector<ChatMessage>> parse_chat_messages(const std::string& json_array_text) {
  const nlohmann::json doc = nlohmann::json::parse(json_array_text, nullptr, /*allow_exceptions=*/false);
  if (doc.is_discarded()) return invalid_argument("messages: not valid JSON");
  if (!doc.is_array()) return invalid_argument("messages: expected a JSON array");
  std::vector<ChatMessage> messages;
  messages.reserve(doc.size());
  for (size_t i = 0; i < doc.size(); ++i) {
    const nlohmann::json& m = doc[i];
    if (!m.is_object()) return invalid_argument("messages[" + std::to_string(i) + "] must be an object");
    const auto role = m.find("role");
    if (role == m.end() || !role->is_string()) return invalid_argument(field(i, "role") + " must be a string");
    ChatMessage msg;
    msg.role = role->get<std::string>();
    if (start_token(msg.role).empty()) {
      return invalid_argument(field(i, "role") + ": unknown role \"" + msg.role +
                              "\" (expected system, user, assistant or tool)");
    }
    K3_ASSIGN_OR_RETURN(msg.content, content_text(m, i, msg.role));
    if (const auto name = m.find("name"); name != m.end() && !name->is_null()) {
      if (!name->is_string()) return invalid_argument(field(i, "name") + " must be a string");
      msg.name = name->get<std::string>();
    }
    if (const auto id = m.find("tool_call_id"); id != m.end() && !id->is_null()) {
      if (!id->is_string()) return invalid_argument(field(i, "tool_call_id") + " must be a string");
      msg.tool_call_id = id->get<std::string>();
    }
    if (const auto calls = m.find("tool_calls"); calls != m.end() && !calls->is_null()) {
      if (!calls->is_array()) return invalid_argument(field(i, "tool_calls") + " must be an array");
      for (const nlohmann::json& c : *calls) {
        const nlohmann::json fn = c.is_object() ? c.value("function", nlohmann::json()) : nlohmann::json();
        if (!c.is_object() || !c.value("id", nlohmann::json()).is_string() || !fn.is_object() ||
            !fn.value("name", nlohmann::json()).is_string() || !fn.value("arguments", nlohmann::json()).is_string())
          return invalid_argument(field(i, "tool_calls") + " entries need a string id, function.name and function.arguments");
        msg.tool_calls.push_back({.id = c["id"].get<std::string>(), .name = fn["name"].get<std::string>(),
                                  .arguments = fn["arguments"].get<std::string>()});
      }
    }
    messages.push_back(std::move(msg));
  }
  return messages;
}

}  // namespace k3
