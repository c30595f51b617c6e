// common/config/cache_layout: the one definition of the per-request cache bytes. Sizes at K3 dimensions
// (docs/MODEL.md §8.5), the packed image's offsets, paged rows, and errors that name the field.
#include <catch2/catch.hpp>

#include <cstdint>
#include <vector>

#include "common/config/cache_layout.h"

using namespace k3;

TEST_CASE("the K3 cache layout has the published sizes") {
  const ModelConfig cfg = preset_config("k3").value();
  const CacheLayout m = CacheLayout::from_config(cfg, {.kv = DType::BF16, .conv = DType::BF16, .state = DType::F32}).value();
  REQUIRE(m.layers.size() == 93);
  CHECK(m.layer_ids(LayerCache::Mla).size() == 24);
  CHECK(m.layer_ids(LayerCache::Kda).size() == 69);
  CHECK(m.layers[3] == LayerCache::Mla);
  CHECK(m.layers[92] == LayerCache::Mla);
  CHECK(m.mla_row_width == 576);
  CHECK(m.mla_row_bytes == 576 * 2);
  CHECK(m.mla_row_bytes * 24 == 27648);  // MLA bytes per token, bf16
  CHECK(m.kda_proj_dim() == 12288);
  CHECK(m.kda_conv_bytes() == 3ull * 3 * 12288 * 2);
  CHECK(m.kda_state_bytes() == 96ull * 128 * 128 * 4);
  CHECK(m.num_main_layers() == 93);
}

TEST_CASE("a packed image lays layers back to back in ascending id") {
  const ModelConfig cfg = preset_config("k3-tiny").value();  // layers 3 and 7 are MLA
  const CacheLayout m = CacheLayout::from_config(cfg, {.kv = DType::F32, .conv = DType::F32, .state = DType::F32}, 1, 40).value();
  REQUIRE(m.layers.size() == 9);
  CHECK(m.layers[8] == LayerCache::Draft);
  CHECK(m.num_main_layers() == 8);
  const uint64_t T = 5, row = m.mla_row_bytes, kda = m.kda_conv_bytes() + m.kda_state_bytes();
  CHECK(row == (32 + 8) * 4);
  const PackedImage img = m.pack({2, 3, 4, 8}, T);
  REQUIRE(img.layers.size() == 4);
  CHECK(img.layers.at(2).conv == 0);
  CHECK(img.layers.at(2).state == m.kda_conv_bytes());
  CHECK(img.layers.at(3).rows == kda);
  CHECK(img.layers.at(4).conv == kda + T * row);
  CHECK(img.layers.at(8).rows == 2 * kda + T * row);
  CHECK(img.total_bytes == 2 * kda + T * row + T * 40);
  CHECK(m.pack_range(2, 5, T).total_bytes == 2 * kda + T * row);
  CHECK(m.pack({}, T).total_bytes == 0);
}

TEST_CASE("paged rows follow the page table") {
  const std::vector<int32_t> pages{7, 2, 5};
  CHECK(CacheLayout::paged_row(pages, 4, 0) == 28);
  CHECK(CacheLayout::paged_row(pages, 4, 3) == 31);
  CHECK(CacheLayout::paged_row(pages, 4, 4) == 8);
  CHECK(CacheLayout::paged_row(pages, 4, 9) == 21);
  const std::vector<uint32_t> upages{1};
  CHECK(CacheLayout::paged_row(upages, 16, 15) == 31);
}

TEST_CASE("cache layout errors name the field") {
  ModelConfig cfg = preset_config("k3-tiny").value();
  cfg.kda.full_attn_layers.push_back(1);  // layer 1 in both lists
  auto r = CacheLayout::from_config(cfg, {});
  REQUIRE_FALSE(r.is_ok());
  CHECK(r.status().message().find("full_attn_layers") != std::string::npos);

  CacheLayout hand;
  hand.layers = {LayerCache::Mla, LayerCache::Kda};
  hand.kda_heads = 2;
  hand.kda_conv_head_bytes = hand.kda_state_head_bytes = 8;
  CHECK(hand.validate().message().find("mla_row_bytes") != std::string::npos);
  hand.mla_row_bytes = 16;
  CHECK(hand.validate().is_ok());
  hand.layers = {LayerCache::Draft, LayerCache::Mla};
  CHECK(hand.validate().message().find("no main layers") != std::string::npos);
}
