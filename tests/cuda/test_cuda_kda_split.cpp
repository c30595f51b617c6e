// The split chunked KDA scan (kernels/cuda/kda_split_plan.h): the plan's job tables (host only, run
// everywhere), and on a GPU the split scan against the CPU recurrence and against the unsplit scan.
// The overlapped form (kernels/cuda/kda_piece_plan.h): its pieces' jobs (host only), and on a GPU
// bitwise the same output, states and checkpoints as prep-then-scan.
#include <algorithm>
#include <cstring>
#include <numeric>
#include <set>

#include "kernels/cuda/cuda_backend.h"
#include "kernels/cuda/kda_piece_plan.h"
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
    int64_t M = 1, num = 0;
    std::vector<int32_t> table;
    if (cs.interval > 0) {
      for (int32_t l : cs.lens) M = std::max<int64_t>(M, l / cs.interval);
      table.assign(static_cast<size_t>(N * M), -1);
      for (int64_t n = 0; n < N; ++n)
        for (int64_t j = 0; j < cs.lens[size_t(n)] / cs.interval; ++j) table[size_t(n * M + j)] = int32_t(num++);
    }
    Tensor tbl = Tensor::from_i32({N, M}, cs.interval > 0 ? table : std::vector<int32_t>(size_t(N * M), -1));
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

namespace {

// Pieces cut the table at increasing bounds covering it; piece i's jobs lie inside its bounds, one
// per sequence with chunks there, in sequence order, and together they scan every chunk of every
// sequence once, in order, from and back to the sequence's slot.
void check_pieces(const cuda::KdaPiecePlan& plan, const std::vector<int32_t>& c0) {
  const int N = int(c0.size()) - 1, P = plan.pieces();
  REQUIRE(plan.job0.size() == size_t(P) + 1);
  CHECK(plan.bounds.front() == 0);
  CHECK(plan.bounds.back() == c0.back());
  std::vector<int> next(c0.begin(), c0.end() - 1);  // each sequence's next chunk to scan
  for (int i = 0; i < P; ++i) {
    CHECK(plan.bounds[size_t(i)] <= plan.bounds[size_t(i) + 1]);
    int last_seq = -1;
    for (int j = plan.job0[size_t(i)]; j < plan.job0[size_t(i) + 1]; ++j) {
      const KdaScanJob& job = plan.jobs[size_t(j)];
      REQUIRE(job.seq > last_seq);
      REQUIRE(job.seq < N);
      last_seq = job.seq;
      CHECK(job.c_begin >= plan.bounds[size_t(i)]);
      CHECK(job.c_end <= plan.bounds[size_t(i) + 1]);
      CHECK(job.c_begin < job.c_end);
      CHECK(job.c_begin == next[size_t(job.seq)]);
      next[size_t(job.seq)] = job.c_end;
      CHECK(job.init == KdaScanJob::kFromSeq);
      CHECK(job.out == KdaScanJob::kToSeq);
      CHECK(job.flags == KdaScanJob::kWriteO);
    }
  }
  for (int n = 0; n < N; ++n) CHECK(next[size_t(n)] == c0[size_t(n) + 1]);
}

}  // namespace

TEST_CASE("kda piece plan: pieces whose scans cover every chunk once, in order", "[cuda][plan]") {
  // The plan's own choice: one piece per 8 chunks of the longest sequence, at most 16; none under 32.
  CHECK(cuda::plan_kda_pieces(chunk0_of({8192})).pieces() == 16);
  CHECK(cuda::plan_kda_pieces(chunk0_of({64 * 40})).pieces() == 5);
  CHECK_FALSE(cuda::plan_kda_pieces(chunk0_of({64 * 31})).used());
  CHECK_FALSE(cuda::plan_kda_pieces(chunk0_of(std::vector<int32_t>(256, 100))).used());
  CHECK_FALSE(cuda::plan_kda_pieces(chunk0_of({8192}), 1).used());
  check_pieces(cuda::plan_kda_pieces(chunk0_of({8192})), chunk0_of({8192}));
  // More pieces than chunks: the extra pieces are empty, never out of order.
  check_pieces(cuda::plan_kda_pieces(chunk0_of({100, 0, 64}), 7), chunk0_of({100, 0, 64}));
  std::mt19937 rng(11);
  for (int trial = 0; trial < 300; ++trial) {
    std::vector<int32_t> lens(1 + rng() % 6);
    for (auto& l : lens) l = int32_t(rng() % 4 == 0 ? 0 : rng() % 3 == 0 ? rng() % 200 : rng() % 20000);
    const auto c0 = chunk0_of(lens);
    const auto plan = cuda::plan_kda_pieces(c0, int(rng() % 20));
    if (plan.used()) check_pieces(plan, c0);
  }
}

