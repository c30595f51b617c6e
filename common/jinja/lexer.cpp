#include "common/jinja/lexer.h"

#include "common/jinja/utf8_code_point.h"

#include <cctype>
#include <cstdint>

namespace k3::jinja {
namespace {

bool is_space(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v'; }

class Lexer {
 public:
  explicit Lexer(const std::string& src) : src_(src) {}

  std::vector<Token> run() {
    size_t pos = 0;
    while (pos < src_.size()) {
      const size_t open = find_open(pos);
      std::string text = src_.substr(pos, open == std::string::npos ? std::string::npos : open - pos);
      if (open == std::string::npos) {
        emit_text(std::move(text), pos);
        break;
      }
      const char kind = src_[open + 1];
      const char sign = open + 2 < src_.size() ? src_[open + 2] : '\0';
      if (sign == '-') {
        while (!text.empty() && is_space(text.back())) text.pop_back();
      } else if (kind != '{' && sign != '+') {
        // lstrip_blocks: a block or comment tag alone after a line's indentation takes it away.
        const size_t line = text.rfind('\n');
        const size_t from = line == std::string::npos ? 0 : line + 1;
        const bool line_start = from > 0 || pos == 0 || src_[pos - 1] == '\n';
        bool blank = from < text.size();
        for (size_t i = from; i < text.size(); ++i) blank = blank && is_space(text[i]);
        if (line_start && blank) text.resize(from);
      }
      emit_text(std::move(text), pos);
      size_t inner = open + 2 + ((sign == '-' || (sign == '+' && kind != '{')) ? 1 : 0);
      pos = kind == '#' ? skip_comment(open, inner) : lex_tag(open, inner, kind);
    }
    tokens_.push_back({Token::Type::End, "", src_.size()});
    return std::move(tokens_);
  }

 private:
  size_t find_open(size_t from) const {
    for (size_t p = src_.find('{', from); p != std::string::npos; p = src_.find('{', p + 1)) {
      if (p + 1 < src_.size() && (src_[p + 1] == '{' || src_[p + 1] == '%' || src_[p + 1] == '#')) return p;
    }
    return std::string::npos;
  }

  void emit_text(std::string text, size_t pos) {
    if (!text.empty()) tokens_.push_back({Token::Type::Text, std::move(text), pos});
  }

  // After a tag's closing mark: "-" strips all following whitespace; otherwise a block or comment
  // tag eats one newline (trim_blocks) unless closed with "+".
  size_t after_close(size_t end, char sign, bool block) const {
    if (sign == '-') {
      while (end < src_.size() && is_space(src_[end])) ++end;
    } else if (block && sign != '+' && end < src_.size() && src_[end] == '\n') {
      ++end;
    }
    return end;
  }

  size_t skip_comment(size_t open, size_t inner) {
    const size_t close = src_.find("#}", inner);
    if (close == std::string::npos) throw TemplateError{"unclosed comment: '{#' without '#}'", open};
    const char sign = close > inner && (src_[close - 1] == '-' || src_[close - 1] == '+') ? src_[close - 1] : '\0';
    return after_close(close + 2, sign, true);
  }

  size_t lex_tag(size_t open, size_t p, char kind) {
    const bool block = kind == '%';
    const char closer = block ? '%' : '}';
    tokens_.push_back({block ? Token::Type::BlockBegin : Token::Type::VarBegin, "", open});
    while (true) {
      while (p < src_.size() && is_space(src_[p])) ++p;
      if (p >= src_.size()) {
        throw TemplateError{std::string("unclosed tag: '") + (block ? "{%" : "{{") + "' without '" +
                                (block ? "%}" : "}}") + "'",
                            open};
      }
      const char c = src_[p];
      const auto closes_at = [&](size_t q) { return q + 1 < src_.size() && src_[q] == closer && src_[q + 1] == '}'; };
      if (closes_at(p)) {
        tokens_.push_back({block ? Token::Type::BlockEnd : Token::Type::VarEnd, "", p});
        return after_close(p + 2, '\0', block);
      }
      if ((c == '-' || (c == '+' && block)) && closes_at(p + 1)) {
        tokens_.push_back({block ? Token::Type::BlockEnd : Token::Type::VarEnd, "", p});
        return after_close(p + 3, c, block);
      }
      p = lex_one(p);
    }
  }

  size_t lex_one(size_t p) {
    const char c = src_[p];
    if (std::isalpha(static_cast<unsigned char>(c)) || c == '_') {
      size_t q = p;
      while (q < src_.size() && (std::isalnum(static_cast<unsigned char>(src_[q])) || src_[q] == '_')) ++q;
      tokens_.push_back({Token::Type::Name, src_.substr(p, q - p), p});
      return q;
    }
    if (std::isdigit(static_cast<unsigned char>(c))) return lex_number(p);
    if (c == '\'' || c == '"') return lex_string(p);
    static const char* const kTwo[] = {"**", "//", "==", "!=", "<=", ">="};
    for (const char* op : kTwo) {
      if (src_.compare(p, 2, op) == 0) {
        tokens_.push_back({Token::Type::Op, op, p});
        return p + 2;
      }
    }
    if (std::string_view("+-*/%~<>=()[]{},.:|").find(c) != std::string_view::npos) {
      tokens_.push_back({Token::Type::Op, std::string(1, c), p});
      return p + 1;
    }
    throw TemplateError{std::string("unexpected character '") + c + "' in a tag", p};
  }

  size_t lex_number(size_t p) {
    size_t q = p;
    const auto digits = [&] {
      while (q < src_.size() && (std::isdigit(static_cast<unsigned char>(src_[q])) || src_[q] == '_')) ++q;
    };
    digits();
    bool is_float = false;
    if (q + 1 < src_.size() && src_[q] == '.' && std::isdigit(static_cast<unsigned char>(src_[q + 1]))) {
      is_float = true;
      ++q;
      digits();
    }
    if (q < src_.size() && (src_[q] == 'e' || src_[q] == 'E')) {
      size_t r = q + 1;
      if (r < src_.size() && (src_[r] == '+' || src_[r] == '-')) ++r;
      if (r < src_.size() && std::isdigit(static_cast<unsigned char>(src_[r]))) {
        is_float = true;
        q = r;
        digits();
      }
    }
    std::string text;
    for (size_t i = p; i < q; ++i)
      if (src_[i] != '_') text += src_[i];
    tokens_.push_back({is_float ? Token::Type::Float : Token::Type::Int, text, p});
    return q;
  }

  size_t lex_string(size_t p) {
    const char quote = src_[p];
    std::string out;
    size_t q = p + 1;
    while (q < src_.size() && src_[q] != quote) {
      if (src_[q] != '\\' || q + 1 >= src_.size()) {
        out += src_[q++];
        continue;
      }
      const char e = src_[q + 1];
      q += 2;
      switch (e) {
        case 'n': out += '\n'; break;
        case 't': out += '\t'; break;
        case 'r': out += '\r'; break;
        case '0': out += '\0'; break;
        case '\\': out += '\\'; break;
        case '\'': out += '\''; break;
        case '"': out += '"'; break;
        case '\n': break;  // a backslash-newline continues the string
        case 'u':
        case 'x': {
          const size_t n = e == 'u' ? 4 : 2;
          bool hex = q + n <= src_.size();
          for (size_t k = 0; hex && k < n; ++k) hex = std::isxdigit(static_cast<unsigned char>(src_[q + k])) != 0;
          if (!hex) throw TemplateError{"bad \\" + std::string(1, e) + " escape in a string", q - 2};
          append_code_point(out, static_cast<uint32_t>(std::stoul(src_.substr(q, n), nullptr, 16)));
          q += n;
          break;
        }
        default: out += '\\'; out += e;  // Python keeps unknown escapes as written
      }
    }
    if (q >= src_.size()) throw TemplateError{"unclosed string literal", p};
    tokens_.push_back({Token::Type::String, std::move(out), p});
    return q + 1;
  }

  const std::string& src_;
  std::vector<Token> tokens_;
};

}  // namespace

std::string normalize_template_source(std::string_view source) {
  std::string out;
  out.reserve(source.size());
  for (size_t i = 0; i < source.size(); ++i) {
    if (source[i] == '\r') {
      out += '\n';
      if (i + 1 < source.size() && source[i + 1] == '\n') ++i;
    } else {
      out += source[i];
    }
  }
  if (!out.empty() && out.back() == '\n') out.pop_back();
  return out;
}

std::vector<Token> tokenize_template(const std::string& source) { return Lexer(source).run(); }

}  // namespace k3::jinja
