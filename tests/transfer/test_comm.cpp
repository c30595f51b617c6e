// Host collectives across real processes (2, 3, 8, 16 ranks on 127.0.0.1): every rank's output equals
// the serial reference, bitwise (all_reduce included, so every rank holds identical bits); with small
// messages (UCX's eager sends) and with large ones (rendezvous, as a K3-width decode group's are).
#include <catch2/catch.hpp>

#include <map>

#include "tests/transfer/comm_scenario.h"
#include "tests/transfer/process_guard.h"
#include "transfer/comm.h"

using namespace k3::test::comm;
using namespace std::chrono_literals;
using k3::test::ProcessGuard;

TEST_CASE("even_chunk covers the range exactly", "[comm]") {
  for (size_t count : {0, 1, 7, 16, 1001}) {
    for (int parts : {1, 2, 3, 8, 16}) {
      size_t next = 0;
      for (int i = 0; i < parts; ++i) {
        auto c = k3::transfer::even_chunk(count, parts, i);
        REQUIRE(c.offset == next);
        REQUIRE(c.count >= count / parts);
        REQUIRE(c.count <= count / parts + 1);
        next += c.count;
      }
      REQUIRE(next == count);
    }
  }
}

namespace {

// Serial reference digests for every rank.
std::vector<std::map<std::string, std::string>> reference(int size, uint64_t seed, size_t scale) {
  std::vector<std::map<std::string, std::string>> out(size);
  // all_reduce
  std::vector<std::vector<float>> ar(size);
  for (int r = 0; r < size; ++r) ar[r] = floats(seed, r, all_reduce_count(seed, size, scale), 2);
  auto sum = serial_sum(ar);
  // reduce_scatter
  std::vector<std::vector<float>> rs(size);
  for (int r = 0; r < size; ++r) rs[r] = floats(seed, r, rs_block(seed, scale) * size, 4);
  auto rs_sum = serial_sum(rs);
  // all_gather
  std::vector<uint8_t> gall;
  for (int r = 0; r < size; ++r) {
    auto g = bytes(seed, r, gather_bytes(seed, scale), 3);
    gall.insert(gall.end(), g.begin(), g.end());
  }
  for (int r = 0; r < size; ++r) {
    if (size > 1) {
      auto got = bytes(seed, (r + size - 1) % size, sendrecv_bytes(scale), 1);
      out[r]["sendrecv"] = hex(fnv(got.data(), got.size()));
    }
    out[r]["all_reduce"] = hex(fnv(sum.data(), sum.size() * 4));
    out[r]["all_gather"] = hex(fnv(gall.data(), gall.size()));
    const size_t b = rs_block(seed, scale);
    out[r]["reduce_scatter"] = hex(fnv(rs_sum.data() + r * b, b * 4));
    std::vector<uint8_t> a2a;
    const size_t ab = a2a_block(seed, scale);
    for (int q = 0; q < size; ++q) {
      auto in = bytes(seed, q, ab * size, 5);
      a2a.insert(a2a.end(), in.begin() + r * ab, in.begin() + (r + 1) * ab);
    }
    out[r]["all_to_all"] = hex(fnv(a2a.data(), a2a.size()));
    std::vector<uint8_t> v;
    for (int q = 0; q < size; ++q)
      for (size_t i = 0; i < a2av_count(seed, q, r, scale); ++i) v.push_back(a2av_byte(q, r, i));
    out[r]["all_to_allv"] = hex(fnv(v.data(), v.size()));
  }
  return out;
}

void run_ranks(int size, uint64_t seed, size_t scale = 1) {
  const auto exe = k3::test::helper_path("k3-test-peer-comm");
  std::vector<std::unique_ptr<ProcessGuard>> ranks;
  ranks.push_back(std::make_unique<ProcessGuard>(
      exe, std::vector<std::string>{"0", std::to_string(size), "tcp://127.0.0.1:*", std::to_string(seed),
                               std::to_string(scale)}));
  auto ep = ranks[0]->wait_for("BOUND ", 20s);
  REQUIRE(ep);
  for (int r = 1; r < size; ++r)
    ranks.push_back(std::make_unique<ProcessGuard>(
        exe, std::vector<std::string>{std::to_string(r), std::to_string(size), *ep, std::to_string(seed),
                                      std::to_string(scale)}));
  auto ref = reference(size, seed, scale);
  std::string first_all_reduce;
  for (int r = 0; r < size; ++r) {
    std::map<std::string, std::string> got;
    for (;;) {
      auto line = ranks[r]->read_line(60s);
      INFO("rank " << r << " of " << size);
      REQUIRE(line);
      if (*line == "DONE") break;
      auto sp = line->find(' ');
      got[line->substr(0, sp)] = line->substr(sp + 1);
    }
    INFO("rank " << r << " of " << size);
    CHECK(got == ref[r]);
    if (r == 0) first_all_reduce = got["all_reduce"];
    CHECK(got["all_reduce"] == first_all_reduce);
  }
  for (int r = 0; r < size; ++r) CHECK(ranks[r]->wait_exit(20s) == 0);
}

}  // namespace

TEST_CASE("collectives over UCX equal the serial reference", "[comm][process]") {
  const int size = GENERATE(2, 3, 8, 16);
  const uint64_t seed = 100 + size;
  run_ranks(size, seed);
}

TEST_CASE("collectives over UCX with large messages (rendezvous) equal the serial reference", "[comm][process]") {
  const int size = GENERATE(2, 3, 8);
  run_ranks(size, 200 + size, 1024);
}
