// Filters: `value | name(args)`.
#include <algorithm>
#include <cmath>
#include <unordered_set>

#include "common/jinja/builtins.h"
#include "common/jinja/call_args.h"

namespace k3::jinja {
namespace {

std::string replace_all(const std::string& s, const std::string& from, const std::string& to, int64_t count) {
  if (from.empty()) {
    // Python inserts `to` between every character (and at both ends).
    std::string out = to;
    for (const Value& ch : iterate(Value(s), 0)) out += ch.as_string() + to;
    return out;
  }
  std::string out;
  size_t at = 0;
  for (int64_t n = 0; count < 0 || n < count; ++n) {
    const size_t hit = s.find(from, at);
    if (hit == std::string::npos) break;
    out.append(s, at, hit - at).append(to);
    at = hit + from.size();
  }
  return out + s.substr(at);
}

std::string change_case(std::string s, bool upper) {
  for (char& c : s)
    if (static_cast<unsigned char>(c) < 0x80) c = upper ? char(std::toupper(c)) : char(std::tolower(c));
  return s;
}

// Follows "a.b.0" through items, as Jinja's attribute= arguments do.
Value attribute_path(const Value& v, const std::string& path, size_t pos) {
  Value cur = v;
  size_t at = 0;
  while (at <= path.size()) {
    const size_t dot = std::min(path.find('.', at), path.size());
    const std::string part = path.substr(at, dot - at);
    const bool digits = !part.empty() && std::all_of(part.begin(), part.end(), [](char c) { return std::isdigit(c); });
    if (cur.is_undefined()) return cur;
    cur = item_of(cur, digits ? Value(static_cast<int64_t>(std::stoll(part))) : Value(part), pos);
    at = dot + 1;
  }
  return cur;
}

Value select_filter(const std::string& name, const Value& input, CallArgs& args, size_t pos) {
  // select(test, args...), reject(...), selectattr(attr, test, args...), rejectattr(...)
  const bool by_attr = name.ends_with("attr");
  const bool keep = name.starts_with("select");
  size_t next = 0;
  std::string attr;
  if (by_attr) {
    if (args.positional.empty() || !args.positional[0].is_string()) throw TemplateError{name + ": needs an attribute name", pos};
    attr = args.positional[next++].as_string();
  }
  std::string test;
  if (next < args.positional.size()) {
    if (!args.positional[next].is_string()) throw TemplateError{name + ": the test name must be a string", pos};
    test = args.positional[next++].as_string();
  }
  CallArgs test_args{{args.positional.begin() + static_cast<long>(next), args.positional.end()}, args.keyword};
  List out;
  for (const Value& v : iterate(input, pos)) {
    const Value subject = by_attr ? attribute_path(v, attr, pos) : v;
    CallArgs a = test_args;
    const bool ok = test.empty() ? subject.truthy() : apply_test(test, subject, a, pos);
    if (ok == keep) out.push_back(v);
  }
  return Value(std::move(out));
}

Value sorted(const Value& input, bool reverse, const Value& attribute, bool case_sensitive, size_t pos) {
  List items = iterate(input, pos);
  const auto key = [&](const Value& v) {
    Value k = attribute.is_string() ? attribute_path(v, attribute.as_string(), pos) : v;
    return (!case_sensitive && k.is_string()) ? Value(change_case(k.as_string(), false)) : k;
  };
  std::stable_sort(items.begin(), items.end(), [&](const Value& a, const Value& b) {
    const int c = compare_values(key(a), key(b), pos);
    return reverse ? c > 0 : c < 0;
  });
  return Value(std::move(items));
}

}  // namespace

bool is_filter_name(const std::string& name) {
  static const std::unordered_set<std::string> kNames = {
      "tojson", "trim",   "length", "count", "default", "d",    "items",      "list",      "string", "upper",
      "lower",  "capitalize", "title", "first", "last", "join",  "replace",   "int",       "float",  "abs",
      "map",    "select", "reject", "selectattr", "rejectattr", "unique", "reverse", "sort", "dictsort", "indent",
      "safe",   "sum",    "min",    "max"};
  return kNames.count(name) != 0;
}

Value apply_filter(const std::string& name, const Value& input, CallArgs& args, size_t pos) {
  ArgReader r(args, "filter '" + name + "'", pos);
  const auto need_string = [&](const Value& v) -> const std::string& {
    if (!v.is_string()) r.fail("expects a string, got " + v.type_name());
    return v.as_string();
  };
  if (name == "tojson") {
    const Value ensure_ascii = r.get(0, "ensure_ascii", Value(false));
    const Value indent = r.get(1, "indent", Value::none());
    const Value separators = r.get(2, "separators", Value::none());
    const Value sort_keys = r.get(3, "sort_keys", Value(false));
    r.done(4);
    std::string item_sep = ", ", key_sep = ": ";
    if (!indent.is_none() && !indent.is_undefined()) item_sep = ",";
    if (separators.is_list()) {
      if (separators.list().size() != 2 || !separators.list()[0].is_string() || !separators.list()[1].is_string())
        r.fail("separators must be a pair of strings");
      item_sep = separators.list()[0].as_string();
      key_sep = separators.list()[1].as_string();
    }
    const int ind = indent.kind() == Value::Kind::Int ? static_cast<int>(indent.as_int()) : -1;
    return Value(json_dumps(input, ind, item_sep, key_sep, sort_keys.truthy(), ensure_ascii.truthy(), pos));
  }
  if (name == "trim") {
    const Value chars = r.get(0, "chars", Value::none());
    r.done(1);
    return Value(python_strip(input.str(), chars, true, true));
  }
  if (name == "length" || name == "count") {
    r.done(0);
    switch (input.kind()) {
      case Value::Kind::Undefined: return Value(0);
      case Value::Kind::String: return Value(static_cast<int64_t>(utf8_length(input.as_string())));
      case Value::Kind::List: return Value(static_cast<int64_t>(input.list().size()));
      case Value::Kind::Dict: return Value(static_cast<int64_t>(input.dict().items.size()));
      default: r.fail("a " + input.type_name() + " value has no length");
    }
  }
  if (name == "default" || name == "d") {
    const Value fallback = r.get(0, "default_value", Value(""));
    const Value boolean = r.get(1, "boolean", Value(false));
    r.done(2);
    return input.is_undefined() || (boolean.truthy() && !input.truthy()) ? fallback : input;
  }
  if (name == "items") {
    r.done(0);
    if (input.is_undefined()) return Value(List{});
    if (!input.is_dict()) r.fail("expects a mapping, got " + input.type_name());
    List out;
    for (const auto& [k, v] : input.dict().items) out.emplace_back(List{Value(k), v});
    return Value(std::move(out));
  }
  if (name == "list") {
    r.done(0);
    return Value(iterate(input, pos));
  }
  if (name == "string") {
    r.done(0);
    return Value(input.str());
  }
  if (name == "upper" || name == "lower") {
    r.done(0);
    return Value(change_case(input.str(), name == "upper"));
  }
  if (name == "capitalize") {
    r.done(0);
    std::string s = change_case(input.str(), false);
    if (!s.empty() && static_cast<unsigned char>(s[0]) < 0x80) s[0] = char(std::toupper(s[0]));
    return Value(s);
  }
  if (name == "title") {
    r.done(0);
    // Python's str.title: a letter after a non-letter is upper-cased, the others lower-cased.
    std::string s = input.str();
    bool prev_alpha = false;
    for (char& c : s) {
      const bool alpha = std::isalpha(static_cast<unsigned char>(c)) != 0;
      if (alpha) c = prev_alpha ? char(std::tolower(c)) : char(std::toupper(c));
      prev_alpha = alpha;
    }
    return Value(s);
  }
  if (name == "first" || name == "last") {
    r.done(0);
    const List items = iterate(input, pos);
    if (items.empty()) return Value();
    return name == "first" ? items.front() : items.back();
  }
  if (name == "join") {
    const Value sep = r.get(0, "d", Value(""));
    const Value attribute = r.get(1, "attribute", Value::none());
    r.done(2);
    std::string out;
    bool first = true;
    for (const Value& v : iterate(input, pos)) {
      if (!first) out += need_string(sep);
      first = false;
      out += (attribute.is_string() ? attribute_path(v, attribute.as_string(), pos) : v).str();
    }
    return Value(out);
  }
  if (name == "replace") {
    const Value from = r.require(0, "old"), to = r.require(1, "new");
    const Value count = r.get(2, "count", Value::none());
    r.done(3);
    return Value(replace_all(input.str(), need_string(from), need_string(to),
                             count.kind() == Value::Kind::Int ? count.as_int() : -1));
  }
  if (name == "int") {
    const Value fallback = r.get(0, "default", Value(0));
    r.done(1);
    if (input.kind() == Value::Kind::Int) return input;
    if (input.kind() == Value::Kind::Bool) return Value(static_cast<int64_t>(input.as_bool()));
    if (input.kind() == Value::Kind::Float) return Value(static_cast<int64_t>(input.as_number()));
    if (input.is_string()) {
      try {
        size_t used = 0;
        const int64_t v = std::stoll(input.as_string(), &used);
        if (used == input.as_string().size()) return Value(v);
      } catch (const std::exception&) {
      }
    }
    return fallback;
  }
  if (name == "float") {
    const Value fallback = r.get(0, "default", Value(0.0));
    r.done(1);
    if (input.is_number() || input.kind() == Value::Kind::Bool) return Value(input.as_number());
    if (input.is_string()) {
      try {
        return Value(std::stod(input.as_string()));
      } catch (const std::exception&) {
      }
    }
    return fallback;
  }
  if (name == "abs") {
    r.done(0);
    if (input.kind() == Value::Kind::Int) return Value(input.as_int() < 0 ? -input.as_int() : input.as_int());
    if (input.kind() == Value::Kind::Float) return Value(std::fabs(input.as_number()));
    r.fail("expects a number, got " + input.type_name());
  }
  if (name == "map") {
    const Value attribute = r.get(99, "attribute", Value::none());
    List out;
    if (attribute.is_string()) {
      const Value fallback = r.get(99, "default");
      r.done(0);
      for (const Value& v : iterate(input, pos)) {
        Value x = attribute_path(v, attribute.as_string(), pos);
        out.push_back(x.is_undefined() && !fallback.is_undefined() ? fallback : x);
      }
      return Value(std::move(out));
    }
    if (args.positional.empty() || !args.positional[0].is_string()) r.fail("needs a filter name or attribute=");
    const std::string filter = args.positional[0].as_string();
    CallArgs rest{{args.positional.begin() + 1, args.positional.end()}, args.keyword};
    for (const Value& v : iterate(input, pos)) {
      CallArgs a = rest;
      out.push_back(apply_filter(filter, v, a, pos));
    }
    return Value(std::move(out));
  }
  if (name == "select" || name == "reject" || name == "selectattr" || name == "rejectattr")
    return select_filter(name, input, args, pos);
  if (name == "unique") {
    r.done(0);
    List out;
    for (const Value& v : iterate(input, pos))
      if (std::none_of(out.begin(), out.end(), [&](const Value& o) { return values_equal(o, v); })) out.push_back(v);
    return Value(std::move(out));
  }
  if (name == "reverse") {
    r.done(0);
    if (input.is_string()) {
      List chars = iterate(input, pos);
      std::string out;
      for (auto it = chars.rbegin(); it != chars.rend(); ++it) out += it->as_string();
      return Value(out);
    }
    List items = iterate(input, pos);
    std::reverse(items.begin(), items.end());
    return Value(std::move(items));
  }
  if (name == "sort") {
    const Value reverse = r.get(0, "reverse", Value(false));
    const Value case_sensitive = r.get(1, "case_sensitive", Value(false));
    const Value attribute = r.get(2, "attribute", Value::none());
    r.done(3);
    return sorted(input, reverse.truthy(), attribute, case_sensitive.truthy(), pos);
  }
  if (name == "dictsort") {
    r.done(0);
    if (!input.is_dict()) r.fail("expects a mapping, got " + input.type_name());
    List pairs;
    for (const auto& [k, v] : input.dict().items) pairs.emplace_back(List{Value(k), v});
    std::stable_sort(pairs.begin(), pairs.end(), [&](const Value& a, const Value& b) {
      return change_case(a.list()[0].as_string(), false) < change_case(b.list()[0].as_string(), false);
    });
    return Value(std::move(pairs));
  }
  if (name == "indent") {
    const Value width = r.get(0, "width", Value(4));
    const Value first = r.get(1, "first", Value(false));
    const Value blank = r.get(2, "blank", Value(false));
    r.done(3);
    const std::string pad = width.is_string() ? width.as_string() : std::string(static_cast<size_t>(width.as_int()), ' ');
    const std::string& s = need_string(input);
    std::string out;
    size_t at = 0;
    bool first_line = true;
    while (at <= s.size()) {
      const size_t nl = std::min(s.find('\n', at), s.size());
      const std::string line = s.substr(at, nl - at);
      if (!first_line || first.truthy()) {
        if (blank.truthy() || !python_strip(line, Value::none(), true, true).empty()) out += pad;
      }
      out += line;
      if (nl < s.size()) out += '\n';
      first_line = false;
      at = nl + 1;
    }
    return Value(out);
  }
  if (name == "safe") {
    r.done(0);
    return input;
  }
  if (name == "sum") {
    const Value attribute = r.get(0, "attribute", Value::none());
    const Value start = r.get(1, "start", Value(0));
    r.done(2);
    Value total = start;
    for (const Value& v : iterate(input, pos)) {
      const Value x = attribute.is_string() ? attribute_path(v, attribute.as_string(), pos) : v;
      if (!x.is_number() || !total.is_number()) r.fail("expects numbers, got " + x.type_name());
      total = total.kind() == Value::Kind::Int && x.kind() == Value::Kind::Int ? Value(total.as_int() + x.as_int())
                                                                                : Value(total.as_number() + x.as_number());
    }
    return total;
  }
  if (name == "min" || name == "max") {
    r.done(0);
    const List items = iterate(input, pos);
    if (items.empty()) return Value();
    Value best = items[0];
    for (const Value& v : items) {
      const int c = compare_values(v, best, pos);
      if (name == "min" ? c < 0 : c > 0) best = v;
    }
    return best;
  }
  throw TemplateError{"unsupported filter '" + name + "'", pos};
}

}  // namespace k3::jinja
