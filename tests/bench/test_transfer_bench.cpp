// `k3-bench transfer`: five consecutive runs must each start, time the protocol round trip through the
// real drivers and fill the bandwidth table against the ucx_perftest of the UCX we link (a missing
// perftest shows as n/a, a round trip that does not start exits non-zero). Latency targets are for a
// quiet machine (docs/PERF.md) and are not asserted on the shared CI host.
#include <catch2/catch.hpp>

#include <cstdio>
#include <regex>
#include <string>
#include <sys/wait.h>

namespace {
struct Run {
  int rc = -1;
  std::string out;
};
Run run(const std::string& args) {
  Run r;
  const std::string cmd = std::string(K3_BIN_DIR) + "/k3-bench transfer " + args + " 2>&1";
  FILE* f = ::popen(cmd.c_str(), "r");
  REQUIRE(f != nullptr);
  char buf[4096];
  while (size_t n = std::fread(buf, 1, sizeof buf, f)) r.out.append(buf, n);
  const int st = ::pclose(f);
  r.rc = WIFEXITED(st) ? WEXITSTATUS(st) : -1;
  return r;
}
}  // namespace

TEST_CASE("k3-bench transfer: the round trip starts in five consecutive runs and the table has perftest beside us") {
  const std::regex rt(R"(protocol round trip .* \((\d+) requests\): p50 (\d+) us, p90 (\d+) us, p99 (\d+) us)");
  const std::regex row(R"(64 KiB\s+\d+\s+([0-9.]+)\s+([0-9.]+)\s+([0-9.]+))");
  for (int i = 0; i < 5; ++i) {
    const Run r = run("--sizes 65536 --bytes-per-size 8388608 --rt-iters 50");
    INFO("run " << i << ":\n" << r.out);
    REQUIRE(r.rc == 0);
    std::smatch m;
    REQUIRE(std::regex_search(r.out, m, rt));
    CHECK(std::stoi(m[1]) == 50);
    CHECK(std::stol(m[2]) <= std::stol(m[3]));
    CHECK(std::stol(m[3]) <= std::stol(m[4]));
    REQUIRE(std::regex_search(r.out, m, row));
    CHECK(std::stod(m[1]) > 0);  // ucx_perftest ran (n/a would not match)
    CHECK(std::stod(m[2]) > 0);
  }
}

TEST_CASE("k3-bench transfer rejects a bad --memory") {
  const Run r = run("--memory disk");
  CHECK(r.rc != 0);
  CHECK(r.out.find("--memory") != std::string::npos);
}
