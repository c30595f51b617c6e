// The disaggregation math without the network: a prompt prefilled by PP stages (each a Model over its
// own layer range, passing P + the AttnRes bank chunk by chunk), every stage's caches exported as packed
// images and imported into a decode-side pool, then decoded greedily. Tokens must equal the monolithic
// engine's, for several partitions and chunk sizes.
#include <catch2/catch.hpp>

#include <numeric>

#include "engine/cache_io.h"
#include "model_fixture.h"

using namespace k3;
using namespace k3::test;

namespace {

std::vector<int32_t> pipeline_generate(const ModelConfig& cfg, const WeightStore& w, Backend& be,
                                       const std::vector<int>& partition, int chunk,
                                       const std::vector<int32_t>& prompt, int max_tokens) {
  const CacheOptions co{.max_seqs = 2, .page_size = 16, .num_pages = 64};
  // streamed: the image a streaming prefill stage builds, each chunk's rows after its forward, the KDA
  // states after the last; it must equal the whole export (the reference).
  struct Stage { std::unique_ptr<Model> model; std::unique_ptr<CachePools> pools; SeqCache seq; int begin, end;
                 std::vector<uint8_t> streamed; };
  std::vector<Stage> stages;
  int at = 0;
  for (int n : partition) {
    Stage s;
    s.begin = at;
    s.end = at + n;
    s.model = Model::create(be, cfg, w, s.begin, s.end).value();
    s.pools = std::make_unique<CachePools>(be, cfg, s.begin, s.end, co);
    s.seq = s.pools->open().value();
    s.streamed.assign(packed_cache_bytes(cfg, *s.pools, s.begin, s.end, prompt.size()), 0xA5);
    stages.push_back(std::move(s));
    at += n;
  }
  Tensor logits;
  for (size_t c0 = 0; c0 < prompt.size(); c0 += chunk) {
    const int64_t n = std::min<int64_t>(chunk, prompt.size() - c0);
    Activations act = stages[0].model->embed(std::span(prompt).subspan(c0, n));
    for (Stage& s : stages) {
      REQUIRE(s.pools->reserve(s.seq, n).is_ok());
      BatchItem item{.seq = &s.seq, .num_new = n};
      s.model->forward(std::span(&item, 1), act, *s.pools);
      s.seq.num_tokens += n;
      const int64_t end = static_cast<int64_t>(c0) + n;
      export_cache_part(be, *s.pools, s.seq, s.begin, s.end, prompt.size(), c0, end, end == int64_t(prompt.size()),
                        s.streamed.data());
    }
    const int32_t last = static_cast<int32_t>(n - 1);
    logits = stages.back().model->logits(act, std::span(&last, 1));
  }
  // Decode side: the whole model, caches imported stage by stage.
  auto full = Model::create(be, cfg, w).value();
  CachePools dpools(be, cfg, 0, cfg.num_hidden_layers, co);
  SeqCache dseq = dpools.open().value();
  REQUIRE(dpools.reserve(dseq, prompt.size()).is_ok());
  for (Stage& s : stages) {
    std::vector<uint8_t> image;
    export_caches(be, *s.pools, s.seq, s.begin, s.end, image);
    REQUIRE(image.size() == packed_cache_bytes(cfg, *s.pools, s.begin, s.end, prompt.size()));
    CHECK(s.streamed == image);
    REQUIRE(import_caches(be, dpools, dseq, s.begin, s.end, prompt.size(), image.data(), image.size()).is_ok());
    s.pools->close(s.seq);
  }
  dseq.num_tokens = static_cast<int64_t>(prompt.size());
  std::vector<int32_t> out;
  auto argmax = [&](const float* row) {
    return static_cast<int32_t>(std::max_element(row, row + cfg.vocab_size) - row);
  };
  out.push_back(argmax(logits.f32()));
  while (static_cast<int>(out.size()) < max_tokens) {
    REQUIRE(dpools.reserve(dseq, 1).is_ok());
    Activations act = full->embed(std::span(&out.back(), 1));
    BatchItem item{.seq = &dseq, .num_new = 1};
    full->forward(std::span(&item, 1), act, dpools);
    dseq.num_tokens += 1;
    const int32_t row = 0;
    Tensor l = full->logits(act, std::span(&row, 1));
    out.push_back(argmax(l.f32()));
  }
  dpools.close(dseq);
  return out;
}

std::vector<int32_t> engine_generate(const ModelConfig& cfg, const WeightStore& w, Backend& be,
                                     const std::vector<int32_t>& prompt, int max_tokens) {
  auto engine = Engine::create(be, cfg, w, engine_options()).value();
  GenerateRequest rq{.prompt = prompt, .max_tokens = max_tokens};
  return engine->generate(std::span(&rq, 1)).value()[0].tokens;
}

}  // namespace

TEST_CASE("PP prefill + cache images + decode equals the monolithic engine (k3-tiny, kimi-linear-tiny)",
          "[pipeline]") {
  // kimi-linear-tiny: a plain residual stream, so only the partial sum crosses the stage boundaries.
  const std::string preset = GENERATE(std::string("k3-tiny"), std::string("kimi-linear-tiny"));
  INFO(preset);
  ModelConfig cfg = tiny_config(preset);
  WeightStore w = random_weights(cfg, 21, DType::F32);
  auto be = make_cpu_backend({.threads = 2});
  std::mt19937 rng(9);
  for (int len : {1, 23, 70}) {
    auto prompt = random_tokens(rng, len, cfg.vocab_size);
    auto ref = engine_generate(cfg, w, *be, prompt, 10);
    for (const auto& part : std::vector<std::vector<int>>{{8}, {4, 4}, {2, 2, 2, 2}, {3, 1, 4}}) {
      for (int chunk : {7, 16, 1000}) {
        INFO("len " << len << " stages " << part.size() << " chunk " << chunk);
        REQUIRE(pipeline_generate(cfg, w, *be, part, chunk, prompt, 10) == ref);
      }
    }
  }
}

TEST_CASE("PP16 on the production partition over 93 layers equals the monolithic engine", "[pipeline]") {
  ModelConfig cfg = tiny_config("k3-tiny-93");
  WeightStore w = random_weights(cfg, 22, DType::F32);
  auto be = make_cpu_backend({.threads = 2});
  std::vector<int> part;
  for (int i = 0; i < 7; ++i) { part.push_back(7); part.push_back(5); }
  part.push_back(6);
  part.push_back(3);
  REQUIRE(std::accumulate(part.begin(), part.end(), 0) == 93);
  std::mt19937 rng(10);
  auto prompt = random_tokens(rng, 40, cfg.vocab_size);
  REQUIRE(pipeline_generate(cfg, w, *be, part, 16, prompt, 6) == engine_generate(cfg, w, *be, prompt, 6));
}
