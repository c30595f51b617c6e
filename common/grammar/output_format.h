// What a request asks its output to be, in the one form that travels: the router parses it from the
// API's response_format (or tools / tool_choice), GenerationParams carries it, and in cluster mode it
// goes to the sampling nodes as text, where compile() builds the same grammar the router checked.
#pragma once
#include <memory>
#include <string>

#include "common/core/status.h"
#include "common/grammar/json_grammar.h"
#include "common/grammar/tool_call_grammar.h"

namespace k3::grammar {

// A compiled OutputFormat: at most one of the two is set (neither for free text).
struct CompiledFormat {
  std::shared_ptr<const JsonGrammar> document;       // json_object / json_schema
  std::shared_ptr<const ToolCallGrammar> tool_calls; // tools
  bool constrained() const { return document || tool_calls; }
};

struct OutputFormat {
  enum class Kind { Text, JsonObject, JsonSchema, ToolCalls };
  Kind kind = Kind::Text;
  std::string schema;  // JsonSchema: the schema's JSON text (key order kept); ToolCalls: ToolCallSpec::to_json

  bool constrained() const { return kind != Kind::Text; }
  // The grammar (nothing for Text). Errors name the schema keyword, as JsonGrammar::from_schema does.
  Result<CompiledFormat> compile(std::string* error_path = nullptr) const;
  // Wire form: "" (text), "json_object", "json_schema:" + schema text or "tool_calls:" + spec text;
  // parse() inverts it.
  std::string encode() const;
  static Result<OutputFormat> parse(const std::string& wire);
};

}  // namespace k3::grammar
