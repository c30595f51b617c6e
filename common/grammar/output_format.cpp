#include "common/grammar/output_format.h"

namespace k3::grammar {

namespace {
constexpr std::string_view kSchemaPrefix = "json_schema:";
constexpr std::string_view kToolCallsPrefix = "tool_calls:";
}

Result<CompiledFormat> OutputFormat::compile(std::string* error_path) const {
  switch (kind) {
    case Kind::Text:
      return CompiledFormat{};
    case Kind::JsonObject:
      return CompiledFormat{.document = std::make_shared<const JsonGrammar>(JsonGrammar::any_object())};
    case Kind::JsonSchema: {
      K3_ASSIGN_OR_RETURN(JsonGrammar g, JsonGrammar::from_schema_text(schema, error_path));
      return CompiledFormat{.document = std::make_shared<const JsonGrammar>(std::move(g))};
    }
    case Kind::ToolCalls: {
      K3_ASSIGN_OR_RETURN(ToolCallSpec spec, ToolCallSpec::from_json(schema));
      K3_ASSIGN_OR_RETURN(ToolCallGrammar g, ToolCallGrammar::compile(spec));
      return CompiledFormat{.tool_calls = std::make_shared<const ToolCallGrammar>(std::move(g))};
    }
  }
  return internal_error("unknown output format");
}

std::string OutputFormat::encode() const {
  if (kind == Kind::JsonObject) return "json_object";
  if (kind == Kind::JsonSchema) return std::string(kSchemaPrefix) + schema;
  if (kind == Kind::ToolCalls) return std::string(kToolCallsPrefix) + schema;
  return "";
}

Result<OutputFormat> OutputFormat::parse(const std::string& wire) {
  if (wire.empty()) return OutputFormat{};
  if (wire == "json_object") return OutputFormat{.kind = Kind::JsonObject};
  if (wire.starts_with(kSchemaPrefix))
    return OutputFormat{.kind = Kind::JsonSchema, .schema = wire.substr(kSchemaPrefix.size())};
  if (wire.starts_with(kToolCallsPrefix))
    return OutputFormat{.kind = Kind::ToolCalls, .schema = wire.substr(kToolCallsPrefix.size())};
  return invalid_argument(
      "output format must be \"\", \"json_object\", \"json_schema:<schema>\" or \"tool_calls:<spec>\"");
}

}  // namespace k3::grammar
