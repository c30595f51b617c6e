// Runs a parsed template: statements write to the output, expressions are evaluated with Python's
// semantics. Scopes follow Jinja: a for loop's body has its own scope (a `set` inside it is not seen
// after the loop, which is why templates carry state out in a namespace), a macro call sees the
// template's top-level names and its own arguments.
#pragma once
#include <string>

#include "common/jinja/ast.h"
#include "common/jinja/value.h"

namespace k3::jinja {

// Throws TemplateError. `context`: the variables the caller passes (messages, tools, ...), looked
// up before the built-in globals.
std::string render_body(const Body& body, const Dict& context);

}  // namespace k3::jinja
