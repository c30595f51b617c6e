// A rank's upload: upload_weights with an ExpertRange (an EP rank) reads and uploads those routed experts
// only, and with a HeadShare (a DCP rank) its heads' rows of the per-head attention weights only, bit for
// bit the rows of the whole upload, from a stored model and from a synthetic one (drawn where the
// weights live); a range or share that is not one of the model's is named; and the upload's progress.
#include <catch2/catch.hpp>

#include <cstdio>
#include <cstring>

#include "common/io/load_progress.h"
#include "engine/model_weights.h"
#include "model_fixture.h"

using namespace k3;
using namespace k3::test;

namespace {

bool same_rows(Backend& be, const Tensor& part, const Tensor& whole, int64_t row0) {
  const Tensor p = be.to_host(part), w = be.to_host(whole);
  const size_t row_bytes = w.nbytes() / static_cast<size_t>(w.dim(0));
  return p.nbytes() == row_bytes * static_cast<size_t>(p.dim(0)) &&
         std::memcmp(p.data(), static_cast<const uint8_t*>(w.data()) + row0 * row_bytes, p.nbytes()) == 0;
}

}  // namespace

TEST_CASE("upload_weights with an expert range holds those experts only, bitwise the whole upload's rows",
          "[engine][ranks]") {
  const ModelConfig cfg = tiny_config("k3-tiny");
  REQUIRE(cfg.num_experts >= 4);
  auto be = make_cpu_backend({.threads = 2});
  const int L = cfg.num_hidden_layers;
  for (const bool synthetic : {false, true}) {
    INFO((synthetic ? "synthetic store" : "stored weights"));
    const WeightStore store = synthetic ? WeightStore::synthetic({.cfg = cfg, .seed = 3, .matrix_dtype = DType::BF16})
                                        : random_weights(cfg, 3, DType::F32);
    auto whole = upload_weights(*be, cfg, store, 0, L);
    REQUIRE(whole.is_ok());
    const int64_t e0 = 2, e1 = 4;
    auto part = upload_weights(*be, cfg, store, 0, L, {e0, e1});
    REQUIRE(part.is_ok());
    int moe_layers = 0;
    for (int l = 0; l < L; ++l) {
      if (cfg.is_dense_ffn(l)) continue;
      ++moe_layers;
      INFO("layer " << l);
      const LayerWeights &p = (*part)->layers[size_t(l)], &w = (*whole)->layers[size_t(l)];
      for (auto [pt, wt] : {std::pair{&p.w1, &w.w1}, std::pair{&p.w3, &w.w3}, std::pair{&p.w2, &w.w2}}) {
        CHECK(pt->dim(0) == e1 - e0);
        CHECK(same_rows(*be, *pt, *wt, e0));
      }
      // Everything else is the whole model's.
      CHECK(same_rows(*be, p.router, w.router, 0));
    }
    CHECK(moe_layers > 0);
  }
  const WeightStore store = random_weights(cfg, 3, DType::F32);
  for (const ExpertRange bad : {ExpertRange{3, 3}, ExpertRange{-1, 2}, ExpertRange{0, cfg.num_experts + 1}}) {
    auto r = upload_weights(*be, cfg, store, 0, L, bad);
    REQUIRE(!r.is_ok());
    CHECK(r.status().message().find("are not a non-empty range of the model's " + std::to_string(cfg.num_experts)) !=
          std::string::npos);
  }
}

