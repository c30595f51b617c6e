// The output of a chat request whose tools may be called, taken apart as the chat template lays it
// out (common/tokenizer/chat_template.h): content text, then at most one tool-call section whose calls
// become OpenAI tool_calls. Fed token by token, it gives what may be sent now: content (stop strings
// apply to it, and only to it) and, per call, a first delta with its id and name and then pieces of
// its arguments (each piece valid UTF-8). The constraint (common/grammar/token_constraint.h) made the
// section well formed; a section cut short (max_tokens) leaves its last call's arguments unfinished.
#pragma once
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "common/core/status.h"
#include "common/tokenizer/chat_template.h"
#include "common/tokenizer/tokenizer.h"
#include "router/text_stream.h"

namespace k3::router {

struct ToolCallDelta {
  int index = 0;            // the call's position in this message
  std::string id, name;     // on the call's first delta only
  std::string arguments;    // the next piece of its JSON text
};

class ToolCallOutput {
 public:
  struct Piece {
    std::string content;
    std::vector<ToolCallDelta> calls;
  };

  ToolCallOutput(std::shared_ptr<const Tokenizer> tok, std::vector<std::string> stop_strings,
                 std::vector<int32_t> stop_ids);
  ToolCallOutput(const ToolCallOutput&) = delete;  // its text streams point back at it
  ToolCallOutput& operator=(const ToolCallOutput&) = delete;
  Result<Piece> push(int32_t id);
  Piece finish();                       // generation ended: what was held back
  bool stopped() const { return content_.stopped(); }  // a stop string ended the content
  int calls_finished() const { return finished_; }
  const std::vector<ChatToolCall>& calls() const { return calls_; }  // every call so far, as sent

 private:
  enum class Phase { Content, Section, Name, Arguments, Over };
  void add(Piece& p, int call, std::string args);

  std::shared_ptr<const Tokenizer> tok_;
  std::vector<int32_t> stop_ids_;
  int32_t section_begin_, section_end_, call_begin_, arguments_, call_end_;
  Phase phase_ = Phase::Content;
  TextStream content_;
  std::optional<TextStream> args_;  // the current call's arguments
  std::string name_;                // the current call's "functions.NAME:INDEX" so far
  std::vector<ChatToolCall> calls_;
  int finished_ = 0;
};

// The function name in a call id "functions.NAME:INDEX" (the id itself when it has another form).
std::string function_of_call_id(const std::string& id);

}  // namespace k3::router
