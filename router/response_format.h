// The chat API's response_format, parsed and compiled at the boundary: text (no constraint),
// json_object, or json_schema (always enforced, strict or not) within the subset docs/API.md lists.
// Anything else is a 400 naming the field, for a schema keyword its path under
// response_format.json_schema.schema.
#pragma once
#include <memory>
#include <string>

#include <nlohmann/json.hpp>

#include "common/grammar/output_format.h"

namespace k3::router {

struct ResponseFormat {
  grammar::OutputFormat format;
  grammar::CompiledFormat grammar;  // nothing for text
};

// body: the parsed request; body_text: its text (re-read with key order kept for the schema).
ResponseFormat parse_response_format(const nlohmann::json& body, const std::string& body_text);

}  // namespace k3::router
