// Tool calls as constrained output. The router turns the API's tools / tool_choice into a ToolCallSpec;
// it travels to the sampling nodes as JSON text inside the OutputFormat wire form, and compile() gives
// the grammar of each callable function's arguments (its `parameters` schema, the subset json_grammar.h
// lists, always an object). TokenConstraint walks the tool-call section of the chat template
// (chat_template.h) with it:
//   None:     free text; the tool-call tokens are never drawn.
//   Auto:     free text, optionally followed by one tool-call section.
//   Required: a tool-call section right away (a named tool_choice is Required with one function).
// A section holds one call, or several when `parallel`; each call's name is one of the functions and
// its index counts on from first_index.
#pragma once
#include <string>
#include <string_view>
#include <vector>

#include "common/core/status.h"
#include "common/grammar/json_grammar.h"

namespace k3::grammar {

enum class ToolCallMode { None, Auto, Required };

struct ToolSpec {
  std::string name;
  std::string parameters;  // JSON-schema text ("{}" when the tool gave none)
};

struct ToolCallSpec {
  ToolCallMode mode = ToolCallMode::Auto;
  std::vector<ToolSpec> tools;  // the functions the output may call
  int first_index = 0;          // index of the first call (tool calls earlier in the conversation)
  bool parallel = true;         // more than one call per section

  std::string to_json() const;
  static Result<ToolCallSpec> from_json(std::string_view text);
};

struct ToolCallGrammar {
  ToolCallMode mode = ToolCallMode::Auto;
  int first_index = 0;
  bool parallel = true;
  std::vector<std::string> names;
  std::vector<JsonGrammar> arguments;  // by function, as names

  // Errors name the function's index and the schema keyword's path ("tools[1].parameters.type").
  static Result<ToolCallGrammar> compile(const ToolCallSpec& spec);
};

// One function's parameters compiled as the grammar of its arguments: a schema without `type` is an
// object schema; one whose type is not object is refused (path "type"). *error_path as in
// JsonGrammar::from_schema.
Result<JsonGrammar> compile_parameters(std::string_view schema_text, std::string* error_path = nullptr);

// A function name the API accepts: 1 to 64 of [A-Za-z0-9_-].
bool valid_function_name(std::string_view name);

}  // namespace k3::grammar
