// The split chunked KDA scan (kernels/cuda/kda_split_plan.h): the plan's job tables (host only, run
// everywhere), and on a GPU the split scan against the CPU recurrence and against the unsplit scan.
#include <algorithm>
#include <array>
#include <numeric>
#include <set>
#include <string>

#include "kernels/cuda/cuda_backend.h"
#include "kernels/cuda/kda_scan_form.h"
#include "kernels/cuda/kda_split_plan.h"
#include "tests/cuda/cuda_test_util.h"
#include "tests/cuda/tolerances.h"

using namespace k3;
using namespace k3::cudatest;
using cuda::KdaScanJob;

namespace {

std::vector<int32_t> chunk0_of(const std::vector<int32_t>& lens) {
  std::vector<int32_t> c0{0};
  for (int32_t l : lens) c0.push_back(c0.back() + (l + 63) / 64);
  return c0;
}

// Every chunk is scanned with its output exactly once; a split sequence's jobs chain through their
// carry slots as the plan's header says; the last segment (or the whole unsplit sequence) ends in
// the sequence's slot; step 1's zeros/identity jobs come in (B, A) pairs over the same chunks.
void check_plan(const cuda::KdaSplitPlan& plan, const std::vector<int32_t>& c0) {
  const int N = int(c0.size()) - 1;
  std::vector<int> written(size_t(c0.back()), 0), to_seq(size_t(N), 0);
  std::set<int> carry_out;
  auto visit = [&](const KdaScanJob& j) {
    REQUIRE(j.seq >= 0);
    REQUIRE(j.seq < N);
    REQUIRE(j.c_begin >= c0[size_t(j.seq)]);
    REQUIRE(j.c_end <= c0[size_t(j.seq) + 1]);
    REQUIRE(j.c_begin <= j.c_end);
    if (j.flags & KdaScanJob::kWriteO)
      for (int c = j.c_begin; c < j.c_end; ++c) ++written[size_t(c)];
    if (j.out == KdaScanJob::kToSeq) ++to_seq[size_t(j.seq)];
    if (j.out == KdaScanJob::kToCarry) {
      CHECK(j.out_slot >= 0);
      CHECK(j.out_slot < plan.carry_slots);
      CHECK(carry_out.insert(j.out_slot).second);  // one writer per carry slot
    }
    if (j.init == KdaScanJob::kFromCarry) CHECK(j.in_slot < plan.carry_slots);
  };
  for (const auto& j : plan.pass1) visit(j);
  for (const auto& j : plan.pass3) visit(j);
  for (int c = 0; c < c0.back(); ++c) CHECK(written[size_t(c)] == 1);
  for (int n = 0; n < N; ++n) CHECK(to_seq[size_t(n)] == 1);
  // Jobs write S_start[1], A and B: 2P - 3 of a split sequence's 3P - 5 slots (the fix-up the rest).
  int job_slots = 0;
  for (size_t i = 0; i < plan.fixup.size(); i += 2) job_slots += 2 * plan.fixup[i] - 3;
  CHECK(int(carry_out.size()) == job_slots);
  // Step 3 reads only what step 1 or the fix-up writes: S_start[1] from step 1, the others from step 2.
  for (const auto& j : plan.pass3) {
    CHECK(j.init == KdaScanJob::kFromCarry);
    CHECK((j.flags & KdaScanJob::kZeroU) == 0);
  }
  for (size_t i = 0; i + 1 < plan.pass1.size(); ++i) {
    const auto& b = plan.pass1[i];
    if (b.init != KdaScanJob::kZeros) continue;
    const auto& a = plan.pass1[i + 1];
    CHECK(a.init == KdaScanJob::kIdentity);
    CHECK(a.flags == KdaScanJob::kZeroU);
    CHECK(b.flags == 0);
    CHECK((a.c_begin == b.c_begin && a.c_end == b.c_end));
  }
}

}  // namespace

