// Every op gives bitwise identical results with 1 and 4 threads (and 3, an odd split); shape
// errors name the op and the field.
#include <catch2/catch.hpp>

#include <atomic>
#include <cstdlib>
#include <limits>
#include <numeric>

#include "common/core/counter_random.h"
#include "kernels/cpu/thread_pool.h"
#include "tests/kernels/kernel_test_util.h"

using namespace k3;
using namespace k3::test;

namespace {

// Runs every op once on seeded inputs big enough to be split across threads; returns all outputs
// (and updated in/out tensors) in a fixed order.
std::vector<Tensor> run_every_op(Backend& be) {
  std::mt19937 rng(51);
  std::vector<Tensor> out;
  auto keep = [&](Tensor t) { out.push_back(t); };
  {
    Tensor x = randn({37, 70}, rng), w = randn({45, 70}, rng), y = randn({37, 45}, rng);
    be.gemm({.x = x, .w = w, .y = y, .alpha = 0.5f, .beta = 0.25f});
    keep(y);
    Tensor r = Tensor::zeros({37, 70}), l = Tensor::zeros({37, 70}), s = Tensor::zeros({37, 70});
    be.rmsnorm({.x = x, .w = randn({70}, rng), .y = r});
    be.l2norm({.x = x, .y = l, .scale = 0.3f});
    be.sigmoid(x, s);
    keep(r), keep(l), keep(s);
    Tensor a = Tensor::zeros({37, 70}), sm = Tensor::zeros({37, 70}), si = Tensor::zeros({37, 70});
    be.add({.a = x, .b = r, .y = a});
    be.sigmoid_mul({.x = x, .gate = l, .y = sm});
    be.situ({.g = x, .u = r, .y = si});
    keep(a), keep(sm), keep(si);
    Tensor e = Tensor::zeros({4, 70});
    be.embedding({.table = x, .ids = i32({4}, {36, 0, 5, 5}), .y = e});
    keep(e);
  }
  {
    const int64_t H = 3, D = 16, P = H * D, C = 3 * P, W = 4, slots = 5;
    Tensor x = randn({90, C}, rng), w = randn({C, W}, rng), cache = randn({slots, W - 1, C}, rng);
    Tensor y = Tensor::zeros({90, C});
    Tensor cu = i32({4}, {0, 40, 41, 90}), sl = i32({3}, {4, 0, 2});
    be.short_conv({.x = x, .w = w, .cache = cache, .slots = sl, .cu_seqlens = cu, .y = y});
    keep(y), keep(cache);
    Tensor f = randn({90, P}, rng), g = Tensor::zeros({90, H, D});
    be.kda_gate({.f = f, .a_log = randn({H}, rng), .dt_bias = randn({P}, rng), .g = g, .heads = H});
    keep(g);
    Tensor q = randn({90, H, D}, rng, 0.25f), k = randn({90, H, D}, rng, 0.25f), v = randn({90, H, D}, rng);
    Tensor beta = uniform({90, H}, rng, 0.f, 1.f);
    for (bool chunked : {false, true}) {
      Tensor state = randn({slots, H, D, D}, rng, 0.1f), o = Tensor::zeros({90, H, D});
      ops::KdaParams p{.q = q, .k = k, .v = v, .g = g, .beta = beta, .state = state, .slots = sl,
                       .cu_seqlens = cu, .o = o, .chunk_size = 32};
      chunked ? be.kda_chunk(p) : be.kda_recurrent(p);
      keep(o), keep(state);
    }
    Tensor state = randn({slots, H, D, D}, rng, 0.1f), o = Tensor::zeros({3, H, D});
    be.kda_decode({.qkv = randn({3, C}, rng), .conv_w = w, .conv_cache = cache, .f = randn({3, P}, rng),
                   .a_log = randn({H}, rng), .dt_bias = randn({P}, rng), .b = randn({3, H}, rng), .state = state,
                   .slots = sl, .o = o, .heads = H});
    keep(o), keep(state), keep(cache);
  }
  {
    const int64_t T = 20, past = 13, H = 4, Dqk = 12, Dv = 8;
    Tensor o = Tensor::zeros({T, H, Dv}), lse = Tensor::zeros({T, H});
    be.mla_prefill({.q = randn({T, H, Dqk}, rng), .k = randn({past + T, H, Dqk}, rng), .v = randn({past + T, H, Dv}, rng),
                    .o = o, .lse = lse, .past = past, .scale = 0.3f});
    keep(o), keep(lse);
    const int64_t B = 5, R = 16, Dr = 4, page = 4;
    Tensor od = Tensor::zeros({B, H, R}), ld = Tensor::zeros({B, H});
    std::vector<int32_t> table(B * 3);
    std::iota(table.begin(), table.end(), 0);
    be.mla_decode({.q_lat = randn({B, H, R}, rng), .q_rope = randn({B, H, Dr}, rng),
                   .kv_cache = randn({B * 3, page, R + Dr}, rng), .block_table = i32({B, 3}, table),
                   .seq_lens = i32({B}, {12, 0, 1, 7, 9}), .o = od, .lse = ld, .scale = 0.2f});
    keep(od), keep(ld);
    Tensor lparts = randn({3, B, H}, rng);
    lparts.f32()[4] = -std::numeric_limits<float>::infinity();
    Tensor om = Tensor::zeros({B, H, R}), lm = Tensor::zeros({B, H});
    be.lse_merge({.o_parts = randn({3, B, H, R}, rng), .lse_parts = lparts, .o = om, .lse = lm});
    keep(om), keep(lm);
  }
  {
    Tensor y = Tensor::zeros({33, 24});
    be.attnres_mix({.candidates = {randn({33, 24}, rng), randn({33, 24}, rng), randn({33, 24}, rng)},
                    .query = randn({24}, rng), .y = y});
    keep(y);
    const int64_t M = 40, E = 9, k = 3, Dl = 20, F = 24;
    Tensor ids = Tensor::zeros({M, k}, DType::I32), wts = Tensor::zeros({M, k});
    be.router_topk({.logits = randn({M, E}, rng), .bias = randn({E}, rng, 0.1f), .ids = ids, .weights = wts, .k = k});
    keep(ids), keep(wts);
    Tensor ym = Tensor::zeros({M, Dl});
    be.moe_experts({.z = randn({M, Dl}, rng), .ids = ids, .weights = wts, .w1 = randn({E, F, Dl}, rng),
                    .w3 = randn({E, F, Dl}, rng), .w2 = randn({E, Dl, F}, rng), .y = ym});
    keep(ym);
    Tensor logits = randn({16, 300}, rng);
    std::vector<ops::SamplingRow> rows;
    for (int b = 0; b < 16; ++b)
      rows.push_back({.temperature = b % 3 ? 0.9f : 0.f, .top_k = b % 2 ? 50 : 0, .top_p = b % 4 ? 0.9f : 1.f,
                      .seed = uint64_t(b), .step = 3});
    std::vector<int32_t> tok;
    be.sample({.logits = logits, .rows = rows, .out = &tok});
    keep(Tensor::from_i32({16}, tok));
  }
  return out;
}

}  // namespace

