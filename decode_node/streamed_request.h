// What a decode node keeps of each request it streams, and the bookkeeping a plain decode rank
// (decode_rank.h) and a rank group's leader (group_leader.h) share: the request's sampling and stop
// conditions from its CLAIM, its first token (drawn by the last prefill stage), each token's stop test and
// TOKENS message, and the end of a request the node cannot continue (the router must hear of it).
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "common/grammar/token_constraint.h"
#include "decode_node/decode_rank_options.h"
#include "decode_node/draw_tokens.h"
#include "transfer/ucx_decode_driver.h"

namespace k3::decode {

struct StreamedRequest {
  uint64_t id = 0;
  uint32_t choice = 0;               // which of the request's n choices this stream is (TOKENS name it)
  std::vector<int32_t> tokens;
  ops::SamplingRow sampling;         // step is kept per request by its batch; its spans are set per draw
  std::vector<ops::LogitBias> logit_bias;
  int max_tokens = 16;               // generated tokens including the first
  std::vector<int32_t> stop_ids;
  int logprobs = -1;                 // >= 0: report each token's logprob and this many alternatives
  // Structured output: the grammar state, advanced by every token (heap-held so a batch's pointer to it
  // survives moves of the request).
  std::unique_ptr<grammar::TokenConstraint> constraint;
};

// From the CLAIM's sampling params; a CLAIM without them (max_tokens 0) or none falls back to the node's
// options. Errors name a bad output format.
Result<StreamedRequest> streamed_request(uint64_t id, const DecodeRankOptions& o, const protocol::Claim* claim);

// The row its next token is drawn with at decode step `step`: its sampling (the logit biases' span set
// at creation), the tokens streamed so far for the penalties, its logprobs and grammar.
DrawRow draw_row(const StreamedRequest& r, uint64_t step);

// The first token, drawn by the last prefill stage under the same params: its logprobs must have come when
// the request asks for them, and the grammar advances past it. Errors say which.
Status take_first_token(StreamedRequest& r, int32_t token, const std::vector<protocol::TokenLogprobs>& logprobs);

// Records `token`, sends its TOKENS to the router (when the node has one; `who` names the node in the
// warning when it cannot be sent) and says whether the request ends with it: a stop id or a closed JSON
// document (Stop), max_tokens (Length), else None.
protocol::FinishReason stream_token(StreamedRequest& r, int32_t token, std::vector<protocol::TokenLogprobs> logprobs,
                                    transfer::DecodeDriver& driver, const DecodeRankOptions& o, const std::string& who);

// A request the node cannot continue: ABORT through the state machine (its prefill stages hear it), and
// FAILED with `why` to the router, which the state machine does not tell about an end that started here.
// The caller forgets the request afterwards (its after-driver step and drop).
void end_here(transfer::DecodeDriver& driver, const DecodeRankOptions& o, uint64_t id, const std::string& who,
              const std::string& why);

}  // namespace k3::decode
