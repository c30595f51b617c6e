#include "common/grammar/json_grammar.h"

#include <nlohmann/json.hpp>

#include <set>

namespace k3::grammar {

using json = nlohmann::ordered_json;

namespace {

// Keywords that describe a schema without constraining values: accepted and ignored.
const std::set<std::string> kAnnotations = {"title", "description", "$schema", "default", "examples", "$comment", "$id"};
const std::set<std::string> kSupported = {"type", "properties", "required", "additionalProperties", "items", "enum",
                                          "const", "minItems", "maxItems", "minLength", "maxLength"};

struct CompileError {
  std::string path;
  std::string message;
};

std::string join(const std::string& path, const std::string& key) { return path.empty() ? key : path + "." + key; }

uint32_t kind_of(const std::string& name, const std::string& path) {
  if (name == "object") return kObject;
  if (name == "array") return kArray;
  if (name == "string") return kString;
  if (name == "number") return kNumber | kInteger;
  if (name == "integer") return kInteger;
  if (name == "boolean") return kBoolean;
  if (name == "null") return kNull;
  throw CompileError{join(path, "type"), "type \"" + name + "\" is not a JSON-schema type"};
}

int64_t count_of(const json& s, const char* key, const std::string& path) {
  const json& v = s.at(key);
  if (!v.is_number_integer() || v.get<int64_t>() < 0)
    throw CompileError{join(path, key), std::string(key) + " must be a non-negative integer"};
  return v.get<int64_t>();
}

}  // namespace

class SchemaCompiler {
 public:
  explicit SchemaCompiler(JsonGrammar& g) : g_(g) {}

  int compile(const json& s, const std::string& path, int depth) {
    if (s.is_boolean()) {
      if (!s.get<bool>()) throw CompileError{path, "a false schema admits no value"};
      return JsonGrammar::kAnyNode;
    }
    if (!s.is_object()) throw CompileError{path, "a schema must be an object"};
    if (depth > kMaxDepth)
      throw CompileError{path, "the schema nests deeper than " + std::to_string(kMaxDepth) + " levels"};
    for (const auto& [key, _] : s.items())
      if (!kSupported.count(key) && !kAnnotations.count(key))
        throw CompileError{join(path, key), "JSON-schema keyword \"" + key + "\" is not supported"};

    SchemaNode n;
    if (s.contains("type")) {
      const json& t = s["type"];
      n.kinds = 0;
      if (t.is_string()) n.kinds = kind_of(t.get<std::string>(), path);
      else if (t.is_array() && !t.empty()) {
        for (const json& x : t) {
          if (!x.is_string()) throw CompileError{join(path, "type"), "type must be a string or a list of strings"};
          n.kinds |= kind_of(x.get<std::string>(), path);
        }
      } else {
        throw CompileError{join(path, "type"), "type must be a string or a non-empty list of strings"};
      }
    }
    if (s.contains("enum") || s.contains("const")) {
      if (s.contains("const")) n.literals.push_back(s["const"].dump());
      if (s.contains("enum")) {
        const json& e = s["enum"];
        if (!e.is_array() || e.empty()) throw CompileError{join(path, "enum"), "enum must be a non-empty array"};
        for (const json& v : e) n.literals.push_back(v.dump());
      }
      if (static_cast<int>(n.literals.size()) > kMaxAlternatives)
        throw CompileError{join(path, "enum"), "enum has more than " + std::to_string(kMaxAlternatives) + " values"};
      const int id = static_cast<int>(g_.nodes_.size());
      g_.nodes_.push_back(std::move(n));
      return id;
    }
    if (s.contains("minLength")) n.min_length = count_of(s, "minLength", path);
    if (s.contains("maxLength")) n.max_length = count_of(s, "maxLength", path);
    if (n.max_length >= 0 && n.max_length < n.min_length)
      throw CompileError{join(path, "maxLength"), "maxLength is below minLength"};
    if (s.contains("minItems")) n.min_items = count_of(s, "minItems", path);
    if (s.contains("maxItems")) n.max_items = count_of(s, "maxItems", path);
    if (n.max_items >= 0 && n.max_items < n.min_items)
      throw CompileError{join(path, "maxItems"), "maxItems is below minItems"};
    if (s.contains("items")) n.items = compile(s["items"], join(path, "items"), depth + 1);
    if (s.contains("additionalProperties") && !s["additionalProperties"].is_boolean())
      throw CompileError{join(path, "additionalProperties"), "additionalProperties must be true or false (a schema is not supported)"};
    const bool closed = s.contains("additionalProperties") && !s["additionalProperties"].get<bool>();
    std::set<std::string> required;
    if (s.contains("required")) {
      const json& r = s["required"];
      if (!r.is_array()) throw CompileError{join(path, "required"), "required must be an array of property names"};
      for (const json& x : r) {
        if (!x.is_string()) throw CompileError{join(path, "required"), "required must be an array of property names"};
        required.insert(x.get<std::string>());
      }
    }
    if (s.contains("properties")) {
      const json& p = s["properties"];
      if (!p.is_object()) throw CompileError{join(path, "properties"), "properties must be an object"};
      if (static_cast<int>(p.size()) > kMaxAlternatives)
        throw CompileError{join(path, "properties"), "more than " + std::to_string(kMaxAlternatives) + " properties"};
      n.free_keys = false;
      // Node ids are assigned after the children compile; collect first.
      for (const auto& [key, sub] : p.items()) {
        const int child = compile(sub, join(join(path, "properties"), key), depth + 1);
        n.props.push_back({.key = json(key).dump(), .node = child, .required = required.count(key) != 0});
      }
    } else if (closed) {
      n.free_keys = false;  // {} only
    }
    for (const std::string& r : required) {
      bool found = false;
      for (const Property& pr : n.props) found |= pr.key == json(r).dump();
      if (!found) throw CompileError{join(path, "required"), "required names \"" + r + "\", which is not in properties"};
    }
    const int id = static_cast<int>(g_.nodes_.size());
    g_.nodes_.push_back(std::move(n));
    return id;
  }

 private:
  JsonGrammar& g_;
};

JsonGrammar::JsonGrammar() {
  nodes_.push_back(SchemaNode{});                      // kAnyNode: items and free-key values are itself
  nodes_.push_back(SchemaNode{.kinds = kString});      // kAnyString
}

JsonGrammar JsonGrammar::any_object() {
  JsonGrammar g;
  g.nodes_.push_back(SchemaNode{.kinds = kObject});
  g.root_ = 2;
  return g;
}

Result<JsonGrammar> JsonGrammar::from_schema(const nlohmann::ordered_json& schema, std::string* error_path) {
  JsonGrammar g;
  try {
    SchemaCompiler c(g);
    g.root_ = c.compile(schema, "", 0);
  } catch (const CompileError& e) {
    if (error_path) *error_path = e.path;
    return invalid_argument(e.path.empty() ? e.message : e.path + ": " + e.message);
  }
  return g;
}

}  // namespace k3::grammar

namespace k3::grammar {

Result<JsonGrammar> JsonGrammar::from_schema_text(std::string_view text, std::string* error_path) {
  json schema = json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (schema.is_discarded()) {
    if (error_path) *error_path = "";
    return invalid_argument("the schema is not valid JSON");
  }
  return from_schema(schema, error_path);
}

}  // namespace k3::grammar
