#include "common/jinja/renderer.h"

#include <cmath>

#include "common/jinja/builtins.h"
#include "common/jinja/lexer.h"

namespace k3::jinja {
namespace {

// One level of names; lookups walk to the parent.
struct Scope {
  Dict vars;
  const Scope* parent = nullptr;

  Value lookup(const std::string& name) const {
    for (const Scope* s = this; s; s = s->parent)
      if (const Value* v = s->vars.find(name)) return *v;
    return Value();
  }
};

enum class Flow { Normal, Break, Continue };

// Output grows past this only through a runaway template (a loop over range(), a recursive macro).
constexpr size_t kMaxOutputBytes = size_t{64} << 20;
constexpr int kMaxMacroDepth = 64;

class Renderer {
 public:
  explicit Renderer(const Dict& context) {
    globals_.vars = builtin_globals();
    root_.vars = context;
    root_.parent = &globals_;
  }

  std::string run(const Body& body) {
    std::string out;
    if (exec(body, root_, out) != Flow::Normal) throw TemplateError{"'break' or 'continue' outside a for loop", 0};
    return out;
  }

 private:
  Flow exec(const Body& body, Scope& scope, std::string& out) {
    for (const auto& s : body) {
      const Flow f = exec_one(*s, scope, out);
      if (f != Flow::Normal) return f;
      if (out.size() > kMaxOutputBytes) throw TemplateError{"the output passed 64 MiB", s->pos};
    }
    return Flow::Normal;
  }

  Flow exec_one(const Stmt& s, Scope& scope, std::string& out) {
    switch (s.kind) {
      case Stmt::Kind::Text: out += s.text; return Flow::Normal;
      case Stmt::Kind::Output: out += eval(*s.expr, scope).str(); return Flow::Normal;
      case Stmt::Kind::If:
        for (const auto& [cond, body] : s.branches)
          if (eval(*cond, scope).truthy()) return exec(body, scope, out);
        return exec(s.else_body, scope, out);
      case Stmt::Kind::For: return exec_for(s, scope, out);
      case Stmt::Kind::Set: {
        Value v = eval(*s.expr, scope);
        if (!s.attr.empty()) {
          Value target = scope.lookup(s.targets[0]);
          if (!target.is_dict() || !target.dict().is_namespace)
            throw TemplateError{"cannot set '" + s.attr + "' on '" + s.targets[0] + "': only a namespace() takes attributes",
                                s.pos};
          target.dict().set(s.attr, std::move(v));
        } else {
          assign(s.targets, v, scope, s.pos);
        }
        return Flow::Normal;
      }
      case Stmt::Kind::SetBlock: {
        std::string captured;
        const Flow f = exec(s.body, scope, captured);
        scope.vars.set(s.targets[0], Value(std::move(captured)));
        return f;
      }
      case Stmt::Kind::Macro: scope.vars.set(s.text, make_macro(s)); return Flow::Normal;
      case Stmt::Kind::Break: return Flow::Break;
      case Stmt::Kind::Continue: return Flow::Continue;
      case Stmt::Kind::Block: return exec(s.body, scope, out);
    }
    return Flow::Normal;
  }

  static void assign(const std::vector<std::string>& targets, const Value& v, Scope& scope, size_t pos) {
    if (targets.size() == 1) {
      scope.vars.set(targets[0], v);
      return;
    }
    const List items = iterate(v, pos);
    if (items.size() != targets.size())
      throw TemplateError{"cannot unpack " + std::to_string(items.size()) + " values into " +
                              std::to_string(targets.size()) + " names",
                          pos};
    for (size_t i = 0; i < targets.size(); ++i) scope.vars.set(targets[i], items[i]);
  }

  Flow exec_for(const Stmt& s, Scope& scope, std::string& out) {
    const Value iterable = eval(*s.expr, scope);
    if (iterable.is_dict() && iterable.dict().is_namespace) throw TemplateError{"a namespace is not iterable", s.expr->pos};
    List items;
    for (Value& v : iterate(iterable, s.expr->pos)) {
      if (s.cond) {
        Scope probe{{}, &scope};
        assign(s.targets, v, probe, s.pos);
        if (!eval(*s.cond, probe).truthy()) continue;
      }
      items.push_back(std::move(v));
    }
    if (items.empty()) return exec(s.else_body, scope, out);
    const auto n = static_cast<int64_t>(items.size());
    for (int64_t i = 0; i < n; ++i) {
      Scope inner{{}, &scope};
      assign(s.targets, items[i], inner, s.pos);
      Dict loop;
      loop.set("index0", Value(i));
      loop.set("index", Value(i + 1));
      loop.set("revindex0", Value(n - 1 - i));
      loop.set("revindex", Value(n - i));
      loop.set("first", Value(i == 0));
      loop.set("last", Value(i == n - 1));
      loop.set("length", Value(n));
      loop.set("previtem", i > 0 ? items[i - 1] : Value());
      loop.set("nextitem", i + 1 < n ? items[i + 1] : Value());
      inner.vars.set("loop", Value(std::move(loop)));
      if (exec(s.body, inner, out) == Flow::Break) break;
    }
    return Flow::Normal;
  }

