#include "decode_node/draw_tokens.h"

#include "kernels/token_mask.h"

namespace k3::decode {

std::vector<Drawn> draw_tokens(Backend& backend, const Tensor& logits, std::span<const DrawRow> rows, int64_t vocab) {
  bool want = false;
  for (const DrawRow& r : rows) want |= r.logprobs >= 0;
  Tensor host;
  if (want) host = backend.to_host(logits);
  std::vector<Drawn> out(rows.size());
  TokenMask mask(vocab);
  for (size_t i = 0; i < rows.size(); ++i)
    if (grammar::TokenConstraint* c = rows[i].constraint) {
      const size_t k = mask.add_row(static_cast<int64_t>(i));
      if (c->fill_mask(mask.row_bits(k), vocab) == 0) {
        out[i].status = internal_error("constrained decoding: no token fits the grammar here");
        for (int32_t t = 0; t < vocab; ++t) mask.allow(k, t);
      }
    }
  if (!mask.empty()) apply_token_mask(logits, mask);
  std::vector<ops::SamplingRow> sampling;
  for (const DrawRow& r : rows) sampling.push_back(r.sampling);
  std::vector<int32_t> next;
  backend.sample({.logits = logits, .rows = sampling, .out = &next});
  for (size_t i = 0; i < rows.size(); ++i) {
    Drawn& d = out[i];
    d.token = next.at(i);
    if (d.status.is_ok() && rows[i].constraint) d.status = rows[i].constraint->accept(d.token);
    if (d.status.is_ok() && rows[i].logprobs >= 0)
      d.logprobs = row_logprobs(host.f32() + static_cast<int64_t>(i) * vocab, vocab, d.token, rows[i].logprobs);
  }
  return out;
}

}  // namespace k3::decode
