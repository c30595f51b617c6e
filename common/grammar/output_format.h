// What a request asks its output to be, in the one form that travels: the router parses it from the
// API's response_format, GenerationParams carries it, and in cluster mode it goes to the sampling
// nodes as text, where compile() builds the same grammar the router checked.
#pragma once
#include <memory>
#include <string>

#include "common/core/status.h"
#include "common/grammar/json_grammar.h"

namespace k3::grammar {

struct OutputFormat {
  enum class Kind { Text, JsonObject, JsonSchema };
  Kind kind = Kind::Text;
  std::string schema;  // JsonSchema: the schema's JSON text (key order kept)

  bool constrained() const { return kind != Kind::Text; }
  // The grammar (null for Text). Errors name the schema keyword, as JsonGrammar::from_schema does.
  Result<std::shared_ptr<const JsonGrammar>> compile(std::string* error_path = nullptr) const;
  // Wire form: "" (text), "json_object", or "json_schema:" + schema text; parse() inverts it.
  std::string encode() const;
  static Result<OutputFormat> parse(const std::string& wire);
};

}  // namespace k3::grammar
