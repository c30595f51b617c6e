// The whole model on the GPU against the CPU engine (the fp32 reference), teacher-forced: 8 prompts
// of 512 tokens, the first 256 positions as one batched prefill (KDA chunked form, MLA prefill), the
// other 256 as batched one-token decode steps (KDA decode, absorbed paged MLA decode). Weights are
// bf16 on both sides (the CPU widens the same values to fp32). Reported: the max logit error over
// every position. Required with every expert routed (k = E, see dense_routing): no non-finite logit,
// the error under 5% of the logit scale, and wherever the CPU's top-1 beats its top-2 by more than
// that error, the same top-1 on the GPU. With the presets' top-k routing the figures are reported.
// Also: the batch-invariant mode's paths against the same reference, and k3-small (opt-in, long).
#include <catch2/catch.hpp>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>

#include "kernels/cpu/thread_pool.h"
#include "tests/cuda/cuda_test_util.h"
#include "tests/cuda/engine_rig.h"

using namespace k3;
using namespace k3::cudatest;

namespace {

// Every expert selected (k = E): the router's top-k has no discontinuity, so the two backends differ
// only by bf16 rounding and the comparison is strict. With k < E a token whose expert scores nearly
// tie can pick a different expert set under bf16 activations, and its logits then differ by O(1):
// that is precision, not a defect, and is reported rather than bounded.
ModelConfig dense_routing(ModelConfig c) {
  c.num_experts_per_token = c.num_experts;
  return c;
}

// Prints the figures of one comparison and returns them (prefill: positions [0, prefill) came from
// the batched prefill forward, the rest from decode steps).
Agreement report(const std::string& label, const ForcedLogits& got, const ForcedLogits& ref, int prefill) {
  const Agreement a = compare(got, ref);
  int64_t top1_all = 0;
  double pre = 0, dec = 0;
  for (int64_t n = 0; n < ref.prompts; ++n)
    for (int64_t p = 0; p < ref.positions; ++p) {
      top1_all += top2(got.row(n, p), ref.vocab).first == top2(ref.row(n, p), ref.vocab).first;
      for (int64_t v = 0; v < ref.vocab; ++v) {
        const double e = std::fabs(got.row(n, p)[v] - ref.row(n, p)[v]);
        (p < prefill ? pre : dec) = std::max(p < prefill ? pre : dec, e);
      }
    }
  std::printf("GPU-ENGINE %s: positions %lld, max |logit err| %.5f (prefill %.5f, decode %.5f; logit scale %.3f, "
              "%.4f relative), decided positions %lld, top-1 agree there %lld, top-1 agree overall %lld, "
              "non-finite %lld\n",
              label.c_str(), (long long)a.positions, a.max_abs_err, pre, dec, a.logit_scale,
              a.max_abs_err / a.logit_scale, (long long)a.decided, (long long)a.agree, (long long)top1_all,
              (long long)a.nonfinite);
  std::fflush(stdout);
  return a;
}

// 8 prompts of `positions` tokens; the first `prefill` of them in one batched forward, the rest as
// batched decode steps.
Agreement run_engine(const std::string& label, ModelConfig cfg, Backends& bk, int positions = 512, int prefill = 256) {
  cfg.vocab_size = 2048;
  cfg.eos_token_ids.clear();
  const WeightStore w = random_weights(cfg, 11, DType::BF16);
  const auto prompts = random_prompts(8, positions, cfg.vocab_size, 5);
  const ForcedLogits ref = teacher_forced(*bk.cpu, cfg, w, prompts, prefill);
  const ForcedLogits got = teacher_forced(*bk.gpu, cfg, w, prompts, prefill);
  return report(label, got, ref, prefill);
}

void check_strict(const std::string& label, const ModelConfig& cfg, Backends& bk, int prefill = 256) {
  const Agreement a = run_engine(label, cfg, bk, 512, prefill);
  INFO(label);
  REQUIRE(a.nonfinite == 0);
  REQUIRE(a.max_abs_err < 0.05 * a.logit_scale);
  REQUIRE(a.decided > 0);
  REQUIRE(a.agree == a.decided);
}

}  // namespace

TEST_CASE("k3-tiny on CUDA equals the CPU engine, teacher-forced over 512 positions of 8 prompts", "[cuda][engine]") {
  K3_GPU_OR_SKIP(bk);
  check_strict("k3-tiny (k = E)", dense_routing(preset_config("k3-tiny").value()), bk);
  check_strict("k3-tiny/K3-heads (k = E)", dense_routing(tiny_with_k3_heads()), bk);
}

// Kimi Linear's unbounded softplus gate through the whole model: the batched prefill of 256 positions
// runs the chunked KDA kernel's unbounded-gate variant, strict as above.
TEST_CASE("kimi-linear-tiny (48B head shapes) on CUDA equals the CPU engine, teacher-forced", "[cuda][engine]") {
  K3_GPU_OR_SKIP(bk);
  check_strict("kimi-linear-tiny/48B-heads (k = E)", dense_routing(kimi_linear_tiny_with_48b_heads()), bk);
}

TEST_CASE("k3-tiny with top-k routing on CUDA: error and agreement reported", "[cuda][engine]") {
  K3_GPU_OR_SKIP(bk);
  for (const auto& [label, cfg] : {std::pair{"k3-tiny", preset_config("k3-tiny").value()},
                                   std::pair{"k3-tiny/K3-heads", tiny_with_k3_heads()}}) {
    const Agreement a = run_engine(label, cfg, bk);
    INFO(label);
    REQUIRE(a.nonfinite == 0);
  }
}

