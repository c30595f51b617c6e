// Tests (`value is name`), the methods of str, dict and list, and the global functions.
#include <chrono>
#include <ctime>

#include "common/jinja/builtins.h"
#include "common/jinja/call_args.h"

namespace k3::jinja {
namespace {

bool all_cased(const std::string& s, bool upper) {
  bool any = false;
  for (unsigned char c : s) {
    if (std::isalpha(c)) {
      any = true;
      if (upper ? !std::isupper(c) : !std::islower(c)) return false;
    }
  }
  return any;
}

// str.split(sep=None, maxsplit=-1)
List split(const std::string& s, const Value& sep, int64_t maxsplit) {
  List out;
  if (!sep.is_string()) {
    size_t i = 0;
    while (true) {
      while (i < s.size() && python_space_at(s, i)) i += python_space_at(s, i);
      if (i >= s.size()) break;
      if (maxsplit >= 0 && static_cast<int64_t>(out.size()) == maxsplit) {
        out.emplace_back(python_strip(s.substr(i), Value::none(), false, true));
        break;
      }
      size_t j = i;
      while (j < s.size() && !python_space_at(s, j)) ++j;
      out.emplace_back(s.substr(i, j - i));
      i = j;
    }
    return out;
  }
  const std::string& d = sep.as_string();
  size_t at = 0;
  while (maxsplit < 0 || static_cast<int64_t>(out.size()) < maxsplit) {
    const size_t hit = s.find(d, at);
    if (hit == std::string::npos) break;
    out.emplace_back(s.substr(at, hit - at));
    at = hit + d.size();
  }
  out.emplace_back(s.substr(at));
  return out;
}

bool affix(const std::string& s, const Value& what, bool prefix, ArgReader& r) {
  const auto one = [&](const Value& v) {
    if (!v.is_string()) r.fail("expects a string or a tuple of strings");
    const std::string& a = v.as_string();
    return prefix ? s.starts_with(a) : s.ends_with(a);
  };
  if (what.is_list()) {
    for (const Value& v : what.list())
      if (one(v)) return true;
    return false;
  }
  return one(what);
}

Value string_method(const std::string& s, const std::string& name, CallArgs& args, size_t pos) {
  ArgReader r(args, "str." + name, pos);
  if (name == "strip" || name == "lstrip" || name == "rstrip") {
    const Value chars = r.get(0, "chars", Value::none());
    r.done(1);
    return Value(python_strip(s, chars, name != "rstrip", name != "lstrip"));
  }
  if (name == "split") {
    const Value sep = r.get(0, "sep", Value::none());
    const Value maxsplit = r.get(1, "maxsplit", Value(-1));
    r.done(2);
    if (sep.is_string() && sep.as_string().empty()) r.fail("empty separator");
    return Value(split(s, sep, maxsplit.as_int()));
  }
  if (name == "startswith" || name == "endswith") {
    const Value what = r.require(0, "prefix");
    r.done(1);
    return Value(affix(s, what, name == "startswith", r));
  }
  if (name == "upper" || name == "lower" || name == "title" || name == "capitalize") {
    r.done(0);
    CallArgs none;
    return apply_filter(name, Value(s), none, pos);
  }
  if (name == "replace") {
    r.done(3);
    return apply_filter("replace", Value(s), args, pos);
  }
  if (name == "find" || name == "count") {
    const Value sub = r.require(0, "sub");
    r.done(1);
    if (!sub.is_string()) r.fail("expects a string");
    if (name == "count") return apply_filter("length", Value(split(s, sub, -1)), args, pos).as_int() - 1;
    const size_t hit = s.find(sub.as_string());
    return Value(hit == std::string::npos ? int64_t{-1} : static_cast<int64_t>(utf8_length(s.substr(0, hit))));
  }
  if (name == "join") {
    const Value items = r.require(0, "iterable");
    r.done(1);
    CallArgs a{{Value(s)}, {}};
    return apply_filter("join", items, a, pos);
  }
  throw TemplateError{"unsupported string method '" + name + "'", pos};
}

Value dict_method(const Value& d, const std::string& name, CallArgs& args, size_t pos) {
  ArgReader r(args, "dict." + name, pos);
  if (name == "get") {
    const Value key = r.require(0, "key");
    const Value fallback = r.get(1, "default", Value::none());
    r.done(2);
    const Value v = item_of(d, key, pos);
    return v.is_undefined() ? fallback : v;
  }
  r.done(0);
  if (name == "items") {
    CallArgs none;
    return apply_filter("items", d, none, pos);
  }
  List out;
  for (const auto& [k, v] : d.dict().items) out.push_back(name == "keys" ? Value(k) : v);
  return Value(std::move(out));
}

}  // namespace

bool is_test_name(const std::string& name) {
  static const char* const kNames[] = {
      "defined", "undefined", "none", "string", "mapping", "iterable", "sequence", "number", "integer", "float",
      "boolean", "true", "false", "callable", "lower", "upper", "odd", "even", "divisibleby", "eq", "equalto",
      "==", "ne", "!=", "lt", "<", "le", "<=", "gt", ">", "ge", ">=", "in", "sameas"};
  for (const char* n : kNames)
    if (name == n) return true;
  return false;
}

bool apply_test(const std::string& name, const Value& v, CallArgs& args, size_t pos) {
  ArgReader r(args, "test '" + name + "'", pos);
  using K = Value::Kind;
  const K k = v.kind();
  const auto no_args = [&](bool result) {
    r.done(0);
    return result;
  };
  if (name == "defined") return no_args(k != K::Undefined);
  if (name == "undefined") return no_args(k == K::Undefined);
  if (name == "none") return no_args(k == K::None);
  if (name == "string") return no_args(k == K::String);
  if (name == "mapping") return no_args(k == K::Dict);
  if (name == "iterable") return no_args(k == K::List || k == K::Dict || k == K::String);
  if (name == "sequence") return no_args(k == K::List || k == K::Dict || k == K::String);
  if (name == "number") return no_args(k == K::Int || k == K::Float || k == K::Bool);
  if (name == "integer") return no_args(k == K::Int);
  if (name == "float") return no_args(k == K::Float);
  if (name == "boolean") return no_args(k == K::Bool);
  if (name == "true") return no_args(k == K::Bool && v.as_bool());
  if (name == "false") return no_args(k == K::Bool && !v.as_bool());
  if (name == "callable") return no_args(k == K::Callable);
  if (name == "lower" || name == "upper") return no_args(k == K::String && all_cased(v.as_string(), name == "upper"));
  if (name == "odd" || name == "even") {
    r.done(0);
    if (k != K::Int) r.fail("expects an integer, got " + v.type_name());
    return (v.as_int() % 2 != 0) == (name == "odd");
  }
  if (name == "divisibleby") {
    const Value n = r.require(0, "num");
    r.done(1);
    if (k != K::Int || n.kind() != K::Int || n.as_int() == 0) r.fail("expects non-zero integers");
    return v.as_int() % n.as_int() == 0;
  }
  const Value other = r.require(0, "other");
  r.done(1);
  if (name == "eq" || name == "equalto" || name == "==") return values_equal(v, other);
  if (name == "ne" || name == "!=") return !values_equal(v, other);
  if (name == "lt" || name == "<") return compare_values(v, other, pos) < 0;
  if (name == "le" || name == "<=") return compare_values(v, other, pos) <= 0;
  if (name == "gt" || name == ">") return compare_values(v, other, pos) > 0;
  if (name == "ge" || name == ">=") return compare_values(v, other, pos) >= 0;
  if (name == "in") return contains(other, v, pos);
  if (name == "sameas") {
    if (v.identity() || other.identity()) return v.identity() == other.identity();
    return v.kind() == other.kind() && values_equal(v, other);
  }
  throw TemplateError{"unsupported test '" + name + "'", pos};
}

Value method_of(const Value& obj, const std::string& name, size_t pos) {
  static const char* const kStr[] = {"strip", "lstrip", "rstrip", "split", "startswith", "endswith", "upper",
                                     "lower", "title", "capitalize", "replace", "find", "count", "join"};
  static const char* const kDict[] = {"get", "items", "keys", "values"};
  if (obj.is_string()) {
    for (const char* m : kStr) {
      if (name == m) {
        const std::string s = obj.as_string();
        return Value(Callable([s, name, pos](CallArgs& a) { return string_method(s, name, a, pos); }));
      }
    }
  }
  if (obj.is_dict() && !obj.dict().is_namespace) {
    for (const char* m : kDict) {
      if (name == m) return Value(Callable([obj, name, pos](CallArgs& a) { return dict_method(obj, name, a, pos); }));
    }
  }
  return Value();
}

Dict builtin_globals() {
  Dict g;
  g.set("raise_exception", Value(Callable([](CallArgs& a) -> Value {
          ArgReader r(a, "raise_exception", 0);
          const Value message = r.require(0, "message");
          throw TemplateError{"the template raised an exception: " + message.str(), std::string::npos};
        })));
  g.set("namespace", Value(Callable([](CallArgs& a) {
          Dict ns;
          ns.is_namespace = true;
          for (const Value& p : a.positional) {
            if (!p.is_dict()) throw TemplateError{"namespace(): positional arguments must be mappings", std::string::npos};
            for (const auto& [k, v] : p.dict().items) ns.set(k, v);
          }
          for (const auto& [k, v] : a.keyword) ns.set(k, v);
          return Value(std::move(ns));
        })));
  g.set("dict", Value(Callable([](CallArgs& a) {
          Dict d;
          for (const Value& p : a.positional) {
            if (!p.is_dict()) throw TemplateError{"dict(): positional arguments must be mappings", std::string::npos};
            for (const auto& [k, v] : p.dict().items) d.set(k, v);
          }
          for (const auto& [k, v] : a.keyword) d.set(k, v);
          return Value(std::move(d));
        })));
  g.set("range", Value(Callable([](CallArgs& a) {
          ArgReader r(a, "range", 0);
          r.done(3);
          for (const Value& p : a.positional)
            if (p.kind() != Value::Kind::Int) r.fail("expects integers");
          int64_t start = 0, stop = 0, step = 1;
          if (a.positional.size() == 1) stop = a.positional[0].as_int();
          if (a.positional.size() >= 2) start = a.positional[0].as_int(), stop = a.positional[1].as_int();
          if (a.positional.size() == 3) step = a.positional[2].as_int();
          if (a.positional.empty() || step == 0) r.fail("needs 1 to 3 integers and a non-zero step");
          if ((stop - start) / step > 100000) r.fail("more than 100000 items");
          List out;
          for (int64_t i = start; step > 0 ? i < stop : i > stop; i += step) out.emplace_back(i);
          return Value(std::move(out));
        })));
  g.set("strftime_now", Value(Callable([](CallArgs& a) {
          ArgReader r(a, "strftime_now", 0);
          const Value format = r.require(0, "format");
          r.done(1);
          if (!format.is_string()) r.fail("expects a format string");
          const std::time_t now = std::chrono::system_clock::to_time_t(std::chrono::system_clock::now());
          std::tm local{};
          localtime_r(&now, &local);
          char buf[256];
          const size_t n = std::strftime(buf, sizeof buf, format.as_string().c_str(), &local);
          return Value(std::string(buf, n));
        })));
  return g;
}

}  // namespace k3::jinja
