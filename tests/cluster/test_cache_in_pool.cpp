// The decode engine's cache placed in the transfer region (decode_node/cache_in_pool.h), in one process
// with the real pool, engine and model (no sockets): the bytes a transfer writes at the ADDRS of a
// request's allocation are the bytes the engine decodes from (no import copy), the next token equals an
// engine that prefilled the prompt itself, and the region's one accounting holds the request once and
// returns to where it started whichever side lets go first.
#include <catch2/catch.hpp>

#include <cstring>

#include "decode_node/cache_in_pool.h"
#include "engine/cache_io.h"
#include "tests/engine/model_fixture.h"

using namespace k3;
using namespace k3::transfer;

namespace {

int argmax(const Tensor& logits) {
  const float* p = logits.f32();
  int best = 0;
  for (int64_t i = 1; i < logits.dim(-1); ++i)
    if (p[i] > p[best]) best = static_cast<int>(i);
  return best;
}

// What the prefill stages' puts do for one request: the packed image's rows into the request's pages of
// every MLA layer, its conv/state into the request's slot of every KDA layer, at the ADDRS addresses.
void write_as_transfer(const CacheLayout& layout, const RankPoolGeometry& geo, const RankAllocation& a,
                       const std::vector<uint8_t>& image, uint32_t num_tokens, std::vector<uint8_t>& region) {
  protocol::Addrs addrs;
  append_addrs(geo, a, addrs);
  std::vector<uint32_t> main_layers;
  for (uint32_t l = 0; l < layout.num_main_layers(); ++l) main_layers.push_back(l);
  const PackedImage img = layout.pack(main_layers, num_tokens);
  REQUIRE(img.total_bytes == image.size());
  const auto& pages = addrs.page_tables.at(0).page_ids;
  for (const auto& e : addrs.entries) {
    uint8_t* dst = region.data() + (e.remote_addr - geo.base);
    const PackedEntry& src = img.layers.at(e.layer_id);
    if (e.kind == EntryKind::MlaKv) {
      for (uint32_t p = 0; p < num_tokens; ++p)
        std::memcpy(dst + CacheLayout::paged_row(pages, geo.page_size, p) * layout.mla_row_bytes,
                    image.data() + src.rows + p * layout.mla_row_bytes, layout.mla_row_bytes);
    } else if (e.kind == EntryKind::KdaConv) {
      std::memcpy(dst, image.data() + src.conv, e.length);
    } else if (e.kind == EntryKind::KdaState) {
      std::memcpy(dst, image.data() + src.state, e.length);
    }
  }
}

}  // namespace

