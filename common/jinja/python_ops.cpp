// Python's indexing, ordering, membership, iteration and json.dumps over template values.
#include <algorithm>
#include <cstdio>

#include "common/jinja/builtins.h"
#include "common/jinja/lexer.h"
#include "common/jinja/utf8_code_point.h"

namespace k3::jinja {

size_t utf8_length(std::string_view s) {
  size_t n = 0;
  for (unsigned char c : s) n += (c & 0xC0) != 0x80;
  return n;
}

namespace {

bool is_python_space(uint32_t cp) {
  return (cp >= 0x09 && cp <= 0x0D) || (cp >= 0x1C && cp <= 0x20) || cp == 0x85 || cp == 0xA0 || cp == 0x1680 ||
         (cp >= 0x2000 && cp <= 0x200A) || cp == 0x2028 || cp == 0x2029 || cp == 0x202F || cp == 0x205F ||
         cp == 0x3000;
}

// Byte offsets of each code point's start, plus the end.
std::vector<size_t> code_point_starts(std::string_view s) {
  std::vector<size_t> starts;
  for (size_t i = 0; i < s.size(); ++i)
    if ((static_cast<unsigned char>(s[i]) & 0xC0) != 0x80) starts.push_back(i);
  starts.push_back(s.size());
  return starts;
}

}  // namespace

size_t python_space_at(std::string_view s, size_t i) {
  if ((static_cast<unsigned char>(s[i]) & 0xC0) == 0x80) return 0;  // inside a code point
  size_t len = 0;
  return is_python_space(decode_code_point(s, i, len)) ? len : 0;
}

std::string python_strip(std::string_view s, const Value& chars, bool left, bool right) {
  // Split into code points, drop from the ends, join.
  std::vector<std::pair<size_t, size_t>> cps;  // offset, length
  for (size_t i = 0, len = 0; i < s.size(); i += len) {
    decode_code_point(s, i, len);
    cps.emplace_back(i, len);
  }
  const auto drop = [&](const std::pair<size_t, size_t>& cp) {
    if (!chars.is_string()) return python_space_at(s, cp.first) != 0;
    return chars.as_string().find(s.substr(cp.first, cp.second)) != std::string::npos;
  };
  size_t b = 0, e = cps.size();
  if (left)
    while (b < e && drop(cps[b])) ++b;
  if (right)
    while (e > b && drop(cps[e - 1])) --e;
  if (b == e) return "";
  return std::string(s.substr(cps[b].first, cps[e - 1].first + cps[e - 1].second - cps[b].first));
}

std::vector<Value> iterate(const Value& v, size_t pos) {
  switch (v.kind()) {
    case Value::Kind::Undefined: return {};
    case Value::Kind::List: return v.list();
    case Value::Kind::Dict: {
      std::vector<Value> keys;
      for (const auto& [k, x] : v.dict().items) keys.emplace_back(k);
      return keys;
    }
    case Value::Kind::String: {
      const auto starts = code_point_starts(v.as_string());
      std::vector<Value> chars;
      for (size_t i = 0; i + 1 < starts.size(); ++i)
        chars.emplace_back(v.as_string().substr(starts[i], starts[i + 1] - starts[i]));
      return chars;
    }
    default: throw TemplateError{"a " + v.type_name() + " value is not iterable", pos};
  }
}

Value item_of(const Value& obj, const Value& key, size_t pos) {
  switch (obj.kind()) {
    case Value::Kind::Undefined: throw TemplateError{"cannot index an undefined value with " + key.repr(), pos};
    case Value::Kind::Dict: {
      if (!key.is_string()) return Value();
      const Value* v = obj.dict().find(key.as_string());
      return v ? *v : Value();
    }
    case Value::Kind::List:
    case Value::Kind::String: {
      if (key.kind() != Value::Kind::Int) return Value();
      const bool is_list = obj.is_list();
      const auto starts = is_list ? std::vector<size_t>() : code_point_starts(obj.as_string());
      const int64_t n = is_list ? static_cast<int64_t>(obj.list().size()) : static_cast<int64_t>(starts.size()) - 1;
      int64_t i = key.as_int();
      if (i < 0) i += n;
      if (i < 0 || i >= n) return Value();
      if (is_list) return obj.list()[i];
      return Value(obj.as_string().substr(starts[i], starts[i + 1] - starts[i]));
    }
    default: return Value();
  }
}

int compare_values(const Value& a, const Value& b, size_t pos) {
  const auto numeric = [](const Value& v) { return v.is_number() || v.kind() == Value::Kind::Bool; };
  if (numeric(a) && numeric(b)) {
    if (a.kind() == Value::Kind::Int && b.kind() == Value::Kind::Int) return a.as_int() < b.as_int() ? -1 : a.as_int() > b.as_int();
    const double x = a.as_number(), y = b.as_number();
    return x < y ? -1 : x > y;
  }
  if (a.is_string() && b.is_string()) {
    const int c = a.as_string().compare(b.as_string());  // byte order = code point order in UTF-8
    return c < 0 ? -1 : c > 0;
  }
  if (a.is_list() && b.is_list()) {
    const size_t n = std::min(a.list().size(), b.list().size());
    for (size_t i = 0; i < n; ++i)
      if (int c = compare_values(a.list()[i], b.list()[i], pos)) return c;
    return a.list().size() < b.list().size() ? -1 : a.list().size() > b.list().size();
  }
  throw TemplateError{"cannot order a " + a.type_name() + " and a " + b.type_name(), pos};
}

bool contains(const Value& container, const Value& item, size_t pos) {
  switch (container.kind()) {
    case Value::Kind::String:
      if (!item.is_string()) throw TemplateError{"'in <string>' needs a string on the left, got " + item.type_name(), pos};
      return container.as_string().find(item.as_string()) != std::string::npos;
    case Value::Kind::List:
      return std::any_of(container.list().begin(), container.list().end(),
                         [&](const Value& v) { return values_equal(v, item); });
    case Value::Kind::Dict: return item.is_string() && container.dict().find(item.as_string()) != nullptr;
    case Value::Kind::Undefined: return false;
    default: throw TemplateError{"'in' needs a string, list or mapping on the right, got " + container.type_name(), pos};
  }
}

namespace {

void json_string(std::string& out, const std::string& s, bool ensure_ascii) {
  out += '"';
  for (size_t i = 0; i < s.size(); ++i) {
    const unsigned char c = s[i];
    switch (c) {
      case '"': out += "\\\""; continue;
      case '\\': out += "\\\\"; continue;
      case '\n': out += "\\n"; continue;
      case '\r': out += "\\r"; continue;
      case '\t': out += "\\t"; continue;
      case '\b': out += "\\b"; continue;
      case '\f': out += "\\f"; continue;
      default: break;
    }
    char buf[16];
    if (c < 0x20 || (ensure_ascii && c == 0x7f)) {
      std::snprintf(buf, sizeof buf, "\\u%04x", c);
      out += buf;
    } else if (c < 0x80 || !ensure_ascii) {
      out += char(c);
    } else {
      // One UTF-8 sequence as \uXXXX (a surrogate pair above the BMP).
      size_t len = 0;
      uint32_t cp = decode_code_point(s, i, len);
      i += len - 1;
      if (cp >= 0x10000) {
        cp -= 0x10000;
        std::snprintf(buf, sizeof buf, "\\u%04x\\u%04x", 0xD800 + (cp >> 10), 0xDC00 + (cp & 0x3FF));
      } else {
        std::snprintf(buf, sizeof buf, "\\u%04x", cp);
      }
      out += buf;
    }
  }
  out += '"';
}

struct JsonWriter {
  int indent;
  std::string_view item_sep, key_sep;
  bool sort_keys, ensure_ascii;
  size_t pos;

