// Splits a chat template into text and tag tokens, applying the whitespace rules Hugging Face
// renders chat templates with (trim_blocks and lstrip_blocks on, `{%-`/`-%}` strip marks, `{%+`
// to keep a line's indentation, one trailing newline of the source dropped, newlines normalised),
// and the inside of each tag into expression tokens.
#pragma once
#include <cstddef>
#include <string>
#include <string_view>
#include <vector>

namespace k3::jinja {

// Thrown while parsing or rendering; Template turns it into a Status naming line and column.
struct TemplateError {
  std::string message;
  size_t pos;  // byte offset into the (normalised) template source
};

struct Token {
  enum class Type { Text, VarBegin, VarEnd, BlockBegin, BlockEnd, Name, String, Int, Float, Op, End };
  Type type;
  std::string text;  // Text: the text; String: the decoded value; Name/Int/Float/Op: as written
  size_t pos;
};

// The source as the lexer sees it: newlines normalised to "\n", one trailing newline removed.
std::string normalize_template_source(std::string_view source);
// Tokens of a normalised source; throws TemplateError on an unclosed tag, comment or string.
std::vector<Token> tokenize_template(const std::string& source);

}  // namespace k3::jinja
