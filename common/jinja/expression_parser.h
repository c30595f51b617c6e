// The token cursor and the expression grammar of the template engine, with Jinja's precedence
// (lowest first): `a if b else c`; or; and; not; comparisons and `in`; + -; ~; * / // %; **; unary
// - +; then primaries with `.attr`, `[key]`, slices and calls, filters `|` and tests `is`. The
// statement parser (parser.h) builds on it.
#pragma once
#include <string>
#include <vector>

#include "common/jinja/ast.h"
#include "common/jinja/lexer.h"

namespace k3::jinja {

class ExpressionParser {
 public:
  explicit ExpressionParser(const std::vector<Token>& tokens) : t_(tokens) {}

 protected:
  using T = Token::Type;
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

  // Nesting of expressions and blocks is bounded, so a hostile template fails with an error instead
  // of exhausting the stack; a Nest counts one level for the scope of a parse call.
  static constexpr int kMaxNesting = 200;
  struct Nest {
    ExpressionParser& p;
    Nest(ExpressionParser& parser, size_t pos) : p(parser) {
      if (++p.depth_ > kMaxNesting) throw TemplateError{"nested deeper than 200 levels", pos};
    }
    ~Nest() { --p.depth_; }
  };

  ExprPtr parse_expression();  // with `a if b else c`
  ExprPtr parse_or();          // without it (a for loop's iterable and filter)

  const std::vector<Token>& t_;
  size_t i_ = 0;
  int depth_ = 0;

 private:
  ExprPtr binary(Expr::Kind kind, std::string op, ExprPtr a, ExprPtr b, size_t pos);
  ExprPtr parse_and();
  ExprPtr parse_not();
  ExprPtr parse_compare();
  ExprPtr parse_math1();
  ExprPtr parse_concat();
  ExprPtr parse_math2();
  ExprPtr parse_pow();
  ExprPtr parse_unary(bool with_filter);
  ExprPtr parse_primary();
  ExprPtr parse_paren();
  ExprPtr parse_postfix(ExprPtr e);
  ExprPtr parse_subscript(ExprPtr target);
  ExprPtr parse_call(ExprPtr target, Expr::Kind kind, std::string name);
  ExprPtr parse_filters(ExprPtr e);
};

}  // namespace k3::jinja
