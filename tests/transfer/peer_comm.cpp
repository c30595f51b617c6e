// One rank of the collective tests: runs the comm_scenario.h workload and prints one line per
// collective, "<name> <digest>", then "DONE". Rank 0 prints "BOUND <endpoint>" first.
//   k3-test-peer-comm <rank> <size> <endpoint> <seed> [scale]   (comm_scenario.h: the sizes' factor, 1 by default)
#include <cstdio>
#include <cstdlib>

#include "tests/transfer/comm_scenario.h"
#include "transfer/comm_ucx.h"

using namespace k3::transfer;
using namespace k3::test::comm;

namespace {
int fail(const k3::Status& s, const char* what) {
  std::fprintf(stderr, "%s: %s\n", what, s.to_string().c_str());
  return 1;
}
void report(const char* name, const void* p, size_t n) {
  std::printf("%s %s\n", name, hex(fnv(p, n)).c_str());
  std::fflush(stdout);
}
}  // namespace

int main(int argc, char** argv) {
  if (argc != 5 && argc != 6) return 2;
  const int rank = std::atoi(argv[1]), size = std::atoi(argv[2]);
  const uint64_t seed = std::strtoull(argv[4], nullptr, 10);
  const size_t scale = argc == 6 ? std::strtoull(argv[5], nullptr, 10) : 1;
  if (scale == 0) return 2;
  auto comm_or = UcxComm::create(rank, size, argv[3], {}, [](const std::string& ep) {
    std::printf("BOUND %s\n", ep.c_str());
    std::fflush(stdout);
  });
  if (!comm_or.is_ok()) return fail(comm_or.status(), "create");
  auto comm = std::move(comm_or).value();

  // Ring send/recv: rank r sends its own bytes to r+1.
  if (size > 1) {
    auto mine = bytes(seed, rank, sendrecv_bytes(scale), 1);
    std::vector<uint8_t> got(mine.size());
    const int next = (rank + 1) % size, prev = (rank + size - 1) % size;
    // Even ranks send first; with rendezvous a blocking send on every rank would deadlock.
    if (rank % 2 == 0) {
      if (auto s = comm->send(next, std::as_bytes(std::span(mine)), 5); !s.is_ok()) return fail(s, "send");
      if (auto s = comm->recv(prev, std::as_writable_bytes(std::span(got)), 5); !s.is_ok()) return fail(s, "recv");
    } else {
      if (auto s = comm->recv(prev, std::as_writable_bytes(std::span(got)), 5); !s.is_ok()) return fail(s, "recv");
      if (auto s = comm->send(next, std::as_bytes(std::span(mine)), 5); !s.is_ok()) return fail(s, "send");
    }
    report("sendrecv", got.data(), got.size());
  }

  auto ar = floats(seed, rank, all_reduce_count(seed, size, scale), 2);
  if (auto s = comm->all_reduce_sum(ar); !s.is_ok()) return fail(s, "all_reduce");
  report("all_reduce", ar.data(), ar.size() * 4);

  auto g = bytes(seed, rank, gather_bytes(seed, scale), 3);
  std::vector<uint8_t> gall(g.size() * size);
  if (auto s = comm->all_gather(std::as_bytes(std::span(g)), std::as_writable_bytes(std::span(gall))); !s.is_ok())
    return fail(s, "all_gather");
  report("all_gather", gall.data(), gall.size());

  auto rs = floats(seed, rank, rs_block(seed, scale) * size, 4);
  std::vector<float> rsout(rs_block(seed, scale));
  if (auto s = comm->reduce_scatter_sum(rs, rsout); !s.is_ok()) return fail(s, "reduce_scatter");
  report("reduce_scatter", rsout.data(), rsout.size() * 4);

  auto a2a = bytes(seed, rank, a2a_block(seed, scale) * size, 5);
  std::vector<uint8_t> a2aout(a2a.size());
  if (auto s = comm->all_to_all(std::as_bytes(std::span(a2a)), std::as_writable_bytes(std::span(a2aout))); !s.is_ok())
    return fail(s, "all_to_all");
  report("all_to_all", a2aout.data(), a2aout.size());

  std::vector<size_t> sc(size), rc(size);
  std::vector<uint8_t> vin, vout;
  for (int p = 0; p < size; ++p) {
    sc[p] = a2av_count(seed, rank, p, scale);
    rc[p] = a2av_count(seed, p, rank, scale);
    for (size_t i = 0; i < sc[p]; ++i) vin.push_back(a2av_byte(rank, p, i));
  }
  size_t rtotal = 0;
  for (auto c : rc) rtotal += c;
  vout.assign(rtotal, 0xAB);
  if (auto s = comm->all_to_allv(std::as_bytes(std::span(vin)), sc, std::as_writable_bytes(std::span(vout)), rc);
      !s.is_ok())
    return fail(s, "all_to_allv");
  report("all_to_allv", vout.data(), vout.size());

  if (auto s = comm->barrier(); !s.is_ok()) return fail(s, "barrier");
  std::printf("DONE\n");
  std::fflush(stdout);
  return 0;
}
