#include "deploy/yaml_text.h"

#include <cctype>

namespace k3::deploy {
namespace {

bool plain_key(const std::string& k) {
  if (k.empty()) return false;
  for (char c : k)
    if (!(std::isalnum(static_cast<unsigned char>(c)) || c == '-' || c == '_' || c == '.' || c == '/')) return false;
  return true;
}

bool is_block(const nlohmann::ordered_json& v) { return (v.is_object() || v.is_array()) && !v.empty(); }

std::string scalar(const nlohmann::ordered_json& v, const std::string& indent) {
  if (v.is_object()) return "{}";
  if (v.is_array()) return "[]";
  if (v.is_string()) {
    const std::string& s = v.get_ref<const std::string&>();
    if (s.find('\n') != std::string::npos) {
      // A literal block: "|" keeps one final newline, "|-" none; lines indented two past the key.
      std::string out = s.back() == '\n' ? "|" : "|-";
      size_t at = 0;
      while (at < s.size()) {
        size_t nl = s.find('\n', at);
        if (nl == std::string::npos) nl = s.size();
        const std::string line = s.substr(at, nl - at);
        out += "\n" + (line.empty() ? "" : indent + "  " + line);
        at = nl + 1;
      }
      return out;
    }
    return v.dump();
  }
  return v.dump();
}

void emit(const nlohmann::ordered_json& v, const std::string& indent, std::string& out) {
  if (v.is_object()) {
    for (auto it = v.begin(); it != v.end(); ++it) {
      out += indent + (plain_key(it.key()) ? it.key() : nlohmann::ordered_json(it.key()).dump()) + ":";
      if (is_block(it.value())) {
        out += "\n";
        emit(it.value(), indent + "  ", out);
      } else {
        out += " " + scalar(it.value(), indent) + "\n";
      }
    }
  } else if (v.is_array()) {
    for (const auto& item : v) {
      if (is_block(item)) {
        // "- " then the item's first line; the rest indented under it.
        std::string inner;
        emit(item, indent + "  ", inner);
        out += indent + "- " + inner.substr(indent.size() + 2);
      } else {
        out += indent + "- " + scalar(item, indent + "  ") + "\n";
      }
    }
  }
}

}  // namespace

std::string yaml_text(const nlohmann::ordered_json& value) {
  if (!is_block(value)) return scalar(value, "") + "\n";
  std::string out;
  emit(value, "", out);
  return out;
}

}  // namespace k3::deploy
