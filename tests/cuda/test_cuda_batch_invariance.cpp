// Batch invariance on the GPU (CudaBackend::set_batch_invariant): a request's logits are bitwise the
// same when it runs alone and when it shares every forward with 7 other requests of other lengths,
// in the batched prefill and in each of 6 batched decode steps (which also changes the attention
// split count: the others' contexts run to 2000 tokens). Prefill chunking (1/63/64/65/1000 tokens
// per forward) runs different kernels (KDA chunk boundaries, one-token decode kernels for chunk 1),
// so there the differences are measured and printed, not required to be zero.
#include <catch2/catch.hpp>

#include <cmath>
#include <cstdio>
#include <cstring>

#include "engine/engine.h"
#include "tests/cuda/cuda_test_util.h"
#include "tests/cuda/engine_rig.h"

using namespace k3;
using namespace k3::cudatest;

namespace {

constexpr int kSteps = 6;

// Logits of request 0 after its prompt and after each of kSteps forced decode tokens, with the
// other prompts batched beside it in every forward.
std::vector<std::vector<float>> run(Engine& e, const std::vector<std::vector<int32_t>>& prompts, int chunk) {
  const int n = static_cast<int>(prompts.size());
  std::vector<SeqCache> seqs;
  for (int i = 0; i < n; ++i) seqs.push_back(e.open().value());
  std::vector<SeqCache*> ptrs;
  for (auto& s : seqs) ptrs.push_back(&s);
  std::vector<std::vector<float>> out;
  const int64_t V = e.config().vocab_size;
  auto keep = [&](const Tensor& lg) { out.emplace_back(lg.f32(), lg.f32() + V); };
  if (chunk == 0) {
    keep(e.feed(ptrs, prompts).value());
  } else {
    REQUIRE(n == 1);
    keep(e.prefill(seqs[0], prompts[0]).value());
  }
  for (int step = 0; step < kSteps; ++step) {
    std::vector<std::vector<int32_t>> toks(n, std::vector<int32_t>{int32_t((step * 37 + 11) % V)});
    keep(e.feed(ptrs, toks).value());
  }
  for (auto& s : seqs) e.close(s);
  return out;
}

std::unique_ptr<Engine> engine(Backend& be, const ModelConfig& cfg, const WeightStore& w, int chunk) {
  EngineOptions o;
  o.cache = {.max_seqs = 8, .page_size = 16, .num_pages = 8 * 160};
  o.prefill_chunk = chunk;
  o.top_logits = 0;
  return Engine::create(be, cfg, w, o).value();
}

double max_diff(const std::vector<float>& a, const std::vector<float>& b) {
  double m = 0;
  for (size_t i = 0; i < a.size(); ++i) m = std::max(m, double(std::fabs(a[i] - b[i])));
  return m;
}

}  // namespace

TEST_CASE("CUDA batch invariance: alone == in a batch of 8, bitwise; chunk sizes measured", "[cuda][engine]") {
  K3_GPU_OR_SKIP(bk);
  bk.gpu->set_batch_invariant(true);
  for (const auto& [label, base] : {std::pair{"k3-tiny", preset_config("k3-tiny").value()},
                                    std::pair{"k3-tiny/K3-heads", tiny_with_k3_heads()}}) {
    ModelConfig cfg = base;
    cfg.vocab_size = 2048;
    const WeightStore w = random_weights(cfg, 13, DType::BF16);
    std::vector<std::vector<int32_t>> prompts;
    const int lens[8] = {1100, 17, 2000, 64, 300, 1, 999, 513};
    for (int i = 0; i < 8; ++i) prompts.push_back(random_prompts(1, lens[i], cfg.vocab_size, 100 + i)[0]);
    auto e = engine(*bk.gpu, cfg, w, 0);
    const auto alone = run(*e, {prompts[0]}, 0);
    const auto batched = run(*e, prompts, 0);
    INFO(label);
    for (size_t s = 0; s < alone.size(); ++s) {
      INFO("forward " << s << " (0 = prefill)");
      REQUIRE(std::memcmp(alone[s].data(), batched[s].data(), alone[s].size() * sizeof(float)) == 0);
    }
    std::printf("BATCH-INVARIANT %s: prefill + %d decode steps of a 1100-token request bitwise equal alone and "
                "in a batch of 8\n", label, kSteps);
    for (const int chunk : {1, 63, 64, 65, 1000}) {
      auto ec = engine(*bk.gpu, cfg, w, chunk);
      const auto chunked = run(*ec, {prompts[0]}, chunk);
      double d = 0;
      bool bitwise = true;
      for (size_t s = 0; s < alone.size(); ++s) {
        d = std::max(d, max_diff(chunked[s], alone[s]));
        bitwise = bitwise && std::memcmp(chunked[s].data(), alone[s].data(), alone[s].size() * 4) == 0;
      }
      std::printf("BATCH-INVARIANT %s: prefill chunk %d vs whole prompt: %s, max |logit diff| %.5f\n", label, chunk,
                  bitwise ? "bitwise equal" : "differs", d);
    }
  }
}
