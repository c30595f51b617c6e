// Transfer plans over every (prefill PP, decode layout) pair, checked by simulation: source "bytes" carry
// labels that say (layer, kind, token/row, head/column block, byte); the plan is applied to simulated
// decode regions (unused bytes poisoned) and every destination byte must carry the label the relayout
// demands, computed here independently from the layout spec. Also: coalescing, shuffled ADDRS, errors.
#include <catch2/catch.hpp>

#include <algorithm>
#include <numeric>
#include <random>

#include "transfer/plan.h"
#include "transfer/pool.h"

using namespace k3;
using namespace k3::transfer;
using protocol::EntryKind;

namespace {

constexpr uint64_t kPoison = ~0ull;

uint64_t label(uint32_t layer, EntryKind kind, uint64_t a, uint64_t b, uint64_t byte) {
  return uint64_t(layer) << 54 | uint64_t(kind) << 52 | a << 32 | b << 16 | byte;
}

// 3 KDA : 1 MLA like K3, optional draft layers; tiny byte sizes so every byte can be checked.
CacheLayout test_model(uint32_t num_layers, uint32_t num_draft) {
  CacheLayout m;
  for (uint32_t l = 0; l < num_layers; ++l) m.layers.push_back(l % 4 == 3 ? LayerCache::Mla : LayerCache::Kda);
  m.layers.insert(m.layers.end(), num_draft, LayerCache::Draft);
  m.mla_row_bytes = 12;
  m.draft_row_bytes = num_draft ? 8 : 0;
  m.kda_heads = 8;
  m.kda_conv_rows = 3;
  m.kda_conv_head_bytes = 4;
  m.kda_state_head_bytes = 6;
  REQUIRE(m.validate().is_ok());
  return m;
}

std::vector<uint32_t> random_partition(uint32_t layers, uint32_t stages, std::mt19937_64& rng) {
  // Choose stages-1 distinct cut points in 1..layers-1.
  std::vector<uint32_t> cuts(layers - 1);
  std::iota(cuts.begin(), cuts.end(), 1);
  std::shuffle(cuts.begin(), cuts.end(), rng);
  cuts.resize(stages - 1);
  std::sort(cuts.begin(), cuts.end());
  std::vector<uint32_t> p;
  uint32_t prev = 0;
  for (uint32_t c : cuts) p.push_back(c - prev), prev = c;
  p.push_back(layers - prev);
  return p;
}

std::vector<uint32_t> production_partition() {  // 7,5,7,5,...,6,3 over 93 layers, 16 stages
  std::vector<uint32_t> p;
  for (int i = 0; i < 7; ++i) p.insert(p.end(), {7, 5});
  p.insert(p.end(), {6, 3});
  return p;
}

struct Decode {
  const char* name;
  DecodeLayout layout;
};

std::vector<Decode> decode_layouts() {
  return {{"DP1", {{0}, true}},
          {"DP2 (group 1)", {{1}, true}},
          {"DCP2", {{2, 3}, true}},
          {"DCP4", {{4, 5, 6, 7}, true}},
          {"DCP8", {{7, 6, 5, 4, 3, 2, 1, 0}, true}},
          {"DCP4 KDA replicated", {{0, 1, 2, 3}, false}}};
}

struct SimRank {
  RankPoolGeometry geo;
  std::vector<uint32_t> page_ids;
  std::vector<uint64_t> mem;      // labels, one per simulated byte of the region
  std::vector<uint8_t> writes;    // how many times each byte was written
};

// Decode side: a geometry per rank, a random (shuffled, sparse) page table, and the ADDRS from them.
struct SimDecode {
  std::vector<SimRank> ranks;  // by rank index
  protocol::Addrs addrs;
};

SimDecode make_decode(const CacheLayout& model, const DecodeLayout& layout, uint32_t num_tokens,
                      uint32_t page_size, std::mt19937_64& rng) {
  SimDecode d;
  d.addrs.request_id = 9;
  for (uint32_t i = 0; i < layout.group_size(); ++i) {
    const uint32_t rows = layout.rows_on(i, num_tokens);
    const uint32_t need = (rows + page_size - 1) / page_size;
    const uint32_t num_pages = 2 * need + 3;
    auto geo = RankPoolGeometry::for_rank(model, layout, i, /*region*/ 10 + i, /*base*/ 0x100000000ull * (i + 1),
                                          page_size, num_pages, /*slots*/ 3);
    REQUIRE(geo.is_ok());
    SimRank r{.geo = geo.value()};
    std::vector<uint32_t> all(num_pages);
    std::iota(all.begin(), all.end(), 0);
    std::shuffle(all.begin(), all.end(), rng);
    r.page_ids.assign(all.begin(), all.begin() + need);
    r.mem.assign(r.geo.region_bytes(), kPoison);
    r.writes.assign(r.geo.region_bytes(), 0);
    const uint32_t slot = uint32_t(rng() % 3);
    for (uint32_t l : r.geo.mla_layer_ids)
      d.addrs.entries.push_back({l, EntryKind::MlaKv, r.geo.rank, r.geo.layer_pages_addr(l).value(),
                                 r.geo.layer_pages_length(l), r.geo.region_id});
    for (uint32_t l : r.geo.draft_layer_ids)
      d.addrs.entries.push_back({l, EntryKind::DraftKv, r.geo.rank, r.geo.layer_pages_addr(l).value(),
                                 r.geo.layer_pages_length(l), r.geo.region_id});
    for (uint32_t l : r.geo.kda_layer_ids) {
      d.addrs.entries.push_back({l, EntryKind::KdaConv, r.geo.rank, r.geo.kda_conv_addr(slot, l).value(),
                                 r.geo.kda_conv_bytes, r.geo.region_id});
      d.addrs.entries.push_back({l, EntryKind::KdaState, r.geo.rank, r.geo.kda_state_addr(slot, l).value(),
                                 r.geo.kda_state_bytes, r.geo.region_id});
    }
    d.addrs.page_tables.push_back({r.geo.rank, page_size, r.page_ids});
    d.ranks.push_back(std::move(r));
  }
  return d;
}

// Prefill side: a stage's source buffer filled with labels following the source layout.
std::vector<uint64_t> make_source(const CacheLayout& m, const StageSource& s) {
  std::vector<uint64_t> buf(s.total_bytes, kPoison);
  const uint64_t H = m.kda_heads, chb = m.kda_conv_head_bytes, shb = m.kda_state_head_bytes;
  for (const auto& [l, ls] : s.layers) {
    if (m.layers[l] == LayerCache::Kda) {
      for (uint64_t t = 0; t < m.kda_conv_rows; ++t)
        for (uint64_t col = 0; col < 3 * H; ++col)  // col = g*H + h
          for (uint64_t j = 0; j < chb; ++j) buf[ls.conv + (t * 3 * H + col) * chb + j] = label(l, EntryKind::KdaConv, t, col, j);
      for (uint64_t h = 0; h < H; ++h)
        for (uint64_t j = 0; j < shb; ++j) buf[ls.state + h * shb + j] = label(l, EntryKind::KdaState, h, 0, j);
    } else {
      const EntryKind k = m.layers[l] == LayerCache::Mla ? EntryKind::MlaKv : EntryKind::DraftKv;
      const uint64_t row = m.row_bytes(m.layers[l]);
      for (uint64_t p = 0; p < s.num_tokens; ++p)
        for (uint64_t j = 0; j < row; ++j) buf[ls.rows + p * row + j] = label(l, k, p, 0, j);
    }
  }
  return buf;
}

// What every MLA/draft decode byte must hold, straight from the layout spec (plan_layout.h); KDA bytes
// are added by the caller, which knows the slot the entries named.
std::vector<uint64_t> expected_region(const CacheLayout& m, const DecodeLayout& layout, const SimRank& r,
                                      uint32_t i, uint32_t num_tokens) {
  std::vector<uint64_t> want(r.geo.region_bytes(), kPoison);
  const uint64_t base = r.geo.base, N = layout.group_size(), ps = r.geo.page_size;
  for (uint32_t l = 0; l < m.layers.size(); ++l) {
    if (m.layers[l] == LayerCache::Kda) continue;
    const EntryKind k = m.layers[l] == LayerCache::Mla ? EntryKind::MlaKv : EntryKind::DraftKv;
    const uint64_t row = m.row_bytes(m.layers[l]);
    const uint64_t arr = r.geo.layer_pages_addr(l).value() - base;
    for (uint64_t p = i; p < num_tokens; p += N) {
      const uint64_t q = p / N;
      const uint64_t dst_row = uint64_t(r.page_ids[q / ps]) * ps + q % ps;
      for (uint64_t j = 0; j < row; ++j) want[arr + dst_row * row + j] = label(l, k, p, 0, j);
    }
  }
  return want;
}

// Applies ops to the simulated regions; every op must lie inside its rank's region.
void apply(const std::vector<WriteOp>& ops, const std::vector<uint64_t>& src, SimDecode& d) {
  for (const WriteOp& op : ops) {
    auto it = std::find_if(d.ranks.begin(), d.ranks.end(), [&](const SimRank& r) { return r.geo.rank == op.dst_rank; });
    REQUIRE(it != d.ranks.end());
    REQUIRE(op.region_id == it->geo.region_id);
    REQUIRE(op.dst_addr >= it->geo.base);
    const uint64_t off = op.dst_addr - it->geo.base;
    REQUIRE(off + op.length <= it->mem.size());
    REQUIRE(op.src_offset + op.length <= src.size());
    for (uint64_t b = 0; b < op.length; ++b) {
      it->mem[off + b] = src[op.src_offset + b];
      it->writes[off + b]++;
    }
  }
}

// Runs every stage's plan into fresh regions and checks every byte of every rank.
void check_pair(const CacheLayout& model, const PrefillLayout& prefill, const DecodeLayout& layout,
                uint32_t num_tokens, std::mt19937_64& rng) {
  const uint32_t page_size = 1 + uint32_t(rng() % 5);
  SimDecode d = make_decode(model, layout, num_tokens, page_size, rng);
  SimDecode d_fine = d;  // same page tables, applied with uncoalesced ops
  auto dest = DecodeDestinations::from_addrs(d.addrs);
  REQUIRE(dest.is_ok());
  // A shuffled copy of ADDRS (entries and page tables in another order) must give the same plans.
  protocol::Addrs shuffled = d.addrs;
  std::shuffle(shuffled.entries.begin(), shuffled.entries.end(), rng);
  std::reverse(shuffled.page_tables.begin(), shuffled.page_tables.end());
  auto dest_shuffled = DecodeDestinations::from_addrs(shuffled);
  REQUIRE(dest_shuffled.is_ok());

  size_t fine_ops = 0, coarse_ops = 0;
  for (uint32_t s = 0; s < prefill.num_stages(); ++s) {
    const StageSource src = pack_stage_source(model, prefill, s, num_tokens);
    const std::vector<uint64_t> buf = make_source(model, src);
    auto ops = plan_stage_writes(model, prefill, layout, src, dest.value());
    REQUIRE(ops.is_ok());
    auto fine = plan_stage_writes_uncoalesced(model, prefill, layout, src, dest.value());
    REQUIRE(fine.is_ok());
    auto again = plan_stage_writes(model, prefill, layout, src, dest_shuffled.value());
    REQUIRE(again.is_ok());
    CHECK(again.value() == ops.value());
    CHECK(coalesce(fine.value()) == ops.value());  // on-the-fly merging equals the reference coalesce
    CHECK(total_bytes(ops.value()) == total_bytes(fine.value()));
    for (const auto& op : ops.value()) CHECK(op.src_stage == s);
    fine_ops += fine->size();
    coarse_ops += ops->size();
    apply(ops.value(), buf, d);
    apply(fine.value(), buf, d_fine);
  }
  CHECK(coarse_ops <= fine_ops);
  if (num_tokens > 1 && layout.group_size() == 1) CHECK(coarse_ops < fine_ops);  // rows inside a page merge

  for (uint32_t i = 0; i < layout.group_size(); ++i) {
    SimRank& r = d.ranks[i];
    std::vector<uint64_t> want = expected_region(model, layout, r, i, num_tokens);
    // KDA: the slot the entries named (found from the entries, then filled from the spec).
    const uint64_t H = model.kda_heads, chb = model.kda_conv_head_bytes, shb = model.kda_state_head_bytes;
    const uint64_t N = layout.group_size();
    const uint64_t hpr = layout.kda_head_sliced ? H / N : H, h0 = layout.kda_head_sliced ? i * hpr : 0;
    for (uint32_t l : r.geo.kda_layer_ids) {
      const auto& conv = dest->entries.at({l, EntryKind::KdaConv, r.geo.rank});
      const auto& state = dest->entries.at({l, EntryKind::KdaState, r.geo.rank});
      for (uint64_t t = 0; t < model.kda_conv_rows; ++t)
        for (uint64_t g = 0; g < 3; ++g)
          for (uint64_t hh = 0; hh < hpr; ++hh)
            for (uint64_t j = 0; j < chb; ++j)
              want[conv.addr - r.geo.base + ((t * 3 + g) * hpr + hh) * chb + j] =
                  label(l, EntryKind::KdaConv, t, g * H + h0 + hh, j);
      for (uint64_t hh = 0; hh < hpr; ++hh)
        for (uint64_t j = 0; j < shb; ++j)
          want[state.addr - r.geo.base + hh * shb + j] = label(l, EntryKind::KdaState, h0 + hh, 0, j);
    }
    INFO("rank index " << i << " T=" << num_tokens << " page_size=" << page_size);
    size_t wrong = 0, twice = 0;
    for (size_t b = 0; b < want.size(); ++b) {
      wrong += r.mem[b] != want[b];
      twice += r.writes[b] > 1;
    }
    CHECK(wrong == 0);
    CHECK(twice == 0);  // no byte written twice
    CHECK(d_fine.ranks[i].mem == r.mem);  // coalescing preserved every byte
  }
}

}  // namespace