  void newline(std::string& out, int depth) const {
    out += '\n';
    out.append(static_cast<size_t>(indent) * depth, ' ');
  }

  void write(std::string& out, const Value& v, int depth) const {
    switch (v.kind()) {
      case Value::Kind::None: out += "null"; return;
      case Value::Kind::Bool: out += v.as_bool() ? "true" : "false"; return;
      case Value::Kind::Int: out += std::to_string(v.as_int()); return;
      case Value::Kind::Float: {
        const double d = v.as_number();
        out += d != d ? "NaN" : d == 1.0 / 0.0 ? "Infinity" : d == -1.0 / 0.0 ? "-Infinity" : python_float_repr(d);
        return;
      }
      case Value::Kind::String: json_string(out, v.as_string(), ensure_ascii); return;
      case Value::Kind::List: {
        if (v.list().empty()) {
          out += "[]";
          return;
        }
        out += '[';
        for (size_t i = 0; i < v.list().size(); ++i) {
          if (i) out += item_sep;
          if (indent >= 0) newline(out, depth + 1);
          write(out, v.list()[i], depth + 1);
        }
        if (indent >= 0) newline(out, depth);
        out += ']';
        return;
      }
      case Value::Kind::Dict: {
        if (v.dict().items.empty()) {
          out += "{}";
          return;
        }
        std::vector<const std::pair<std::string, Value>*> items;
        for (const auto& kv : v.dict().items) items.push_back(&kv);
        if (sort_keys) std::stable_sort(items.begin(), items.end(), [](auto* a, auto* b) { return a->first < b->first; });
        out += '{';
        for (size_t i = 0; i < items.size(); ++i) {
          if (i) out += item_sep;
          if (indent >= 0) newline(out, depth + 1);
          json_string(out, items[i]->first, ensure_ascii);
          out += key_sep;
          write(out, items[i]->second, depth + 1);
        }
        if (indent >= 0) newline(out, depth);
        out += '}';
        return;
      }
      default: throw TemplateError{"tojson: a " + v.type_name() + " value is not JSON serializable", pos};
    }
  }
};

}  // namespace

std::string json_dumps(const Value& v, int indent, std::string_view item_sep, std::string_view key_sep,
                       bool sort_keys, bool ensure_ascii, size_t pos) {
  std::string out;
  JsonWriter{indent, item_sep, key_sep, sort_keys, ensure_ascii, pos}.write(out, v, 0);
  return out;
}

}  // namespace k3::jinja
