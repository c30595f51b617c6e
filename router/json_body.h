// Parsing a request body into JSON with errors a client can act on: nesting depth is bounded before
// the recursive parser runs, and a value the parser cannot represent (a number like 1e400 overflows
// a double) is reported as a 400 naming the field it sits in, not as an internal error.
#pragma once
#include <nlohmann/json.hpp>

#include <string>

namespace k3::router {

// The parsed body; throws ApiError 400 (code invalid_json, or number_out_of_range with the field's
// path such as "messages[0].content" or "temperature" as param).
nlohmann::json parse_json_body(const std::string& text, int max_depth);

// Where a parse failed: the path of the value being read ("" at the top level) and the reason.
struct JsonFailure {
  std::string path, reason;
  bool out_of_range = false;
};
JsonFailure locate_json_failure(const std::string& text);

// A Content-Type naming JSON, compared as RFC 9110 says (case-insensitive, parameters ignored):
// application/json, text/json or any type with a "+json" suffix.
bool is_json_media_type(const std::string& content_type);

}  // namespace k3::router