TEST_CASE("plans relayout every byte for every (prefill PP, decode layout) pair", "[plan]") {
  const int pp = GENERATE(1, 2, 4, 16, -16);  // -16: the production partition 7,5,7,5,...,6,3
  const auto layouts = decode_layouts();
  const size_t which = GENERATE(range<size_t>(0, 6));
  const Decode& dl = layouts[which];
  std::mt19937_64 rng(1234 + pp * 31 + which);
  for (int trial = 0; trial < 3; ++trial) {
    const uint32_t draft = trial == 1 ? 1 : 0;
    const CacheLayout model = test_model(93, draft);
    PrefillLayout prefill{pp < 0 ? production_partition() : random_partition(93, uint32_t(pp), rng)};
    REQUIRE(prefill.validate(model).is_ok());
    // Include prompts shorter than the DCP group (ranks holding zero tokens).
    const uint32_t T = trial == 2 ? 1 + uint32_t(rng() % 3) : 1 + uint32_t(rng() % 37);
    INFO(dl.name << " PP=" << pp << " T=" << T << " draft=" << draft);
    check_pair(model, prefill, dl.layout, T, rng);
  }
}

TEST_CASE("production partition covers 93 layers in 16 stages", "[plan]") {
  const auto p = production_partition();
  CHECK(p.size() == 16);
  CHECK(std::accumulate(p.begin(), p.end(), 0u) == 93);
  const CacheLayout model = test_model(93, 1);
  PrefillLayout prefill{p};
  CHECK(prefill.stage_layers(model, 0) == std::vector<uint32_t>{0, 1, 2, 3, 4, 5, 6});
  CHECK(prefill.stage_layers(model, 15) == std::vector<uint32_t>{90, 91, 92, 93});  // + the draft layer
}