TEST_CASE("kda split plan: who is cut, and job tables that cover every chunk once", "[cuda][plan]") {
  // Few heads, one long sequence (T = 65536, H = 4 on 132 SMs): cut into segments of 57 chunks.
  {
    const auto c0 = chunk0_of({65536});
    const auto plan = cuda::plan_kda_split(c0, 4, 132);
    REQUIRE(plan.split());
    CHECK(plan.max_segments == 18);
    CHECK(plan.pass1.size() == 1 + 2 * 16);
    CHECK(plan.pass3.size() == 17);
    check_plan(plan, c0);
  }
  // Many heads (the grid already fills the GPU) or many sequences: never cut.
  CHECK_FALSE(cuda::plan_kda_split(chunk0_of({8192}), 96, 132).split());
  CHECK_FALSE(cuda::plan_kda_split(chunk0_of({32768}), 32, 132).split());
  CHECK_FALSE(cuda::plan_kda_split(chunk0_of(std::vector<int32_t>(256, 100)), 96, 132).split());
  // Too short for three segments of the minimum length: not cut.
  CHECK_FALSE(cuda::plan_kda_split(chunk0_of({64 * (3 * cuda::kKdaMinSegmentChunks - 1)}), 1, 132).split());
  // Mixed lengths: the long ones cut, the short and empty ones scanned whole, in one table.
  {
    const std::vector<int32_t> lens = {4096, 100, 0, 3100, 64 * 47};
    const auto c0 = chunk0_of(lens);
    const auto plan = cuda::plan_kda_split(c0, 1, 132);
    REQUIRE(plan.split());
    check_plan(plan, c0);
    CHECK(plan.fixup.size() == 4);  // 4096 and 3100 tokens are cut, 47 chunks is not
  }
  // Random shapes keep every invariant.
  std::mt19937 rng(7);
  for (int trial = 0; trial < 200; ++trial) {
    std::vector<int32_t> lens(1 + rng() % 5);
    for (auto& l : lens) l = int32_t(rng() % 3 == 0 ? rng() % 200 : rng() % 40000);
    const int H = 1 + int(rng() % 8), sms = 16 + int(rng() % 200);
    const auto c0 = chunk0_of(lens);
    const auto plan = cuda::plan_kda_split(c0, H, sms);
    if (plan.split()) check_plan(plan, c0);
  }
}

TEST_CASE("kda scan form: by the grid's blocks per wave", "[cuda][plan]") {
  using cuda::KdaScanForm;
  using cuda::pick_kda_scan_form;
  // 132 SMs: 32-row blocks (4 per sequence and head) <= 132 -> three-stage mma.sync, < 264 -> two
  // stages, >= 264 -> the wide grid: wgmma in 32-row blocks while they fit one wave of three per SM
  // (<= 396), in 64-row blocks past it.
  CHECK(pick_kda_scan_form(32, 1, 132, true, 0) == KdaScanForm::kMma32x3);  // T = 32768, H = 32
  CHECK(pick_kda_scan_form(33, 1, 132, true, 0) == KdaScanForm::kMma32x3);  // 132 blocks: one per SM
  CHECK(pick_kda_scan_form(34, 1, 132, true, 0) == KdaScanForm::kMma32x2);
  CHECK(pick_kda_scan_form(65, 1, 132, true, 0) == KdaScanForm::kMma32x2);
  CHECK(pick_kda_scan_form(66, 1, 132, true, 0) == KdaScanForm::kWg32);
  CHECK(pick_kda_scan_form(96, 1, 132, true, 0) == KdaScanForm::kWg32);     // T = 8192, H = 96
  CHECK(pick_kda_scan_form(99, 1, 132, true, 0) == KdaScanForm::kWg32);
  CHECK(pick_kda_scan_form(100, 1, 132, true, 0) == KdaScanForm::kWg64);
  CHECK(pick_kda_scan_form(96, 256, 132, true, 0) == KdaScanForm::kWg64);   // 256 x 100 tokens
  CHECK(pick_kda_scan_form(64, 2, 132, true, 0) == KdaScanForm::kWg64);     // 2 x 8192, H = 64
  // The backend's switches: wgmma off, or its block rows held.
  CHECK(pick_kda_scan_form(96, 1, 132, false, 0) == KdaScanForm::kMma64);
  CHECK(pick_kda_scan_form(96, 1, 132, true, 64) == KdaScanForm::kWg64);
  CHECK(pick_kda_scan_form(96, 256, 132, true, 32) == KdaScanForm::kWg32);
  CHECK(pick_kda_scan_form(32, 1, 132, true, 32) == KdaScanForm::kMma32x3);  // narrow grids stay mma.sync
  // A checkpoint after every chunk: a head per block where that grid fits one wave.
  CHECK(pick_kda_scan_form(96, 1, 132, true, 0, true) == KdaScanForm::kWgHead);
  CHECK(pick_kda_scan_form(132, 1, 132, true, 0, true) == KdaScanForm::kWgHead);
  CHECK(pick_kda_scan_form(133, 1, 132, true, 0, true) == KdaScanForm::kWg64);
  CHECK(pick_kda_scan_form(96, 1, 132, true, 32, true) == KdaScanForm::kWg32);
  CHECK(pick_kda_scan_form(96, 1, 132, true, 128) == KdaScanForm::kWgHead);
  CHECK(pick_kda_scan_form(32, 1, 132, true, 0, true) == KdaScanForm::kMma32x3);
  CHECK(std::string(cuda::kda_scan_form_name(KdaScanForm::kWg32)) == "wgmma 32-row");
}

