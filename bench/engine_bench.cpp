// `k3-bench engine`: the whole model on one GPU through the engine (engine/engine.h).
//   decode: tok/s per request and in total at each batch size and context, against the roofline of
//           the bytes one step must move (weights it touches + MLA latent KV + KDA state read and
//           written) at the copy bandwidth measured in the same run; eager steps against CUDA-graph
//           steps, the launches one eager step makes, and the step's device time by layer type;
//   prefill: tok/s of one prompt of each length, against the bf16 GEMM rate of the same run;
//   gemm: the fixed-order (batch-invariant) GEMM against cuBLASLt at decode and prefill shapes;
//   moe: the routed experts in each mode and grouped-GEMM form (bench/moe_table.h).
// Weights are the preset's synthetic model (drawn on the GPU where they live, the numbers
// `--model synthetic:PRESET[:SEED]` and k3-genweights give); the caches of a decode benchmark are left as allocated (zeros), their lengths set
// without a prefill: timing only, the tokens are meaningless.
#include <CLI/CLI.hpp>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "bench/bench_commands.h"
#include "bench/engine_profile.h"
#include "bench/kernel_timing.h"
#include "bench/kernels_bench.h"
#include "bench/moe_table.h"
#include "engine/engine.h"
#include "common/model/weights_init.h"
#include "kernels/backend_select.h"

