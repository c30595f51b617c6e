// The chunk-invariant rule for KDA with the chunked form (engine/kda_heads.h) on the CPU, the fp32
// reference of what CUDA runs in batch-invariant mode: with K3's head shapes (D = 128, where CUDA's
// chunked kernel runs) whole 64-token blocks at absolute multiples of 64 go through kda_chunk and the
// rest through the recurrence. A prompt fed whole, cut at multiples of 64, or inside a batch gives
// bitwise the same logits (after the prompt and after a decode step); a cut elsewhere gives the same
// math in another rounding.
#include <catch2/catch.hpp>

#include "engine/engine.h"
#include "engine/kda_heads.h"
#include "tests/engine/model_fixture.h"

using namespace k3;
using namespace k3::test;

namespace {
constexpr double kTol = 1e-4;  // fp32: the recurrence against the chunked form
}  // namespace

TEST_CASE("kda_aligned_rows: whole blocks at absolute multiples of 64, the rest before and after", "[engine]") {
  // Items packed from row 0: (position, length).
  const std::vector<int64_t> pos = {0, 0, 10, 60, 64, 5, 100}, len = {200, 64, 40, 200, 1, 0, 30};
  const KdaAlignedRows r = kda_aligned_rows(pos, len);
  // 0+200: blocks [0, 192), 8 rows after.  0+64: one block.  60+200: 4 rows before, blocks [64, 256), 4
  // after. An item without a whole block is all "head": 10+40 (inside one block), 64+1, 100+30 (it
  // crosses 128 but completes no block). The empty item has empty ranges.
  const std::vector<int32_t> head = {0, 0, 200, 200, 264, 304, 304, 308, 504, 505, 505, 505, 505, 535};
  const std::vector<int32_t> blocks = {0, 192, 200, 264, 304, 304, 308, 500, 505, 505, 505, 505, 535, 535};
  const std::vector<int32_t> tail = {192, 200, 264, 264, 304, 304, 500, 504, 505, 505, 505, 505, 535, 535};
  CHECK(r.head == head);
  CHECK(r.blocks == blocks);
  CHECK(r.tail == tail);
  CHECK(r.any_head);
  CHECK(r.any_blocks);
  CHECK(r.any_tail);
  const KdaAlignedRows none = kda_aligned_rows(std::vector<int64_t>{3}, std::vector<int64_t>{1});
  CHECK((!none.any_blocks && !none.any_tail && none.any_head));
}

namespace {

ModelConfig tiny_with_k3_kda_heads(const char* preset) {
  ModelConfig c = tiny_config(preset);
  c.kda.num_heads = 2;
  c.kda.head_dim = 128;
  REQUIRE(validate(c).is_ok());
  return c;
}

// Logits after `toks` (fed whole or in forwards of `chunk` tokens, or batched with `others`), then after
// one decode token.
std::vector<float> run(Engine& e, const std::vector<int32_t>& toks, int chunk,
                       const std::vector<std::vector<int32_t>>& others) {
  std::vector<SeqCache> seqs;
  for (size_t i = 0; i <= others.size(); ++i) seqs.push_back(e.open().value());
  std::vector<SeqCache*> ptrs;
  for (auto& s : seqs) ptrs.push_back(&s);
  const int64_t V = e.config().vocab_size;
  std::vector<float> out;
  Tensor a;
  if (chunk > 0) {
    for (size_t at = 0; at < toks.size(); at += size_t(chunk)) {
      std::vector<std::vector<int32_t>> piece{
          std::vector<int32_t>(toks.begin() + at, toks.begin() + std::min(toks.size(), at + size_t(chunk)))};
      a = e.feed(std::span<SeqCache* const>(ptrs.data(), 1), piece).value();
    }
  } else {
    std::vector<std::vector<int32_t>> prompts{toks};
    prompts.insert(prompts.end(), others.begin(), others.end());
    a = e.feed(ptrs, prompts).value();
  }
  out.assign(a.f32(), a.f32() + V);
  std::vector<std::vector<int32_t>> steps(seqs.size(), std::vector<int32_t>{7});
  Tensor b = e.feed(ptrs, steps).value();
  out.insert(out.end(), b.f32(), b.f32() + V);
  for (auto& s : seqs) e.close(s);
  return out;
}

}  // namespace

TEST_CASE("chunk-invariant mode with the chunked KDA form: cuts at multiples of 64 give one prefill's bits",
          "[engine]") {
  for (const char* preset : {"k3-tiny", "kimi-linear-tiny"}) {
    INFO(preset);
    const ModelConfig cfg = tiny_with_k3_kda_heads(preset);
    const WeightStore w = random_weights(cfg, 9, DType::F32);
    auto be = make_cpu_backend({.threads = 2, .chunk_invariant = true});
    auto e = Engine::create(*be, cfg, w, engine_options()).value();
    std::mt19937 rng(6);
    const auto toks = random_tokens(rng, 200, cfg.vocab_size);   // three whole blocks and 8 rows after
    const auto ref = run(*e, toks, 0, {});
    for (int chunk : {64, 128}) {
      INFO("chunk " << chunk);
      CHECK(run(*e, toks, chunk, {}) == ref);
    }
    const int V = cfg.vocab_size;
    CHECK(run(*e, toks, 0, {random_tokens(rng, 40, V), random_tokens(rng, 1, V), random_tokens(rng, 130, V)}) == ref);
    // Cuts elsewhere move a block's rows to the recurrence: the same values to fp32 rounding, other bits
    // (which also shows the whole prompt's blocks took the chunked form).
    for (int chunk : {1, 63, 65}) {
      INFO("chunk " << chunk);
      const auto got = run(*e, toks, chunk, {});
      CHECK(rel_diff(got.data(), ref.data(), V) < kTol);
      CHECK(rel_diff(got.data() + V, ref.data() + V, V) < kTol);
      if (chunk == 1) CHECK(got != ref);
    }
  }
}

TEST_CASE("chunk-invariant mode refuses KDA checkpoints for a step that starts off the 64-token grid", "[engine]") {
  const ModelConfig cfg = tiny_with_k3_kda_heads("k3-tiny");
  const WeightStore w = random_weights(cfg, 9, DType::F32);
  auto be = make_cpu_backend({.threads = 2, .chunk_invariant = true});
  EngineOptions o = engine_options();
  o.cache.checkpoint_slots = 1;
  auto e = Engine::create(*be, cfg, w, o).value();
  std::mt19937 rng(7);
  const auto toks = random_tokens(rng, 100, cfg.vocab_size);
  SeqCache s = e->open().value();
  (void)e->prefill(s, std::span<const int32_t>(toks.data(), 10)).value();
  const int slot = e->caches().alloc_slot().value();
  // 64 tokens after the step's start, so a chunk end of the step, but not an absolute multiple of 64.
  const std::vector<KdaCheckpoint> plan{{.pos = 74, .slot = slot}};
  CHECK_THROWS_WITH(e->prefill_planned_on_backend(s, toks, plan, 90),
                    Catch::Contains("must start its sequence at a multiple of 64") && Catch::Contains("starts at 10"));
  e->caches().free_slot(slot);
  e->close(s);
}
