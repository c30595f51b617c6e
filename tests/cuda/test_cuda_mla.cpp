// CUDA backend vs the CPU reference for MLA: decode (the mma.sync kernel and every form of the
// Hopper wgmma kernel) and prefill, and the LSE merge of split partials. Edge sizes: requests with
// no cached tokens, lengths on tile and split boundaries, empty partitions. Unused cache pages hold
// NaN.
#include <algorithm>
#include <cstring>
#include <numeric>
#include <tuple>

#include "kernels/cuda/cuda_backend.h"
#include "kernels/cuda/launch.h"
#include "tests/cuda/cuda_test_util.h"
#include "tests/cuda/tolerances.h"

using namespace k3;
using namespace k3::cudatest;

namespace {

struct MlaCase {
  int64_t H, R, Dr, page;
  std::vector<int32_t> lens;
  bool f32_out = false;
};

// A case's inputs on the host: random bf16-exact rows for every cached token, NaN in every cache row
// past a request's length (never to be read), pages shuffled over the pool.
struct MlaInputs {
  Tensor kv, q_lat, q_rope, block_table, seq_lens;
  float scale = 1.f / std::sqrt(192.f);
};
MlaInputs mla_inputs(const MlaCase& c, std::mt19937& rng) {
  const int64_t B = int64_t(c.lens.size());
  int64_t max_pages = 0;
  for (int32_t l : c.lens) max_pages = std::max<int64_t>(max_pages, (l + c.page - 1) / c.page);
  max_pages += 1;
  const int64_t num_pages = B * max_pages + 3;
  Tensor kv = filled({num_pages, c.page, c.R + c.Dr}, std::numeric_limits<float>::quiet_NaN());
  std::vector<int32_t> perm(num_pages);
  std::iota(perm.begin(), perm.end(), 0);
  std::shuffle(perm.begin(), perm.end(), rng);
  std::vector<int32_t> table(B * max_pages, 0);
  std::normal_distribution<float> nd(0.f, 1.f);
  int next = 0;
  for (int64_t b = 0; b < B; ++b)
    for (int64_t j = 0; j < max_pages; ++j) {
      const int32_t page = perm[next++];
      table[b * max_pages + j] = page;
      for (int64_t r = 0; r < c.page; ++r) {
        if (j * c.page + r >= c.lens[b]) continue;  // stays NaN: must never be read
        float* row = kv.f32() + (int64_t(page) * c.page + r) * (c.R + c.Dr);
        for (int64_t i = 0; i < c.R + c.Dr; ++i) row[i] = round_bf16(nd(rng));
      }
    }
  Tensor q_lat = randn({B, c.H, c.R}, rng, 0.3f), q_rope = randn({B, c.H, c.Dr}, rng, 0.3f);
  return {std::move(kv), std::move(q_lat), std::move(q_rope), Tensor::from_i32({B, max_pages}, table), ints(c.lens)};
}

// `in` through g's mla_decode (uploaded as bf16; outputs poisoned with NaN first): {o, lse} on the device.
std::pair<Tensor, Tensor> gpu_mla_decode(Backend& g, const MlaCase& c, const MlaInputs& in) {
  const int64_t B = int64_t(c.lens.size());
  Tensor go = poisoned(g, {B, c.H, c.R}, c.f32_out ? DType::F32 : DType::BF16), glse = poisoned(g, {B, c.H}, DType::F32);
  g.mla_decode({.q_lat = g.from_host(in.q_lat, DType::BF16), .q_rope = g.from_host(in.q_rope, DType::BF16),
                .kv_cache = g.from_host(in.kv, DType::BF16), .block_table = g.from_host(in.block_table, DType::I32),
                .seq_lens = g.from_host(in.seq_lens, DType::I32), .o = go, .lse = glse, .scale = in.scale});
  return {std::move(go), std::move(glse)};
}

// Runs each case on the cpu reference and on `g` and compares o and lse.
void check_mla_decode_cases(Backend& cpu, Backend& g, const std::vector<MlaCase>& cases, std::mt19937& rng,
                            const std::string& what) {
  for (const auto& c : cases) {
    const int64_t B = int64_t(c.lens.size());
    const MlaInputs in = mla_inputs(c, rng);
    Tensor o = Tensor::zeros({B, c.H, c.R}), lse = Tensor::zeros({B, c.H});
    cpu.mla_decode({.q_lat = in.q_lat, .q_rope = in.q_rope, .kv_cache = in.kv, .block_table = in.block_table,
                    .seq_lens = in.seq_lens, .o = o, .lse = lse, .scale = in.scale});
    const auto [go, glse] = gpu_mla_decode(g, c, in);
    std::string tag = " H=" + std::to_string(c.H) + " R=" + std::to_string(c.R) + " page=" + std::to_string(c.page) +
                      (c.f32_out ? " f32 out" : "") + " lens=";
    for (int32_t l : c.lens) tag += std::to_string(l) + ",";
    expect_close(g, go, o, tol("mla_decode"), what + " o" + tag);
    expect_close(g, glse, lse, tol("mla_lse"), what + " lse" + tag);
  }
}

}  // namespace

