// A decode rank of a GPU group imports a request from its transfer region in place: the region is device
// memory and import_caches_from gathers the request's MLA rows out of the region's page tables and copies
// its KDA entries, on the device. Checked against the path that has served GPU ranks until now (the packed
// image, from host memory, through import_caches): the caches hold the same bytes, exported again. The
// tables are random finite bytes at random rows, so a row taken from the wrong place shows. Prints SKIPPED
// where no GPU is visible.
#include <catch2/catch.hpp>

#include <algorithm>
#include <numeric>
#include <random>

#include "engine/cache_io.h"
#include "tests/cuda/cuda_test_util.h"
#include "tests/engine/model_fixture.h"

using namespace k3;

TEST_CASE("cuda import_caches_from device tables equals the packed image's import", "[cuda][transfer]") {
  K3_GPU_OR_SKIP(bk);
  Backend& gpu = *bk.gpu;
  const ModelConfig cfg = test::tiny_config();
  const int L = cfg.num_hidden_layers;
  const CacheOptions opts{.max_seqs = 3, .page_size = 16, .num_pages = 24};
  CachePools by_image(gpu, cfg, 0, L, opts), by_tables(gpu, cfg, 0, L, opts);
  const CacheLayout& layout = by_image.layout();
  std::mt19937 rng(31);

  for (const int64_t T : {1, 16, 37, 100}) {
    INFO("tokens " << T);
    // The "region": per layer an MLA table of R rows or a KDA conv + state entry, random bytes below 0x40
    // (every bf16 and f32 they form is finite, so any copy keeps them bit for bit).
    const int64_t R = 160;
    const PackedImage img = layout.pack_range(0, L, static_cast<uint64_t>(T));
    std::vector<uint64_t> at(static_cast<size_t>(L));
    uint64_t total = 0;
    for (int l = 0; l < L; ++l) {
      at[static_cast<size_t>(l)] = total;
      total += layout.layers.at(l) == LayerCache::Kda ? layout.kda_conv_bytes() + layout.kda_state_bytes()
                                                      : static_cast<uint64_t>(R) * layout.mla_row_bytes;
    }
    total = (total + 3) / 4 * 4;
    std::vector<uint8_t> host(total);
    std::uniform_int_distribution<int> byte(0, 0x3F);
    for (auto& b : host) b = static_cast<uint8_t>(byte(rng));
    std::vector<int32_t> rows(static_cast<size_t>(R));
    std::iota(rows.begin(), rows.end(), 0);
    std::shuffle(rows.begin(), rows.end(), rng);
    rows.resize(static_cast<size_t>(T));

    // The packed image of the same bytes, built on the host by hand.
    std::vector<uint8_t> image(img.total_bytes);
    for (const auto& [l, e] : img.layers) {
      const uint8_t* base = host.data() + at[l];
      if (layout.layers.at(l) == LayerCache::Kda) {
        std::copy_n(base, layout.kda_conv_bytes(), image.data() + e.conv);
        std::copy_n(base + layout.kda_conv_bytes(), layout.kda_state_bytes(), image.data() + e.state);
      } else {
        for (int64_t p = 0; p < T; ++p)
          std::copy_n(base + static_cast<uint64_t>(rows[static_cast<size_t>(p)]) * layout.mla_row_bytes,
                      layout.mla_row_bytes, image.data() + e.rows + static_cast<uint64_t>(p) * layout.mla_row_bytes);
      }
    }

    // The region on the device.
    Tensor dev = gpu.alloc({static_cast<int64_t>(total / 4)}, DType::F32);
    gpu.copy(Tensor::view(host.data(), {static_cast<int64_t>(total / 4)}, DType::F32), dev);
    auto* region = static_cast<uint8_t*>(dev.data());
    CacheTables tables{.device = Device::Cuda, .table_rows = R, .rows = rows,
                       .mla_table = [&](int l) { return region + at[static_cast<size_t>(l)]; },
                       .kda_entries = [&](int l) {
                         uint8_t* c = region + at[static_cast<size_t>(l)];
                         return std::pair<uint8_t*, uint8_t*>{c, c + layout.kda_conv_bytes()};
                       }};

    SeqCache a = by_image.open().value(), b = by_tables.open().value();
    REQUIRE(by_image.reserve(a, T).is_ok());
    REQUIRE(by_tables.reserve(b, T).is_ok());
    REQUIRE(import_caches(gpu, by_image, a, 0, L, T, image.data(), image.size()).is_ok());
    const Status st = import_caches_from(gpu, by_tables, b, 0, L, T, tables);
    INFO(st.to_string());
    REQUIRE(st.is_ok());
    a.num_tokens = b.num_tokens = T;
    std::vector<uint8_t> out_a, out_b;
    export_caches(gpu, by_image, a, 0, L, out_a);
    export_caches(gpu, by_tables, b, 0, L, out_b);
    CHECK(out_a == image);
    CHECK(out_b == out_a);

    // Host tables for device caches are refused, naming it; a row past the tables too.
    CacheTables host_tables = tables;
    host_tables.device = Device::Cpu;
    CHECK(import_caches_from(gpu, by_tables, b, 0, L, T, host_tables).message().find("another memory") != std::string::npos);
    CacheTables past = tables;
    past.rows[0] = static_cast<int32_t>(R);
    CHECK(import_caches_from(gpu, by_tables, b, 0, L, T, past).message().find("outside") != std::string::npos);
    by_image.close(a);
    by_tables.close(b);
  }
}
