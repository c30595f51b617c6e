// A decode step's device time split by layer type (KDA attention, MLA attention, MoE FFN, dense FFN,
// the rest: embedding, norms, AttnRes mixes, adds, the LM head). The step is recorded as one graph
// per stretch of the forward (Model::set_phase_hook), nothing of it runs while recording; then the
// whole sequence of recordings is replayed, and again without the stretches of one type: the
// difference is that type's device time (the host only launches graphs, so the device stays busy).
#pragma once
#include <array>
#include <cstdint>
#include <span>
#include <vector>

#include "engine/engine.h"

namespace k3::bench {

struct PhaseSplit {
  static constexpr int kTypes = 5;  // LayerPhase Rest, Kda, Mla, Moe, Dense
  std::array<double, kTypes> ms{};       // device time per step
  std::array<int64_t, kTypes> nodes{};   // kernels/copies/memsets per step
  double total_ms = 0;                   // all recordings replayed back to back
  bool ok = false;                       // false: the backend cannot record (nothing measured)
};

// Runs one profiled decode step of `seqs` (the engine's decode step must be warm for this batch:
// run one step first). Advances num_tokens like any step; the step's results are not computed.
PhaseSplit profile_decode_step(Engine& e, std::span<SeqCache* const> seqs,
                               std::span<const std::vector<int32_t>> tokens, int reps);

// A prefill's time split by layer type: the backend is synchronised at every change of stretch, and
// each stretch's wall time (its launches and its device work) goes to its type. The syncs cost a few
// hundred round trips over a forward of seconds, so the split is a prefill's, not a decode step's.
struct PrefillSplit {
  std::array<double, PhaseSplit::kTypes> ms{};
  double total_ms = 0;
};
PrefillSplit profile_prefill(Engine& e, SeqCache& seq, std::span<const int32_t> prompt);

const char* phase_name(int type);

}  // namespace k3::bench