TEST_CASE("every op is bitwise identical with 1, 3 and 4 threads") {
  auto one = run_every_op(*cpu_backend(1));
  for (int threads : {3, 4}) {
    auto many = run_every_op(*cpu_backend(threads));
    REQUIRE(one.size() == many.size());
    for (size_t i = 0; i < one.size(); ++i) {
      INFO("threads=" << threads << " output #" << i << " " << shape_str(one[i].shape()));
      CHECK(bitwise_equal(one[i], many[i]));
    }
  }
}

// Weight set-up runs in parallel on the CPU backend: the draws and the bf16 widening are the
// single-threaded definitions' bits (counter_random::uniform; Tensor::to_f32).
TEST_CASE("CPU weight fills and widening equal the serial definitions for any thread count") {
  const int64_t n = 300007;  // several chunks of the fill's grain, and an odd tail
  for (int threads : {1, 3}) {
    auto be = cpu_backend(threads);
    for (const bool round : {false, true}) {
      Tensor f = Tensor::zeros({n}), b = Tensor::zeros({n}, DType::BF16);
      be->fill_uniform({.y = f, .seed = 77, .scale = 0.02f, .round_to_bf16 = round});
      be->fill_uniform({.y = b, .seed = 77, .scale = 0.02f, .round_to_bf16 = round});
      for (int64_t i = 0; i < n; ++i) {
        float want = counter_random::uniform(77, static_cast<uint64_t>(i), 0.02f);
        if (round) want = bf16_to_f32(f32_to_bf16(want));
        INFO("threads=" << threads << " round=" << round << " i=" << i);
        REQUIRE(std::memcmp(&want, f.f32() + i, sizeof(float)) == 0);
        REQUIRE(b.ptr<uint16_t>()[i] == f32_to_bf16(want));
      }
      Tensor wide = be->from_host(b, DType::F32);
      REQUIRE(bitwise_equal(wide, b.to_f32()));
      // A part drawn alone from its first index is the whole draw's elements there.
      const int64_t first = 123457, len = 70001;
      Tensor part = Tensor::zeros({len});
      be->fill_uniform({.y = part, .seed = 77, .scale = 0.02f, .round_to_bf16 = round, .first = first});
      REQUIRE(std::memcmp(part.f32(), f.f32() + first, len * sizeof(float)) == 0);
    }
  }
}

TEST_CASE("thread pool: chunks cover the range once, exceptions propagate, nested calls run inline") {
  k3::cpu::ThreadPool pool(4);
  std::vector<int> hits(1000, 0);
  pool.parallel_for(1000, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) hits[i]++;
  });
  CHECK(std::all_of(hits.begin(), hits.end(), [](int h) { return h == 1; }));
  CHECK_THROWS_WITH(pool.parallel_for(100, [](int64_t b, int64_t e) {
                      if (b <= 50 && 50 < e) throw std::runtime_error("chunk 50 failed");
                    }),
                    "chunk 50 failed");
  std::atomic<int64_t> total{0};
  pool.parallel_for(8, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i)
      pool.parallel_for(10, [&](int64_t b2, int64_t e2) { total += e2 - b2; });
  });
  CHECK(total == 80);
}