TEST_CASE("cuda mla_decode matches cpu (paged, empty request, NaN in unused pages)", "[cuda]") {
  K3_GPU_OR_SKIP(bk);
  std::mt19937 rng(25);
  // Head counts that leave a head group partly empty (20, 33, 48, 64), page sizes below one
  // 64-token tile (16) and not a power of two (48), lengths on tile and split boundaries (64, 256,
  // 512, 1024), fp32 output with one split and with several.
  const std::vector<MlaCase> cases = {{16, 512, 64, 64, {0, 1, 200, 1000}},
                                      {20, 512, 64, 16, {37, 0, 3}},
                                      {96, 512, 64, 64, {5000, 64}},
                                      {4, 64, 16, 8, {9, 0, 30}},
                                      {33, 512, 64, 64, {256, 129}, true},
                                      {48, 512, 64, 16, {700, 1024, 1}},
                                      {64, 512, 64, 48, {500, 97, 512}},
                                      {16, 512, 64, 64, {4096, 2048, 0, 64}, true}};
  // The mma.sync kernel for every head count (H >= 64 would take the wgmma kernel by default).
  auto* cb = dynamic_cast<cuda::CudaBackend*>(bk.gpu.get());
  REQUIRE(cb != nullptr);
  cb->set_mla_decode_wgmma(false);
  check_mla_decode_cases(*bk.cpu, *bk.gpu, cases, rng, "mla_decode");
  cb->set_mla_decode_wgmma(true);
}

// Pages of one row: how a decode rank of a DCP group reads a partition of a request (every V-th cached
// token, rows scattered over the pool), with partitions of a few rows; on the mma.sync kernel (H <= 16 by
// default), the wgmma kernel (H >= 64), in batch-invariant mode (fixed-size splits) and not.
TEST_CASE("cuda mla_decode reads pages of one row", "[cuda]") {
  K3_GPU_OR_SKIP(bk);
  auto* cb = dynamic_cast<cuda::CudaBackend*>(bk.gpu.get());
  REQUIRE(cb != nullptr);
  std::mt19937 rng(77);
  const std::vector<MlaCase> cases = {{4, 512, 64, 1, {1, 2, 5, 0, 13}},
                                      {16, 512, 64, 1, {40, 7, 3}, true},
                                      {64, 512, 64, 1, {3, 70, 1}},
                                      {96, 512, 64, 1, {2, 130}, true}};
  for (bool invariant : {false, true}) {
    cb->set_batch_invariant(invariant);
    check_mla_decode_cases(*bk.cpu, *bk.gpu, cases, rng,
                           std::string("mla_decode page 1") + (invariant ? " batch-invariant" : ""));
  }
  cb->set_batch_invariant(false);
}

