// Per layer type (KDA + dense FFN, KDA + LatentMoE, MLA + LatentMoE, the last MLA layer): a one-layer
// Model fed random activations. Prefill of T+1 rows == prefill of T rows then one decode row;
// chunked prefill == one prefill. Tolerance 1e-4 relative to the output scale (fp32, summation order).
#include <catch2/catch.hpp>

#include "model_fixture.h"

using namespace k3;
using namespace k3::test;

namespace {

struct LayerRig {
  ModelConfig cfg;
  WeightStore weights;
  std::unique_ptr<Backend> backend = make_cpu_backend({.threads = 2});
  std::unique_ptr<Model> model;
  int layer;

  LayerRig(int l) : layer(l) {
    cfg = tiny_config("k3-tiny");
    weights = random_weights(cfg, 11, DType::F32);
    model = Model::create(*backend, cfg, weights, l, l + 1).value();
  }
  int bank_size() const { return layer == 0 ? 0 : (layer - 1) / cfg.attn_res_block_size + 1; }

  // Inputs for `rows` tokens: token ids for layer 0, random P and bank rows otherwise.
  struct Input { std::vector<int32_t> ids; Tensor partial; std::vector<Tensor> bank; };
  Input make_input(int rows, uint32_t seed) {
    std::mt19937 rng(seed);
    Input in;
    if (layer == 0) { in.ids = random_tokens(rng, rows, cfg.vocab_size); return in; }
    std::normal_distribution<float> n(0.f, 1.f);
    auto rnd = [&] {
      Tensor t = Tensor::zeros({rows, cfg.hidden_size});
      for (int64_t i = 0; i < t.numel(); ++i) t.f32()[i] = n(rng);
      return t;
    };
    in.partial = rnd();
    for (int b = 0; b < bank_size(); ++b) in.bank.push_back(rnd());
    return in;
  }
  Activations slice(const Input& in, int64_t from, int64_t to) {
    if (layer == 0) return model->embed(std::span(in.ids).subspan(from, to - from));
    Activations a;
    a.partial = in.partial.slice_rows(from, to).clone();
    for (const Tensor& b : in.bank) a.bank.push_back(b.slice_rows(from, to).clone());
    return a;
  }
  // Runs rows [0, total) in pieces of `chunk`, returning the concatenated output partial sums.
  std::vector<float> run(const Input& in, int64_t total, int64_t chunk) {
    CacheOptions co{.max_seqs = 2, .page_size = 4, .num_pages = 128};
    CachePools pools(*backend, cfg, layer, layer + 1, co);
    SeqCache seq = pools.open().value();
    std::vector<float> out;
    for (int64_t at = 0; at < total; at += chunk) {
      const int64_t n = std::min(chunk, total - at);
      REQUIRE(pools.reserve(seq, n).is_ok());
      Activations act = slice(in, at, at + n);
      BatchItem item{.seq = &seq, .num_new = n};
      model->forward(std::span(&item, 1), act, pools);
      seq.num_tokens += n;
      out.insert(out.end(), act.partial.f32(), act.partial.f32() + act.partial.numel());
    }
    pools.close(seq);
    return out;
  }
};

}  // namespace

TEST_CASE("each layer type: decode after prefill and chunked prefill match one prefill", "[layers]") {
  // k3-tiny: layer 0 = KDA + dense, 1 = KDA + MoE, 3 = MLA + MoE, 4 = KDA starting AttnRes block 2, 7 = last MLA.
  for (int layer : {0, 1, 3, 4, 7}) {
    LayerRig rig(layer);
    const int64_t d = rig.cfg.hidden_size;
    for (int T : {1, 6, 64, 66}) {
      auto in = rig.make_input(T + 1, 100 + T);
      auto full = rig.run(in, T + 1, T + 1);
      // T rows, then the last row alone (a decode step).
      auto split = rig.run(in, T + 1, T);
      INFO("layer " << layer << " T=" << T);
      REQUIRE(rel_diff(split.data() + T * d, full.data() + T * d, d) < 1e-4);
      for (int chunk : {1, 5, 64}) {
        auto chunked = rig.run(in, T + 1, chunk);
        INFO("chunk " << chunk);
        REQUIRE(rel_diff(chunked.data(), full.data(), (T + 1) * d) < 1e-4);
      }
    }
  }
}
