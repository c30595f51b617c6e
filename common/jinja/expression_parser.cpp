#include "common/jinja/expression_parser.h"

#include "common/jinja/builtins.h"

namespace k3::jinja {
namespace {

ExprPtr node(Expr::Kind kind, size_t pos) {
  auto e = std::make_unique<Expr>();
  e->kind = kind;
  e->pos = pos;
  return e;
}

}  // namespace

ExprPtr ExpressionParser::parse_expression() {
  const Nest nest(*this, cur().pos);
  ExprPtr e = parse_or();
  while (is_name("if")) {
    auto t = node(Expr::Kind::Ternary, cur().pos);
    ++i_;
    t->b = parse_or();
    if (accept_name("else")) t->c = parse_expression();
    t->a = std::move(e);
    e = std::move(t);
  }
  return e;
}

ExprPtr ExpressionParser::binary(Expr::Kind kind, std::string op, ExprPtr a, ExprPtr b, size_t pos) {
  auto e = node(kind, pos);
  e->name = std::move(op);
  e->a = std::move(a);
  e->b = std::move(b);
  return e;
}

ExprPtr ExpressionParser::parse_or() {
  ExprPtr e = parse_and();
  while (is_name("or")) {
    const size_t pos = next().pos;
    e = binary(Expr::Kind::Or, "or", std::move(e), parse_and(), pos);
  }
  return e;
}
ExprPtr ExpressionParser::parse_and() {
  ExprPtr e = parse_not();
  while (is_name("and")) {
    const size_t pos = next().pos;
    e = binary(Expr::Kind::And, "and", std::move(e), parse_not(), pos);
  }
  return e;
}
ExprPtr ExpressionParser::parse_not() {
  if (is_name("not")) {
    auto e = node(Expr::Kind::Unary, next().pos);
    e->name = "not";
    e->a = parse_not();
    return e;
  }
  return parse_compare();
}
ExprPtr ExpressionParser::parse_compare() {
  ExprPtr e = parse_math1();
  while (true) {
    const size_t pos = cur().pos;
    std::string op;
    if (cur().type == T::Op && (cur().text == "==" || cur().text == "!=" || cur().text == "<" ||
                                cur().text == "<=" || cur().text == ">" || cur().text == ">=")) {
      op = next().text;
    } else if (accept_name("in")) {
      op = "in";
    } else if (is_name("not") && t_[i_ + 1].type == T::Name && t_[i_ + 1].text == "in") {
      i_ += 2;
      op = "not in";
    } else {
      return e;
    }
    e = binary(Expr::Kind::Binary, op, std::move(e), parse_math1(), pos);
  }
}
ExprPtr ExpressionParser::parse_math1() {
  ExprPtr e = parse_concat();
  while (is_op("+") || is_op("-")) {
    const Token& op = next();
    e = binary(Expr::Kind::Binary, op.text, std::move(e), parse_concat(), op.pos);
  }
  return e;
}
ExprPtr ExpressionParser::parse_concat() {
  ExprPtr e = parse_math2();
  while (is_op("~")) {
    const Token& op = next();
    e = binary(Expr::Kind::Binary, "~", std::move(e), parse_math2(), op.pos);
  }
  return e;
}
ExprPtr ExpressionParser::parse_math2() {
  ExprPtr e = parse_pow();
  while (is_op("*") || is_op("/") || is_op("//") || is_op("%")) {
    const Token& op = next();
    e = binary(Expr::Kind::Binary, op.text, std::move(e), parse_pow(), op.pos);
  }
  return e;
}
ExprPtr ExpressionParser::parse_pow() {
  ExprPtr e = parse_unary(true);
  while (is_op("**")) {
    const Token& op = next();
    e = binary(Expr::Kind::Binary, "**", std::move(e), parse_unary(true), op.pos);
  }
  return e;
}
ExprPtr ExpressionParser::parse_unary(bool with_filter) {
  const Nest nest(*this, cur().pos);
  ExprPtr e;
  if (is_op("-") || is_op("+")) {
    e = node(Expr::Kind::Unary, cur().pos);
    e->name = next().text;
    e->a = parse_unary(false);
  } else {
    e = parse_postfix(parse_primary());
  }
  return with_filter ? parse_filters(std::move(e)) : std::move(e);
}

ExprPtr ExpressionParser::parse_primary() {
  const Token& tok = cur();
  switch (tok.type) {
    case T::String: {
      auto e = node(Expr::Kind::Literal, tok.pos);
      std::string s;
      while (cur().type == T::String) s += next().text;  // adjacent literals concatenate
      e->literal = Value(std::move(s));
      return e;
    }
    case T::Int: {
      auto e = node(Expr::Kind::Literal, next().pos);
      try {
        e->literal = Value(static_cast<int64_t>(std::stoll(tok.text)));
      } catch (const std::exception&) {
        throw TemplateError{"integer literal out of range", tok.pos};
      }
      return e;
    }
    case T::Float: {
      auto e = node(Expr::Kind::Literal, next().pos);
      e->literal = Value(std::stod(tok.text));
      return e;
    }
    case T::Name: {
      ++i_;
      auto e = node(Expr::Kind::Literal, tok.pos);
      if (tok.text == "true" || tok.text == "True") e->literal = Value(true);
      else if (tok.text == "false" || tok.text == "False") e->literal = Value(false);
      else if (tok.text == "none" || tok.text == "None") e->literal = Value::none();
      else {
        e->kind = Expr::Kind::Name;
        e->name = tok.text;
      }
      return e;
    }
    case T::Op:
      if (tok.text == "(") return parse_paren();
      if (tok.text == "[") {
        auto e = node(Expr::Kind::ListLit, next().pos);
        while (!accept_op("]")) {
          if (!e->args.empty()) expect_op(",");
          if (accept_op("]")) break;  // trailing comma
          e->args.push_back(parse_expression());
        }
        return e;
      }
      if (tok.text == "{") {
        auto e = node(Expr::Kind::DictLit, next().pos);
        while (!accept_op("}")) {
          if (!e->entries.empty()) expect_op(",");
          if (accept_op("}")) break;
          ExprPtr k = parse_expression();
          expect_op(":");
          e->entries.emplace_back(std::move(k), parse_expression());
        }
        return e;
      }
      break;
    default: break;
  }
  fail("expected an expression");
}

// (expr) or a tuple (a, b) / (a,) / () — tuples are lists here.
ExprPtr ExpressionParser::parse_paren() {
  const size_t pos = next().pos;
  if (accept_op(")")) return node(Expr::Kind::ListLit, pos);
  ExprPtr first = parse_expression();
  if (accept_op(")")) return first;
  auto e = node(Expr::Kind::ListLit, pos);
  e->args.push_back(std::move(first));
  while (accept_op(",")) {
    if (is_op(")")) break;
    e->args.push_back(parse_expression());
  }
  expect_op(")");
  return e;
}

ExprPtr ExpressionParser::parse_postfix(ExprPtr e) {
  while (true) {
    if (is_op(".")) {
      const size_t pos = next().pos;
      auto a = node(Expr::Kind::Attr, pos);
      if (cur().type == T::Int) {  // a.0 is a[0]
        a->kind = Expr::Kind::Item;
        a->b = node(Expr::Kind::Literal, cur().pos);
        a->b->literal = Value(static_cast<int64_t>(std::stoll(next().text)));
      } else {
        a->name = expect_name();
      }
      a->a = std::move(e);
      e = std::move(a);
    } else if (is_op("[")) {
      e = parse_subscript(std::move(e));
    } else if (is_op("(")) {
      e = parse_call(std::move(e), Expr::Kind::Call, "");
    } else {
      return e;
    }
  }
}

ExprPtr ExpressionParser::parse_subscript(ExprPtr target) {
  const size_t pos = next().pos;
  ExprPtr parts[3];
  int colons = 0;
  while (!accept_op("]")) {
    if (accept_op(":")) {
      if (++colons > 2) fail("too many ':' in a slice");
      continue;
    }
    if (parts[colons]) fail("expected ']' or ':'");
    parts[colons] = parse_expression();
  }
  if (colons == 0) {
    if (!parts[0]) throw TemplateError{"empty subscript", pos};
    auto e = node(Expr::Kind::Item, pos);
    e->a = std::move(target);
    e->b = std::move(parts[0]);
    return e;
  }
  auto e = node(Expr::Kind::Slice, pos);
  e->a = std::move(target);
  for (auto& p : parts) e->args.push_back(std::move(p));
  return e;
}

ExprPtr ExpressionParser::parse_call(ExprPtr target, Expr::Kind kind, std::string name) {
  auto e = node(kind, target ? target->pos : cur().pos);  // a call is where its callee starts
  e->name = std::move(name);
  e->a = std::move(target);
  if (!accept_op("(")) return e;
  while (!accept_op(")")) {
    if (!e->args.empty() || !e->kwargs.empty()) {
      expect_op(",");
      if (accept_op(")")) break;
    }
    if (is_op("*") || is_op("**")) fail("*args and **kwargs in calls are not supported");
    if (cur().type == T::Name && t_[i_ + 1].type == T::Op && t_[i_ + 1].text == "=") {
      std::string key = next().text;
      ++i_;
      e->kwargs.emplace_back(std::move(key), parse_expression());
    } else {
      if (!e->kwargs.empty()) fail("a positional argument follows a keyword argument");
      e->args.push_back(parse_expression());
    }
  }
  return e;
}

ExprPtr ExpressionParser::parse_filters(ExprPtr e) {
  while (true) {
    if (accept_op("|")) {
      const size_t pos = cur().pos;
      std::string name = expect_name();
      if (!is_filter_name(name)) throw TemplateError{"unsupported filter '" + name + "'", pos};
      e = parse_call(std::move(e), Expr::Kind::Filter, std::move(name));
      e->pos = pos;
    } else if (is_name("is")) {
      ++i_;
      const bool negate = accept_name("not");
      const size_t pos = cur().pos;
      std::string name = expect_name();
      if (!is_test_name(name)) throw TemplateError{"unsupported test '" + name + "'", pos};
      auto t = node(Expr::Kind::Test, pos);
      t->name = std::move(name);
      t->negate = negate;
      t->a = std::move(e);
      const bool arg_follows =
          (cur().type == T::Name && cur().text != "else" && cur().text != "or" && cur().text != "and") ||
          cur().type == T::String || cur().type == T::Int || cur().type == T::Float || is_op("[") || is_op("{");
      if (is_op("(")) {
        ExprPtr call = parse_call(nullptr, Expr::Kind::Call, "");
        t->args = std::move(call->args);
        t->kwargs = std::move(call->kwargs);
      } else if (arg_follows) {
        t->args.push_back(parse_postfix(parse_primary()));
      }
      e = std::move(t);
    } else if (is_op("(")) {
      e = parse_call(std::move(e), Expr::Kind::Call, "");
    } else {
      return e;
    }
  }
}

}  // namespace k3::jinja