// The Hopper wgmma kernel (mla_decode_wgmma.cu), the default for H >= 64: H = 64 (one head group), 96 (64 + a half-empty group), 128; lengths 0, 1,
// 64, 300, 5000 (one split and several, merged); pages of 64, 16, 48 and 8; bf16 and fp32 o; S split over tokens and over dims;
// the 32-head transposed blocks (mla_decode_t32.cuh) for the last group and for all; the seesaw blocks (mla_decode_seesaw.cuh, the
// default), with the lockstep form checked first; the seesaw refilled by halves (mla_decode_halves.cuh); the 48-head transposed seesaw
// (mla_decode_t48.cuh).
TEST_CASE("cuda mla_decode wgmma kernel matches cpu", "[cuda]") {
  K3_GPU_OR_SKIP(bk);
  auto* cb = dynamic_cast<cuda::CudaBackend*>(bk.gpu.get());
  REQUIRE(cb != nullptr);
  cb->set_mla_decode_wgmma(true);
  std::mt19937 rng(31);
  const std::vector<MlaCase> cases = {{64, 512, 64, 64, {0, 1, 64, 300}},
                                      {96, 512, 64, 64, {5000, 64, 0}},
                                      {96, 512, 64, 16, {300, 1, 0, 64}, true},
                                      {128, 512, 64, 16, {5000, 1}, true},
                                      {96, 512, 64, 64, {1, 300}},
                                      {128, 512, 64, 48, {700, 64, 129}},
                                      {64, 512, 64, 16, {5000, 0, 1, 300}},
                                      {96, 512, 64, 8, {700, 65, 1}}};
  // The lockstep form first (the seesaw, the default, below): KV tiles by TMA (boxes of 64 rows for
  // pages of 64, 16 rows for pages of 16 and 48, 8 for 8) and by cp.async; S split over tokens (here
  // with the L2 prefetch on: a hint, same results) and over dims; the exact and the lazy running
  // max, each in two of the four.
  cb->set_mla_decode_seesaw(false);
  cb->set_mla_decode_cluster(false);
  for (bool tma : {true, false})
    for (bool split_s : {false, true}) {
      const bool lazy = tma == split_s;
      cb->set_mla_decode_tma(tma);
      cb->set_mla_decode_lazy_rescale(lazy);
      cb->set_mla_decode_split_s(split_s);
      cb->set_mla_decode_l2_prefetch(split_s ? 0 : 2);
      check_mla_decode_cases(*bk.cpu, *bk.gpu, cases, rng,
                             std::string("mla_decode wgmma") + (tma ? " tma" : " cp.async") +
                                 (split_s ? " split S" : "") + (lazy ? " lazy max" : ""));
    }
  cb->set_mla_decode_tma(true);
  cb->set_mla_decode_split_s(false);
  cb->set_mla_decode_l2_prefetch(0);
  // 32-head blocks in transposed form: the last group of 96 heads only (64 and 128 have none, so
  // those cases check the switch leaves them alone), and every block, with the lazy and the exact max.
  for (int t32 : {1, 2})
    for (bool lazy : {true, false}) {
      cb->set_mla_decode_t32(t32);
      cb->set_mla_decode_lazy_rescale(lazy);
      check_mla_decode_cases(*bk.cpu, *bk.gpu, cases, rng,
                             std::string("mla_decode wgmma t32 mode ") + std::to_string(t32) +
                                 (lazy ? " lazy max" : " exact max"));
    }
  cb->set_mla_decode_t32(0);
  // The seesaw over pairs of tiles (odd and even tile counts, a lone tile, splits), lazy and exact
  // max; each also with the head groups of a request launched as one cluster.
  for (bool lazy : {true, false})
    for (bool cluster : {false, true}) {
      cb->set_mla_decode_seesaw(true);
      cb->set_mla_decode_lazy_rescale(lazy);
      cb->set_mla_decode_cluster(cluster);
      check_mla_decode_cases(*bk.cpu, *bk.gpu, cases, rng,
                             std::string("mla_decode wgmma seesaw") + (lazy ? " lazy max" : " exact max") +
                                 (cluster ? " clustered" : ""));
    }
  cb->set_mla_decode_cluster(false);
  // The seesaw refilled by halves (mla_decode_halves.cuh), forced on for every case (the default takes
  // it only for splits of 8192 tokens or more): its four pair forms (a pair with tiles after it, the
  // one before the last with an A after it, a last pair, a lone last tile) are all reached by the
  // lengths above and by 256, 448 and 193 (4, 7 and 4 tiles, the last of one row).
  std::vector<MlaCase> halves_cases = cases;
  halves_cases.push_back({96, 512, 64, 64, {256, 448, 193}});
  cb->set_mla_decode_seesaw_halves(1);
  for (bool lazy : {true, false}) {
    cb->set_mla_decode_lazy_rescale(lazy);
    check_mla_decode_cases(*bk.cpu, *bk.gpu, halves_cases, rng,
                           std::string("mla_decode wgmma seesaw by halves") + (lazy ? " lazy max" : " exact max"));
  }
  cb->set_mla_decode_seesaw_halves(2);
  REQUIRE_THROWS_WITH(cb->set_mla_decode_seesaw_halves(3), Catch::Matchers::Contains("seesaw halves mode 3 not in 0..2"));
  // The 48-head transposed seesaw (mla_decode_t48.cuh): forced on for every case (H = 64 and 128 then
  // have a partly empty last block: 16 and 32 of 48 heads), lazy and exact max, odd and even tile
  // counts and a last tile of one row; then by the rule (mode 2: only H = 96 takes it).
  cb->set_mla_decode_t48(1);
  for (bool lazy : {true, false}) {
    cb->set_mla_decode_lazy_rescale(lazy);
    check_mla_decode_cases(*bk.cpu, *bk.gpu, halves_cases, rng,
                           std::string("mla_decode wgmma t48") + (lazy ? " lazy max" : " exact max"));
  }
  cb->set_mla_decode_lazy_rescale(true);
  cb->set_mla_decode_t48(2);
  check_mla_decode_cases(*bk.cpu, *bk.gpu, cases, rng, "mla_decode wgmma t48 by rule");
  cb->set_mla_decode_t48(0);
  REQUIRE_THROWS_WITH(cb->set_mla_decode_t48(3), Catch::Matchers::Contains("t48 mode 3 not in 0..2"));
  // The block of three warpgroups in fixed roles (mla_decode_roles.cu): forced on for every case, over
  // its three-stage ring (1 to 79 tiles a block, a last tile of one row, splits), lazy and exact max;
  // it takes precedence over the 48-head blocks.
  cb->set_mla_decode_roles(true);
  for (bool lazy : {true, false}) {
    cb->set_mla_decode_lazy_rescale(lazy);
    cb->set_mla_decode_t48(lazy ? 2 : 0);
    check_mla_decode_cases(*bk.cpu, *bk.gpu, halves_cases, rng,
                           std::string("mla_decode wgmma roles") + (lazy ? " lazy max" : " exact max"));
  }
  cb->set_mla_decode_t48(0);
  cb->set_mla_decode_roles(false);
  cb->set_mla_decode_lazy_rescale(true);
  cb->set_mla_decode_wgmma(false);
  REQUIRE_THROWS_WITH(cb->set_mla_decode_t32(3), Catch::Matchers::Contains("t32 mode 3 not in 0..2"));
}