TEST_CASE("cuda kda_chunk split into segments matches the cpu recurrence and the unsplit scan", "[cuda]") {
  K3_GPU_OR_SKIP(bk);
  auto& g = *bk.gpu;
  auto* cb = dynamic_cast<cuda::CudaBackend*>(bk.gpu.get());
  REQUIRE(cb != nullptr);
  std::mt19937 rng(31);
  // H = 1 and 2: the plan cuts every sequence of >= 48 chunks (3072 tokens) on any GPU of >= 16 SMs.
  // 4096 tokens: 4 segments of 16 chunks (two fix-up steps); 3100: a last segment of one short chunk;
  // 100 and 0: scanned whole beside them. Checkpoints every 64 and 256 tokens, written only by the
  // jobs that write output.
  struct Case { std::vector<int32_t> lens; int64_t H; int interval; };
  for (const Case& cs : {Case{{4096}, 1, 256}, Case{{4096, 100, 0, 3100}, 2, 64}, Case{{9000}, 1, 0}}) {
    const int64_t D = 128, H = cs.H, N = int64_t(cs.lens.size());
    const int64_t T = std::accumulate(cs.lens.begin(), cs.lens.end(), int64_t(0));
    std::string tag = "N=" + std::to_string(N) + " H=" + std::to_string(H) + " interval=" + std::to_string(cs.interval);
    REQUIRE(cuda::plan_kda_split(chunk0_of(cs.lens), int(H), cb->num_sms()).split());
    Tensor q = randn({T, H, D}, rng), k = randn({T, H, D}, rng), v = randn({T, H, D}, rng);
    normalise_heads(q, 1.f / std::sqrt(float(D)));
    normalise_heads(k, 1.f);
    Tensor gate = uniform({T, H, D}, rng, -1.f, -0.001f, false);  // slow decay: the state carries far
    Tensor beta = uniform({T, H}, rng, 0.05f, 0.95f, false);
    Tensor state0 = randn({N, H, D, D}, rng, 0.1f, false);
    std::vector<int32_t> slot_ids(static_cast<size_t>(N));
    std::iota(slot_ids.rbegin(), slot_ids.rend(), 0);
    Tensor slots = ints(slot_ids), cu = cu_of(cs.lens);
    const CheckpointTable ct = cs.interval > 0 ? checkpoint_table(cs.lens, cs.interval)
                                               : CheckpointTable{std::vector<int32_t>(size_t(N), -1)};
    const int64_t num = ct.num;
    Tensor tbl = Tensor::from_i32({N, ct.M}, ct.slots);
    Tensor ref_state = state0.clone(), ref_o = Tensor::zeros({T, H, D}), ref_ck = Tensor::zeros({std::max<int64_t>(num, 1), H, D, D});
    ops::KdaParams ref{.q = q, .k = k, .v = v, .g = gate, .beta = beta, .state = ref_state, .slots = slots,
                       .cu_seqlens = cu, .o = ref_o};
    if (cs.interval > 0) {
      ref.checkpoints = ref_ck;
      ref.checkpoint_slots = tbl;
      ref.checkpoint_interval = cs.interval;
    }
    bk.cpu->kda_recurrent(ref);
    Tensor outs[2], states[2], cks[2];
    for (int split = 1; split >= 0; --split) {
      cb->set_kda_chunk_split(split != 0);
      states[split] = g.from_host(state0, DType::F32);
      outs[split] = poisoned(g, {T, H, D}, DType::BF16);
      cks[split] = poisoned(g, {std::max<int64_t>(num, 1), H, D, D}, DType::F32);
      ops::KdaParams p{.q = g.from_host(q, DType::BF16), .k = g.from_host(k, DType::BF16),
                       .v = g.from_host(v, DType::BF16), .g = g.from_host(gate, DType::F32),
                       .beta = g.from_host(beta, DType::F32), .state = states[split],
                       .slots = g.from_host(slots, DType::I32), .cu_seqlens = g.from_host(cu, DType::I32),
                       .o = outs[split]};
      if (cs.interval > 0) {
        p.checkpoints = cks[split];
        p.checkpoint_slots = g.from_host(tbl, DType::I32);
        p.checkpoint_interval = cs.interval;
      }
      g.kda_chunk(p);
    }
    cb->set_kda_chunk_split(true);
    expect_close(g, outs[1], ref_o, tol("kda_out"), "split o vs cpu " + tag);
    expect_close(g, states[1], ref_state, tol("kda_state"), "split state vs cpu " + tag);
    if (cs.interval > 0) expect_close(g, cks[1], ref_ck, tol("kda_state"), "split checkpoints vs cpu " + tag);
    // Against the unsplit scan on the same device: only the rounding of the segments' bf16 operands
    // and the fix-up's fp32 products differ.
    expect_close(g, outs[1], g.to_host(outs[0]), tol("kda_out"), "split o vs unsplit " + tag);
    expect_close(g, states[1], g.to_host(states[0]), tol("kda_state"), "split state vs unsplit " + tag);
  }
}

