#include "decode_node/streamed_request.h"

#include <spdlog/spdlog.h>

#include <algorithm>

#include "engine/sampling_wire.h"

namespace k3::decode {

Result<StreamedRequest> streamed_request(uint64_t id, const DecodeRankOptions& o, const protocol::Claim* claim) {
  StreamedRequest r{.id = id};
  r.sampling = o.sampling;
  r.max_tokens = o.max_tokens;
  r.stop_ids = o.stop_ids;
  if (!claim || claim->sampling.max_tokens == 0) return r;
  const protocol::SamplingParams& sp = claim->sampling;
  r.sampling = sampling_row(sp);
  r.logit_bias = logit_biases(sp);
  r.sampling.logit_bias = r.logit_bias;  // the buffer moves with the request: draw_row reads it, a batch copies it
  r.max_tokens = static_cast<int>(sp.max_tokens);
  r.stop_ids = sp.stop_token_ids;
  r.logprobs = sp.logprobs;
  auto constraint = grammar::TokenConstraint::for_format(sp.output_format, o.vocab, r.stop_ids);
  if (!constraint.is_ok())
    return Status(constraint.status().code(), "output format: " + constraint.status().message());
  r.constraint = std::move(constraint).value();
  return r;
}

DrawRow draw_row(const StreamedRequest& r, uint64_t step) {
  DrawRow row{.sampling = r.sampling, .logprobs = r.logprobs, .constraint = r.constraint.get()};
  row.sampling.step = step;
  row.sampling.generated = r.tokens;  // every token streamed so far, the first included
  return row;
}

Status take_first_token(StreamedRequest& r, int32_t token, const std::vector<protocol::TokenLogprobs>& logprobs) {
  if (r.logprobs >= 0 && logprobs.size() != 1)
    return internal_error("the last prefill stage sent no logprobs for the first token");
  if (r.constraint) return r.constraint->accept(token);
  return Status::ok();
}

protocol::FinishReason stream_token(StreamedRequest& r, int32_t token, std::vector<protocol::TokenLogprobs> logprobs,
                                    transfer::DecodeDriver& driver, const DecodeRankOptions& o, const std::string& who) {
  r.tokens.push_back(token);
  protocol::FinishReason why = protocol::FinishReason::None;
  // A closed JSON document ends the request: nothing may follow it but EOS.
  if (std::find(r.stop_ids.begin(), r.stop_ids.end(), token) != r.stop_ids.end() || (r.constraint && r.constraint->closed()))
    why = protocol::FinishReason::Stop;
  else if (static_cast<int>(r.tokens.size()) >= r.max_tokens)
    why = protocol::FinishReason::Length;
  if (!o.router_endpoint.empty()) {
    Status st = driver.send_to_router(
        protocol::Tokens{.request_id = r.id, .token_ids = {token}, .finish = why, .logprobs = std::move(logprobs),
                         .choice = r.choice});
    if (!st.is_ok()) spdlog::warn("{}: TOKENS for {} not sent: {}", who, r.id, st.to_string());
  }
  return why;
}

void end_here(transfer::DecodeDriver& driver, const DecodeRankOptions& o, uint64_t id, const std::string& who,
              const std::string& why) {
  driver.apply([&](transfer::DecodeSide& side, transfer::Millis now) {
    return side.on_abort(protocol::Abort{.request_id = id, .reason = protocol::AbortReason::Internal,
                                         .origin_role = protocol::Role::Decode, .origin_instance = o.instance_id},
                         now);
  });
  // The ABORT came from here, so the state machine tells nobody upstream: the router must hear it, or the
  // client's stream would wait forever.
  if (o.router_endpoint.empty()) return;
  Status st = driver.send_to_router(
      protocol::Failed{.request_id = id, .cause = protocol::AbortReason::Internal, .detail = who + ": " + why});
  if (!st.is_ok()) spdlog::warn("{}: FAILED for {} not sent: {}", who, id, st.to_string());
}

}  // namespace k3::decode