TEST_CASE("K3_THREADS sets the default thread count") {
  setenv("K3_THREADS", "3", 1);
  CHECK(k3::cpu::resolve_thread_count(0) == 3);
  CHECK(k3::cpu::resolve_thread_count(2) == 2);
  setenv("K3_THREADS", "zero", 1);
  CHECK_THROWS_WITH(k3::cpu::resolve_thread_count(0), Catch::Contains("K3_THREADS"));
  unsetenv("K3_THREADS");
  CHECK(k3::cpu::resolve_thread_count(0) >= 1);
}

TEST_CASE("shape errors name the op, the field, the expected and the got shape") {
  auto be = cpu_backend(2);
  using Catch::Contains;
  CHECK_THROWS_WITH(be->gemm({.x = Tensor::zeros({2, 3}), .w = Tensor::zeros({4, 5}), .y = Tensor::zeros({2, 4})}),
                    Contains("gemm: w: expected shape [*, 3], got [4, 5]"));
  CHECK_THROWS_WITH(be->gemm({.x = Tensor::zeros({2, 3}), .w = Tensor::zeros({4, 3}), .y = Tensor::zeros({2, 5})}),
                    Contains("gemm: y: expected shape [2, 4], got [2, 5]"));
  CHECK_THROWS_WITH(be->rmsnorm({.x = Tensor::zeros({2, 3}), .w = Tensor::zeros({4}), .y = Tensor::zeros({2, 3})}),
                    Contains("rmsnorm: w: expected shape [3], got [4]"));
  CHECK_THROWS_WITH(be->kda_chunk({.q = Tensor::zeros({5, 2, 4}), .k = Tensor::zeros({5, 2, 4}), .v = Tensor::zeros({5, 2, 3}),
                                   .g = Tensor::zeros({5, 2, 4}), .beta = Tensor::zeros({5, 2}),
                                   .state = Tensor::zeros({1, 2, 4, 3}), .slots = i32({1}, {0}),
                                   .cu_seqlens = i32({2}, {0, 5}), .o = Tensor::zeros({5, 2, 3})}),
                    Contains("kda_chunk: state: expected shape [*, 2, 3, 4], got [1, 2, 4, 3]"));
  CHECK_THROWS_WITH(be->kda_recurrent({.q = Tensor::zeros({5, 2, 4}), .k = Tensor::zeros({5, 2, 4}), .v = Tensor::zeros({5, 2, 3}),
                                       .g = Tensor::zeros({5, 2, 4}), .beta = Tensor::zeros({5, 2}),
                                       .state = Tensor::zeros({1, 2, 3, 4}), .slots = i32({1}, {0}),
                                       .cu_seqlens = i32({2}, {0, 4}), .o = Tensor::zeros({5, 2, 3})}),
                    Contains("kda_recurrent: cu_seqlens: last entry must equal the total token count 5, got 4"));
  CHECK_THROWS_WITH(be->mla_decode({.q_lat = Tensor::zeros({1, 2, 4}), .q_rope = Tensor::zeros({1, 2, 2}),
                                    .kv_cache = Tensor::zeros({2, 4, 6}), .block_table = i32({1, 1}, {5}),
                                    .seq_lens = i32({1}, {3}), .o = Tensor::zeros({1, 2, 4}), .lse = Tensor::zeros({1, 2}),
                                    .scale = 1.f}),
                    Contains("mla_decode: block_table[0, 0] = 5 is outside [0, num_pages = 2)"));
  CHECK_THROWS_WITH(be->router_topk({.logits = Tensor::zeros({2, 4}), .bias = Tensor::zeros({4}),
                                     .ids = Tensor::zeros({2, 2}), .weights = Tensor::zeros({2, 2}), .k = 2}),
                    Contains("router_topk: ids: expected dtype I32, got F32"));
  CHECK_THROWS_WITH(be->kda_gate({.f = Tensor::zeros({2, 8}), .a_log = Tensor::zeros({1}), .dt_bias = Tensor::zeros({8}),
                                  .g = Tensor::zeros({2, 2, 4}), .heads = 2}),
                    Contains("kda_gate: a_log: expected at least heads = 2 values"));
  CHECK_THROWS_WITH(be->attnres_mix({.candidates = {Tensor::zeros({2, 3}), Tensor::zeros({2, 4})},
                                     .query = Tensor::zeros({3}), .y = Tensor::zeros({2, 3})}),
                    Contains("attnres_mix: candidates[1]: expected shape [2, 3], got [2, 4]"));
  CHECK_THROWS_WITH(be->moe_experts({.z = Tensor::zeros({1, 4}), .ids = i32({1, 1}, {3}), .weights = Tensor::zeros({1, 1}),
                                     .w1 = Tensor::zeros({2, 5, 4}), .w3 = Tensor::zeros({2, 5, 4}),
                                     .w2 = Tensor::zeros({2, 4, 5}), .y = Tensor::zeros({1, 4})}),
                    Contains("moe_experts: ids[0, 0] = 3 is outside [0, E = 2)"));
}