// The scan's wide grid on wgmma (CudaBackend::set_kda_chunk_scan_wgmma), in blocks of 64 and of 32
// rows of V and in blocks of a whole head (set_kda_chunk_scan_wg_rows), against the CPU recurrence and the mma.sync scan: several
// sequences (one empty, one shorter than a chunk), checkpoints every 64 tokens, a grid of >= 2 blocks
// per SM of 32 rows so that the wide scan runs.
TEST_CASE("cuda kda_chunk wide scan on wgmma matches the cpu recurrence and the mma.sync scan", "[cuda]") {
  K3_GPU_OR_SKIP(bk);
  auto& g = *bk.gpu;
  auto* cb = dynamic_cast<cuda::CudaBackend*>(bk.gpu.get());
  REQUIRE(cb != nullptr);
  std::mt19937 rng(53);
  const std::vector<int32_t> lens{700, 64, 1300, 5, 0};
  const int64_t D = 128, N = int64_t(lens.size()), H = (2 * cb->num_sms() + 4 * N - 1) / (4 * N) + 1;
  const int64_t T = std::accumulate(lens.begin(), lens.end(), int64_t(0));
  Tensor q = randn({T, H, D}, rng), k = randn({T, H, D}, rng), v = randn({T, H, D}, rng);
  normalise_heads(q, 1.f / std::sqrt(float(D)));
  normalise_heads(k, 1.f);
  Tensor gate = uniform({T, H, D}, rng, -1.f, -0.001f, false), beta = uniform({T, H}, rng, 0.05f, 0.95f, false);
  Tensor state0 = randn({N, H, D, D}, rng, 0.1f, false);
  std::vector<int32_t> slot_ids(static_cast<size_t>(N));
  std::iota(slot_ids.rbegin(), slot_ids.rend(), 0);
  const CheckpointTable ct = checkpoint_table(lens, 64);
  const int64_t num = ct.num;
  Tensor slots = ints(slot_ids), cu = cu_of(lens), tbl = Tensor::from_i32({N, ct.M}, ct.slots);
  Tensor ref_state = state0.clone(), ref_o = Tensor::zeros({T, H, D}), ref_ck = Tensor::zeros({num, H, D, D});
  bk.cpu->kda_recurrent({.q = q, .k = k, .v = v, .g = gate, .beta = beta, .state = ref_state, .slots = slots,
                         .cu_seqlens = cu, .o = ref_o, .checkpoints = ref_ck, .checkpoint_slots = tbl,
                         .checkpoint_interval = 64});
  constexpr int kForms = 4;  // mma.sync, wgmma 64 rows, wgmma 32 rows, wgmma a head per block
  const int wg_rows[kForms] = {64, 64, 32, 128};
  const char* names[kForms] = {"mma.sync scan", "wgmma scan", "wgmma 32-row scan", "wgmma head scan"};
  Tensor outs[kForms], states[kForms], cks[kForms];
  for (int wgmma = 0; wgmma < kForms; ++wgmma) {
    cb->set_kda_chunk_scan_wgmma(wgmma != 0);
    cb->set_kda_chunk_scan_wg_rows(wg_rows[wgmma]);
    states[wgmma] = g.from_host(state0, DType::F32);
    outs[wgmma] = poisoned(g, {T, H, D}, DType::BF16);
    cks[wgmma] = poisoned(g, {num, H, D, D}, DType::F32);
    g.kda_chunk({.q = g.from_host(q, DType::BF16), .k = g.from_host(k, DType::BF16), .v = g.from_host(v, DType::BF16),
                 .g = g.from_host(gate, DType::F32), .beta = g.from_host(beta, DType::F32), .state = states[wgmma],
                 .slots = g.from_host(slots, DType::I32), .cu_seqlens = g.from_host(cu, DType::I32), .o = outs[wgmma],
                 .checkpoints = cks[wgmma], .checkpoint_slots = g.from_host(tbl, DType::I32), .checkpoint_interval = 64});
  }
  cb->set_kda_chunk_scan_wgmma(true);
  cb->set_kda_chunk_scan_wg_rows(0);
  // A row count the scans do not have is refused, naming it.
  CHECK_THROWS_WITH(cb->set_kda_chunk_scan_wg_rows(48),
                    Catch::Contains("48") && Catch::Contains("128"));
  for (int wgmma = 0; wgmma < kForms; ++wgmma) {
    const std::string tag = names[wgmma];
    expect_close(g, outs[wgmma], ref_o, tol("kda_out"), tag + " o vs cpu");
    expect_close(g, states[wgmma], ref_state, tol("kda_state"), tag + " state vs cpu");
    expect_close(g, cks[wgmma], ref_ck, tol("kda_state"), tag + " checkpoints vs cpu");
  }
  for (int wgmma = 1; wgmma < kForms; ++wgmma) {
    const std::string tag = names[wgmma];
    expect_close(g, outs[wgmma], g.to_host(outs[0]), tol("kda_out"), tag + " o vs mma.sync");
    expect_close(g, states[wgmma], g.to_host(states[0]), tol("kda_state"), tag + " state vs mma.sync");
  }
}

