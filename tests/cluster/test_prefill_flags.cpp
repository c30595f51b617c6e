// k3-prefill refuses bad flags with the flag named, before it connects to anything.
#include <catch2/catch.hpp>

#include "tests/support/run_command.h"

namespace {
const std::string kBin = K3_BIN_DIR;

// k3-prefill on a fresh k3-tiny with `flags` added; its exit code and output.
k3::test::CommandResult prefill_with(const std::string& flags) {
  k3::test::TempDir dir("prefill-flags");
  const std::string model = dir.path() + "/m";
  auto gen = k3::test::run_command(kBin + "/k3-genweights --preset k3-tiny --seed 1 --quiet --out '" + model + "' 2>&1");
  INFO(gen.out);
  REQUIRE(gen.exit_code == 0);
  return k3::test::run_command(kBin + "/k3-prefill --model '" + model +
                               "' --insecure-control-plane --decode-endpoint tcp://127.0.0.1:9 " + flags +
                               " --threads 1 2>&1");
}
}  // namespace

TEST_CASE("k3-prefill --max-inflight-chunks 0 is refused with the flag named", "[cluster]") {
  const auto r = prefill_with("--max-inflight-chunks 0");
  INFO(r.out);
  CHECK(r.exit_code != 0);
  CHECK(r.out.find("--max-inflight-chunks must be >= 1 (got 0)") != std::string::npos);
}

TEST_CASE("k3-prefill --cache-region-mib too small for one slot and one page is refused with the flag named", "[cluster]") {
  const auto r = prefill_with("--cache-region-mib 0.001");
  INFO(r.out);
  CHECK(r.exit_code != 0);
  CHECK(r.out.find("--cache-region-mib: unified region: region_bytes (1048) holds no") != std::string::npos);
}
