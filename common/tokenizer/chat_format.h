// How a model's chat requests become prompt text: through the checkpoint's own Jinja chat template
// when its tokenizer_config.json has one ("chat_template", as Hugging Face tokenizers apply it),
// otherwise through the built-in Kimi renderer (chat_template.h). The template sees what
// transformers' apply_chat_template passes: messages (role, content, then name, tool_calls with
// id / type / function{name, arguments}, tool_call_id where present), tools (the declared tools,
// or none), add_generation_prompt, and the special tokens bos_token, eos_token, pad_token, unk_token.
#pragma once
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/core/status.h"
#include "common/jinja/template.h"
#include "common/jinja/value.h"
#include "common/tokenizer/chat_template.h"

namespace k3 {

class ChatFormat {
 public:
  ChatFormat() = default;  // the built-in renderer
  // From a parsed tokenizer_config.json: a "chat_template" string (or Hugging Face's list of named
  // templates, of which "default" is used) is parsed now, so a template outside the supported
  // subset refuses the model at load with the line and column of the construct.
  static Result<ChatFormat> from_tokenizer_config(const nlohmann::json& config, const std::string& path);

  bool has_template() const { return tmpl_.has_value(); }
  // tools_json: the declared tools as a JSON array text ("" when none).
  Result<std::string> render(const std::vector<ChatMessage>& messages, bool add_generation_prompt,
                             std::string_view tools_json) const;

 private:
  std::optional<jinja::Template> tmpl_;
  jinja::Dict special_tokens_;  // bos_token, eos_token, ... as the config names them
};

// The variables a chat template sees for these messages (public for tests that hand the same
// variables to another renderer).
Result<jinja::Dict> chat_template_context(const std::vector<ChatMessage>& messages, bool add_generation_prompt,
                                          std::string_view tools_json);

}  // namespace k3