TEST_CASE("coalescing merges only contiguous neighbours", "[plan]") {
  std::vector<WriteOp> ops = {
      {0, 0, 1, 5, 1000, 10}, {0, 10, 1, 5, 1010, 6},   // merge
      {0, 16, 1, 5, 2000, 4},                           // dst jump
      {0, 20, 2, 5, 2004, 4},                           // other rank
      {0, 24, 2, 6, 2008, 4},                           // other region
      {0, 28, 2, 6, 2012, 0},                           // empty: dropped
      {1, 28, 2, 6, 2012, 4},                           // other stage
      {1, 40, 2, 6, 2016, 4},                           // src jump
  };
  const auto c = coalesce(ops);
  REQUIRE(c.size() == 6);
  CHECK(c[0] == WriteOp{0, 0, 1, 5, 1000, 16});
  CHECK(total_bytes(c) == total_bytes(ops));
}

TEST_CASE("plan errors name the layer, kind and rank", "[plan]") {
  std::mt19937_64 rng(5);
  const CacheLayout model = test_model(8, 0);  // layers 3 and 7 are MLA
  const PrefillLayout prefill{{4, 4}};
  const DecodeLayout layout{{0, 1}, true};
  SimDecode d = make_decode(model, layout, 10, 4, rng);
  const StageSource src = pack_stage_source(model, prefill, 1, 10);

  SECTION("missing entry") {
    auto a = d.addrs;
    std::erase_if(a.entries, [](const auto& e) { return e.layer_id == 7 && e.dest_rank == 1; });
    auto r = plan_stage_writes(model, prefill, layout, src, DecodeDestinations::from_addrs(a).value());
    REQUIRE_FALSE(r.is_ok());
    CHECK(r.status().code() == Code::NotFound);
    CHECK(r.status().message().find("layer 7 MLA_KV rank 1") != std::string::npos);
  }
  SECTION("entries of other stages' layers are not needed") {
    auto a = d.addrs;
    std::erase_if(a.entries, [](const auto& e) { return e.layer_id < 4; });
    CHECK(plan_stage_writes(model, prefill, layout, src, DecodeDestinations::from_addrs(a).value()).is_ok());
  }
  SECTION("page table too short") {
    auto a = d.addrs;
    a.page_tables[0].page_ids.pop_back();
    auto r = plan_stage_writes(model, prefill, layout, src, DecodeDestinations::from_addrs(a).value());
    REQUIRE_FALSE(r.is_ok());
    CHECK(r.status().code() == Code::OutOfRange);
  }
  SECTION("page id outside the layer's page array") {
    auto a = d.addrs;
    a.page_tables[1].page_ids[0] = 1000;
    auto r = plan_stage_writes(model, prefill, layout, src, DecodeDestinations::from_addrs(a).value());
    REQUIRE_FALSE(r.is_ok());
    CHECK(r.status().message().find("overruns") != std::string::npos);
  }
  SECTION("KDA destination of the wrong size") {
    auto a = d.addrs;
    for (auto& e : a.entries)
      if (e.layer_id == 5 && e.kind == EntryKind::KdaState) e.length += 1;
    auto r = plan_stage_writes(model, prefill, layout, src, DecodeDestinations::from_addrs(a).value());
    REQUIRE_FALSE(r.is_ok());
    CHECK(r.status().message().find("layer 5 KDA_STATE") != std::string::npos);
  }
  SECTION("duplicate entries and page tables are refused") {
    auto a = d.addrs;
    a.entries.push_back(a.entries.front());
    CHECK_FALSE(DecodeDestinations::from_addrs(a).is_ok());
    a = d.addrs;
    a.page_tables.push_back(a.page_tables.front());
    CHECK_FALSE(DecodeDestinations::from_addrs(a).is_ok());
  }
  SECTION("source not matching the stage") {
    StageSource bad = src;
    bad.layers.erase(6);
    CHECK_FALSE(plan_stage_writes(model, prefill, layout, bad, DecodeDestinations::from_addrs(d.addrs).value()).is_ok());
    bad = src;
    bad.layers[0] = {};
    CHECK_FALSE(plan_stage_writes(model, prefill, layout, bad, DecodeDestinations::from_addrs(d.addrs).value()).is_ok());
  }
  SECTION("heads not divisible by the group") {
    const DecodeLayout three{{0, 1, 2}, true};
    CHECK_FALSE(three.validate(model).is_ok());
    CHECK(DecodeLayout({0, 1, 2}, false).validate(model).is_ok());
  }
}