  Value make_macro(const Stmt& s) {
    return Value(Callable([this, &s](CallArgs& args) {
      if (args.positional.size() > s.params.size())
        throw TemplateError{"macro '" + s.text + "' takes " + std::to_string(s.params.size()) + " arguments", s.pos};
      if (++depth_ > kMaxMacroDepth) throw TemplateError{"macro calls nested deeper than 64", s.pos};
      Scope frame{{}, &root_};
      for (size_t i = 0; i < s.params.size(); ++i) {
        const auto& [name, def] = s.params[i];
        Value v = i < args.positional.size() ? args.positional[i] : Value();
        for (const auto& [k, kv] : args.keyword)
          if (k == name) v = kv;
        if (v.is_undefined() && def) v = eval(*def, frame);
        frame.vars.set(name, v);
      }
      for (const auto& [k, kv] : args.keyword) {
        bool known = false;
        for (const auto& p : s.params) known = known || p.first == k;
        if (!known) throw TemplateError{"macro '" + s.text + "' has no argument '" + k + "'", s.pos};
      }
      std::string out;
      (void)exec(s.body, frame, out);
      --depth_;
      return Value(std::move(out));
    }));
  }

  CallArgs eval_args(const Expr& e, Scope& scope) {
    CallArgs a;
    for (const auto& x : e.args) a.positional.push_back(eval(*x, scope));
    for (const auto& [k, x] : e.kwargs) a.keyword.emplace_back(k, eval(*x, scope));
    return a;
  }

  Value eval(const Expr& e, Scope& scope) {
    switch (e.kind) {
      case Expr::Kind::Literal: return e.literal;
      case Expr::Kind::Name: return scope.lookup(e.name);
      case Expr::Kind::ListLit: {
        List l;
        for (const auto& x : e.args) l.push_back(eval(*x, scope));
        return Value(std::move(l));
      }
      case Expr::Kind::DictLit: {
        Dict d;
        for (const auto& [k, v] : e.entries) {
          const Value key = eval(*k, scope);
          if (!key.is_string()) throw TemplateError{"dict keys must be strings here, got " + key.type_name(), k->pos};
          d.set(key.as_string(), eval(*v, scope));
        }
        return Value(std::move(d));
      }
      case Expr::Kind::Attr: {
        const Value obj = eval(*e.a, scope);
        if (obj.is_undefined()) throw TemplateError{"cannot read '" + e.name + "' of an undefined value", e.pos};
        // Python attribute first (a method of str/dict), then the item, as Jinja's getattr does.
        Value m = method_of(obj, e.name, e.pos);
        if (!m.is_undefined()) return m;
        return obj.is_dict() ? item_of(obj, Value(e.name), e.pos) : Value();
      }
      case Expr::Kind::Item: {
        const Value obj = eval(*e.a, scope);
        const Value key = eval(*e.b, scope);
        Value v = item_of(obj, key, e.pos);
        if (v.is_undefined() && key.is_string() && !obj.is_dict()) v = method_of(obj, key.as_string(), e.pos);
        return v;
      }
      case Expr::Kind::Slice: return slice(e, scope);
      case Expr::Kind::Call: {
        const Value fn = eval(*e.a, scope);
        if (fn.kind() != Value::Kind::Callable) throw TemplateError{"a " + fn.type_name() + " value is not callable", e.pos};
        CallArgs a = eval_args(e, scope);
        try {
          return fn.callable()(a);
        } catch (TemplateError& err) {
          if (err.pos == std::string::npos) err.pos = e.pos;
          throw;
        }
      }
      case Expr::Kind::Filter: {
        const Value input = eval(*e.a, scope);
        CallArgs a = eval_args(e, scope);
        return apply_filter(e.name, input, a, e.pos);
      }
      case Expr::Kind::Test: {
        const Value input = eval(*e.a, scope);
        CallArgs a = eval_args(e, scope);
        return Value(apply_test(e.name, input, a, e.pos) != e.negate);
      }
      case Expr::Kind::Unary: {
        const Value v = eval(*e.a, scope);
        if (e.name == "not") return Value(!v.truthy());
        if (v.kind() == Value::Kind::Int) return e.name == "-" ? Value(-v.as_int()) : v;
        if (v.kind() == Value::Kind::Float) return e.name == "-" ? Value(-v.as_number()) : v;
        throw TemplateError{"unary '" + e.name + "' needs a number, got " + v.type_name(), e.pos};
      }
      case Expr::Kind::And: {
        Value a = eval(*e.a, scope);
        return a.truthy() ? eval(*e.b, scope) : a;
      }
      case Expr::Kind::Or: {
        Value a = eval(*e.a, scope);
        return a.truthy() ? a : eval(*e.b, scope);
      }
      case Expr::Kind::Ternary:
        if (eval(*e.b, scope).truthy()) return eval(*e.a, scope);
        return e.c ? eval(*e.c, scope) : Value();
      case Expr::Kind::Binary: return binary(e, eval(*e.a, scope), eval(*e.b, scope));
    }
    return Value();
  }

