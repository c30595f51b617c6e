// Engine's resumed prefill with in-pass KDA checkpoints (the prefix cache's half of the engine).
#include <algorithm>

#include "engine/engine.h"

namespace k3 {

Result<Tensor> Engine::prefill_planned_on_backend(SeqCache& seq, std::span<const int32_t> prompt,
                                                  std::span<const KdaCheckpoint> plan, int64_t stop_at) {
  const int64_t n = stop_at < 0 ? static_cast<int64_t>(prompt.size()) : std::min<int64_t>(stop_at, prompt.size());
  if (seq.num_tokens >= n) return invalid_argument("prefill: nothing left to compute (cached " +
                                                   std::to_string(seq.num_tokens) + " of " + std::to_string(n) + ")");
  const bool in_kernel = backend().supports("kda_chunk_checkpoints", {}).empty();
  const int64_t chunk = opts_.prefill_chunk;
  size_t next = 0;   // first plan entry not yet taken (earlier ones were taken by earlier calls)
  while (next < plan.size() && plan[next].pos <= seq.num_tokens) ++next;
  Tensor logits;
  while (seq.num_tokens < n) {
    const int64_t at = seq.num_tokens;
    // Feeds end where the full prefill's do (absolute multiples of prefill_chunk), so KDA chunks line up.
    int64_t end = chunk > 0 ? std::min(n, (at / chunk + 1) * chunk) : n;
    if (!in_kernel && next < plan.size()) end = std::min(end, plan[next].pos);
    std::vector<KdaCheckpoint> here;
    for (size_t j = next; j < plan.size() && plan[j].pos <= end; ++j) here.push_back(plan[j]);
    std::vector<std::vector<int32_t>> piece{{prompt.begin() + at, prompt.begin() + end}};
    std::vector<std::vector<KdaCheckpoint>> ckpts{in_kernel ? here : std::vector<KdaCheckpoint>{}};
    SeqCache* s = &seq;
    K3_ASSIGN_OR_RETURN(logits, run_step(std::span<SeqCache* const>(&s, 1), piece, ckpts));
    // Snapshot after the feed when the kernel could not take it inside: the feed ended right there.
    if (!in_kernel)
      for (const KdaCheckpoint& c : here) caches_->copy_slot(seq.slot, c.slot);
    next += here.size();
  }
  return logits;
}

}  // namespace k3
