#include "common/jinja/value.h"

#include "common/jinja/utf8_code_point.h"

#include <charconv>
#include <cmath>
#include <cstdio>

namespace k3::jinja {

const Value* Dict::find(std::string_view key) const {
  for (const auto& [k, v] : items)
    if (k == key) return &v;
  return nullptr;
}

void Dict::set(const std::string& key, Value v) {
  for (auto& [k, old] : items) {
    if (k == key) {
      old = std::move(v);
      return;
    }
  }
  items.emplace_back(key, std::move(v));
}

Value::Kind Value::kind() const {
  switch (data_.index()) {
    case 0: return Kind::Undefined;
    case 1: return Kind::None;
    case 2: return Kind::Bool;
    case 3: return Kind::Int;
    case 4: return Kind::Float;
    case 5: return Kind::String;
    case 6: return Kind::List;
    case 7: return Kind::Dict;
    default: return Kind::Callable;
  }
}

double Value::as_number() const {
  switch (kind()) {
    case Kind::Int: return static_cast<double>(as_int());
    case Kind::Bool: return as_bool() ? 1.0 : 0.0;
    default: return std::get<double>(data_);
  }
}

const void* Value::identity() const {
  switch (kind()) {
    case Kind::List: return &list();
    case Kind::Dict: return &dict();
    case Kind::Callable: return &callable();
    default: return nullptr;
  }
}

bool Value::truthy() const {
  switch (kind()) {
    case Kind::Undefined:
    case Kind::None: return false;
    case Kind::Bool: return as_bool();
    case Kind::Int: return as_int() != 0;
    case Kind::Float: return as_number() != 0.0;
    case Kind::String: return !as_string().empty();
    case Kind::List: return !list().empty();
    case Kind::Dict: return !dict().items.empty();
    case Kind::Callable: return true;
  }
  return false;
}

std::string python_float_repr(double d) {
  if (std::isnan(d)) return "nan";
  if (std::isinf(d)) return d > 0 ? "inf" : "-inf";
  // Shortest round-trip digits, then Python's layout: fixed for exponents in [-4, 16), else
  // scientific with a signed two-digit (or longer) exponent.
  char buf[64];
  auto [end, ec] = std::to_chars(buf, buf + sizeof buf, d, std::chars_format::scientific);
  std::string sci(buf, end);
  const size_t e = sci.find('e');
  std::string mant = sci.substr(0, e);
  const int exp = std::stoi(sci.substr(e + 1));
  const bool neg = mant[0] == '-';
  if (neg) mant.erase(0, 1);
  std::string digits;
  for (char c : mant)
    if (c != '.') digits += c;
  std::string out;
  if (exp >= -4 && exp < 16) {
    if (exp >= 0) {
      if (digits.size() <= static_cast<size_t>(exp) + 1) {
        out = digits + std::string(exp + 1 - digits.size(), '0') + ".0";
      } else {
        out = digits.substr(0, exp + 1) + "." + digits.substr(exp + 1);
      }
    } else {
      out = "0." + std::string(-exp - 1, '0') + digits;
    }
  } else {
    out = digits.substr(0, 1);
    if (digits.size() > 1) out += "." + digits.substr(1);
    char eb[16];
    std::snprintf(eb, sizeof eb, "e%c%02d", exp < 0 ? '-' : '+', exp < 0 ? -exp : exp);
    out += eb;
  }
  return neg ? "-" + out : out;
}

namespace {

// Python's str.isprintable() is false for control, format, separator (but ' '), surrogate and
// private-use code points; repr() escapes those. This covers the ones text carries in practice
// (unassigned code points, which Python also escapes, are printed as they are).
bool python_printable(uint32_t cp) {
  if (cp < 0x20 || (cp >= 0x7F && cp <= 0xA0) || cp == 0xAD || cp == 0x61C || cp == 0x1680 || cp == 0x180E) return false;
  if ((cp >= 0x2000 && cp <= 0x200F) || (cp >= 0x2028 && cp <= 0x202F) || (cp >= 0x205F && cp <= 0x206F)) return false;
  if (cp == 0x3000 || (cp >= 0xD800 && cp <= 0xF8FF) || cp == 0xFEFF || (cp >= 0xFFF9 && cp <= 0xFFFB)) return false;
  return cp < 0xE0000;
}

std::string string_repr(const std::string& s) {
  const bool has_single = s.find('\'') != std::string::npos;
  const bool has_double = s.find('"') != std::string::npos;
  const char quote = has_single && !has_double ? '"' : '\'';
  std::string out(1, quote);
  for (size_t i = 0; i < s.size();) {
    size_t len = 0;
    const uint32_t cp = decode_code_point(s, i, len);
    char b[16];
    if (cp == '\\') out += "\\\\";
    else if (cp == static_cast<uint32_t>(quote)) out += std::string("\\") + quote;
    else if (cp == '\n') out += "\\n";
    else if (cp == '\r') out += "\\r";
    else if (cp == '\t') out += "\\t";
    else if (python_printable(cp)) out.append(s, i, len);
    else {
      std::snprintf(b, sizeof b, cp < 0x100 ? "\\x%02x" : cp < 0x10000 ? "\\u%04x" : "\\U%08x", cp);
      out += b;
    }
    i += len;
  }
  out += quote;
  return out;
}

}  // namespace

std::string Value::str() const {
  switch (kind()) {
    case Kind::Undefined: return "";
    case Kind::String: return as_string();
    default: return repr();
  }
}

std::string Value::repr() const {
  switch (kind()) {
    case Kind::Undefined: return "";
    case Kind::None: return "None";
    case Kind::Bool: return as_bool() ? "True" : "False";
    case Kind::Int: return std::to_string(as_int());
    case Kind::Float: return python_float_repr(as_number());
    case Kind::String: return string_repr(as_string());
    case Kind::List: {
      std::string out = "[";
      for (size_t i = 0; i < list().size(); ++i) out += (i ? ", " : "") + list()[i].repr();
      return out + "]";
    }
    case Kind::Dict: {
      std::string out = dict().is_namespace ? "<Namespace {" : "{";
      bool first = true;
      for (const auto& [k, v] : dict().items) {
        out += (first ? "" : ", ") + string_repr(k) + ": " + v.repr();
        first = false;
      }
      return out + (dict().is_namespace ? "}>" : "}");
    }
    case Kind::Callable: return "<function>";
  }
  return "";
}

std::string Value::type_name() const {
  switch (kind()) {
    case Kind::Undefined: return "undefined";
    case Kind::None: return "none";
    case Kind::Bool: return "boolean";
    case Kind::Int: return "integer";
    case Kind::Float: return "float";
    case Kind::String: return "string";
    case Kind::List: return "list";
    case Kind::Dict: return dict().is_namespace ? "namespace" : "mapping";
    case Kind::Callable: return "callable";
  }
  return "";
}

Value Value::from_json(const nlohmann::ordered_json& j) {
  switch (j.type()) {
    case nlohmann::ordered_json::value_t::null: return none();
    case nlohmann::ordered_json::value_t::boolean: return Value(j.get<bool>());
    case nlohmann::ordered_json::value_t::number_integer: return Value(j.get<int64_t>());
    case nlohmann::ordered_json::value_t::number_unsigned: return Value(static_cast<int64_t>(j.get<uint64_t>()));
    case nlohmann::ordered_json::value_t::number_float: return Value(j.get<double>());
    case nlohmann::ordered_json::value_t::string: return Value(j.get<std::string>());
    case nlohmann::ordered_json::value_t::array: {
      List l;
      for (const auto& e : j) l.push_back(from_json(e));
      return Value(std::move(l));
    }
    case nlohmann::ordered_json::value_t::object: {
      Dict d;
      for (const auto& [k, v] : j.items()) d.items.emplace_back(k, from_json(v));
      return Value(std::move(d));
    }
    default: return Value();
  }
}

bool values_equal(const Value& a, const Value& b) {
  using K = Value::Kind;
  const auto numeric = [](K k) { return k == K::Int || k == K::Float || k == K::Bool; };
  if (numeric(a.kind()) && numeric(b.kind())) {
    if (a.kind() != K::Float && b.kind() != K::Float) {
      const int64_t x = a.kind() == K::Bool ? a.as_bool() : a.as_int();
      const int64_t y = b.kind() == K::Bool ? b.as_bool() : b.as_int();
      return x == y;
    }
    return a.as_number() == b.as_number();
  }
  if (a.kind() != b.kind()) return false;
  switch (a.kind()) {
    case K::Undefined:
    case K::None: return true;
    case K::String: return a.as_string() == b.as_string();
    case K::List: {
      if (a.list().size() != b.list().size()) return false;
      for (size_t i = 0; i < a.list().size(); ++i)
        if (!values_equal(a.list()[i], b.list()[i])) return false;
      return true;
    }
    case K::Dict: {
      if (a.dict().items.size() != b.dict().items.size()) return false;
      for (const auto& [k, v] : a.dict().items) {
        const Value* o = b.dict().find(k);
        if (!o || !values_equal(v, *o)) return false;
      }
      return true;
    }
    default: return a.identity() == b.identity();
  }
}

}  // namespace k3::jinja
