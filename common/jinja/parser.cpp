#include "common/jinja/parser.h"

#include <algorithm>
#include <initializer_list>

#include "common/jinja/expression_parser.h"

namespace k3::jinja {
namespace {

class Parser : public ExpressionParser {
 public:
  using ExpressionParser::ExpressionParser;

  Body run() {
    Body body;
    std::string stop = parse_body(body, {});
    (void)stop;
    return body;
  }

 private:
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

  // Counts one level of nesting for the scope of a parse call.
  std::unique_ptr<Stmt> parse_statement(size_t pos) {
    const Nest nest(*this, pos);
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

};

}  // namespace

Body parse_template(const std::vector<Token>& tokens) { return Parser(tokens).run(); }

}  // namespace k3::jinja