TEST_CASE("layouts validate and derive from a model config", "[plan]") {
  ModelConfig c;
  c.num_hidden_layers = 4;
  c.kda.num_heads = 96;
  c.kda.head_dim = 128;
  c.kda.short_conv_kernel_size = 4;
  c.kda.kda_layers = {1, 2, 3};
  c.kda.full_attn_layers = {4};
  c.kv_lora_rank = 512;
  c.qk_rope_head_dim = 64;
  auto m = CacheLayout::from_config(c, {.kv = DType::BF16, .conv = DType::BF16, .state = DType::F32}, 1, 1024);
  REQUIRE(m.is_ok());
  CHECK(m->layers == std::vector<LayerCache>{LayerCache::Kda, LayerCache::Kda, LayerCache::Kda, LayerCache::Mla,
                                             LayerCache::Draft});
  CHECK(m->mla_row_bytes == 576 * 2);
  CHECK(m->kda_conv_bytes() == 3ull * 3 * 96 * 128 * 2);
  CHECK(m->kda_state_bytes() == 96ull * 128 * 128 * 4);
  CHECK(m->num_main_layers() == 4);
  c.kda.full_attn_layers = {3, 4};
  CHECK_FALSE(CacheLayout::from_config(c, {}).is_ok());  // layer 3 in both lists
  CHECK_FALSE(PrefillLayout{{2, 1}}.validate(m.value()).is_ok());     // sums to 3, not 4
  CHECK_FALSE(PrefillLayout{{4, 0}}.validate(m.value()).is_ok());
  CHECK_FALSE(DecodeLayout({1, 1}, true).validate(m.value()).is_ok());
  const DecodeLayout d4{{0, 1, 2, 3}, true};
  CHECK(d4.rows_on(0, 10) == 3);
  CHECK(d4.rows_on(1, 10) == 3);
  CHECK(d4.rows_on(2, 10) == 2);
  CHECK(d4.rows_on(3, 2) == 0);
}