// The batch-invariant mode's own paths (KDA token recurrence for prompts, MLA prompt rows through the
// absorbed decode kernel, no fused KDA decode) against the same CPU reference, strict as above.
TEST_CASE("batch-invariant CUDA (chunk-invariant paths) equals the CPU engine, teacher-forced", "[cuda][engine]") {
  K3_GPU_OR_SKIP(bk);
  bk.gpu->set_batch_invariant(true);
  check_strict("k3-tiny/K3-heads, batch-invariant (k = E)", dense_routing(tiny_with_k3_heads()), bk);
  check_strict("k3-tiny/K3-heads, batch-invariant, all 512 in one prefill (k = E)", dense_routing(tiny_with_k3_heads()),
               bk, 512);
}

// k3-small (93 layers, the preset's top-4 of 32 routing) teacher-forced with every position of the
// 8 prompts in one prefill forward. The fp32 CPU reference costs ~7 GFLOP per position (~28 TFLOP
// for 8 x 512; its time on the GPU host is estimated in docs/PERF.md), so the test is opt-in
// ("[small]") and K3_FORCED_POSITIONS sets the positions per prompt (default 512). The CPU backend
// takes every core of the host (or K3_THREADS). The bound is the measured max logit error; wherever the CPU's top-1 beats
// its top-2 by more than it, the GPU's top-1 must be the same token. With top-k routing a near-tie
// of expert scores flips the expert set under bf16 activations (an O(1) logit change), so the bound
// is large and stated, not required to be small.
TEST_CASE("k3-small on CUDA against the CPU engine, teacher-forced prefill", "[.][cuda][engine][small]") {
  K3_GPU_OR_SKIP(bk);
  const char* env = std::getenv("K3_FORCED_POSITIONS");
  const int positions = env ? std::atoi(env) : 512;
  REQUIRE(positions > 0);
  ModelConfig cfg = preset_config("k3-small").value();
  cfg.vocab_size = 2048;
  cfg.eos_token_ids.clear();
  // Synthetic: each backend draws the matrices where they live (the CPU in parallel, the GPU on the
  // device; the same bits, cuda_test_cuda_weight_fill), so no 15 GB bf16 host copy is held beside the
  // CPU's 30 GB fp32 one (docs/PERF.md: the reference's memory).
  const WeightStore w = WeightStore::synthetic({.cfg = cfg, .seed = 11, .matrix_dtype = DType::BF16});
  const auto prompts = random_prompts(8, positions, cfg.vocab_size, 5);
  const auto t0 = std::chrono::steady_clock::now();
  const ForcedLogits ref = teacher_forced(*bk.cpu, cfg, w, prompts, positions);
  std::printf("GPU-ENGINE k3-small: CPU reference (%d threads, set-up included) over 8 x %d positions in %.1f s\n",
              cpu::resolve_thread_count(0), positions,
              std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  std::fflush(stdout);
  for (const bool invariant : {false, true}) {
    bk.gpu->set_batch_invariant(invariant);
    const ForcedLogits got = teacher_forced(*bk.gpu, cfg, w, prompts, positions);
    const Agreement a = report(invariant ? "k3-small, batch-invariant" : "k3-small", got, ref, positions);
    REQUIRE(a.nonfinite == 0);
    REQUIRE(a.positions == 8 * positions);
    REQUIRE(a.agree == a.decided);
  }
}

// Diagnosis (run explicitly: cuda_test_cuda_engine "[diag]"): the residual stream after each layer
// prefix [0, l), CUDA vs CPU, norm-relative, for one batched prefill of 2 prompts x 64 tokens.
TEST_CASE("layer-by-layer residual error, CUDA vs CPU", "[.][diag]") {
  K3_GPU_OR_SKIP(bk);
  for (const int np : {1, 2}) {
    const char* preset = "k3-tiny (k = E)";
    ModelConfig cfg = dense_routing(preset_config("k3-tiny").value());
    cfg.vocab_size = 2048;
    const WeightStore w = random_weights(cfg, 11, DType::BF16);
    const auto prompts = random_prompts(np, 64, cfg.vocab_size, 5);
    std::vector<int32_t> ids;
    for (const auto& p : prompts) ids.insert(ids.end(), p.begin(), p.end());
    for (int l = 1; l <= cfg.num_hidden_layers; ++l) {
      std::vector<Tensor> outs;
      for (Backend* be : {bk.cpu.get(), bk.gpu.get()}) {
        auto model = Model::create(*be, cfg, w, 0, l).value();
        CachePools pools(*be, cfg, 0, l, {.max_seqs = np, .page_size = 16, .num_pages = 16});
        std::vector<SeqCache> seqs;
        std::vector<BatchItem> batch;
        for (int i = 0; i < np; ++i) seqs.push_back(pools.open().value());
        for (int i = 0; i < np; ++i) {
          REQUIRE(pools.reserve(seqs[i], 64).is_ok());
          batch.push_back({.seq = &seqs[i], .num_new = 64});
        }
        Activations act = model->embed(ids);
        model->forward(batch, act, pools);
        outs.push_back(be->to_host(act.partial));
      }
      double num = 0, den = 0;
      for (int64_t i = 0; i < outs[0].numel(); ++i) {
        const double d = outs[1].f32()[i] - outs[0].f32()[i];
        num += d * d;
        den += double(outs[0].f32()[i]) * outs[0].f32()[i];
      }
      std::printf("DIAG %s prompts %d layers [0,%d) %s: residual rel err %.5f\n", preset, np, l,
                  cfg.layer_kind(l - 1) == LayerKind::Kda ? "KDA" : "MLA", std::sqrt(num / std::max(den, 1e-30)));
    }
  }
}
