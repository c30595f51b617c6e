// A Jinja template in the subset chat templates use (docs/MODELS.md, Chat templates), parsed once
// and rendered many times. Errors name the construct and its line and column; anything outside the
// subset is refused when the template is parsed, not silently rendered differently.
#pragma once
#include <memory>
#include <string>
#include <string_view>

#include "common/core/status.h"
#include "common/jinja/value.h"

namespace k3::jinja {

struct Stmt;

class Template {
 public:
  static Result<Template> parse(std::string_view source);
  // context: the variables the template sees (for a chat: messages, tools, add_generation_prompt,
  // bos_token, eos_token). Errors, raise_exception() included, come back as InvalidArgument.
  Result<std::string> render(const Dict& context) const;

 private:
  struct Parsed;
  explicit Template(std::shared_ptr<const Parsed> parsed) : parsed_(std::move(parsed)) {}
  std::shared_ptr<const Parsed> parsed_;  // immutable: copies share it, rendering is thread-safe
};

}  // namespace k3::jinja
