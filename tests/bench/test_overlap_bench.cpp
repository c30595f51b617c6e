// `k3-bench overlap` on a short k3-tiny prompt with two real k3-prefill stages and a k3-decode: every
// round runs with and without the transfer, the stages' TIMING lines give each transfer run a write span
// and a hidden share in [0, 1], and the summary lines are printed; with the decode side a DCP2 or EP2 rank
// group the stages' bytes reach it and a write rate is reported. The figures themselves are for
// docs/PERF.md (a loaded CI host proves nothing about them); bad input is refused with the flag named.
#include <catch2/catch.hpp>

#include <regex>
#include <string>

#include "tests/support/run_command.h"

namespace {

const std::string kBin = K3_BIN_DIR;

struct TinyModel {
  k3::test::TempDir dir{"overlap-model"};
  TinyModel() {
    auto r = k3::test::run_command(kBin + "/k3-genweights --preset k3-tiny --seed 5 --quiet --out '" + path() + "' 2>&1");
    INFO(r.out);
    REQUIRE(r.exit_code == 0);
  }
  std::string path() const { return dir.path() + "/m"; }
};

}  // namespace

TEST_CASE("k3-bench overlap: transfer runs have write spans and a hidden share, skipped runs none") {
  TinyModel model;
  const auto r = k3::test::run_command(kBin + "/k3-bench overlap --model '" + model.path() +
                                       "' --prompt 96 --stages 2 --chunk 16 --runs 2 --threads 1 --timeout-s 120 2>&1");
  INFO(r.out);
  REQUIRE(r.exit_code == 0);
  // round transfer TTFT compute tail writes exposed hidden
  const std::regex row(R"((warm|\d+)\s+(yes|skipped)\s+([0-9.]+)\s+([0-9.]+)\s+([0-9.]+)\s+([0-9.]+)\s+([0-9.]+)\s+(\S+))");
  int with = 0, skipped = 0;
  for (auto it = std::sregex_iterator(r.out.begin(), r.out.end(), row); it != std::sregex_iterator(); ++it) {
    const std::smatch& m = *it;
    const double ttft = std::stod(m[3]), compute = std::stod(m[4]), tail = std::stod(m[5]), writes = std::stod(m[6]),
                 exposed = std::stod(m[7]);
    CHECK(ttft > 0);
    CHECK(compute > 0);
    CHECK(compute <= ttft + 0.1);
    if (m[2] == "yes") {
      ++with;
      CHECK(writes > 0);           // both stages put their layers into decode memory
      CHECK(exposed <= writes + 0.01);
      CHECK(tail > 0);             // the first token comes after the transfer
      const double hidden = std::stod(m[8]);
      CHECK(hidden >= 0);
      CHECK(hidden <= 1);
    } else {
      ++skipped;
      CHECK(writes == 0);          // no CLAIM: nothing was allocated or written
      CHECK(m[8] == "-");
    }
  }
  CHECK(with == 3);                // the warm-up round and two timed rounds
  CHECK(skipped == 3);
  CHECK(std::regex_search(r.out, std::regex(R"(median TTFT with transfer [0-9.]+ ms, transfer skipped [0-9.]+ ms: ratio [0-9.]+x)")));
  CHECK(std::regex_search(r.out, std::regex(R"(median hidden share of the write time [0-9.]+)")));
}

TEST_CASE("k3-bench overlap --no-stream measures the stages that write after the whole prompt") {
  TinyModel model;
  const auto r = k3::test::run_command(kBin + "/k3-bench overlap --model '" + model.path() +
                                       "' --prompt 64 --stages 2 --chunk 16 --runs 1 --threads 1 --timeout-s 120 --no-stream 2>&1");
  INFO(r.out);
  REQUIRE(r.exit_code == 0);
  CHECK(r.out.find("writes after the whole prompt (--no-stream)") != std::string::npos);
  CHECK(std::regex_search(r.out, std::regex(R"(median hidden share of the write time [0-9.]+)")));
}

TEST_CASE("k3-bench overlap refuses a prompt the model has no positions for") {
  TinyModel model;
  const auto r = k3::test::run_command(kBin + "/k3-bench overlap --model '" + model.path() + "' --prompt 100000 2>&1");
  CHECK(r.exit_code != 0);
  CHECK(r.out.find("--prompt 100000") != std::string::npos);
}

TEST_CASE("k3-bench overlap --group-dcp / --group-ep: the stages write into a decode rank group, bytes and rate reported") {
  TinyModel model;
  for (const std::string group : {"--group-dcp 2", "--group-ep 2"}) {
    INFO(group);
    const auto r = k3::test::run_command(kBin + "/k3-bench overlap --model '" + model.path() +
                                         "' --prompt 64 --stages 2 --chunk 16 --runs 1 --threads 1 --timeout-s 120 " +
                                         group + " 2>&1");
    INFO(r.out);
    REQUIRE(r.exit_code == 0);
    CHECK(r.out.find(group == "--group-dcp 2" ? "decode a DCP2 group" : "decode an EP2 group") != std::string::npos);
    // round transfer TTFT compute tail writes exposed hidden MB GB/s
    const std::regex row(
        R"((warm|\d+)\s+(yes|skipped)\s+[0-9.]+\s+[0-9.]+\s+[0-9.]+\s+([0-9.]+)\s+[0-9.]+\s+\S+\s+([0-9.]+)\s+([0-9.]+))");
    int with = 0;
    for (auto it = std::sregex_iterator(r.out.begin(), r.out.end(), row); it != std::sregex_iterator(); ++it) {
      const std::smatch& m = *it;
      if (m[2] != "yes") {
        CHECK(std::stod(m[4]) == 0);   // nothing written without a CLAIM
        continue;
      }
      ++with;
      CHECK(std::stod(m[3]) > 0);
      CHECK(std::stod(m[4]) > 0);      // the stages' bytes reached the group's regions
      CHECK(std::stod(m[5]) > 0);
    }
    CHECK(with == 2);
    CHECK(std::regex_search(r.out, std::regex(R"(median write rate [0-9.]+ GB/s)")));
  }
  // A group is DCP or EP, not both.
  const auto both = k3::test::run_command(kBin + "/k3-bench overlap --model '" + model.path() +
                                          "' --group-dcp 2 --group-ep 2 2>&1");
  CHECK(both.exit_code != 0);
  CHECK(both.out.find("--group-dcp and --group-ep are exclusive") != std::string::npos);
}
