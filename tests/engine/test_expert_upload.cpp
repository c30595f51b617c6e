// An EP rank's upload: upload_weights with an ExpertRange reads and uploads those routed experts only,
// bit for bit the rows of the whole upload, from a stored model and from a synthetic one (drawn where
// the weights live), and names a range that is not one of the model's; and the upload's progress.
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