TEST_CASE("plans relayout every byte for the Kimi Linear 48B schedule (27 layers, MLA at 4, 8, ..., 24, 27)",
          "[plan]") {
  // The real layer kinds, small byte sizes (the relayout depends on kinds and counts, not on widths).
  const ModelConfig cfg = preset_config("kimi-linear-48b").value();
  CacheLayout model = test_model(1, 0);
  model.layers.clear();
  for (int l = 0; l < cfg.num_hidden_layers; ++l)
    model.layers.push_back(cfg.layer_kind(l) == LayerKind::Mla ? LayerCache::Mla : LayerCache::Kda);
  REQUIRE(model.validate().is_ok());
  REQUIRE(model.num_main_layers() == 27);
  const auto layouts = decode_layouts();
  std::mt19937_64 rng(27);
  for (uint32_t pp : {1u, 2u, 4u, 27u})
    for (const Decode& dl : layouts) {
      PrefillLayout prefill{random_partition(27, pp, rng)};
      REQUIRE(prefill.validate(model).is_ok());
      const uint32_t T = 1 + uint32_t(rng() % 37);
      INFO(dl.name << " PP=" << pp << " T=" << T);
      check_pair(model, prefill, dl.layout, T, rng);
    }
}

TEST_CASE("a stage's plan parts (chunk rows, then states) partition its whole plan", "[plan][stream]") {
  // A streaming stage plans each chunk's rows as it is computed and the KDA states after the last chunk:
  // the union of those parts must be exactly the whole-prompt plan (the reference), every op once.
  const auto layouts = decode_layouts();
  const size_t which = GENERATE(range<size_t>(0, 6));
  std::mt19937_64 rng(77 + which);
  const CacheLayout model = test_model(16, 1);
  const PrefillLayout prefill{random_partition(16, 3, rng)};
  for (int trial = 0; trial < 4; ++trial) {
    const uint32_t T = 1 + uint32_t(rng() % 40);
    SimDecode d = make_decode(model, layouts[which].layout, T, 1 + uint32_t(rng() % 5), rng);
    auto dest = DecodeDestinations::from_addrs(d.addrs);
    REQUIRE(dest.is_ok());
    for (uint32_t s = 0; s < prefill.num_stages(); ++s) {
      const StageSource src = pack_stage_source(model, prefill, s, T);
      auto whole = plan_stage_writes_uncoalesced(model, prefill, layouts[which].layout, src, dest.value());
      REQUIRE(whole.is_ok());
      std::vector<WriteOp> parts, coalesced_parts;
      for (uint32_t at = 0; at < T;) {
        const uint32_t next = std::min<uint32_t>(T, at + 1 + uint32_t(rng() % 9));
        const PlanPart rows{.row_begin = at, .row_end = next, .states = false};
        auto fine = plan_stage_writes_uncoalesced(model, prefill, layouts[which].layout, src, dest.value(), rows);
        auto coarse = plan_stage_writes(model, prefill, layouts[which].layout, src, dest.value(), rows);
        REQUIRE(fine.is_ok());
        REQUIRE(coarse.is_ok());
        CHECK(total_bytes(coarse.value()) == total_bytes(fine.value()));
        parts.insert(parts.end(), fine->begin(), fine->end());
        coalesced_parts.insert(coalesced_parts.end(), coarse->begin(), coarse->end());
        at = next;
      }
      const PlanPart states{.row_begin = T, .row_end = T, .states = true};
      auto last = plan_stage_writes_uncoalesced(model, prefill, layouts[which].layout, src, dest.value(), states);
      REQUIRE(last.is_ok());
      parts.insert(parts.end(), last->begin(), last->end());
      const auto key = [](const WriteOp& a, const WriteOp& b) {
        return std::tie(a.dst_rank, a.dst_addr, a.src_offset, a.length) < std::tie(b.dst_rank, b.dst_addr, b.src_offset, b.length);
      };
      std::vector<WriteOp> want = whole.value();
      std::sort(want.begin(), want.end(), key);
      std::sort(parts.begin(), parts.end(), key);
      INFO(layouts[which].name << " T=" << T << " stage " << s);
      CHECK(parts == want);
      CHECK(total_bytes(coalesced_parts) + total_bytes(last.value()) == total_bytes(want));
    }
  }
  const StageSource src = pack_stage_source(model, prefill, 0, 4);
  SimDecode d = make_decode(model, layouts[0].layout, 4, 2, rng);
  auto dest = DecodeDestinations::from_addrs(d.addrs);
  auto reversed = plan_stage_writes(model, prefill, layouts[0].layout, src, dest.value(), {.row_begin = 3, .row_end = 1});
  REQUIRE_FALSE(reversed.is_ok());
  CHECK_THAT(reversed.status().message(), Catch::Contains("rows [3, 1) are reversed"));
}