  Value slice(const Expr& e, Scope& scope) {
    const Value obj = eval(*e.a, scope);
    int64_t bounds[3] = {0, 0, 1};
    bool given[3] = {false, false, false};
    for (int i = 0; i < 3; ++i) {
      if (!e.args[i]) continue;
      const Value v = eval(*e.args[i], scope);
      if (v.is_none()) continue;
      if (v.kind() != Value::Kind::Int) throw TemplateError{"slice bounds must be integers", e.pos};
      bounds[i] = v.as_int();
      given[i] = true;
    }
    const int64_t step = bounds[2];
    if (step == 0) throw TemplateError{"slice step cannot be zero", e.pos};
    if (!obj.is_list() && !obj.is_string()) throw TemplateError{"cannot slice a " + obj.type_name(), e.pos};
    const List items = iterate(obj, e.pos);
    const auto n = static_cast<int64_t>(items.size());
    // Python's slice.indices().
    const auto clamp = [&](int64_t v, bool has, int64_t def) {
      if (!has) return def;
      if (v < 0) v += n;
      if (step > 0) return std::clamp<int64_t>(v, 0, n);
      return std::clamp<int64_t>(v, -1, n - 1);
    };
    const int64_t start = clamp(bounds[0], given[0], step > 0 ? 0 : n - 1);
    const int64_t stop = clamp(bounds[1], given[1], step > 0 ? n : -1);
    List out;
    for (int64_t i = start; step > 0 ? i < stop : i > stop; i += step) out.push_back(items[i]);
    if (obj.is_list()) return Value(std::move(out));
    std::string s;
    for (const Value& c : out) s += c.as_string();
    return Value(s);
  }

  static Value binary(const Expr& e, const Value& a, const Value& b) {
    const std::string& op = e.name;
    using K = Value::Kind;
    if (op == "~") return Value(a.str() + b.str());
    if (op == "==") return Value(values_equal(a, b));
    if (op == "!=") return Value(!values_equal(a, b));
    if (op == "<") return Value(compare_values(a, b, e.pos) < 0);
    if (op == "<=") return Value(compare_values(a, b, e.pos) <= 0);
    if (op == ">") return Value(compare_values(a, b, e.pos) > 0);
    if (op == ">=") return Value(compare_values(a, b, e.pos) >= 0);
    if (op == "in") return Value(contains(b, a, e.pos));
    if (op == "not in") return Value(!contains(b, a, e.pos));
    if (op == "+" && a.is_string() && b.is_string()) return Value(a.as_string() + b.as_string());
    if (op == "+" && a.is_list() && b.is_list()) {
      List l = a.list();
      l.insert(l.end(), b.list().begin(), b.list().end());
      return Value(std::move(l));
    }
    if (op == "*" && (a.is_string() || a.is_list()) && b.kind() == K::Int) {
      if (a.is_string()) {
        std::string s;
        for (int64_t i = 0; i < b.as_int(); ++i) s += a.as_string();
        return Value(s);
      }
      List l;
      for (int64_t i = 0; i < b.as_int(); ++i) l.insert(l.end(), a.list().begin(), a.list().end());
      return Value(std::move(l));
    }
    const auto numeric = [](const Value& v) { return v.is_number() || v.kind() == K::Bool; };
    if (!numeric(a) || !numeric(b))
      throw TemplateError{"unsupported operand types for " + op + ": " + a.type_name() + " and " + b.type_name(), e.pos};
    const bool ints = a.kind() != K::Float && b.kind() != K::Float;
    const auto iv = [](const Value& v) { return v.kind() == K::Bool ? int64_t{v.as_bool()} : v.as_int(); };
    const double x = a.as_number(), y = b.as_number();
    if (op == "+") return ints ? Value(iv(a) + iv(b)) : Value(x + y);
    if (op == "-") return ints ? Value(iv(a) - iv(b)) : Value(x - y);
    if (op == "*") return ints ? Value(iv(a) * iv(b)) : Value(x * y);
    if (op == "**") return ints && iv(b) >= 0 ? Value(static_cast<int64_t>(std::llround(std::pow(x, y)))) : Value(std::pow(x, y));
    if (y == 0) throw TemplateError{"division by zero", e.pos};
    if (op == "/") return Value(x / y);
    if (op == "//") {
      if (!ints) return Value(std::floor(x / y));
      const int64_t q = iv(a) / iv(b);
      return Value((iv(a) % iv(b) != 0 && ((iv(a) < 0) != (iv(b) < 0))) ? q - 1 : q);
    }
    if (op == "%") {
      if (!ints) return Value(x - y * std::floor(x / y));
      const int64_t m = iv(a) % iv(b);
      return Value(m != 0 && ((m < 0) != (iv(b) < 0)) ? m + iv(b) : m);
    }
    throw TemplateError{"unsupported operator '" + op + "'", e.pos};
  }

  Scope globals_;
  Scope root_;
  int depth_ = 0;
};

}  // namespace

std::string render_body(const Body& body, const Dict& context) { return Renderer(context).run(body); }

}  // namespace k3::jinja
