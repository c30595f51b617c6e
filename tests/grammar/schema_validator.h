// A reference validator for the JSON-schema subset of common/grammar/json_grammar.h, written from the
// JSON-schema rules and not from the matcher, so tests can check constrained output independently.
#pragma once
#include <nlohmann/json.hpp>

#include <string>
#include <vector>

namespace k3::testing {

inline bool validates(const nlohmann::json& v, const nlohmann::json& s) {
  if (s.is_boolean()) return s.get<bool>();
  if (s.contains("const") && v != s["const"]) return false;
  if (s.contains("enum")) {
    bool any = false;
    for (const nlohmann::json& e : s["enum"]) any |= e == v;
    if (!any) return false;
  }
  if (s.contains("type")) {
    std::vector<std::string> types;
    if (s["type"].is_string()) types.push_back(s["type"]);
    else for (const nlohmann::json& t : s["type"]) types.push_back(t);
    bool ok = false;
    for (const std::string& t : types)
      ok |= (t == "object" && v.is_object()) || (t == "array" && v.is_array()) || (t == "string" && v.is_string()) ||
            (t == "number" && v.is_number()) || (t == "integer" && v.is_number_integer()) ||
            (t == "boolean" && v.is_boolean()) || (t == "null" && v.is_null());
    if (!ok) return false;
  }
  if (v.is_object()) {
    if (s.contains("required"))
      for (const nlohmann::json& r : s["required"])
        if (!v.contains(r.get<std::string>())) return false;
    for (const auto& [k, x] : v.items()) {
      if (s.contains("properties") && s["properties"].contains(k)) {
        if (!validates(x, s["properties"][k])) return false;
      } else if (s.value("additionalProperties", nlohmann::json(true)) == nlohmann::json(false)) {
        return false;
      }
    }
  }
  if (v.is_array()) {
    if (s.contains("minItems") && v.size() < s["minItems"].get<size_t>()) return false;
    if (s.contains("maxItems") && v.size() > s["maxItems"].get<size_t>()) return false;
    if (s.contains("items"))
      for (const nlohmann::json& x : v)
        if (!validates(x, s["items"])) return false;
  }
  if (v.is_string()) {
    size_t cps = 0;
    for (unsigned char c : v.get<std::string>()) cps += (c & 0xC0) != 0x80;
    if (s.contains("minLength") && cps < s["minLength"].get<size_t>()) return false;
    if (s.contains("maxLength") && cps > s["maxLength"].get<size_t>()) return false;
  }
  return true;
}

}  // namespace k3::testing
