#include "common/jinja/parser.h"

#include "common/jinja/builtins.h"

#include <algorithm>
#include <initializer_list>

namespace k3::jinja {
namespace {

using T = Token::Type;

ExprPtr node(Expr::Kind kind, size_t pos) {
  auto e = std::make_unique<Expr>();
  e->kind = kind;
  e->pos = pos;
  return e;
}

class Parser {
 public:
  explicit Parser(const std::vector<Token>& tokens) : t_(tokens) {}

  Body run() {
    Body body;
    std::string stop = parse_body(body, {});
    (void)stop;
    return body;
  }

 private:
  const Token& cur() const { return t_[i_]; }
  const Token& next() { return t_[i_++]; }
  bool is_op(const char* op) const { return cur().type == T::Op && cur().text == op; }
  bool is_name(const char* n) const { return cur().type == T::Name && cur().text == n; }
  bool accept_op(const char* op) {
    if (!is_op(op)) return false;
    ++i_;
    return true;
  }
  bool accept_name(const char* n) {
    if (!is_name(n)) return false;
    ++i_;
    return true;
  }
  [[noreturn]] void fail(const std::string& what) const {
    std::string got;
    switch (cur().type) {
      case T::Text: got = "text"; break;
      case T::VarEnd: got = "'}}'"; break;
      case T::BlockEnd: got = "'%}'"; break;
      case T::End: got = "the end of the template"; break;
      default: got = "'" + cur().text + "'";
    }
    throw TemplateError{what + ", got " + got, cur().pos};
  }
  void expect_op(const char* op) {
    if (!accept_op(op)) fail(std::string("expected '") + op + "'");
  }
  std::string expect_name() {
    if (cur().type != T::Name) fail("expected a name");
    return next().text;
  }
  void expect_block_end() {
    if (cur().type != T::BlockEnd) fail("expected '%}'");
    ++i_;
  }

  // Parses statements until a block tag named in `stops`; returns that name, the cursor after it.
  std::string parse_body(Body& body, std::initializer_list<const char*> stops, size_t opened_at = 0,
                         const char* opener = nullptr) {
    while (true) {
      const Token& tok = cur();
      if (tok.type == T::End) {
        if (stops.size() == 0) return "";
        throw TemplateError{std::string("'") + opener + "' is never closed (expected '" + *(stops.end() - 1) + "')",
                            opened_at};
      }
      if (tok.type == T::Text) {
        auto s = std::make_unique<Stmt>();
        s->kind = Stmt::Kind::Text;
        s->pos = tok.pos;
        s->text = tok.text;
        body.push_back(std::move(s));
        ++i_;
      } else if (tok.type == T::VarBegin) {
        ++i_;
        auto s = std::make_unique<Stmt>();
        s->kind = Stmt::Kind::Output;
        s->pos = tok.pos;
        s->expr = parse_expression();
        if (cur().type != T::VarEnd) fail("expected '}}'");
        ++i_;
        body.push_back(std::move(s));
      } else if (tok.type == T::BlockBegin) {
        ++i_;
        if (cur().type != T::Name) fail("expected a tag name after '{%'");
        const std::string name = cur().text;
        if (std::any_of(stops.begin(), stops.end(), [&](const char* s) { return name == s; })) {
          ++i_;
          return name;
        }
        body.push_back(parse_statement(tok.pos));
      } else {
        fail("unexpected token");
      }
    }
  }

