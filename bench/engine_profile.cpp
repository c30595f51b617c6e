#include "bench/engine_profile.h"

#include <chrono>
#include <memory>
#include <utility>

namespace k3::bench {

const char* phase_name(int type) {
  static const char* const names[] = {"rest", "KDA", "MLA", "MoE", "dense"};
  return type >= 0 && type < PhaseSplit::kTypes ? names[type] : "?";
}

PhaseSplit profile_decode_step(Engine& e, std::span<SeqCache* const> seqs,
                               std::span<const std::vector<int32_t>> tokens, int reps) {
  Backend& be = e.backend();
  PhaseSplit out;
  std::vector<std::pair<int, std::unique_ptr<StepGraph>>> segs;
  int current = -1;  // the type being recorded, -1: none
  bool failed = false;
  e.model().set_phase_hook([&](LayerPhase p) {
    if (failed) return;
    if (current >= 0) {
      segs.emplace_back(current, be.end_capture());
      current = -1;
    }
    if (p != LayerPhase::End) {
      if (!be.begin_capture(false)) {
        failed = true;
        return;
      }
      current = static_cast<int>(p);
    }
  });
  const bool graphs = e.decode_step().graphs();
  e.decode_step().set_graphs(false);  // the step must run its forward (recorded stretch by stretch)
  try {
    (void)e.feed_on_backend(seqs, tokens).value();
  } catch (...) {
    if (current >= 0) be.abandon_capture();
    e.model().set_phase_hook(nullptr);
    e.decode_step().set_graphs(graphs);
    throw;
  }
  e.model().set_phase_hook(nullptr);
  e.decode_step().set_graphs(graphs);
  if (failed || segs.empty()) return out;

  using Clock = std::chrono::steady_clock;
  auto replay = [&](int skip) {
    for (auto& [type, g] : segs)
      if (type != skip) g->launch();  // warm
    be.synchronize();
    const auto t0 = Clock::now();
    for (int r = 0; r < reps; ++r)
      for (auto& [type, g] : segs)
        if (type != skip) g->launch();
    be.synchronize();
    return std::chrono::duration<double, std::milli>(Clock::now() - t0).count() / reps;
  };
  out.total_ms = replay(-1);
  for (int t = 0; t < PhaseSplit::kTypes; ++t) {
    bool any = false;
    for (auto& [type, g] : segs)
      if (type == t) {
        any = true;
        out.nodes[t] += g->nodes();
      }
    out.ms[t] = any ? out.total_ms - replay(t) : 0.0;
  }
  out.ok = true;
  return out;
}

PrefillSplit profile_prefill(Engine& e, SeqCache& seq, std::span<const int32_t> prompt) {
  using Clock = std::chrono::steady_clock;
  Backend& be = e.backend();
  PrefillSplit out;
  int current = static_cast<int>(LayerPhase::Rest);
  be.synchronize();
  const auto t_begin = Clock::now();
  auto mark = t_begin;
  e.model().set_phase_hook([&](LayerPhase p) {
    be.synchronize();
    const auto now = Clock::now();
    out.ms[static_cast<size_t>(current)] += std::chrono::duration<double, std::milli>(now - mark).count();
    mark = now;
    current = p == LayerPhase::End ? static_cast<int>(LayerPhase::Rest) : static_cast<int>(p);
  });
  auto result = e.prefill_on_backend(seq, prompt);
  e.model().set_phase_hook(nullptr);
  (void)result.value();
  be.synchronize();
  const auto end = Clock::now();
  out.ms[static_cast<size_t>(current)] += std::chrono::duration<double, std::milli>(end - mark).count();
  out.total_ms = std::chrono::duration<double, std::milli>(end - t_begin).count();
  return out;
}

}  // namespace k3::bench