namespace k3::bench {
namespace {

struct EngineBenchOptions {
  std::string preset = "k3-small";
  int layers = 0;  // 0: the preset's
  int device = 0;
  std::vector<int> batches = {1, 8, 64, 256};
  std::vector<int> contexts = {1024, 8192};
  std::vector<int> prefill = {8192, 32768};
  int steps = 10;
  bool batch_invariant = false;
  bool kda_decode_as_steps = true;  // batch-invariant decode steps through the fused KDA kernel
  int moe_grouped_form = 0;          // 0 by the grid, 1 wide, 2 narrow (CudaBackend::set_moe_grouped_form)
  bool profile = true;  // decode time split by layer type
  bool gemm_only = false;  // the GEMM table alone
  std::vector<std::string> gemm_shapes;  // "NxK" of the GEMM tables (empty: hidden x hidden)
  uint64_t seed = 0;     // of the synthetic weights
};

using Clock = std::chrono::steady_clock;
double seconds_since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

// y = x w^T at M x N x K: cuBLASLt against the fixed-order form, each timed two ways. Host-timed: 50
// calls between two synchronisations, what a caller outside a graph sees (at small M that is the
// host's time per call as much as the GPU's). Graph-timed (CUDA): the median device time of one call
// replayed from a CUDA graph, what a recorded decode step pays.
void print_gemm_table(Backend& be, int64_t N, int64_t K) {
  std::printf("| GEMM M x %lld x %lld | cuBLASLt (us) | fixed-order (us) | fixed / cuBLASLt | fixed TFLOP/s "
              "| cuBLASLt, graph (us) | fixed-order, graph (us) | fixed / cuBLASLt, graph |\n"
              "|---|---:|---:|---:|---:|---:|---:|---:|\n",
              (long long)N, (long long)K);
  for (int64_t M : {1, 8, 64, 128, 256, 1024, 2048, 8192}) {
    Tensor x = be.alloc({M, K}, DType::BF16), w = be.alloc({N, K}, DType::BF16), y = be.alloc({M, N}, DType::BF16);
    auto call = [&] { be.gemm({.x = x, .w = w, .y = y}); };
    double host[2], graph[2] = {0, 0};
    for (int inv = 0; inv < 2; ++inv) {
      be.set_batch_invariant(inv == 1);
      for (int i = 0; i < 3; ++i) call();
      be.synchronize();
      const auto t0 = Clock::now();
      const int reps = 50;
      for (int i = 0; i < reps; ++i) call();
      be.synchronize();
      host[inv] = seconds_since(t0) * 1e6 / reps;
#ifdef K3_HAVE_CUDA
      if (auto* cb = dynamic_cast<cuda::CudaBackend*>(&be)) graph[inv] = time_graphs(cb->stream(), 50, {call});
#endif
    }
    std::printf("| %lld | %.1f | %.1f | %.2f | %.0f |", (long long)M, host[0], host[1], host[1] / host[0],
                2.0 * double(M) * double(N) * double(K) / host[1] / 1e6);
    if (graph[0] > 0) std::printf(" %.1f | %.1f | %.2f |\n", graph[0], graph[1], graph[1] / graph[0]);
    else std::printf(" - | - | - |\n");
  }
  std::printf("\n");
}

// The prefill benches' prompt of P tokens: ids spread over the vocabulary, the same every run.
std::vector<int32_t> bench_prompt(const ModelConfig& cfg, int P) {
  std::vector<int32_t> prompt(P);
  for (int i = 0; i < P; ++i) prompt[i] = (i * 131 + 7) % cfg.vocab_size;
  return prompt;
}

// Bytes of weights one decode step reads for B requests: everything but the embedding table, the
// routed experts only as many as B*k draws touch (uniform routing: E (1 - (1 - k/E)^B) per layer).
double decode_weight_bytes(const ModelConfig& cfg, int B) {
  double bytes = 0, expert_bytes = 0;
  for (const TensorSpec& s : expected_tensors(cfg)) {
    if (s.name == "model.embed_tokens.weight") continue;
    const double n = double(shape_numel(s.shape));
    if (s.name.find(".experts.") != std::string::npos) expert_bytes += n * 2;
    else bytes += n * (init_dtype(s, DType::BF16) == DType::F32 ? 4 : 2);
  }
  const double E = cfg.num_experts, k = cfg.num_experts_per_token;
  const double touched = E > 0 ? E * (1.0 - std::pow(1.0 - k / E, B)) / E : 0.0;
  return bytes + expert_bytes * touched;
}

// Per token, the parameters a prefill multiplies by (routed experts: k of E) and the attention FLOPs.
double prefill_flops(const ModelConfig& cfg, int64_t T) {
  double params = 0;
  for (const TensorSpec& s : expected_tensors(cfg)) {
    if (s.name == "model.embed_tokens.weight") continue;
    double n = double(shape_numel(s.shape));
    if (s.name.find(".experts.") != std::string::npos) n *= double(cfg.num_experts_per_token) / cfg.num_experts;
    params += n;
  }
  int mla = 0;
  for (int l = 0; l < cfg.num_hidden_layers; ++l) mla += cfg.layer_kind(l) == LayerKind::Mla;
  const double dqk = cfg.qk_nope_head_dim + cfg.qk_rope_head_dim, dv = cfg.v_head_dim;
  const double attn = double(mla) * cfg.num_attention_heads * (dqk + dv) * double(T) * double(T);  // causal: 2*T^2/2
  return 2.0 * params * double(T) + attn;
}

int run_engine_bench(const EngineBenchOptions& o) {
  std::setvbuf(stdout, nullptr, _IOLBF, 0);  // a crash mid-run keeps the rows already measured
  auto cfg_r = preset_config(o.preset);
  if (!cfg_r.is_ok()) {
    std::fprintf(stderr, "k3-bench engine: %s\n", cfg_r.status().to_string().c_str());
    return 2;
  }
  ModelConfig cfg = *cfg_r;
  std::vector<std::pair<int64_t, int64_t>> gemm_shapes;  // (N, K) of the GEMM tables
  for (const std::string& nk : o.gemm_shapes) {
    long long n = 0, k = 0;
    char tail = 0;
    if (std::sscanf(nk.c_str(), "%lldx%lld%c", &n, &k, &tail) != 2 || n <= 0 || k <= 0) {
      std::fprintf(stderr, "k3-bench engine: --gemm-shapes: '%s' is not NxK with positive N and K\n", nk.c_str());
      return 2;
    }
    gemm_shapes.emplace_back(n, k);
  }
  if (gemm_shapes.empty()) gemm_shapes.emplace_back(cfg.hidden_size, cfg.hidden_size);
  if (o.layers > 0) {
    cfg.num_hidden_layers = o.layers;
    cfg.attn_res_block_size = std::min(cfg.attn_res_block_size, o.layers);
    fill_k3_layer_pattern(cfg);
  }
  auto be_r = make_backend({.kind = "cuda", .device = o.device, .batch_invariant = false});  // ceilings on cuBLASLt
  if (!be_r.is_ok()) {
    std::fprintf(stderr, "k3-bench engine: %s\n", be_r.status().to_string().c_str());
    return 2;
  }
  Backend& be = **be_r;
  const BenchCeilings c = measure_bench_ceilings(be, false);
  std::printf("## k3-bench engine: %s, %d layers, %s\n", o.preset.c_str(), cfg.num_hidden_layers,
              o.batch_invariant ? "batch-invariant GEMMs" : "cuBLASLt GEMMs");
  std::printf("ceilings: copy %.0f GB/s (read+write), bf16 GEMM %.0f TFLOP/s\n\n", c.copy_bytes_per_us / 1e3,
              c.gemm_flops_per_us / 1e6);

  // GEMM cost of batch invariance: fixed-order kernel vs cuBLASLt at decode and prefill row counts.
  for (const auto& [n, k] : gemm_shapes) print_gemm_table(be, n, k);
  // And of the routed experts, where the mode swaps the per-row decode kernel for the grouped GEMM.
  print_moe_table(be, cfg, c.copy_bytes_per_us);
  if (o.gemm_only) return 0;
  be.set_batch_invariant(o.batch_invariant);
#ifdef K3_HAVE_CUDA
  if (auto* cb = dynamic_cast<cuda::CudaBackend*>(&be)) {
    cb->set_kda_decode_matches_steps(o.kda_decode_as_steps);
    cb->set_moe_grouped_form(o.moe_grouped_form);
  }
#endif
  std::printf("kernel switches: kda_decode as the steps %s, grouped MoE form %d (0: by the grid)\n\n",
              o.kda_decode_as_steps ? "on" : "off", o.moe_grouped_form);

  const int bmax = *std::max_element(o.batches.begin(), o.batches.end());
  const int cmax = *std::max_element(o.contexts.begin(), o.contexts.end());
  const int pmax = *std::max_element(o.prefill.begin(), o.prefill.end());
  const WeightStore weights = WeightStore::synthetic({.cfg = cfg, .seed = o.seed, .matrix_dtype = DType::BF16});
  EngineOptions eo;
  eo.top_logits = 0;
  eo.prefill_chunk = 8192;
  eo.cache.max_seqs = bmax;
  eo.cache.page_size = 64;
  eo.cache.num_pages = std::max(bmax * ((cmax + 3 * o.steps + 8 + 63) / 64 + 1), (pmax + 63) / 64 + 1);
  const auto t_load = Clock::now();
  auto engine_r = Engine::create(be, cfg, weights, eo);
  if (!engine_r.is_ok()) {
    std::fprintf(stderr, "k3-bench engine: %s\n", engine_r.status().to_string().c_str());
    return 2;
  }
  Engine& e = **engine_r;
  be.synchronize();
  std::printf("model upload + cache pools: %.1f s (%d pages of 64 tokens, %d slots)\n\n", seconds_since(t_load),
              eo.cache.num_pages, eo.cache.max_seqs);

  int kda = 0, mla = 0;
  for (int l = 0; l < cfg.num_hidden_layers; ++l) (cfg.layer_kind(l) == LayerKind::Mla ? mla : kda)++;
  const double kv_row = double(mla) * cfg.mla_cache_width() * 2;
  const double state = double(kda) * cfg.kda.num_heads * cfg.kda.head_dim * cfg.kda.head_dim * 4;
  std::printf("| decode: batch | context | step eager (ms) | step graph (ms) | tok/s per request | tok/s total | "
              "roofline step (ms) | roofline fraction | launches per eager step |\n"
              "|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n");
  std::vector<std::string> splits;
  for (int ctx : o.contexts)
    for (int B : o.batches) {
      std::vector<SeqCache> seqs;
      std::vector<SeqCache*> ptrs;
      for (int i = 0; i < B; ++i) {
        seqs.push_back(e.open().value());
        (void)e.caches().reserve(seqs.back(), ctx + 3 * o.steps + 8);
        seqs.back().num_tokens = ctx;
      }
      for (auto& s : seqs) ptrs.push_back(&s);
      // A different token per request: identical rows would all route to the same experts and a MoE
      // step would read far fewer weights than the roofline assumes.
      std::vector<std::vector<int32_t>> toks;
      for (int i = 0; i < B; ++i) toks.push_back({static_cast<int32_t>((7 + 7919LL * i) % cfg.vocab_size)});
      std::vector<ops::SamplingRow> rows(B);
      std::vector<int32_t> ids;
      auto step = [&] {
        Tensor lg = e.feed_on_backend(ptrs, toks).value();
        be.sample({.logits = lg, .rows = rows, .out = &ids});  // the one read-back of a step
      };
      // Eager, then graphs (first step of a bucket eager, second records, the rest replay).
      double dt[2] = {0, 0};
      for (int graphs = 0; graphs < 2; ++graphs) {
        e.decode_step().set_graphs(graphs == 1);
        step();
        step();
        const auto t0 = Clock::now();
        for (int i = 0; i < o.steps; ++i) step();
        dt[graphs] = seconds_since(t0) / o.steps;
      }
      const int64_t launches = e.decode_step().stats().last_nodes;
      const double bytes = decode_weight_bytes(cfg, B) + double(B) * (ctx + o.steps) * kv_row + 2.0 * B * state;
      const double roof = bytes / c.copy_bytes_per_us / 1e6;
      std::printf("| %d | %d | %.2f | %.2f | %.1f | %.0f | %.2f | %.2f | %lld |\n", B, ctx, dt[0] * 1e3, dt[1] * 1e3,
                  1.0 / dt[1], B / dt[1], roof * 1e3, roof / dt[1], (long long)launches);
      std::fflush(stdout);
      if (o.profile) {
        const PhaseSplit ps = profile_decode_step(e, ptrs, toks, 5);
        char line[512];
        if (ps.ok) {
          double sum = 0;
          for (double v : ps.ms) sum += v;
          std::snprintf(line, sizeof line, "| %d | %d | %.3f | %.3f | %.3f | %.3f | %.3f | %.3f | %.3f | %lld / %lld / %lld / %lld / %lld |",
                        B, ctx, ps.ms[1], ps.ms[2], ps.ms[3], ps.ms[4], ps.ms[0], sum, ps.total_ms, (long long)ps.nodes[1],
                        (long long)ps.nodes[2], (long long)ps.nodes[3], (long long)ps.nodes[4], (long long)ps.nodes[0]);
        } else {
          std::snprintf(line, sizeof line, "| %d | %d | (backend cannot record) |", B, ctx);
        }
        splits.emplace_back(line);
      }
      e.decode_step().set_graphs(true);
      for (auto& s : seqs) e.close(s);
    }
  if (!splits.empty()) {
    std::printf("\ndecode step device time by layer type (ms; each type: all stretches replayed minus all but that "
                "type's)\n\n| batch | context | KDA | MLA | MoE | dense | rest | sum | replayed total | "
                "launches KDA / MLA / MoE / dense / rest |\n|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n");
    for (const auto& l : splits) std::printf("%s\n", l.c_str());
  }

  std::printf("\n| prefill: prompt | seconds | tok/s | TFLOP/s | fraction of bf16 GEMM peak |\n|---:|---:|---:|---:|---:|\n");
  for (int P : o.prefill) {
    const std::vector<int32_t> prompt = bench_prompt(cfg, P);
    SeqCache s = e.open().value();
    const auto t0 = Clock::now();
    Tensor lg = e.prefill_on_backend(s, prompt).value();
    be.synchronize();
    const double dt = seconds_since(t0);
    e.close(s);
    const double flops = prefill_flops(cfg, P);
    std::printf("| %d | %.2f | %.0f | %.1f | %.3f |\n", P, dt, P / dt, flops / dt / 1e12,
                flops / dt / 1e6 / c.gemm_flops_per_us);
    std::fflush(stdout);
  }
  if (o.profile) {
    std::printf("\nprefill time by layer type (ms; synchronised at each change of type, so launches count)\n\n"
                "| prompt | KDA | MLA | MoE | dense | rest | total |\n|---:|---:|---:|---:|---:|---:|---:|\n");
    for (int P : o.prefill) {
      const std::vector<int32_t> prompt = bench_prompt(cfg, P);
      SeqCache s = e.open().value();
      const PrefillSplit ps = profile_prefill(e, s, prompt);
      e.close(s);
      std::printf("| %d | %.1f | %.1f | %.1f | %.1f | %.1f | %.1f |\n", P, ps.ms[1], ps.ms[2], ps.ms[3], ps.ms[4],
                  ps.ms[0], ps.total_ms);
      std::fflush(stdout);
    }
  }
  return 0;
}

}  // namespace

void add_engine_command(CLI::App& app) {
  auto o = std::make_shared<EngineBenchOptions>();
  auto* cmd = app.add_subcommand("engine", "whole-model decode and prefill on one GPU against the roofline");
  cmd->add_option("--preset", o->preset, "model preset (default k3-small)");
  cmd->add_option("--layers", o->layers, "override the layer count (0 = the preset's)")->check(CLI::NonNegativeNumber);
  cmd->add_option("--device", o->device, "CUDA device")->check(CLI::NonNegativeNumber);
  cmd->add_option("--batches", o->batches, "decode batch sizes")->check(CLI::PositiveNumber);
  cmd->add_option("--contexts", o->contexts, "decode context lengths")->check(CLI::PositiveNumber);
  cmd->add_option("--prefill", o->prefill, "prefill prompt lengths")->check(CLI::PositiveNumber);
  cmd->add_option("--steps", o->steps, "timed decode steps per point")->check(CLI::PositiveNumber);
  cmd->add_option("--seed", o->seed, "seed of the synthetic weights (default 0)");
  cmd->add_flag("--batch-invariant", o->batch_invariant, "fixed-order GEMMs and fixed attention splits");
  cmd->add_flag("!--kda-decode-separate", o->kda_decode_as_steps,
                "with --batch-invariant: decode tokens take the separate KDA steps instead of the fused kernel "
                "(which rounds and sums as they do, the default)");
  cmd->add_option("--moe-grouped-form", o->moe_grouped_form, "grouped MoE GEMM form: 0 by the grid (default), 1 wide, "
                  "2 narrow")->check(CLI::Range(0, 2));
  cmd->add_flag("--gemm-only", o->gemm_only,
                "print the GEMM tables (fixed-order vs cuBLASLt) and the routed experts' table (each mode and "
                "grouped-GEMM form) and stop");
  cmd->add_option("--gemm-shapes", o->gemm_shapes, "N x K of the GEMM tables, as NxK (default: the preset's hidden size twice)");
  cmd->add_flag("!--no-profile", o->profile, "skip the decode and prefill time split by layer type");
  cmd->callback([o] {
    const int rc = run_engine_bench(*o);
    if (rc != 0) throw CLI::RuntimeError(rc);
  });
}

}  // namespace k3::bench
