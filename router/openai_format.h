// JSON bodies of the OpenAI API: non-streamed completion objects, SSE chunk objects, logprobs in the
// chat and the legacy completions shapes, usage, and SSE framing.
#pragma once
#include <nlohmann/json.hpp>

#include <string>
#include <vector>

#include "common/tokenizer/tokenizer.h"
#include "router/completion_request.h"
#include "router/tool_call_output.h"

namespace k3::router {

struct ResponseIds {
  std::string id;        // "chatcmpl-..." or "cmpl-..."
  int64_t created = 0;   // unix seconds
  std::string model;
};

// Everything generated so far for one choice (a piece of it, in a chunk).
struct ChoiceText {
  std::string text;
  std::vector<int32_t> token_ids;
  std::vector<TokenLogprob> logprobs;
  int64_t text_offset = 0;   // completions logprobs: offset of this piece in the whole text
  std::vector<ChatToolCall> tool_calls;        // chat message: its calls (content becomes null when empty)
  std::vector<ToolCallDelta> tool_call_deltas; // chat chunk: delta.tool_calls
  int index = 0;                               // which choice (0..n-1)
  std::string finish_reason;                   // completion object: why the choice ended
};

nlohmann::json usage_json(int64_t prompt_tokens, int64_t completion_tokens);
// Chat: {"content": [{token, logprob, bytes, top_logprobs}]}; completions: {tokens, token_logprobs, top_logprobs, text_offset}.
nlohmann::json logprobs_json(Endpoint endpoint, const std::vector<TokenLogprob>& lps, const Tokenizer& tok,
                             int64_t text_offset);

// The whole response: `choices` in index order; usage counts every choice's tokens.
nlohmann::json completion_object(const CompletionRequest& rq, const ResponseIds& ids, const std::vector<ChoiceText>& choices,
                                 const std::vector<int32_t>& prompt, int64_t completion_tokens, const Tokenizer& tok);
// One streamed chunk. role: chat's first chunk only. finish_reason empty: null.
nlohmann::json chunk_object(const CompletionRequest& rq, const ResponseIds& ids, const ChoiceText& piece,
                            const std::string& finish_reason, bool role, const Tokenizer& tok);
nlohmann::json usage_chunk(const CompletionRequest& rq, const ResponseIds& ids, int64_t prompt_tokens,
                           int64_t completion_tokens);

// "data: <json>\n\n"; invalid UTF-8 replaced, never throws.
std::string sse_data(const nlohmann::json& j);
std::string dump_json(const nlohmann::json& j);
inline constexpr const char* kSseDone = "data: [DONE]\n\n";

}  // namespace k3::router
