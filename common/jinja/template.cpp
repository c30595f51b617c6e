#include "common/jinja/template.h"

#include "common/jinja/lexer.h"
#include "common/jinja/parser.h"
#include "common/jinja/renderer.h"

namespace k3::jinja {

struct Template::Parsed {
  std::string source;  // normalised, for line and column of errors
  Body body;
};

namespace {

Status located(const std::string& source, const TemplateError& e) {
  if (e.pos >= source.size() + 1) return invalid_argument("chat template: " + e.message);
  size_t line = 1, col = 1;
  for (size_t i = 0; i < e.pos && i < source.size(); ++i) {
    if (source[i] == '\n') {
      ++line;
      col = 1;
    } else if ((static_cast<unsigned char>(source[i]) & 0xC0) != 0x80) {
      ++col;
    }
  }
  return invalid_argument("chat template line " + std::to_string(line) + ", column " + std::to_string(col) + ": " +
                          e.message);
}

}  // namespace

Result<Template> Template::parse(std::string_view source) {
  auto parsed = std::make_shared<Parsed>();
  parsed->source = normalize_template_source(source);
  try {
    parsed->body = parse_template(tokenize_template(parsed->source));
  } catch (const TemplateError& e) {
    return located(parsed->source, e);
  } catch (const std::exception& e) {
    return invalid_argument(std::string("chat template: ") + e.what());
  }
  return Template(std::move(parsed));
}

Result<std::string> Template::render(const Dict& context) const {
  try {
    return render_body(parsed_->body, context);
  } catch (const TemplateError& e) {
    return located(parsed_->source, e);
  } catch (const std::exception& e) {
    return invalid_argument(std::string("chat template: ") + e.what());
  }
}

}  // namespace k3::jinja
