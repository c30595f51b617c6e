// One decode step's tokens from its logits, for every request of the batch at once: the same for a plain
// decode rank (decode_batch.h) and a rank group's leader (group_leader.h), so both report the same
// logprobs and keep structured output to its grammar the same way.
//   1. logprobs, for the rows that ask, from the raw logits (copied to the host only then): they describe
//      the model, so they are taken before the mask changes the row;
//   2. each constrained row masked to the tokens its grammar allows next (a grammar with no token left is a
//      bug: that row fails, and stays drawable so the others' draws do not change);
//   3. one sampling call for the batch ((seed, step) per row);
//   4. each grammar advanced by its row's token; a token it refuses fails that row.
#pragma once
#include <cstdint>
#include <optional>
#include <span>
#include <vector>

#include "common/grammar/token_constraint.h"
#include "engine/token_logprobs.h"
#include "kernels/backend.h"

namespace k3::decode {

struct DrawRow {
  ops::SamplingRow sampling;                       // with the request's step
  int logprobs = -1;                               // >= 0: report the token's logprob and this many alternatives
  grammar::TokenConstraint* constraint = nullptr;  // structured output (not owned; may be null)
};

struct Drawn {
  int32_t token = 0;
  Status status;                                   // not ok: the row failed (its token must not be used)
  std::optional<RowLogprobs> logprobs;             // when the row asked
};

// `logits`: [rows.size(), vocab] F32 on the backend; masked in place.
std::vector<Drawn> draw_tokens(Backend& backend, const Tensor& logits, std::span<const DrawRow> rows, int64_t vocab);

}  // namespace k3::decode