// Split jobs on the wgmma scans: where the plan's first step is a wide grid (a long sequence at few
// heads: T = 65536, H = 4 on the H200), the middle segments' B and A jobs run the wgmma kernels
// with no output (their write_o-false path) and the true pass with output and checkpoints every
// 256 tokens. Against the same call unsplit (one chain per head, the narrow mma.sync scan).
TEST_CASE("cuda kda_chunk split jobs on the wgmma scans match the unsplit scan", "[cuda]") {
  K3_GPU_OR_SKIP(bk);
  auto& g = *bk.gpu;
  auto* cb = dynamic_cast<cuda::CudaBackend*>(bk.gpu.get());
  REQUIRE(cb != nullptr);
  const int64_t D = 128;
  int64_t H = 0;
  int32_t len = 0;
  for (auto [l, h] : std::vector<std::array<int64_t, 2>>{{65536, 4}, {65536, 8}, {131072, 4}}) {
    const cuda::KdaSplitPlan plan = cuda::plan_kda_split(chunk0_of({int32_t(l)}), int(h), cb->num_sms());
    const auto form = cuda::pick_kda_scan_form(h, int64_t(plan.pass1.size()), cb->num_sms(), true, 0);
    if (plan.split() && (form == cuda::KdaScanForm::kWg32 || form == cuda::KdaScanForm::kWg64)) {
      len = int32_t(l);
      H = h;
      break;
    }
  }
  if (H == 0) {
    WARN("no candidate shape gives this GPU's split plan a wide first step; skipped");
    return;
  }
  INFO("T = " << len << ", H = " << H);
  std::mt19937 rng(71);
  const std::vector<int32_t> lens{len};
  Tensor q = randn({len, H, D}, rng), k = randn({len, H, D}, rng), v = randn({len, H, D}, rng);
  normalise_heads(q, 1.f / std::sqrt(float(D)));
  normalise_heads(k, 1.f);
  Tensor gate = uniform({len, H, D}, rng, -1.f, -0.001f, false), beta = uniform({len, H}, rng, 0.05f, 0.95f, false);
  Tensor state0 = randn({1, H, D, D}, rng, 0.1f, false);
  const CheckpointTable ct = checkpoint_table(lens, 256);
  Tensor tbl = Tensor::from_i32({1, ct.M}, ct.slots);
  // Unsplit; then split with the wgmma scan in 32-row, 64-row and whole-head blocks.
  constexpr int kRuns = 4;
  const int wg_rows[kRuns] = {32, 32, 64, 128};
  Tensor outs[kRuns], states[kRuns], cks[kRuns];
  for (int run = 0; run < kRuns; ++run) {
    cb->set_kda_chunk_split(run > 0);
    cb->set_kda_chunk_scan_wg_rows(wg_rows[run]);
    states[run] = g.from_host(state0, DType::F32);
    outs[run] = poisoned(g, {len, H, D}, DType::BF16);
    cks[run] = poisoned(g, {ct.num, H, D, D}, DType::F32);
    g.kda_chunk({.q = g.from_host(q, DType::BF16), .k = g.from_host(k, DType::BF16), .v = g.from_host(v, DType::BF16),
                 .g = g.from_host(gate, DType::F32), .beta = g.from_host(beta, DType::F32), .state = states[run],
                 .slots = g.from_host(ints({0}), DType::I32), .cu_seqlens = g.from_host(cu_of(lens), DType::I32),
                 .o = outs[run], .checkpoints = cks[run], .checkpoint_slots = g.from_host(tbl, DType::I32),
                 .checkpoint_interval = 256});
  }
  cb->set_kda_chunk_split(true);
  cb->set_kda_chunk_scan_wg_rows(0);
  for (int run = 1; run < kRuns; ++run) {
    const std::string tag = run == 1 ? "split, wgmma 32-row" : run == 2 ? "split, wgmma 64-row" : "split, wgmma head";
    expect_close(g, outs[run], g.to_host(outs[0]), tol("kda_out"), tag + " o vs unsplit");
    expect_close(g, states[run], g.to_host(states[0]), tol("kda_state"), tag + " state vs unsplit");
    expect_close(g, cks[run], g.to_host(cks[0]), tol("kda_state"), tag + " checkpoints vs unsplit");
  }
}