TEST_CASE("cuda kda_chunk in overlapped pieces equals prep-then-scan bitwise", "[cuda]") {
  K3_GPU_OR_SKIP(bk);
  auto& g = *bk.gpu;
  auto* cb = dynamic_cast<cuda::CudaBackend*>(bk.gpu.get());
  REQUIRE(cb != nullptr);
  std::mt19937 rng(41);
  // Segments off, so that few heads take the pieced path too. Mixed lengths with an empty sequence
  // and chunks that straddle piece bounds; checkpoints every 64 tokens; the unbounded gate's prep.
  struct Case { std::vector<int32_t> lens; int64_t H; int interval; bool bounded; std::vector<int> pieces; };
  for (const Case& cs : {Case{{4096}, 2, 256, true, {0, 2, 3}}, Case{{2100, 100, 0, 3100}, 3, 64, true, {0, 5, 40}},
                         Case{{1500, 2600}, 2, 0, false, {0, 4}}}) {
    const int64_t D = 128, H = cs.H, N = int64_t(cs.lens.size());
    const int64_t T = std::accumulate(cs.lens.begin(), cs.lens.end(), int64_t(0));
    Tensor q = randn({T, H, D}, rng), k = randn({T, H, D}, rng), v = randn({T, H, D}, rng);
    normalise_heads(q, 1.f / std::sqrt(float(D)));
    normalise_heads(k, 1.f);
    Tensor gate = uniform({T, H, D}, rng, cs.bounded ? -5.f : -30.f, -0.001f, false);
    Tensor beta = uniform({T, H}, rng, 0.05f, 0.95f, false);
    Tensor state0 = randn({N, H, D, D}, rng, 0.1f, false);
    std::vector<int32_t> slot_ids(static_cast<size_t>(N));
    std::iota(slot_ids.rbegin(), slot_ids.rend(), 0);
    Tensor slots = ints(slot_ids), cu = cu_of(cs.lens);
    int64_t M = 1, num = 0;
    std::vector<int32_t> table;
    if (cs.interval > 0) {
      for (int32_t l : cs.lens) M = std::max<int64_t>(M, l / cs.interval);
      table.assign(static_cast<size_t>(N * M), -1);
      for (int64_t n = 0; n < N; ++n)
        for (int64_t j = 0; j < cs.lens[size_t(n)] / cs.interval; ++j) table[size_t(n * M + j)] = int32_t(num++);
    }
    Tensor tbl = Tensor::from_i32({N, M}, cs.interval > 0 ? table : std::vector<int32_t>(size_t(N * M), -1));
    auto run = [&](int pieces, Tensor& o, Tensor& st, Tensor& ck) {
      cb->set_kda_chunk_split(false);
      cb->set_kda_chunk_pieces(pieces);
      st = g.from_host(state0, DType::F32);
      o = poisoned(g, {T, H, D}, DType::BF16);
      ck = poisoned(g, {std::max<int64_t>(num, 1), H, D, D}, DType::F32);
      ops::KdaParams p{.q = g.from_host(q, DType::BF16), .k = g.from_host(k, DType::BF16),
                       .v = g.from_host(v, DType::BF16), .g = g.from_host(gate, DType::F32),
                       .beta = g.from_host(beta, DType::F32), .state = st,
                       .slots = g.from_host(slots, DType::I32), .cu_seqlens = g.from_host(cu, DType::I32),
                       .o = o, .bounded_gate = cs.bounded};
      if (cs.interval > 0) {
        p.checkpoints = ck;
        p.checkpoint_slots = g.from_host(tbl, DType::I32);
        p.checkpoint_interval = cs.interval;
      }
      g.kda_chunk(p);
      cb->set_kda_chunk_pieces(0);
      cb->set_kda_chunk_split(true);
    };
    Tensor o1, s1, k1;
    run(1, o1, s1, k1);
    const Tensor ho1 = g.to_host(o1), hs1 = g.to_host(s1), hk1 = g.to_host(k1);
    for (int pieces : cs.pieces) {
      INFO("N=" << N << " H=" << H << " interval=" << cs.interval << " pieces=" << pieces
                << " bounded=" << cs.bounded);
      const auto plan = cuda::plan_kda_pieces(chunk0_of(cs.lens), pieces);
      REQUIRE(plan.used());
      Tensor o, s, ck;
      run(pieces, o, s, ck);
      const Tensor ho = g.to_host(o), hs = g.to_host(s), hk = g.to_host(ck);
      CHECK(std::memcmp(ho.data(), ho1.data(), ho.nbytes()) == 0);
      CHECK(std::memcmp(hs.data(), hs1.data(), hs.nbytes()) == 0);
      if (cs.interval > 0) CHECK(std::memcmp(hk.data(), hk1.data(), hk.nbytes()) == 0);
    }
  }
}
