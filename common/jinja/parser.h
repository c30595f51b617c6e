// Turns template tokens into statements. Throws TemplateError naming the construct and its offset
// for anything outside the supported subset (docs/MODELS.md, Chat templates).
#pragma once
#include <vector>

#include "common/jinja/ast.h"
#include "common/jinja/lexer.h"

namespace k3::jinja {

Body parse_template(const std::vector<Token>& tokens);

}  // namespace k3::jinja
