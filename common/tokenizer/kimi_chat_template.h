// The Kimi chat format written as a Jinja chat template, the form a checkpoint ships it in
// (tokenizer_config.json "chat_template"). The generated tiny checkpoints carry it, so the serving
// path renders them through the template engine exactly as it renders a downloaded checkpoint; it
// renders what render_chat (chat_template.h) renders, and a test holds the two equal.
#pragma once
#include <string_view>

namespace k3 {

std::string_view kimi_chat_template_jinja();

}  // namespace k3