TEST_CASE("cache in the transfer pool: one copy per request, decoded where the transfer wrote it", "[cluster]") {
  const ModelConfig cfg = test::tiny_config("k3-tiny", 512);
  const WeightStore weights = random_weights(cfg, 7, DType::BF16);
  auto be = make_cpu_backend({.threads = 1});
  const CacheLayout layout = cache_layout(cfg, *be).value();
  std::mt19937 rng(3);
  constexpr uint32_t kTokens = 21, kPageSize = 16;  // two pages; the next token needs no third
  const auto prompt = test::random_tokens(rng, kTokens, cfg.vocab_size);

  // Reference: an engine with its own pools prefills the prompt, then decodes one token.
  auto ref = Engine::create(*be, cfg, weights, test::engine_options()).value();
  SeqCache ref_seq = ref->open().value();
  const int first = argmax(ref->prefill(ref_seq, prompt).value());
  std::vector<uint8_t> image;
  export_caches(*be, ref->caches(), ref_seq, 0, cfg.num_hidden_layers, image);
  SeqCache* ref_ptr = &ref_seq;
  const std::vector<int32_t> next_in = {first};
  const Tensor ref_logits = ref->feed(std::span(&ref_ptr, 1), std::span(&next_in, 1)).value();

  // The decode rank's region: the transfer pool's geometry, the engine's pools inside it.
  const DecodeLayout plain{.ranks = {0}};
  auto probe = RankPoolGeometry::for_rank(layout, plain, 0, 0, 0, kPageSize, 8, 2).value();
  std::vector<uint8_t> region(probe.region_bytes(), 0xEE);
  auto geo = RankPoolGeometry::for_rank(layout, plain, 0, 0, reinterpret_cast<uint64_t>(region.data()), kPageSize, 8, 2)
                 .value();
  auto pool = RankPool::create(geo).value();
  auto memory = decode::cache_memory_in_region(layout, geo, region, Device::Cpu).value();
  EngineOptions eo;
  eo.cache = decode::cache_options_for(geo, memory);
  auto engine = Engine::create(*be, cfg, weights, eo).value();
  REQUIRE(pool->share_ids(std::make_shared<decode::CachePoolIds>(engine->caches())).is_ok());
  const uint64_t start = pool->free_bytes();
  REQUIRE(start == pool->capacity_bytes());

  // CLAIM: the pool allocates the request's pages and slot; the transfer writes its caches there.
  RankAllocation a{.rank = 0, .pages = pool->allocate_pages((kTokens + kPageSize - 1) / kPageSize).value(),
                   .slot = pool->allocate_slot().value()};
  const uint64_t one_request = a.pages.page_ids().size() * geo.page_bytes() + geo.slot_bytes();
  CHECK(start - pool->free_bytes() == one_request);
  write_as_transfer(layout, geo, a, image, kTokens, region);

  // Ready: the engine adopts the pages and slot in place. Still one copy in the accounting.
  const auto& ids = a.pages.page_ids();
  SeqCache seq = engine->caches()
                     .adopt(static_cast<int>(*a.slot.slot()), std::vector<int32_t>(ids.begin(), ids.end()), kTokens)
                     .value();
  CHECK(start - pool->free_bytes() == one_request);
  CHECK(engine->caches().free_pages() == static_cast<int>(pool->free_pages()));
  // The engine reads the transferred bytes themselves: its pools are the region, its image is the one written.
  const Tensor& kv = engine->caches().mla_kv(static_cast<int>(geo.mla_layer_ids.at(0)));
  CHECK(kv.ptr<uint8_t>() >= region.data());
  CHECK(kv.ptr<uint8_t>() + kv.nbytes() <= region.data() + region.size());
  std::vector<uint8_t> read_back;
  export_caches(*be, engine->caches(), seq, 0, cfg.num_hidden_layers, read_back);
  CHECK(read_back == image);

  // Decoding from there gives the reference engine's logits for the same next token.
  SeqCache* ptr = &seq;
  const Tensor logits = engine->feed(std::span(&ptr, 1), std::span(&next_in, 1)).value();
  REQUIRE(logits.numel() == ref_logits.numel());
  CHECK(test::rel_diff(logits.f32(), ref_logits.f32(), logits.numel()) < 1e-6);
  CHECK(argmax(logits) == argmax(ref_logits));
  CHECK(start - pool->free_bytes() == one_request);

  SECTION("the engine lets go first (decoding ended), then the transfer (on_finished)") {
    engine->caches().close(seq);
    CHECK(start - pool->free_bytes() == one_request);  // the transfer still holds it
    a.pages.release();
    a.slot.release();
  }
  SECTION("the transfer lets go first (an ABORT while decoding), then the engine") {
    a.pages.release();
    a.slot.release();
    CHECK(start - pool->free_bytes() == one_request);  // the engine still decodes from it
    // Nobody else is handed the request's pages while the engine holds them.
    auto rest = pool->allocate_pages(pool->free_pages()).value();
    for (uint32_t id : rest.page_ids()) CHECK(std::find(ids.begin(), ids.end(), id) == ids.end());
    rest.release();
    engine->caches().close(seq);
  }
  CHECK(pool->free_bytes() == start);
  CHECK(pool->free_slots() == geo.num_slots);
  ref->close(ref_seq);
}

TEST_CASE("cache in the transfer pool: bad input is refused by name", "[cluster]") {
  const ModelConfig cfg = test::tiny_config("k3-tiny", 512);
  const WeightStore weights = random_weights(cfg, 7, DType::BF16);
  auto be = make_cpu_backend({.threads = 1});
  const CacheLayout layout = cache_layout(cfg, *be).value();
  const DecodeLayout plain{.ranks = {0}};
  auto probe = RankPoolGeometry::for_rank(layout, plain, 0, 0, 0, 16, 4, 2).value();
  std::vector<uint8_t> region(probe.region_bytes());
  auto geo = RankPoolGeometry::for_rank(layout, plain, 0, 0, reinterpret_cast<uint64_t>(region.data()), 16, 4, 2).value();
  // A region smaller than the geometry.
  auto small = decode::cache_memory_in_region(layout, geo, std::span(region).first(region.size() - 1), Device::Cpu);
  CHECK(small.status().code() == Code::InvalidArgument);
  EngineOptions eo;
  eo.cache = decode::cache_options_for(geo, decode::cache_memory_in_region(layout, geo, region, Device::Cpu).value());
  auto engine = Engine::create(*be, cfg, weights, eo).value();
  // Adopting ids nobody allocated.
  CHECK(engine->caches().adopt(0, {0}, 1).status().code() == Code::InvalidArgument);
  // Ids are shared only while the pool hands out nothing.
  auto pool = RankPool::create(geo).value();
  auto held = pool->allocate_pages(1).value();
  CHECK(pool->share_ids(std::make_shared<decode::CachePoolIds>(engine->caches())).code() == Code::InvalidArgument);
}