TEST_CASE("upload_weights with a head share holds those heads' rows only, bitwise the whole upload's rows",
          "[engine][ranks]") {
  const ModelConfig cfg = tiny_config("k3-tiny");
  const int64_t H = cfg.kda.num_heads, D = cfg.kda.head_dim, P = H * D, Hm = cfg.num_attention_heads;
  REQUIRE(H % 2 == 0);
  REQUIRE(Hm % 2 == 0);
  REQUIRE(cfg.kda.use_full_rank_gate);
  REQUIRE(cfg.mla_use_output_gate);
  auto be = make_cpu_backend({.threads = 2});
  const int L = cfg.num_hidden_layers;
  for (const bool synthetic : {false, true}) {
    INFO((synthetic ? "synthetic store" : "stored weights"));
    const WeightStore store = synthetic ? WeightStore::synthetic({.cfg = cfg, .seed = 4, .matrix_dtype = DType::BF16})
                                        : random_weights(cfg, 4, DType::F32);
    auto whole = upload_weights(*be, cfg, store, 0, L);
    REQUIRE(whole.is_ok());
    const HeadShare share{.index = 1, .count = 2};
    auto part = upload_weights(*be, cfg, store, 0, L, {}, share);
    REQUIRE(part.is_ok());
    const int64_t h0 = H / 2, c0 = h0 * D, n = P / 2, m0 = Hm / 2, dv = cfg.v_head_dim;
    int kda_layers = 0, mla_layers = 0;
    for (int l = 0; l < L; ++l) {
      INFO("layer " << l);
      const LayerWeights &p = (*part)->layers[size_t(l)], &w = (*whole)->layers[size_t(l)];
      if (cfg.layer_kind(l) == LayerKind::Kda) {
        ++kda_layers;
        for (const auto* t : {&p.w_qkv, &p.conv_w}) {  // the share's rows of each of the q, k and v thirds
          REQUIRE(t->dim(0) == 3 * n);
          const Tensor& wt = t == &p.w_qkv ? w.w_qkv : w.conv_w;
          for (int64_t third = 0; third < 3; ++third)
            CHECK(same_rows(*be, t->slice_rows(third * n, (third + 1) * n), wt, third * P + c0));
        }
        CHECK(same_rows(*be, p.w_fb, w.w_fb, c0));
        CHECK(same_rows(*be, p.a_log, w.a_log, h0));
        CHECK(same_rows(*be, p.dt_bias, w.dt_bias, c0));
        CHECK(same_rows(*be, p.w_b, w.w_b, h0));
        CHECK(same_rows(*be, p.w_g, w.w_g, c0));
        CHECK((p.w_fb.dim(0) == n && p.a_log.dim(0) == H / 2 && p.w_b.dim(0) == H / 2 && p.w_g.dim(0) == n));
        CHECK(same_rows(*be, p.w_o, w.w_o, 0));  // the output side stays whole
        CHECK(p.w_o.dim(0) == w.w_o.dim(0));
      } else {
        ++mla_layers;
        CHECK(p.w_uv.dim(0) == Hm / 2);
        CHECK(same_rows(*be, p.w_uv, w.w_uv, m0));
        CHECK(same_rows(*be, p.w_g, w.w_g, m0 * dv));
        CHECK(p.w_g.dim(0) == Hm / 2 * dv);
        CHECK(same_rows(*be, p.w_uk_t, w.w_uk_t, 0));  // the query side stays whole
        CHECK(p.w_uk_t.dim(0) == Hm);
      }
    }
    CHECK(kda_layers > 0);
    CHECK(mla_layers > 0);
  }
  CHECK(upload_bytes(cfg, 0, L, {}, DType::F32, {.index = 0, .count = 2}) < upload_bytes(cfg, 0, L, {}, DType::F32));
  const WeightStore store = random_weights(cfg, 4, DType::F32);
  for (const HeadShare bad : {HeadShare{2, 2}, HeadShare{-1, 2}, HeadShare{0, 0}}) {
    auto r = upload_weights(*be, cfg, store, 0, L, {}, bad);
    REQUIRE(!r.is_ok());
    CHECK(r.status().message().find("is not a share") != std::string::npos);
  }
  auto uneven = upload_weights(*be, cfg, store, 0, L, {}, {.index = 0, .count = H + 1});
  REQUIRE(!uneven.is_ok());
  CHECK(uneven.status().message().find("heads do not split into " + std::to_string(H + 1)) != std::string::npos);
}

// The upload tells the store's observer each weight as it goes: bytes done rising to the expected total
// (upload_bytes, which an EP rank's expert range shrinks), and a LoadProgress shows it as 5 % lines
// ending at 100 % in a log (none at all under its threshold, as for k3-tiny by default).
TEST_CASE("upload_weights reports its progress to the store's observer, and LoadProgress prints it", "[engine]") {
  const ModelConfig cfg = tiny_config("k3-tiny");
  auto be = make_cpu_backend({.threads = 2});
  const int L = cfg.num_hidden_layers;
  WeightStore store = random_weights(cfg, 5, DType::F32);
  const uint64_t whole = upload_bytes(cfg, 0, L, {}, DType::F32), part = upload_bytes(cfg, 0, L, {0, 2}, DType::F32);
  CHECK(part < whole);
  std::vector<std::pair<uint64_t, uint64_t>> seen;
  store.set_upload_observer([&](uint64_t done, uint64_t total) { seen.emplace_back(done, total); });
  REQUIRE(upload_weights(*be, cfg, store, 0, L, {0, 2}).is_ok());
  REQUIRE(seen.size() > 10);
  for (size_t i = 0; i < seen.size(); ++i) {
    CHECK(seen[i].second == part);
    if (i > 0) CHECK(seen[i].first > seen[i - 1].first);
  }
  CHECK(seen.back().first >= part);  // every tensor once, plus the MLA up-projections in two forms

  std::FILE* log = std::tmpfile();
  REQUIRE(log != nullptr);
  {
    LoadProgress progress("test: weights", 0, log);
    store.set_upload_observer(progress.observer());
    REQUIRE(upload_weights(*be, cfg, store, 0, L).is_ok());
    progress.finish();
  }
  std::rewind(log);
  std::string text;
  for (int c; (c = std::fgetc(log)) != EOF;) text += static_cast<char>(c);
  std::fclose(log);
  INFO(text);
  CHECK(text.find("test: weights 100%") != std::string::npos);
  CHECK(text.find("took") != std::string::npos);
  size_t lines = 0;
  for (char c : text) lines += c == '\n';
  CHECK(lines >= 5);   // the way there, not just the end
  CHECK(lines <= 21);  // a line each 5 % at most, and the last

  std::FILE* quiet = std::tmpfile();
  {
    LoadProgress below("test: weights", whole + 1, quiet);  // a model under the threshold shows nothing
    store.set_upload_observer(below.observer());
    REQUIRE(upload_weights(*be, cfg, store, 0, L).is_ok());
    below.finish();
  }
  CHECK(std::ftell(quiet) == 0);
  std::fclose(quiet);
}