// Host only (runs without a GPU): the split plan at the K3 decode shapes on 132 SMs, which the
// measured figures in docs/PERF.md rest on, and which of them take the seesaw block refilled by
// halves by default (splits of 8192 tokens or more).
// Batch-invariant mode cuts contexts into fixed splits, and a block may take several of them in turn
// (MlaDecodePlan::splits_per_block): every count must give the same bits as a block per split. H = 96
// (the wgmma kernel's seesaw, and its fixed-role blocks: two 64-head groups) and H = 16 and 40 (the mma.sync kernel:
// one 16-head and 48-head blocks), splits of 1024 tokens: a request ending inside a split on an odd tile, one on a
// split boundary, one of a single token (splits past its end: empty partials), one past the others; 1,
// 2, 3, 5 and 13 splits a block, and the count the backend picks itself. One split a block is checked
// against the CPU as well.
TEST_CASE("cuda mla_decode in batch-invariant mode: splits taken several to a block give the same bits",
          "[cuda]") {
  K3_GPU_OR_SKIP(bk);
  auto* cb = dynamic_cast<cuda::CudaBackend*>(bk.gpu.get());
  REQUIRE(cb != nullptr);
  std::mt19937 rng(53);
  cb->set_batch_invariant(true);
  for (const auto& [H, f32_out, roles] : std::vector<std::tuple<int64_t, bool, bool>>{
           {96, false, false}, {96, true, false}, {96, false, true}, {16, false, false}, {40, true, false}}) {
    cb->set_mla_decode_roles(roles);
    const MlaCase c{H, 512, 64, 64, {12 * 1024 + 3 * 64, 4 * 1024, 1, 13 * 1024 - 5}, f32_out};
    const MlaInputs in = mla_inputs(c, rng);
    cb->set_mla_decode_splits_per_block(1);
    const auto [ref_o, ref_lse] = gpu_mla_decode(*bk.gpu, c, in);
    check_mla_decode_cases(*bk.cpu, *bk.gpu, {c}, rng, "mla_decode invariant, a split a block");
    const Tensor want_o = bk.gpu->to_host(ref_o), want_lse = bk.gpu->to_host(ref_lse);
    for (const int per_block : {2, 3, 5, 13, 0}) {
      cb->set_mla_decode_splits_per_block(per_block);
      const auto [o, lse] = gpu_mla_decode(*bk.gpu, c, in);
      const Tensor got_o = bk.gpu->to_host(o), got_lse = bk.gpu->to_host(lse);
      INFO("H " << H << ", splits a block " << per_block << (f32_out ? ", fp32 o" : ", bf16 o")
                << (roles ? ", fixed-role blocks" : ""));
      REQUIRE(got_o.nbytes() == want_o.nbytes());
      CHECK(std::memcmp(got_o.data(), want_o.data(), want_o.nbytes()) == 0);
      CHECK(std::memcmp(got_lse.data(), want_lse.data(), want_lse.nbytes()) == 0);
    }
  }
  cb->set_mla_decode_roles(false);
  cb->set_mla_decode_splits_per_block(0);
  cb->set_batch_invariant(false);
}

