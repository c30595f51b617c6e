#include "router/generation_service.h"

#include <string>

namespace k3::router {

Status check_generation_params(const GenerationParams& params, bool has_sink, int64_t vocab_size,
                               int64_t context_limit, const char* logprobs_unsupported) {
  if (params.prompt.empty()) return invalid_argument("prompt: empty");
  if (params.max_tokens < 1) return invalid_argument("max_tokens: must be >= 1");
  if (params.n < 1) return invalid_argument("n: must be >= 1");
  if (logprobs_unsupported && params.logprobs >= 0)
    return invalid_argument(std::string("logprobs: ") + logprobs_unsupported);
  for (int32_t id : params.prompt)
    if (id < 0 || id >= vocab_size)
      return invalid_argument("prompt: token id " + std::to_string(id) + " outside [0, " + std::to_string(vocab_size) + ")");
  if (static_cast<int64_t>(params.prompt.size()) + params.max_tokens > context_limit)
    return invalid_argument("prompt (" + std::to_string(params.prompt.size()) + " tokens) + max_tokens (" +
                            std::to_string(params.max_tokens) + ") exceeds the context limit " +
                            std::to_string(context_limit));
  if (!has_sink) return invalid_argument("sink is required");
  return Status::ok();
}

}  // namespace k3::router
