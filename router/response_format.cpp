#include "router/response_format.h"

#include "router/api_error.h"

namespace k3::router {

using json = nlohmann::json;

ResponseFormat parse_response_format(const json& body, const std::string& body_text) {
  ResponseFormat out;
  const auto rf = body.find("response_format");
  if (rf == body.end() || rf->is_null()) return out;
  if (!rf->is_object()) throw bad_param("response_format", "response_format must be an object");
  const auto type = rf->find("type");
  if (type == rf->end()) throw bad_param("response_format.type", "response_format.type is required");
  if (!type->is_string()) throw bad_param("response_format.type", "response_format.type must be a string");
  const std::string t = type->get<std::string>();
  if (t == "text") return out;
  if (t == "json_object") out.format.kind = grammar::OutputFormat::Kind::JsonObject;
  else if (t == "json_schema") {
    const auto js = rf->find("json_schema");
    if (js == rf->end() || !js->is_object())
      throw bad_param("response_format.json_schema", "response_format.json_schema must be an object");
    const auto name = js->find("name");
    if (name == js->end() || !name->is_string() || name->get<std::string>().empty())
      throw bad_param("response_format.json_schema.name", "response_format.json_schema.name must be a non-empty string");
    if (const auto strict = js->find("strict"); strict != js->end() && !strict->is_boolean() && !strict->is_null())
      throw bad_param("response_format.json_schema.strict", "response_format.json_schema.strict must be a boolean");
    const auto schema = js->find("schema");
    if (schema == js->end() || !schema->is_object())
      throw bad_param("response_format.json_schema.schema", "response_format.json_schema.schema must be an object");
    // The parsed body sorts keys; the schema's own order decides the order of the output's properties.
    const auto ordered = nlohmann::ordered_json::parse(body_text);
    out.format.kind = grammar::OutputFormat::Kind::JsonSchema;
    out.format.schema = ordered["response_format"]["json_schema"]["schema"].dump();
  } else {
    throw bad_param("response_format.type",
                    "response_format.type must be one of text, json_object, json_schema (got \"" + t + "\")");
  }
  std::string path;
  auto g = out.format.compile(&path);
  if (!g.is_ok()) {
    const std::string param = "response_format.json_schema.schema" + (path.empty() ? "" : "." + path);
    throw ApiError(400, "response_format.json_schema.schema: " + g.status().message(), param, "unsupported_value");
  }
  out.grammar = std::move(g).value();
  return out;
}

}  // namespace k3::router
