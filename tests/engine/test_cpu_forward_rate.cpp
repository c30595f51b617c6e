// The CPU engine's prefill rate at k3-small's widths (opt-in: engine_test_cpu_forward_rate "[perf]").
// The fp32 CPU forward is the reference the GPU engine is checked against; for k3-small that is a
// teacher-forced prefill of 8 prompts x 512 positions over 93 layers, too large for a test here.
// This runs the first K3_RATE_LAYERS layers (default 4: the dense layer, three KDA, one MLA; the
// MoE after every KDA/MLA but the first) of the real k3-small config (vocabulary cut to 2048, as in
// the GPU comparison) on a prefill of 8 x K3_RATE_POSITIONS tokens (default 128), times every
// stretch of the forward by type (Model::set_phase_hook), and extrapolates to all 93 layers and to
// 8 x 512 positions on C cores (C = K3_RATE_CORES, default 16) as layers-of-each-kind x measured
// CPU time per layer, positions scaled linearly (attention's quadratic part is small at 512: the
// figure is a lower bound). Threads: K3_THREADS (default all cores).
#include <catch2/catch.hpp>

#include <array>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <random>

#include "engine/model.h"
#include "kernels/backend.h"
#include "kernels/cpu/thread_pool.h"

using namespace k3;

namespace {

int env_int(const char* name, int fallback) {
  const char* v = std::getenv(name);
  return v ? std::atoi(v) : fallback;
}

double now_s() { return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count(); }

// CPU time of the whole process (all pool threads), for the rate per busy core on a shared host.
double process_cpu_s() {
  timespec ts{};
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return double(ts.tv_sec) + 1e-9 * double(ts.tv_nsec);
}

constexpr std::array<const char*, 5> kPhaseNames = {"rest", "KDA", "MLA", "MoE", "dense"};

}  // namespace

TEST_CASE("CPU prefill rate at k3-small widths, extrapolated to the 8 x 512 reference", "[.][perf]") {
  const int probe_layers = env_int("K3_RATE_LAYERS", 4), positions = env_int("K3_RATE_POSITIONS", 128);
  const int cores = env_int("K3_RATE_CORES", 16), prompts = 8;
  REQUIRE(probe_layers >= 2);
  REQUIRE(positions >= 1);
  ModelConfig cfg = preset_config("k3-small").value();
  cfg.vocab_size = 2048;
  cfg.eos_token_ids.clear();
  REQUIRE(probe_layers <= cfg.num_hidden_layers);
  auto be = make_cpu_backend({.threads = 0});
  const WeightStore w = WeightStore::synthetic({.cfg = cfg, .seed = 11, .matrix_dtype = DType::BF16});
  double t0 = now_s();
  auto model = Model::create(*be, cfg, w, 0, probe_layers).value();
  const double setup_s = now_s() - t0;

  const int page = 16;
  CachePools pools(*be, cfg, 0, probe_layers,
                   {.max_seqs = prompts, .page_size = page, .num_pages = prompts * ((positions + page - 1) / page) + 1});
  std::vector<SeqCache> seqs;
  std::vector<BatchItem> batch;
  std::vector<int32_t> ids;
  std::mt19937 rng(5);
  std::uniform_int_distribution<int32_t> tok(0, cfg.vocab_size - 1);
  for (int i = 0; i < prompts; ++i) seqs.push_back(pools.open().value());
  for (int i = 0; i < prompts; ++i) {
    REQUIRE(pools.reserve(seqs[i], positions).is_ok());
    batch.push_back({.seq = &seqs[i], .num_new = positions});
    for (int t = 0; t < positions; ++t) ids.push_back(tok(rng));
  }

  // Per stretch type: wall seconds and process CPU seconds (on a shared host the wall clock also
  // counts time the threads waited for a core; the estimate uses CPU time).
  std::array<double, 5> phase_s{}, phase_cpu{};
  int current = 0;
  double mark = now_s(), mark_cpu = process_cpu_s();
  auto close_stretch = [&] {
    const double t = now_s(), c = process_cpu_s();
    phase_s[current] += t - mark;
    phase_cpu[current] += c - mark_cpu;
    mark = t;
    mark_cpu = c;
  };
  model->set_phase_hook([&](LayerPhase p) {
    close_stretch();
    current = p == LayerPhase::End ? 0 : static_cast<int>(p);
  });
  const double c0 = process_cpu_s();
  t0 = now_s();
  mark = t0;
  mark_cpu = c0;
  Activations act = model->embed(ids);
  model->forward(batch, act, pools);
  const double wall = now_s() - t0, cpu = process_cpu_s() - c0;
  close_stretch();
  model->set_phase_hook(nullptr);
  // The forward's output is finite (a rate of a broken forward means nothing).
  const Tensor out = be->to_host(act.partial);
  for (int64_t i = 0; i < out.numel(); i += 997) REQUIRE(std::isfinite(out.f32()[i]));
  for (auto& s : seqs) pools.close(s);

  // Layers of each kind in the probe and in the whole model.
  std::array<int, 5> probe{}, whole{};
  for (int l = 0; l < cfg.num_hidden_layers; ++l) {
    const int attn = cfg.layer_kind(l) == LayerKind::Kda ? 1 : 2, ffn = cfg.is_dense_ffn(l) ? 4 : 3;
    ++whole[attn];
    ++whole[ffn];
    if (l < probe_layers) {
      ++probe[attn];
      ++probe[ffn];
    }
  }
  probe[0] = probe_layers;
  whole[0] = cfg.num_hidden_layers;
  const int threads = cpu::resolve_thread_count(0);  // what make_cpu_backend({.threads = 0}) took
  const double tokens = double(prompts) * positions, want_tokens = prompts * 512.0;
  double whole_s = 0;
  std::printf("CPU-RATE k3-small widths, layers [0, %d), %d x %d tokens, %d thread(s): forward %.2f s wall, %.2f s "
              "process CPU (%.0f tok/s), set-up %.1f s\n",
              probe_layers, prompts, positions, threads, wall, cpu, tokens / wall, setup_s);
  for (int k = 0; k < 5; ++k) {
    if (probe[k] == 0) continue;
    const double cpu_per_layer_token = phase_cpu[k] / probe[k] / tokens;
    whole_s += cpu_per_layer_token * whole[k] * want_tokens;
    std::printf("CPU-RATE   %-5s %d layer(s) here, %2d in k3-small: %.3f s wall, %.3f s CPU here, %.1f us CPU per "
                "layer-token\n",
                kPhaseNames[k], probe[k], whole[k], phase_s[k], phase_cpu[k], 1e6 * cpu_per_layer_token);
  }
  // Core-seconds -> `cores` on the GPU host, assuming the per-core rate holds and the work splits
  // evenly (a lower bound: no memory-bandwidth limit, no serial stretch).
  std::printf("CPU-RATE estimate for k3-small 8 x 512 teacher-forced prefill: %.0f core-seconds, %.0f s on %d cores "
              "(forward only; measured here with %d thread(s))\n",
              whole_s, whole_s / cores, cores, threads);
  std::fflush(stdout);
  REQUIRE(whole_s > 0);
}