TEST_CASE("mla decode plan at the K3 shapes and where the halves block is taken", "[cuda]") {
  struct Shape {
    int B, H, ctx, splits, tokens_per_split;
    bool halves;
  };
  for (const Shape& c : std::vector<Shape>{{32, 96, 4096, 2, 2048, false},
                                           {64, 96, 8192, 1, 8192, true},
                                           {128, 96, 16384, 1, 16384, true},
                                           {64, 64, 8192, 2, 4096, false}}) {
    INFO("B " << c.B << " H " << c.H << " ctx " << c.ctx);
    const cuda::MlaDecodePlan plan = cuda::plan_mla_decode(c.B, c.H, c.ctx, 132, true);
    CHECK(plan.splits == c.splits);
    CHECK(plan.tokens_per_split == c.tokens_per_split);
    CHECK(plan.splits * plan.tokens_per_split >= c.ctx);  // the splits cover the context
    cuda::MlaDecodeArgs a;
    a.wgmma_seesaw = true;
    CHECK(cuda::mla_wgmma_seesaw_halves(a, plan) == c.halves);  // the default, mode 2
    a.wgmma_seesaw_halves = 1;
    CHECK(cuda::mla_wgmma_seesaw_halves(a, plan));
    a.wgmma_seesaw_halves = 0;
    CHECK_FALSE(cuda::mla_wgmma_seesaw_halves(a, plan));
    a.wgmma_seesaw_halves = 1;
    a.wgmma_seesaw = false;  // the lockstep form has no halves
    CHECK_FALSE(cuda::mla_wgmma_seesaw_halves(a, plan));
    // 48-head blocks by the rule (mode 2) only where they pad fewer rows: H = 96, not 64; the plan
    // counts the same blocks per request at these shapes (2 at H = 96, 1 at H = 64).
    a.H = c.H;
    a.wgmma_t48 = 2;
    CHECK(cuda::mla_wgmma_t48(a) == (c.H == 96));
    const int form = cuda::mla_wgmma_head_form(a);
    const cuda::MlaDecodePlan plan48 = cuda::plan_mla_decode(c.B, c.H, c.ctx, 132, true, form);
    CHECK(plan48.splits == plan.splits);
    CHECK(plan48.tokens_per_split == plan.tokens_per_split);
    a.wgmma_split_s = true;  // S split over dims has no 48-head form
    CHECK_FALSE(cuda::mla_wgmma_t48(a));
  }
  CHECK(cuda::mla_wgmma_head_groups(96, cuda::kMlaHeadForm48).g48 == 2);
  CHECK(cuda::mla_wgmma_head_groups(128, cuda::kMlaHeadForm48).g48 == 3);
  CHECK(cuda::mla_wgmma_head_groups(96, 0).g64 == 2);
}

