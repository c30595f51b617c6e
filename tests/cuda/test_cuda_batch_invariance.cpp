// Batch and chunk invariance on the GPU (CudaBackend::set_batch_invariant): a request's logits after
// its prompt and after each of 6 forced decode steps are bitwise the same
//   - alone and sharing every forward with 7 other requests of other lengths (the batched prefill and
//     batched decode steps; the others' contexts run to 2000 tokens, so the attention split count and
//     every GEMM's row count change), and
//   - with its prompt fed whole or in chunks of 64, 128 or 1024 tokens per forward (KDA takes whole
//     64-token blocks at absolute multiples of 64 through the chunked kernel and the other rows
//     through the token recurrence, MLA one absorbed row per token: engine/kda_heads.h).
// Cuts elsewhere (chunks of 1, 63, 65, 1000) are also bitwise for k3-tiny, whose KDA (D = 16) runs the
// recurrence everywhere; with K3's head shapes they move a block's rows to the recurrence, and the test
// reports how far that moves the logits. That is bounded with every expert routed; with top-k routing
// bf16 rounding flips a token's experts at near ties (O(1) logit changes), so it is only reported.
// For k3-tiny, k3-tiny with the K3 head shapes and k3-small (93 layers). k3-small's chunk-1 case runs
// a shorter prompt (one forward per token through 93 layers), compared with that prompt fed whole.
#include <catch2/catch.hpp>

#include <chrono>
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
using Logits = std::vector<std::vector<float>>;

// Logits of request 0 after its prompt and after each of kSteps forced decode tokens, the other
// prompts batched beside it in every forward. chunk > 0 (one request only): the prompt goes in
// forwards of `chunk` tokens, each its own feed, as a chunked prefill cuts it.
Logits run(Engine& e, const std::vector<std::vector<int32_t>>& prompts, int chunk) {
  const int n = static_cast<int>(prompts.size());
  std::vector<SeqCache> seqs;
  for (int i = 0; i < n; ++i) seqs.push_back(e.open().value());
  std::vector<SeqCache*> ptrs;
  for (auto& s : seqs) ptrs.push_back(&s);
  Logits out;
  const int64_t V = e.config().vocab_size;
  auto keep = [&](const Tensor& lg) { out.emplace_back(lg.f32(), lg.f32() + V); };
  if (chunk == 0) {
    keep(e.feed(ptrs, prompts).value());
  } else {
    REQUIRE(n == 1);
    const auto& p = prompts[0];
    Tensor last;
    for (size_t from = 0; from < p.size(); from += size_t(chunk)) {
      std::vector<std::vector<int32_t>> piece(1);
      piece[0].assign(p.begin() + from, p.begin() + std::min(p.size(), from + size_t(chunk)));
      last = e.feed(ptrs, piece).value();
    }
    keep(last);
  }
  for (int step = 0; step < kSteps; ++step) {
    std::vector<std::vector<int32_t>> toks(n, std::vector<int32_t>{int32_t((step * 37 + 11) % V)});
    keep(e.feed(ptrs, toks).value());
  }
  for (auto& s : seqs) e.close(s);
  return out;
}

double max_diff(const Logits& a, const Logits& b) {
  double m = 0;
  for (size_t s = 0; s < a.size(); ++s)
    for (size_t i = 0; i < a[s].size(); ++i) m = std::max(m, double(std::fabs(a[s][i] - b[s][i])));
  return m;
}

bool bitwise(const Logits& a, const Logits& b) {
  if (a.size() != b.size()) return false;
  for (size_t s = 0; s < a.size(); ++s)
    if (a[s].size() != b[s].size() || std::memcmp(a[s].data(), b[s].data(), a[s].size() * sizeof(float)) != 0)
      return false;
  return true;
}

// Seconds since `t0`, for the progress lines (a 93-layer run takes a while; the lines say where).
double since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// unaligned_bound: the largest logit difference a cut off the 64-token grid may make (0: must be
// bitwise; negative: reported only).
void check_model(const char* label, ModelConfig cfg, Backend& gpu, int chunk1_len, double unaligned_bound) {
  const auto t0 = std::chrono::steady_clock::now();
  cfg.vocab_size = 2048;
  const WeightStore w = random_weights(cfg, 13, DType::BF16);
  std::vector<std::vector<int32_t>> prompts;
  const int lens[8] = {1100, 17, 2000, 64, 300, 1, 999, 513};
  for (int i = 0; i < 8; ++i) prompts.push_back(random_prompts(1, lens[i], cfg.vocab_size, 100 + i)[0]);
  EngineOptions o;
  o.cache = {.max_seqs = 8, .page_size = 16, .num_pages = 8 * 160};
  o.top_logits = 0;
  auto e = Engine::create(gpu, cfg, w, o).value();
  std::printf("BATCH-INVARIANT %s: weights and engine ready at %.1f s\n", label, since(t0));
  std::fflush(stdout);
  INFO(label);
  const Logits alone = run(*e, {prompts[0]}, 0);
  const Logits batched = run(*e, prompts, 0);
  const bool same = bitwise(alone, batched);
  std::printf("BATCH-INVARIANT %s: alone vs batch of 8 (prefill + %d decode steps): %s, max |logit diff| %.6f "
              "(%.1f s)\n", label, kSteps, same ? "bitwise equal" : "DIFFERS", max_diff(alone, batched), since(t0));
  std::fflush(stdout);
  CHECK(same);
  for (const int chunk : {64, 128, 1024, 1, 63, 65, 1000}) {
    // Chunk 1 on a shorter prompt where one forward per token would be slow; its reference is that
    // prompt fed whole.
    const bool short_prompt = chunk == 1 && chunk1_len < lens[0];
    const std::vector<int32_t> p =
        short_prompt ? std::vector<int32_t>(prompts[0].begin(), prompts[0].begin() + chunk1_len) : prompts[0];
    const Logits ref = short_prompt ? run(*e, {p}, 0) : alone;
    const Logits got = run(*e, {p}, chunk);
    const bool equal = bitwise(got, ref);
    std::printf("BATCH-INVARIANT %s: %zu-token prompt in chunks of %d vs whole: %s, max |logit diff| %.6f (%.1f s)\n",
                label, p.size(), chunk, equal ? "bitwise equal" : "DIFFERS", max_diff(got, ref), since(t0));
    std::fflush(stdout);
    INFO("chunk " << chunk);
    if (chunk % 64 == 0 || unaligned_bound == 0) {
      CHECK(equal);
    } else if (unaligned_bound > 0) {
      CHECK(max_diff(got, ref) <= unaligned_bound);
    }
  }
}

}  // namespace

TEST_CASE("CUDA batch invariance: alone == in a batch of 8 == prefill cut at multiples of 64, bitwise", "[cuda][engine]") {
  K3_GPU_OR_SKIP(bk);
  bk.gpu->set_batch_invariant(true);
  check_model("k3-tiny", preset_config("k3-tiny").value(), *bk.gpu, 1100, 0);
  check_model("k3-tiny/K3-heads", tiny_with_k3_heads(), *bk.gpu, 1100, -1);
  check_model("k3-tiny/K3-heads (k = E)", dense_routing(tiny_with_k3_heads()), *bk.gpu, 1100, 0.25);
}

TEST_CASE("CUDA batch invariance for k3-small: alone == in a batch of 8 == prefill cut at multiples of 64, bitwise",
          "[cuda][engine][small]") {
  K3_GPU_OR_SKIP(bk);
  bk.gpu->set_batch_invariant(true);
  check_model("k3-small", preset_config("k3-small").value(), *bk.gpu, 80, -1);
}
