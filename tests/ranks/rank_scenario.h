// The rank-group workload shared by the tests and their rank processes: a pure function of
// (heads, seed), so every process rebuilds the same model, prompts and decode tokens.
//   - k3-tiny with random F32 weights (KDA and MLA heads set to `heads`, so DCP8 splits evenly);
//   - prompts long enough that every rank of a DCP8 group holds MLA rows, prefilled by the monolithic
//     engine, whose cache images are cut per rank (rank_image: the transfer plan's per-rank layout);
//   - `steps` decode steps, teacher-forced with fixed random tokens, every request in the batch.
// run_group() runs one rank and returns, per step, the logits of each request it serves.
#pragma once
#include <cstring>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "common/model/weights.h"
#include "engine/cache_io.h"
#include "engine/engine.h"
#include "engine/rank_model.h"
#include "kernels/backend.h"
#include "kernels/backend_select.h"

namespace k3::test::ranks {

struct Scenario {
  ModelConfig cfg;
  WeightStore weights;
  std::vector<std::vector<int32_t>> prompts;
  std::vector<std::vector<int32_t>> steps;  // steps[s][i]: the token request i feeds at step s
};

// k3_head_shapes: K3's head sizes at small width (with_k3_head_shapes), the shapes the GPU's fused decode
// kernels take (k3-tiny's D = 16 has none on CUDA).
inline Scenario make_scenario(int heads, uint64_t seed, int num_requests = 3, int num_steps = 4,
                              bool k3_head_shapes = false) {
  Scenario sc;
  sc.cfg = preset_config("k3-tiny").value();
  sc.cfg.vocab_size = 512;
  sc.cfg.eos_token_ids.clear();
  sc.cfg.kda.num_heads = heads;
  sc.cfg.num_attention_heads = sc.cfg.num_key_value_heads = heads;
  if (k3_head_shapes) sc.cfg = with_k3_head_shapes(sc.cfg);
  sc.weights = random_weights(sc.cfg, seed, DType::F32);
  std::mt19937 rng(static_cast<uint32_t>(seed));
  std::uniform_int_distribution<int32_t> tok(0, sc.cfg.vocab_size - 1);
  for (int i = 0; i < num_requests; ++i) {
    std::vector<int32_t> p(9 + 7 * i + static_cast<int>(seed % 5));  // >= 9 tokens: every DCP8 rank has rows
    for (auto& t : p) t = tok(rng);
    sc.prompts.push_back(p);
  }
  for (int s = 0; s < num_steps; ++s) {
    std::vector<int32_t> t(num_requests);
    for (auto& x : t) x = tok(rng);
    sc.steps.push_back(t);
  }
  return sc;
}

inline EngineOptions reference_options() {
  EngineOptions o;
  o.cache = {.max_seqs = 8, .page_size = 4, .num_pages = 256};
  return o;
}

// The packed image of one DCP rank's slice of a request (prefilled to `tokens` tokens) from the packed
// image of the whole request: MLA token p -> rank p % N, local row p / N; KDA conv columns and state of
// the rank's heads. A slow, independent restatement of the transfer plan's relayout.
inline std::vector<uint8_t> rank_image(const CacheLayout& full, const CacheLayout& part, const RankLayout& g,
                                       int64_t tokens, const std::vector<uint8_t>& image) {
  const uint32_t L = static_cast<uint32_t>(full.layers.size());
  const int64_t rows = dcp_rows_on(g, tokens);
  PackedImage fi = full.pack_range(0, L, tokens), pi = part.pack_range(0, L, rows);
  std::vector<uint8_t> out(pi.total_bytes);
  const uint64_t hb = full.kda_conv_head_bytes, Hl = part.kda_heads, h0 = g.dcp_rank() * Hl;
  for (uint32_t l = 0; l < L; ++l) {
    const PackedEntry &f = fi.layers.at(l), &p = pi.layers.at(l);
    if (full.layers.at(l) == LayerCache::Kda) {
      for (uint64_t w = 0; w < full.kda_conv_rows; ++w)
        for (uint64_t t = 0; t < 3; ++t)
          std::memcpy(out.data() + p.conv + (w * 3 + t) * Hl * hb,
                      image.data() + f.conv + (w * 3 + t) * full.kda_heads * hb + h0 * hb, Hl * hb);
      std::memcpy(out.data() + p.state, image.data() + f.state + h0 * full.kda_state_head_bytes,
                  Hl * full.kda_state_head_bytes);
    } else {
      const uint64_t rb = full.mla_row_bytes;
      for (int64_t t = g.dcp_rank(); t < tokens; t += g.dcp)
        std::memcpy(out.data() + p.rows + (t / g.dcp) * rb, image.data() + f.rows + t * rb, rb);
    }
  }
  return out;
}

// Requests rank `g.rank` serves: all of them in a DCP group, every ep-th in an EP group.
inline std::vector<int> served(const RankLayout& g, int num_requests) {
  std::vector<int> ids;
  for (int i = 0; i < num_requests; ++i)
    if (g.ep == 1 || i % g.ep == g.rank) ids.push_back(i);
  return ids;
}

using StepLogits = std::vector<std::map<int, std::vector<float>>>;  // [step][request] -> logits

// One rank of the group set up for the scenario: its model, and the requests it serves prefilled by the
// monolithic engine and cut to its slice.
struct RankRun {
  std::unique_ptr<Backend> be;
  std::unique_ptr<RankModel> model;
  std::vector<int> mine;          // request ids served
  std::vector<SeqCache> seqs;
  std::vector<RankItem> items;
  ~RankRun() { close(); }
  void close() {
    if (model)
      for (auto& s : seqs) model->caches().close(s);
  }
  // Decode step `st` of the scenario: logits of each served request.
  Result<std::map<int, std::vector<float>>> step(const Scenario& sc, size_t st) {
    std::vector<int32_t> toks;
    for (int id : mine) toks.push_back(sc.steps[st][id]);
    K3_ASSIGN_OR_RETURN(Tensor lg, model->decode_step(items, toks));
    const int64_t V = sc.cfg.vocab_size;
    std::map<int, std::vector<float>> out;
    for (size_t k = 0; k < mine.size(); ++k) out[mine[k]].assign(lg.f32() + k * V, lg.f32() + (k + 1) * V);
    return out;
  }
};

// `backend`: "cpu" or "cuda" (GPU 0, or `device`).
inline Result<std::unique_ptr<RankRun>> setup_rank(const Scenario& sc, const RankLayout& g, Comm& comm, int threads = 1,
                                                   const CacheOptions& cache = reference_options().cache,
                                                   const std::string& backend = "cpu", int device = 0) {
  auto run = std::make_unique<RankRun>();
  K3_ASSIGN_OR_RETURN(run->be, make_backend({.kind = backend, .device = device, .threads = threads}));
  Backend& be = *run->be;
  K3_ASSIGN_OR_RETURN(auto ref, Engine::create(be, sc.cfg, sc.weights, reference_options()));
  K3_ASSIGN_OR_RETURN(run->model, RankModel::create(be, sc.cfg, sc.weights, g, comm, cache));
  K3_ASSIGN_OR_RETURN(CacheLayout full, cache_layout(sc.cfg, be));
  run->mine = served(g, static_cast<int>(sc.prompts.size()));
  run->seqs.resize(run->mine.size());
  run->items.resize(run->mine.size());
  for (size_t k = 0; k < run->mine.size(); ++k) {
    const auto& prompt = sc.prompts[run->mine[k]];
    const int64_t T = static_cast<int64_t>(prompt.size());
    SeqCache s;
    K3_ASSIGN_OR_RETURN(s, ref->open());
    K3_TRY(ref->prefill(s, prompt).status());
    std::vector<uint8_t> image;
    export_caches(be, ref->caches(), s, 0, sc.cfg.num_hidden_layers, image);
    ref->close(s);
    auto part = rank_image(full, run->model->caches().layout(), g, T, image);
    CachePools& pools = run->model->caches();
    K3_ASSIGN_OR_RETURN(run->seqs[k], pools.open());
    const int64_t rows = dcp_rows_on(g, T);
    K3_TRY(pools.reserve(run->seqs[k], rows));
    K3_TRY(import_caches(be, pools, run->seqs[k], 0, sc.cfg.num_hidden_layers, rows, part.data(), part.size()));
    run->seqs[k].num_tokens = rows;
    run->items[k] = {.seq = &run->seqs[k], .position = T};
  }
  return run;
}

// Runs one rank of the group through every step of the scenario.
inline Result<StepLogits> run_group(const Scenario& sc, const RankLayout& g, Comm& comm, int threads = 1,
                                    const std::string& backend = "cpu", int device = 0) {
  K3_ASSIGN_OR_RETURN(auto run, setup_rank(sc, g, comm, threads, reference_options().cache, backend, device));
  StepLogits out(sc.steps.size());
  for (size_t st = 0; st < sc.steps.size(); ++st) {
    K3_ASSIGN_OR_RETURN(out[st], run->step(sc, st));
  }
  return out;
}

// The monolithic engine's logits of the scenario on `backend`: every request prefilled, then batched
// decode steps.
inline Result<StepLogits> monolithic(const Scenario& sc, const std::string& backend = "cpu") {
  K3_ASSIGN_OR_RETURN(auto be, make_backend({.kind = backend, .threads = 1}));
  K3_ASSIGN_OR_RETURN(auto eng, Engine::create(*be, sc.cfg, sc.weights, reference_options()));
  const size_t n = sc.prompts.size();
  std::vector<SeqCache> seqs(n);
  std::vector<SeqCache*> ptrs;
  for (size_t i = 0; i < n; ++i) {
    K3_ASSIGN_OR_RETURN(seqs[i], eng->open());
    K3_TRY(eng->prefill(seqs[i], sc.prompts[i]).status());
    ptrs.push_back(&seqs[i]);
  }
  StepLogits out(sc.steps.size());
  for (size_t s = 0; s < sc.steps.size(); ++s) {
    std::vector<std::vector<int32_t>> toks;
    for (size_t i = 0; i < n; ++i) toks.push_back({sc.steps[s][i]});
    K3_ASSIGN_OR_RETURN(Tensor lg, eng->feed(ptrs, toks));
    const int64_t V = sc.cfg.vocab_size;
    for (size_t i = 0; i < n; ++i) out[s][static_cast<int>(i)].assign(lg.f32() + i * V, lg.f32() + (i + 1) * V);
  }
  for (auto& s : seqs) eng->close(s);
  return out;
}

inline uint64_t fnv(const void* p, size_t n) {
  uint64_t h = 0xcbf29ce484222325ull;
  auto* b = static_cast<const uint8_t*>(p);
  for (size_t i = 0; i < n; ++i) h = (h ^ b[i]) * 0x100000001b3ull;
  return h;
}

}  // namespace k3::test::ranks