TEST_CASE("cuda mla_prefill matches cpu", "[cuda]") {
  K3_GPU_OR_SKIP(bk);
  auto& g = *bk.gpu;
  std::mt19937 rng(26);
  // T >= 16 with bf16 inputs takes the GEMM form (cuBLASLt + causal softmax), shorter the simple kernel.
  for (auto [T, past] : std::vector<std::pair<int64_t, int64_t>>{{1, 0}, {5, 7}, {70, 0}, {300, 45}, {64, 1000}}) {
    const int64_t H = 3, Dqk = 192, Dv = 128, S = past + T;
    Tensor q = randn({T, H, Dqk}, rng, 0.3f), k = randn({S, H, Dqk}, rng, 0.3f), v = randn({S, H, Dv}, rng);
    Tensor o = Tensor::zeros({T, H, Dv}), lse = Tensor::zeros({T, H});
    const float scale = 1.f / std::sqrt(float(Dqk));
    bk.cpu->mla_prefill({.q = q, .k = k, .v = v, .o = o, .lse = lse, .past = past, .scale = scale});
    Tensor go = poisoned(g, {T, H, Dv}, DType::BF16), glse = poisoned(g, {T, H}, DType::F32);
    g.mla_prefill({.q = g.from_host(q, DType::BF16), .k = g.from_host(k, DType::BF16),
                   .v = g.from_host(v, DType::BF16), .o = go, .lse = glse, .past = past, .scale = scale});
    const std::string tag = " T=" + std::to_string(T) + " past=" + std::to_string(past);
    expect_close(g, go, o, tol("mla_prefill"), "mla_prefill o" + tag);
    expect_close(g, glse, lse, tol("mla_lse"), "mla_prefill lse" + tag);
  }
}

TEST_CASE("cuda lse_merge matches cpu (empty partitions, all-empty rows)", "[cuda]") {
  K3_GPU_OR_SKIP(bk);
  auto& g = *bk.gpu;
  std::mt19937 rng(27);
  const int64_t N = 4, B = 3, H = 5, D = 64;
  Tensor parts = randn({N, B, H, D}, rng, 1.f, false), lse = randn({N, B, H}, rng, 3.f, false);
  const float ninf = -std::numeric_limits<float>::infinity();
  for (int64_t h = 0; h < H; ++h) lse.f32()[(1 * B + 0) * H + h] = ninf;  // partition 1 empty for request 0
  for (int64_t n = 0; n < N; ++n) lse.f32()[(n * B + 2) * H + 4] = ninf;  // request 2 head 4: no keys anywhere
  Tensor o = Tensor::zeros({B, H, D}), ol = Tensor::zeros({B, H});
  bk.cpu->lse_merge({.o_parts = parts, .lse_parts = lse, .o = o, .lse = ol});
  Tensor go = poisoned(g, {B, H, D}, DType::F32), gl = poisoned(g, {B, H}, DType::F32);
  g.lse_merge({.o_parts = g.from_host(parts, DType::F32), .lse_parts = g.from_host(lse, DType::F32), .o = go,
               .lse = gl});
  expect_close(g, go, o, tol("lse_merge"), "lse_merge o");
  expect_close(g, gl, ol, tol("lse_merge"), "lse_merge lse");
}
