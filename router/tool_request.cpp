#include "router/tool_request.h"

#include <set>

#include "common/grammar/tool_call_grammar.h"
#include "router/api_error.h"

namespace k3::router {

namespace {

using ojson = nlohmann::ordered_json;

const ojson* member(const ojson& obj, const char* name) {
  auto it = obj.find(name);
  if (it == obj.end() || it->is_null()) return nullptr;
  return &*it;
}

// One entry of `tools`: its function's name and parameters (checked against the supported subset).
grammar::ToolSpec parse_tool(const ojson& t, const std::string& where) {
  if (!t.is_object()) throw bad_param(where, where + " must be an object");
  const ojson* type = member(t, "type");
  if (!type || !type->is_string() || type->get<std::string>() != "function")
    throw bad_param(where + ".type", where + ".type must be \"function\"");
  const ojson* fn = member(t, "function");
  if (!fn || !fn->is_object()) throw bad_param(where + ".function", where + ".function must be an object");
  const ojson* name = member(*fn, "name");
  if (!name || !name->is_string() || !grammar::valid_function_name(name->get<std::string>()))
    throw bad_param(where + ".function.name", where + ".function.name must be 1 to 64 of a-z, A-Z, 0-9, _ and -");
  if (const ojson* d = member(*fn, "description"); d && !d->is_string())
    throw bad_param(where + ".function.description", where + ".function.description must be a string");
  if (const ojson* s = member(*fn, "strict"); s && !s->is_boolean())
    throw bad_param(where + ".function.strict", where + ".function.strict must be a boolean");
  grammar::ToolSpec spec{.name = name->get<std::string>(), .parameters = "{}"};
  if (const ojson* p = member(*fn, "parameters")) {
    if (!p->is_object()) throw bad_param(where + ".function.parameters", where + ".function.parameters must be an object");
    spec.parameters = p->dump();
  }
  std::string path;
  auto g = grammar::compile_parameters(spec.parameters, &path);
  if (!g.is_ok()) {
    const std::string param = where + ".function.parameters" + (path.empty() ? "" : "." + path);
    throw ApiError(400, where + ".function.parameters: " + g.status().message(), param, "unsupported_value");
  }
  return spec;
}

}  // namespace

ToolRequest parse_tool_request(const nlohmann::json& body, const std::string& body_text, int first_index) {
  ToolRequest out;
  const auto tools_it = body.find("tools");
  const bool has_tools = tools_it != body.end() && !tools_it->is_null() && !(tools_it->is_array() && tools_it->empty());
  const auto choice_it = body.find("tool_choice");
  const bool has_choice = choice_it != body.end() && !choice_it->is_null();
  if (const auto p = body.find("parallel_tool_calls"); p != body.end() && !p->is_null() && !p->is_boolean())
    throw bad_param("parallel_tool_calls", "parallel_tool_calls must be a boolean");
  if (!has_tools) {
    if (has_choice && !(choice_it->is_string() && choice_it->get<std::string>() == "none"))
      throw bad_param("tool_choice", "tool_choice is only allowed when tools are given");
    return out;
  }
  if (!tools_it->is_array()) throw bad_param("tools", "tools must be an array");
  // The schemas keep their key order: it decides the order of the arguments' properties.
  const ojson ordered = ojson::parse(body_text);
  const ojson& tools = ordered.at("tools");
  grammar::ToolCallSpec spec{.first_index = first_index};
  std::set<std::string> names;
  for (size_t i = 0; i < tools.size(); ++i) {
    const std::string where = "tools[" + std::to_string(i) + "]";
    grammar::ToolSpec t = parse_tool(tools[i], where);
    if (!names.insert(t.name).second)
      throw bad_param(where + ".function.name", where + ".function.name \"" + t.name + "\" is declared twice");
    spec.tools.push_back(std::move(t));
  }
  if (const auto p = body.find("parallel_tool_calls"); p != body.end() && p->is_boolean()) spec.parallel = p->get<bool>();

  if (!has_choice || (choice_it->is_string() && choice_it->get<std::string>() == "auto")) {
    spec.mode = grammar::ToolCallMode::Auto;
  } else if (choice_it->is_string() && choice_it->get<std::string>() == "none") {
    spec.mode = grammar::ToolCallMode::None;
  } else if (choice_it->is_string() && choice_it->get<std::string>() == "required") {
    spec.mode = grammar::ToolCallMode::Required;
  } else if (choice_it->is_object()) {
    const auto type = choice_it->find("type");
    if (type == choice_it->end() || *type != "function")
      throw bad_param("tool_choice.type", "tool_choice.type must be \"function\"");
    const auto fn = choice_it->find("function");
    if (fn == choice_it->end() || !fn->is_object())
      throw bad_param("tool_choice.function", "tool_choice.function must be an object");
    const auto name = fn->find("name");
    if (name == fn->end() || !name->is_string())
      throw bad_param("tool_choice.function.name", "tool_choice.function.name must be a string");
    const std::string wanted = name->get<std::string>();
    if (!names.count(wanted))
      throw bad_param("tool_choice.function.name", "tool_choice.function.name \"" + wanted + "\" is not one of the tools");
    std::erase_if(spec.tools, [&](const grammar::ToolSpec& t) { return t.name != wanted; });
    spec.mode = grammar::ToolCallMode::Required;
  } else {
    throw bad_param("tool_choice", "tool_choice must be \"none\", \"auto\", \"required\" or {\"type\": \"function\", "
                                   "\"function\": {\"name\": ...}}");
  }

  out.tools_json = tools.dump();
  out.calls_possible = spec.mode != grammar::ToolCallMode::None;
  out.format = {.kind = grammar::OutputFormat::Kind::ToolCalls, .schema = spec.to_json()};
  auto g = out.format.compile();
  if (!g.is_ok()) throw ApiError(500, "tools: " + g.status().message(), "tools", "internal_error");
  out.grammar = std::move(g).value();
  return out;
}

}  // namespace k3::router
