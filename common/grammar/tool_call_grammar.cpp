#include "common/grammar/tool_call_grammar.h"

#include <nlohmann/json.hpp>

namespace k3::grammar {

using json = nlohmann::ordered_json;

namespace {

const char* mode_name(ToolCallMode m) {
  switch (m) {
    case ToolCallMode::None: return "none";
    case ToolCallMode::Auto: return "auto";
    case ToolCallMode::Required: return "required";
  }
  return "auto";
}

}  // namespace

bool valid_function_name(std::string_view name) {
  if (name.empty() || name.size() > 64) return false;
  for (char c : name)
    if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' || c == '-'))
      return false;
  return true;
}

std::string ToolCallSpec::to_json() const {
  json tools_json = json::array();
  for (const ToolSpec& t : tools) tools_json.push_back({{"name", t.name}, {"parameters", t.parameters}});
  return json{{"mode", mode_name(mode)}, {"first_index", first_index}, {"parallel", parallel}, {"tools", tools_json}}
      .dump();
}

Result<ToolCallSpec> ToolCallSpec::from_json(std::string_view text) {
  const json j = json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object()) return invalid_argument("tool-call spec: not a JSON object");
  ToolCallSpec s;
  const auto mode = j.find("mode");
  if (mode == j.end() || !mode->is_string()) return invalid_argument("tool-call spec: mode must be a string");
  if (*mode == "none") s.mode = ToolCallMode::None;
  else if (*mode == "auto") s.mode = ToolCallMode::Auto;
  else if (*mode == "required") s.mode = ToolCallMode::Required;
  else return invalid_argument("tool-call spec: mode must be none, auto or required");
  const auto first = j.find("first_index");
  if (first == j.end() || !first->is_number_integer() || first->get<int64_t>() < 0 || first->get<int64_t>() > 1000000)
    return invalid_argument("tool-call spec: first_index must be an integer in [0, 1000000]");
  s.first_index = first->get<int>();
  const auto parallel = j.find("parallel");
  if (parallel == j.end() || !parallel->is_boolean()) return invalid_argument("tool-call spec: parallel must be a boolean");
  s.parallel = parallel->get<bool>();
  const auto tools = j.find("tools");
  if (tools == j.end() || !tools->is_array()) return invalid_argument("tool-call spec: tools must be an array");
  for (const json& t : *tools) {
    if (!t.is_object() || !t.contains("name") || !t["name"].is_string() || !t.contains("parameters") ||
        !t["parameters"].is_string())
      return invalid_argument("tool-call spec: every tool needs a string name and parameters");
    s.tools.push_back({.name = t["name"].get<std::string>(), .parameters = t["parameters"].get<std::string>()});
  }
  return s;
}

Result<JsonGrammar> compile_parameters(std::string_view schema_text, std::string* error_path) {
  json schema = json::parse(schema_text, nullptr, /*allow_exceptions=*/false);
  if (schema.is_discarded() || !schema.is_object()) {
    if (error_path) *error_path = "";
    return invalid_argument("parameters must be a JSON-schema object");
  }
  // Arguments are always a JSON object; a schema that says nothing about the type means one.
  if (!schema.contains("type")) schema["type"] = "object";
  if (schema["type"] != "object") {
    if (error_path) *error_path = "type";
    return invalid_argument("type: the parameters of a function must be of type \"object\"");
  }
  return JsonGrammar::from_schema(schema, error_path);
}

Result<ToolCallGrammar> ToolCallGrammar::compile(const ToolCallSpec& spec) {
  ToolCallGrammar g{.mode = spec.mode, .first_index = spec.first_index, .parallel = spec.parallel};
  if (spec.mode == ToolCallMode::Required && spec.tools.empty())
    return invalid_argument("tool calls are required but no function is given");
  for (size_t i = 0; i < spec.tools.size(); ++i) {
    const ToolSpec& t = spec.tools[i];
    const std::string where = "tools[" + std::to_string(i) + "]";
    if (!valid_function_name(t.name))
      return invalid_argument(where + ".name: \"" + t.name + "\" is not 1 to 64 of a-z, A-Z, 0-9, _ and -");
    std::string path;
    auto args = compile_parameters(t.parameters, &path);
    if (!args.is_ok()) return invalid_argument(where + ".parameters: " + args.status().message());
    g.names.push_back(t.name);
    g.arguments.push_back(std::move(args).value());
  }
  return g;
}

}  // namespace k3::grammar
