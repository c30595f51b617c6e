// `k3-bench engine` needs a GPU for its figures (tests/cuda and docs/PERF.md run it there); what it
// checks before touching one is tested here: a bad GEMM shape or preset is refused by name, exit 2.
#include <catch2/catch.hpp>

#include <string>

#include "tests/support/run_command.h"

namespace {
const std::string kBin = K3_BIN_DIR;
}  // namespace

TEST_CASE("k3-bench engine refuses a bad --gemm-shapes or preset before it looks for a GPU") {
  for (const char* bad : {"7168", "7168y7168", "7168x0", "7168x7168z", "-1x64"}) {
    const auto r = k3::test::run_command(kBin + "/k3-bench engine --gemm-only --gemm-shapes 2048x2048 '" +
                                         std::string(bad) + "' 2>&1");
    INFO(bad << ": " << r.out);
    CHECK(r.exit_code == 2);
    CHECK(r.out.find(std::string("--gemm-shapes: '") + bad + "' is not NxK") != std::string::npos);
  }
  const auto r = k3::test::run_command(kBin + "/k3-bench engine --gemm-only --preset k3-huge 2>&1");
  INFO(r.out);
  CHECK(r.exit_code == 2);
  CHECK(r.out.find("k3-huge") != std::string::npos);
}
