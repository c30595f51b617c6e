#include "common/grammar/output_format.h"

namespace k3::grammar {

namespace {
constexpr std::string_view kSchemaPrefix = "json_schema:";
}

Result<std::shared_ptr<const JsonGrammar>> OutputFormat::compile(std::string* error_path) const {
  switch (kind) {
    case Kind::Text:
      return std::shared_ptr<const JsonGrammar>();
    case Kind::JsonObject:
      return std::make_shared<const JsonGrammar>(JsonGrammar::any_object());
    case Kind::JsonSchema: {
      K3_ASSIGN_OR_RETURN(JsonGrammar g, JsonGrammar::from_schema_text(schema, error_path));
      return std::make_shared<const JsonGrammar>(std::move(g));
    }
  }
  return internal_error("unknown output format");
}

std::string OutputFormat::encode() const {
  if (kind == Kind::JsonObject) return "json_object";
  if (kind == Kind::JsonSchema) return std::string(kSchemaPrefix) + schema;
  return "";
}

Result<OutputFormat> OutputFormat::parse(const std::string& wire) {
  if (wire.empty()) return OutputFormat{};
  if (wire == "json_object") return OutputFormat{.kind = Kind::JsonObject};
  if (wire.starts_with(kSchemaPrefix))
    return OutputFormat{.kind = Kind::JsonSchema, .schema = wire.substr(kSchemaPrefix.size())};
  return invalid_argument("output format must be \"\", \"json_object\" or \"json_schema:<schema>\"");
}

}  // namespace k3::grammar
