// The router's half of a TOKENS message: the ids become text through the request's TextStream and end
// at the first stop id, stop string or max_tokens (decode may stop later than the router: a stop string
// is only seen here); the logprobs the decode rank sent ride along, one per id kept.
#pragma once
#include <string>

#include "common/protocol/messages.h"
#include "router/generation_service.h"
#include "router/text_stream.h"

namespace k3::router {

// Appends the message's tokens (text, ids, logprobs) to `ev`, counting them in `generated`. Returns
// "stop" or "length" when generation ended inside this message, "" when it goes on; an error when the
// text could not be decoded or the logprobs do not match the ids.
Result<std::string> absorb_tokens(const protocol::Tokens& t, const GenerationParams& params, TextStream& text,
                                  int64_t& generated, GenerationEvent& ev);

// A TOKENS/COMPUTE_DONE logprobs entry as the API layer reports it.
TokenLogprob token_logprob(int32_t id, const protocol::TokenLogprobs& lp);

}  // namespace k3::router
