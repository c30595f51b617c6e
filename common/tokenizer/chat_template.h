// The Kimi chat template rendered from OpenAI-style messages:
//   <|im_system|>tool_declare<|im_middle|>[tools as compact JSON]<|im_end|>   (only when tools are given)
//   <|im_system|>system<|im_middle|>...<|im_end|><|im_user|>user<|im_middle|>...<|im_end|>
//   <|im_assistant|>assistant<|im_middle|>   (generation prompt)
// Tool calls are a section of special tokens inside an assistant turn (the same text the model
// produces when it calls a tool, so a conversation replays what was generated):
//   <|tool_calls_section_begin|><|tool_call_begin|>functions.NAME:INDEX<|tool_call_argument_begin|>
//   {arguments as JSON}<|tool_call_end|>...<|tool_calls_section_end|>
// INDEX counts the tool calls of the whole conversation from 0; "functions.NAME:INDEX" is also the
// call's id in the API. A tool result renders as "## Return of ID\n" followed by its content.
#pragma once
#include <string>
#include <string_view>
#include <vector>

#include "common/core/status.h"

namespace k3 {

// The special tokens of the tool-call section (one definition: the template, the output constraint
// and the output parser all use these).
inline constexpr std::string_view kToolCallsBegin = "<|tool_calls_section_begin|>";
inline constexpr std::string_view kToolCallsEnd = "<|tool_calls_section_end|>";
inline constexpr std::string_view kToolCallBegin = "<|tool_call_begin|>";
inline constexpr std::string_view kToolCallArguments = "<|tool_call_argument_begin|>";
inline constexpr std::string_view kToolCallEnd = "<|tool_call_end|>";

// The id of a call as the model writes it: "functions.NAME:INDEX".
std::string tool_call_id(std::string_view name, int index);

struct ChatToolCall {
  std::string id;         // as the API gave it ("functions.NAME:INDEX" when this server made it)
  std::string name;
  std::string arguments;  // JSON text
};

struct ChatMessage {
  std::string role;     // "system" | "user" | "assistant" | "tool"
  std::string content;
  std::string name;     // optional
  std::vector<ChatToolCall> tool_calls;  // assistant: calls it made
  std::string tool_call_id;              // tool: the call this message answers
};

// Rejects unknown roles and an empty list with an error naming the message index and field.
// tools_json: the API's tools array as compact JSON text ("" when there are none).
Result<std::string> render_chat(const std::vector<ChatMessage>& messages, bool add_generation_prompt = true,
                                std::string_view tools_json = {});
// Parses an OpenAI "messages" JSON array (content as string or [{type:"text", text}] parts).
Result<std::vector<ChatMessage>> parse_chat_messages(const std::string& json_array_text);

}  // namespace k3
