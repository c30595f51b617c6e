// A DCP group agrees before each step that every rank has room for its new rows: when the rank that
// owns the next position is out of MLA pages, EVERY rank's step returns ResourceExhausted and no rank
// advances (the group stays in step and usable). Two ranks in two threads, each with its own UCX
// communicator (the math, not the processes, is the point here).
#include <catch2/catch.hpp>

#include <future>
#include <thread>

#include "tests/ranks/rank_scenario.h"
#include "transfer/comm_ucx.h"

using namespace k3;
using namespace k3::test::ranks;

TEST_CASE("a rank out of pages fails the step on every rank of the group, before any cache moves", "[ranks]") {
  // One request of 13 tokens: rank 0 holds rows of p = 0, 2, .., 12 (7 rows), rank 1 p = 1, .., 11 (6);
  // 2 pages of 4 rows each. Steps at positions 13, 14, 15 fit; position 16 needs rank 0's 9th row.
  const Scenario sc = make_scenario(4, 4, 1, 6);
  REQUIRE(sc.prompts[0].size() == 13);
  const CacheOptions tight{.max_seqs = 2, .page_size = 4, .num_pages = 2};
  struct Outcome {
    std::vector<Code> codes;
    int64_t position = 0, rows = 0;
    int free_pages = -1;
    std::string error;
  };
  Outcome out[2];
  std::promise<std::string> bound;
  auto ep = bound.get_future();
  auto rank = [&](int r) {
    const RankLayout g{.dcp = 2, .kv_partitions = 2, .rank = r};
    auto comm = r == 0 ? transfer::UcxComm::create(0, 2, "tcp://127.0.0.1:*", {}, [&](const std::string& e) { bound.set_value(e); })
                       : transfer::UcxComm::create(1, 2, ep.get());
    if (!comm.is_ok()) return void(out[r].error = comm.status().to_string());
    auto run = setup_rank(sc, g, **comm, 1, tight);
    if (!run.is_ok()) return void(out[r].error = run.status().to_string());
    for (size_t st = 0; st < sc.steps.size(); ++st) out[r].codes.push_back((*run)->step(sc, st).status().code());
    out[r].position = (*run)->items[0].position;
    out[r].rows = (*run)->items[0].seq->num_tokens;
    (*run)->close();
    out[r].free_pages = (*run)->model->caches().free_pages();
  };
  std::thread t0(rank, 0), t1(rank, 1);
  t0.join();
  t1.join();
  for (int r = 0; r < 2; ++r) {
    INFO("rank " << r << ": " << out[r].error);
    REQUIRE(out[r].error.empty());
    REQUIRE(out[r].codes.size() == 6);
    CHECK(out[r].codes[0] == Code::Ok);
    CHECK(out[r].codes[1] == Code::Ok);
    CHECK(out[r].codes[2] == Code::Ok);
    for (size_t s = 3; s < 6; ++s) CHECK(out[r].codes[s] == Code::ResourceExhausted);  // refused every time, in step
    CHECK(out[r].position == 16);  // three steps advanced, the refused ones did not
    CHECK(out[r].free_pages == 2);
  }
  CHECK(out[0].rows == 8);  // rows of p = 0, 2, .., 14
  CHECK(out[1].rows == 8);  // rows of p = 1, 3, .., 15
}
