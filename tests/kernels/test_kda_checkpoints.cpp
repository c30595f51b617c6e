// The chunked KDA op's optional checkpoint output: the state copied at a chunk end is bitwise the final
// state of the same op run on just that prefix, for several sequences of a varlen batch; the running
// states are unchanged by it; bad checkpoints are refused with the reason.
#include <catch2/catch.hpp>

#include <cstring>

#include "tests/kernels/kernel_test_util.h"

using namespace k3;
using namespace k3::test;

namespace {
constexpr int64_t H = 2, K = 16, V = 16, C = 64;

struct Inputs {
  Tensor q, k, v, g, beta;
};
Inputs inputs(std::mt19937& rng, int64_t T) {
  Inputs in{randn({T, H, K}, rng, 0.2f), randn({T, H, K}, rng, 0.2f), randn({T, H, V}, rng),
            uniform({T, H, K}, rng, -1.f, -0.01f), uniform({T, H}, rng, 0.05f, 0.95f)};
  return in;
}
// Rows [from, to) of a [T, ...] tensor as a fresh tensor.
Tensor rows(const Tensor& t, int64_t from, int64_t to) { return t.slice_rows(from, to).clone(); }
bool same_bytes(const Tensor& a, const Tensor& b) {
  return a.nbytes() == b.nbytes() && std::memcmp(a.data(), b.data(), a.nbytes()) == 0;
}
}  // namespace

TEST_CASE("kda_chunk checkpoints are the state of the prefix run alone", "[kda]") {
  auto be = cpu_backend(2);
  std::mt19937 rng(3);
  const std::vector<int32_t> lens = {200, 130};
  const int64_t T = 330;
  Inputs in = inputs(rng, T);
  // Slots 0, 1: the sequences (random start states); 2..5: checkpoint destinations.
  Tensor state = randn({6, H, V, K}, rng, 0.3f);
  const Tensor start = state.clone();
  Tensor o = Tensor::zeros({T, H, V});
  ops::KdaParams p{.q = in.q, .k = in.k, .v = in.v, .g = in.g, .beta = in.beta, .state = state,
                   .slots = i32({2}, {0, 1}), .cu_seqlens = i32({3}, {0, 200, 330}), .o = o, .chunk_size = C,
                   .ckpt_seq = i32({3}, {0, 0, 1}), .ckpt_pos = i32({3}, {64, 192, 128}),
                   .ckpt_slots = i32({3}, {2, 3, 4})};
  be->kda_chunk(p);

  // Without checkpoints: the same outputs and final states.
  Tensor state2 = start.clone(), o2 = Tensor::zeros({T, H, V});
  ops::KdaParams plain = p;
  plain.state = state2;
  plain.o = o2;
  plain.ckpt_seq = plain.ckpt_pos = plain.ckpt_slots = Tensor();
  be->kda_chunk(plain);
  REQUIRE(same_bytes(o, o2));
  REQUIRE(same_bytes(state.slice_rows(0, 2), state2.slice_rows(0, 2)));

  // Each checkpoint against the prefix alone, from the same start state.
  struct Want { int seq; int64_t pos; int slot; };
  for (Want w : {Want{0, 64, 2}, Want{0, 192, 3}, Want{1, 128, 4}}) {
    const int64_t at = w.seq == 0 ? 0 : 200;
    Tensor s1 = start.slice_rows(w.seq, w.seq + 1).clone();
    Tensor o1 = Tensor::zeros({w.pos, H, V});
    be->kda_chunk({.q = rows(in.q, at, at + w.pos), .k = rows(in.k, at, at + w.pos), .v = rows(in.v, at, at + w.pos),
                   .g = rows(in.g, at, at + w.pos), .beta = rows(in.beta, at, at + w.pos), .state = s1,
                   .slots = i32({1}, {0}), .cu_seqlens = i32({2}, {0, static_cast<int32_t>(w.pos)}), .o = o1,
                   .chunk_size = C});
    INFO("sequence " << w.seq << " checkpoint at " << w.pos);
    REQUIRE(same_bytes(state.slice_rows(w.slot, w.slot + 1), s1));
  }
  REQUIRE(same_bytes(state.slice_rows(5, 6), start.slice_rows(5, 6)));   // an unused slot is untouched
}

TEST_CASE("kda_chunk refuses checkpoints off chunk ends or onto a running slot", "[kda]") {
  auto be = cpu_backend(1);
  std::mt19937 rng(4);
  Inputs in = inputs(rng, 100);
  Tensor state = Tensor::zeros({3, H, V, K}), o = Tensor::zeros({100, H, V});
  ops::KdaParams p{.q = in.q, .k = in.k, .v = in.v, .g = in.g, .beta = in.beta, .state = state,
                   .slots = i32({1}, {0}), .cu_seqlens = i32({2}, {0, 100}), .o = o, .chunk_size = C,
                   .ckpt_seq = i32({1}, {0}), .ckpt_pos = i32({1}, {50}), .ckpt_slots = i32({1}, {1})};
  REQUIRE_THROWS_WITH(be->kda_chunk(p), Catch::Contains("not a chunk end"));
  p.ckpt_pos = i32({1}, {128});
  REQUIRE_THROWS_WITH(be->kda_chunk(p), Catch::Contains("not a chunk end"));
  p.ckpt_pos = i32({1}, {64});
  p.ckpt_slots = i32({1}, {0});
  REQUIRE_THROWS_WITH(be->kda_chunk(p), Catch::Contains("running sequence's slot"));
  p.ckpt_slots = i32({1}, {7});
  REQUIRE_THROWS_WITH(be->kda_chunk(p), Catch::Contains("out of range"));
}
