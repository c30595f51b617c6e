// The chat API's tools, tool_choice and parallel_tool_calls, checked at the boundary: every problem is
// a 400 naming the field ("tools[1].function.parameters.properties.x.pattern", "tool_choice.function.name").
// Tools given make the output a ToolCalls format (common/grammar/tool_call_grammar.h):
//   tool_choice "none" -> mode None (declared to the model, never called),
//   absent or "auto"   -> mode Auto (the model may call any of them),
//   "required"         -> mode Required with every function,
//   {"type": "function", "function": {"name": N}} -> mode Required with N only.
#pragma once
#include <string>

#include <nlohmann/json.hpp>

#include "common/grammar/output_format.h"

namespace k3::router {

struct ToolRequest {
  std::string tools_json;        // the declared tools, compact, for the chat template; "" when none
  bool calls_possible = false;   // tools given and tool_choice is not "none": the output may hold calls
  grammar::OutputFormat format;  // Text when no tools are given
  grammar::CompiledFormat grammar;
};

// body: the parsed request; body_text: its text (re-read with key order kept for the schemas);
// first_index: how many tool calls the conversation already holds.
ToolRequest parse_tool_request(const nlohmann::json& body, const std::string& body_text, int first_index);

}  // namespace k3::router
