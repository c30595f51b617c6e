// Decode steps as CUDA graphs (engine/decode_step.h). Two engines on one GPU, one eager and one
// recording graphs in the process-wide checking capture mode (cudaStreamCaptureModeGlobal: any
// allocation, host synchronisation or pageable copy inside the step fails the recording), feed the
// same requests; every decode step's logits must be bitwise equal, across two batch sizes and a
// block-table width change, with and without batch-invariant GEMMs. The recording's node count is
// the launches one eager step makes; a replayed step makes one graph launch.
#include <catch2/catch.hpp>

#include <cstdio>
#include <cstring>

#include "engine/engine.h"
#include "tests/cuda/cuda_test_util.h"
#include "tests/cuda/engine_rig.h"

using namespace k3;
using namespace k3::cudatest;

namespace {

std::unique_ptr<Engine> make_engine(Backend& be, const ModelConfig& cfg, const WeightStore& w, bool graphs) {
  EngineOptions o;
  o.cache = {.max_seqs = 8, .page_size = 16, .num_pages = 8 * 16};
  o.top_logits = 0;
  o.decode_graphs = {.enabled = graphs, .strict = true};
  return Engine::create(be, cfg, w, o).value();
}

std::vector<float> host_row(Backend& be, const Tensor& logits) {
  Tensor h = be.to_host(logits);
  return std::vector<float>(h.f32(), h.f32() + h.numel());
}

}  // namespace

TEST_CASE("CUDA decode graph: replay bitwise equal to eager; capture refuses syncs", "[cuda][engine]") {
  K3_GPU_OR_SKIP(bk);
  Backend& be = *bk.gpu;

  SECTION("a capture that synchronises with the host fails and leaves the stream usable") {
    Tensor x = be.alloc({4, 8}, DType::BF16), y = be.alloc({4, 8}, DType::BF16);
    REQUIRE_THROWS(be.capture([&] { be.synchronize(); }, true));
    REQUIRE_THROWS(be.capture([&] { (void)be.to_host(x); }, true));
    auto g = be.capture([&] { be.add({.a = x, .b = x, .y = y}); }, true);
    REQUIRE(g);
    REQUIRE(g->nodes() == 1);
    g->launch();
    be.synchronize();
  }

  SECTION("two batch sizes, a width change, both GEMM modes") {
    ModelConfig cfg = tiny_with_k3_heads();
    cfg.vocab_size = 2048;
    const WeightStore w = random_weights(cfg, 21, DType::BF16);
    const int lens[5] = {60, 17, 40, 3, 33};  // request 0 crosses 64 tokens: 4 -> 5 pages, width 4 -> 8
    std::vector<std::vector<int32_t>> prompts;
    for (int i = 0; i < 5; ++i) prompts.push_back(random_prompts(1, lens[i], cfg.vocab_size, 200 + i)[0]);
    for (const bool invariant : {false, true}) {
      be.set_batch_invariant(invariant);
      auto eager = make_engine(be, cfg, w, false), graphed = make_engine(be, cfg, w, true);
      std::vector<SeqCache> se, sg;
      for (int i = 0; i < 5; ++i) {
        se.push_back(eager->open().value());
        sg.push_back(graphed->open().value());
      }
      auto ptrs = [](std::vector<SeqCache>& v, size_t n) {
        std::vector<SeqCache*> p;
        for (size_t i = 0; i < n; ++i) p.push_back(&v[i]);
        return p;
      };
      REQUIRE(host_row(be, eager->feed_on_backend(ptrs(se, 5), prompts).value()) ==
              host_row(be, graphed->feed_on_backend(ptrs(sg, 5), prompts).value()));
      int steps = 0;
      for (const size_t B : {size_t(5), size_t(4)}) {
        for (int s = 0; s < 8; ++s, ++steps) {
          std::vector<std::vector<int32_t>> toks(B);
          for (size_t i = 0; i < B; ++i) toks[i] = {int32_t((steps * 131 + i * 7 + 5) % cfg.vocab_size)};
          const auto a = host_row(be, eager->feed_on_backend(ptrs(se, B), toks).value());
          const auto b = host_row(be, graphed->feed_on_backend(ptrs(sg, B), toks).value());
          INFO("invariant " << invariant << " batch " << B << " step " << s);
          REQUIRE(a.size() == b.size());
          REQUIRE(std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0);
        }
      }
      const DecodeStepStats& g = graphed->decode_step().stats();
      const DecodeStepStats& e = eager->decode_step().stats();
      INFO("last capture failure: " << g.last_failure);
      REQUIRE(g.capture_failures == 0);
      REQUIRE(g.captures >= 3);  // (5, width 4), (5, width 8), (4, width 8)
      REQUIRE(g.replays + g.eager == steps);
      REQUIRE(g.replays >= steps - 2 * g.captures);
      REQUIRE(g.last_nodes > 0);
      REQUIRE(e.captures == 0);
      REQUIRE(e.eager == steps);
      std::printf("DECODE-GRAPH (%s GEMMs): %d decode steps bitwise equal eager vs graph; %lld recordings, %lld "
                  "replays, %lld eager; one step = %lld kernels/copies/memsets replayed by 1 graph launch\n",
                  invariant ? "fixed-order" : "cuBLASLt", steps, (long long)g.captures, (long long)g.replays,
                  (long long)g.eager, (long long)g.last_nodes);
      for (auto& s : se) eager->close(s);
      for (auto& s : sg) graphed->close(s);
    }
    be.set_batch_invariant(false);
  }
}
