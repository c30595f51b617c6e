// The Kimi chat template rendered from OpenAI-style messages:
//   <|im_system|>system<|im_middle|>...<|im_end|><|im_user|>user<|im_middle|>...<|im_end|>
//   <|im_assistant|>assistant<|im_middle|>   (generation prompt)
#pragma once
#include <string>
#include <vector>

#include "common/core/status.h"

namespace k3 {

struct ChatMessage {
  std::string role;     // "system" | "user" | "assistant" | "tool"
  std::string content;
  std::string name;     // optional
};

// Rejects unknown roles and an empty list with an error naming the message index and field.
Result<std::string> render_chat(const std::vector<ChatMessage>& messages, bool add_generation_prompt = true);
// Parses an OpenAI "messages" JSON array (content as string or [{type:"text", text}] parts).
Result<std::vector<ChatMessage>> parse_chat_messages(const std::string& json_array_text);

}  // namespace k3
