// k3-prefill refuses bad streaming flags with the flag named, before it connects to anything.
#include <catch2/catch.hpp>

#include "tests/support/run_command.h"

namespace {
const std::string kBin = K3_BIN_DIR;
}  // namespace

TEST_CASE("k3-prefill --max-inflight-chunks 0 is refused with the flag named", "[cluster]") {
  k3::test::TempDir dir("prefill-flags");
  const std::string model = dir.path() + "/m";
  auto gen = k3::test::run_command(kBin + "/k3-genweights --preset k3-tiny --seed 1 --quiet --out '" + model + "' 2>&1");
  INFO(gen.out);
  REQUIRE(gen.exit_code == 0);
  const auto r = k3::test::run_command(kBin + "/k3-prefill --model '" + model +
                                       "' --insecure-control-plane --decode-endpoint tcp://127.0.0.1:9 "
                                       "--max-inflight-chunks 0 --threads 1 2>&1");
  INFO(r.out);
  CHECK(r.exit_code != 0);
  CHECK(r.out.find("--max-inflight-chunks must be >= 1 (got 0)") != std::string::npos);
}

TEST_CASE("k3-prefill --cache-region-mib too small for one slot and one page is refused with the flag named", "[cluster]") {
  k3::test::TempDir dir("prefill-flags");
  const std::string model = dir.path() + "/m";
  auto gen = k3::test::run_command(kBin + "/k3-genweights --preset k3-tiny --seed 1 --quiet --out '" + model + "' 2>&1");
  INFO(gen.out);
  REQUIRE(gen.exit_code == 0);
  const auto r = k3::test::run_command(kBin + "/k3-prefill --model '" + model +
                                       "' --insecure-control-plane --decode-endpoint tcp://127.0.0.1:9 "
                                       "--cache-region-mib 0.001 --threads 1 2>&1");
  INFO(r.out);
  CHECK(r.exit_code != 0);
  CHECK(r.out.find("--cache-region-mib: unified region: region_bytes (1048) holds no") != std::string::npos);
}