  std::unique_ptr<Stmt> parse_statement(size_t pos) {
    auto s = std::make_unique<Stmt>();
    s->pos = pos;
    const std::string tag = next().text;
    if (tag == "if") {
      s->kind = Stmt::Kind::If;
      std::string stop = "elif";
      while (stop == "elif") {
        ExprPtr cond = parse_expression();
        expect_block_end();
        Body body;
        stop = parse_body(body, {"elif", "else", "endif"}, pos, "if");
        s->branches.emplace_back(std::move(cond), std::move(body));
      }
      if (stop == "else") {
        expect_block_end();
        parse_body(s->else_body, {"endif"}, pos, "if");
      }
      expect_block_end();
    } else if (tag == "for") {
      s->kind = Stmt::Kind::For;
      do s->targets.push_back(expect_name());
      while (accept_op(","));
      if (!accept_name("in")) fail("expected 'in' in a for loop");
      s->expr = parse_or();
      if (accept_name("if")) s->cond = parse_or();
      if (is_name("recursive")) fail("recursive for loops are not supported");
      expect_block_end();
      const std::string stop = parse_body(s->body, {"else", "endfor"}, pos, "for");
      if (stop == "else") {
        expect_block_end();
        parse_body(s->else_body, {"endfor"}, pos, "for");
      }
      expect_block_end();
    } else if (tag == "set") {
      s->targets.push_back(expect_name());
      if (accept_op(".")) {
        s->attr = expect_name();
      } else {
        while (accept_op(",")) s->targets.push_back(expect_name());
      }
      if (accept_op("=")) {
        s->kind = Stmt::Kind::Set;
        s->expr = parse_expression();
        expect_block_end();
      } else {
        if (!s->attr.empty() || s->targets.size() != 1) fail("a block set takes one plain name");
        s->kind = Stmt::Kind::SetBlock;
        expect_block_end();
        parse_body(s->body, {"endset"}, pos, "set");
        expect_block_end();
      }
    } else if (tag == "macro") {
      s->kind = Stmt::Kind::Macro;
      s->text = expect_name();
      expect_op("(");
      while (!accept_op(")")) {
        if (!s->params.empty()) expect_op(",");
        std::string p = expect_name();
        ExprPtr def = accept_op("=") ? parse_expression() : nullptr;
        s->params.emplace_back(std::move(p), std::move(def));
      }
      expect_block_end();
      parse_body(s->body, {"endmacro"}, pos, "macro");
      expect_block_end();
    } else if (tag == "break" || tag == "continue") {
      s->kind = tag == "break" ? Stmt::Kind::Break : Stmt::Kind::Continue;
      expect_block_end();
    } else if (tag == "generation") {
      // Hugging Face's marker of assistant text: renders its body unchanged.
      s->kind = Stmt::Kind::Block;
      expect_block_end();
      parse_body(s->body, {"endgeneration"}, pos, "generation");
      expect_block_end();
    } else if (tag.starts_with("end") || tag == "elif" || tag == "else") {
      throw TemplateError{"'" + tag + "' without an open block it belongs to", pos};
    } else {
      throw TemplateError{"unsupported tag '" + tag + "'", pos};
    }
    return s;
  }

  ExprPtr parse_expression() {
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

  ExprPtr binary(Expr::Kind kind, std::string op, ExprPtr a, ExprPtr b, size_t pos) {
    auto e = node(kind, pos);
    e->name = std::move(op);
    e->a = std::move(a);
    e->b = std::move(b);
    return e;
  }

  ExprPtr parse_or() {
    ExprPtr e = parse_and();
    while (is_name("or")) {
      const size_t pos = next().pos;
      e = binary(Expr::Kind::Or, "or", std::move(e), parse_and(), pos);
    }
    return e;
  }
  ExprPtr parse_and() {
    ExprPtr e = parse_not();
    while (is_name("and")) {
      const size_t pos = next().pos;
      e = binary(Expr::Kind::And, "and", std::move(e), parse_not(), pos);
    }
    return e;
  }
  ExprPtr parse_not() {
    if (is_name("not")) {
      auto e = node(Expr::Kind::Unary, next().pos);
      e->name = "not";
      e->a = parse_not();
      return e;
    }
    return parse_compare();
  }
  ExprPtr parse_compare() {
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
  ExprPtr parse_math1() {
    ExprPtr e = parse_concat();
    while (is_op("+") || is_op("-")) {
      const Token& op = next();
      e = binary(Expr::Kind::Binary, op.text, std::move(e), parse_concat(), op.pos);
    }
    return e;
  }
  ExprPtr parse_concat() {
    ExprPtr e = parse_math2();
    while (is_op("~")) {
      const Token& op = next();
      e = binary(Expr::Kind::Binary, "~", std::move(e), parse_math2(), op.pos);
    }
    return e;
  }
  ExprPtr parse_math2() {
    ExprPtr e = parse_pow();
    while (is_op("*") || is_op("/") || is_op("//") || is_op("%")) {
      const Token& op = next();
      e = binary(Expr::Kind::Binary, op.text, std::move(e), parse_pow(), op.pos);
    }
    return e;
  }
  ExprPtr parse_pow() {
    ExprPtr e = parse_unary(true);
    while (is_op("**")) {
      const Token& op = next();
      e = binary(Expr::Kind::Binary, "**", std::move(e), parse_unary(true), op.pos);
    }
    return e;
  }
  ExprPtr parse_unary(bool with_filter) {
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

  ExprPtr parse_primary() {
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
  ExprPtr parse_paren() {
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

  ExprPtr parse_postfix(ExprPtr e) {
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

  ExprPtr parse_subscript(ExprPtr target) {
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

  ExprPtr parse_call(ExprPtr target, Expr::Kind kind, std::string name) {
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

  ExprPtr parse_filters(ExprPtr e) {
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

  const std::vector<Token>& t_;
  size_t i_ = 0;
};

}  // namespace

Body parse_template(const std::vector<Token>& tokens) { return Parser(tokens).run(); }

}  // namespace k3::jinja
