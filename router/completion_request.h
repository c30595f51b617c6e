// Parsing and validation of POST /v1/chat/completions and /v1/completions bodies. Every problem is an
// ApiError naming the parameter (400), except an unknown model (404 model_not_found). Unknown fields
// are ignored as OpenAI does; known ones are type- and range-checked.
#pragma once
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "common/grammar/output_format.h"
#include "common/tokenizer/chat_template.h"
#include "common/tokenizer/tokenizer.h"
#include "router/generation_service.h"

namespace k3::router {

enum class Endpoint { Chat, Completions };

struct CompletionRequest {
  Endpoint endpoint = Endpoint::Chat;
  std::string model;
  std::vector<ChatMessage> messages;         // chat
  std::optional<std::string> prompt_text;    // completions: string prompt (raw, no chat template)
  std::vector<int32_t> prompt_ids;           // completions: token-id prompt
  std::optional<int64_t> max_tokens;         // max_tokens or max_completion_tokens
  std::string max_tokens_field = "max_tokens";  // the field it came from (errors name it)
  float temperature = 1.f;
  float top_p = 1.f;
  int top_k = 0;                             // 0 or -1: off
  std::optional<uint64_t> seed;
  float presence_penalty = 0.f;              // [-2, 2], over the generated tokens (ops::SamplingRow)
  float frequency_penalty = 0.f;             // [-2, 2]
  std::vector<ops::LogitBias> logit_bias;    // token ids in [0, vocab), biases in [-100, 100]
  std::vector<std::string> stop;             // at most 4
  std::vector<int32_t> stop_token_ids;       // extension (vLLM)
  bool ignore_eos = false;                   // extension (vLLM)
  int logprobs = -1;                         // -1: off; else number of alternatives
  int n = 1;                                 // choices: samples of the one prompt, 1..kMaxChoices
  bool stream = false;
  bool include_usage = false;
  bool return_token_ids = false;             // extension: choices[].token_ids (and prompt_token_ids)
  grammar::OutputFormat output_format;       // chat response_format (json_object / json_schema) or tools
  grammar::CompiledFormat grammar;           // its compiled grammar; nothing for text
  std::string tools_json;                    // chat: the declared tools for the template ("" when none)
  bool tool_calls_possible = false;          // chat: the output may hold tool calls (router/tool_request.h)
};

struct ModelLimits {
  std::string served_model;   // the only model id accepted
  int64_t context = 0;        // max_position_embeddings
  int vocab = 0;
  int default_max_tokens = 256;
};

// The most choices (`n`) one request may ask for; a service may allow fewer (its running batch).
inline constexpr int kMaxChoices = 16;
inline constexpr size_t kMaxLogitBias = 1024;  // logit_bias entries

// Rejects nesting deeper than this before parsing (a recursive parser must not meet hostile depth).
inline constexpr int kMaxJsonDepth = 64;
bool json_depth_ok(const std::string& body, int max_depth);

CompletionRequest parse_completion_request(const std::string& body, Endpoint endpoint, const ModelLimits& limits);
// The prompt's token ids: chat via the template (special tokens allowed), string prompts as plain text.
std::vector<int32_t> prompt_tokens(const CompletionRequest& rq, const Tokenizer& tok);
// Resolves max_tokens against the context, checks ids, adds EOS ids; throws ApiError.
GenerationParams generation_params(const CompletionRequest& rq, std::vector<int32_t> prompt, const ModelLimits& limits,
                                   const std::vector<int32_t>& eos_ids);

}  // namespace k3::router
