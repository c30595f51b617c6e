// StepWorkspace (the decode step's arena) and DecodeStep on the CPU backend: a step's takes land on
// the same addresses every step, come back zeroed even after a step wrote them, an overflow falls
// back to Backend::alloc and grows the arena (new epoch) at the next step; and a decode batch run
// through DecodeStep gives the same logits as the plain forward with per-op uploads.
#include <catch2/catch.hpp>

#include <cstring>

#include "engine/decode_step.h"
#include "engine/engine.h"
#include "model_fixture.h"

using namespace k3;
using namespace k3::test;

TEST_CASE("StepWorkspace: same addresses per step, zeroed takes, growth by use", "[engine]") {
  auto be = make_cpu_backend({.threads = 1});
  StepWorkspace ws(*be);
  ws.begin_step();
  Tensor a0 = ws.take({8, 4}, DType::F32);  // empty arena: from Backend::alloc
  REQUIRE(ws.overflowed());
  REQUIRE(ws.epoch() == 0);
  ws.begin_step();
  REQUIRE(ws.epoch() == 1);
  REQUIRE(ws.capacity() >= 8 * 4 * 4);
  Tensor a = ws.take({8, 4}, DType::F32);
  REQUIRE_FALSE(ws.overflowed());
  for (int i = 0; i < 32; ++i) a.f32()[i] = 1.f + i;
  ws.begin_step();
  Tensor b = ws.take({8, 4}, DType::F32);
  REQUIRE(b.data() == a.data());
  for (int i = 0; i < 32; ++i) REQUIRE(b.f32()[i] == 0.f);
  Tensor c = ws.take({1 << 12}, DType::F32);  // past the capacity: falls back, arena grows next step
  REQUIRE(ws.overflowed());
  REQUIRE(c.data() != nullptr);
  ws.begin_step();
  REQUIRE(ws.epoch() == 2);
  REQUIRE(ws.capacity() >= 256 + (1 << 14));
  Tensor d = ws.take({8, 4}, DType::F32), e = ws.take({1 << 12}, DType::F32);
  REQUIRE_FALSE(ws.overflowed());
  REQUIRE((static_cast<char*>(e.data()) - static_cast<char*>(d.data())) % 256 == 0);  // takes stay 256-aligned to the base
}

TEST_CASE("DecodeStep on the CPU: same logits as the per-op forward; no graphs recorded", "[engine]") {
  struct {
    ModelConfig cfg = tiny_config();
    WeightStore weights = random_weights(cfg, 5, DType::F32);
  } m;
  auto be = make_cpu_backend({.threads = 1});
  EngineOptions eo;
  eo.cache = {.max_seqs = 4, .page_size = 4, .num_pages = 64};
  eo.top_logits = 0;
  auto e = Engine::create(*be, m.cfg, m.weights, eo).value();
  auto model = Model::create(*be, m.cfg, m.weights).value();
  CachePools pools(*be, m.cfg, 0, m.cfg.num_hidden_layers, eo.cache);
  std::vector<std::vector<int32_t>> prompts = {{5, 9, 13}, {7}, {21, 3, 8, 30, 2, 11}};
  std::vector<SeqCache> se, sr;
  std::vector<SeqCache*> pe;
  for (size_t i = 0; i < prompts.size(); ++i) {
    se.push_back(e->open().value());
    sr.push_back(pools.open().value());
  }
  for (auto& s : se) pe.push_back(&s);
  e->feed(pe, prompts).value();
  for (size_t i = 0; i < prompts.size(); ++i) {
    REQUIRE(pools.reserve(sr[i], int64_t(prompts[i].size())).is_ok());
    BatchItem item{.seq = &sr[i], .num_new = int64_t(prompts[i].size())};
    Activations act = model->embed(prompts[i]);
    model->forward(std::span(&item, 1), act, pools);
    sr[i].num_tokens += item.num_new;
  }
  for (int step = 0; step < 6; ++step) {
    std::vector<std::vector<int32_t>> toks;
    std::vector<int32_t> flat;
    std::vector<BatchItem> batch;
    for (size_t i = 0; i < prompts.size(); ++i) {
      const int32_t t = int32_t((step * 17 + i * 5 + 1) % m.cfg.vocab_size);
      toks.push_back({t});
      flat.push_back(t);
      REQUIRE(pools.reserve(sr[i], 1).is_ok());
      batch.push_back({.seq = &sr[i], .num_new = 1});
    }
    Tensor got = e->feed(pe, toks).value();
    Activations act = model->embed(flat);
    model->forward(batch, act, pools);
    std::vector<int32_t> rows = {0, 1, 2};
    Tensor want = model->logits(act, rows);
    for (auto& s : sr) s.num_tokens += 1;
    INFO("step " << step);
    REQUIRE(std::memcmp(got.data(), want.data(), want.nbytes()) == 0);
  }
  const DecodeStepStats& st = e->decode_step().stats();
  REQUIRE(st.eager == 6);
  REQUIRE(st.captures == 0);
  REQUIRE(st.replays == 0);
}
