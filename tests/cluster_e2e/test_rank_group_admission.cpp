// Admission onto a decode rank group by every rank's own room, against real processes (k3-router in
// cluster mode, one k3-prefill stage, an EP2 group of two k3-decode processes with 16 cache pages of 16
// tokens each). The group reports the sum of its ranks' caches to the router, and its leader places each
// request on a rank whose own pages hold the prompt plus max_tokens:
//  - a request no rank can ever hold is refused, naming the ranks and their pages;
//  - of three requests sent together, two take a rank each and the third, which fits the group's total
//    but neither rank's own pages, waits on the rank the prefill stage wrote it to (the leader says WAITING
//    and names that rank's room), then runs once that rank has room; all three give k3-generate's tokens.
//    (By request count alone the third would join a rank whose pages its running request still needs.)
#include <catch2/catch.hpp>

#include <future>
#include <regex>
#include <string>

#include "tests/cluster_e2e/paired_nodes.h"
#include "tests/cluster_e2e/stream_load.h"
#include "tests/support/generate_reference.h"
#include "tests/support/run_command.h"
#include "tests/support/scratch_dir.h"
#include "tests/transfer/process_guard.h"

using namespace std::chrono_literals;
using k3::test::ProcessGuard;
using k3::test::StreamOutcome;

namespace {

const std::string kBin = K3_BIN_DIR;

// The first line of `p` matching `re` (lines before it are kept in `seen`).
std::smatch wait_match(ProcessGuard& p, const std::regex& re, std::vector<std::string>& seen,
                       std::chrono::seconds within = 120s) {
  const auto until = std::chrono::steady_clock::now() + within;
  for (;;) {
    REQUIRE(std::chrono::steady_clock::now() < until);
    auto line = p.read_line(200ms);
    if (!line) {
      REQUIRE(p.running());
      continue;
    }
    seen.push_back(*line);
    std::smatch m;
    if (std::regex_match(seen.back(), m, re)) return m;
  }
}

std::vector<int32_t> prompt_of(int len, int salt) {
  std::vector<int32_t> p(len);
  for (int i = 0; i < len; ++i) p[i] = 10 + (i * 13 + salt * 7) % 490;
  return p;
}

}  // namespace

TEST_CASE("decode rank group: admission checks every rank's own pages; a request waits or is refused by name",
          "[cluster_e2e][ranks][admission]") {
  k3::testing::ScratchDir dir("group-admission");
  const std::string model = dir.file("model");
  REQUIRE(k3::test::run_command(kBin + "/k3-genweights --preset k3-tiny --seed 0 --out '" + model + "'").exit_code == 0);
  k3::test::PairedNodes nodes(model, {"--heartbeat-ms", "200", "--heartbeat-misses", "10"});
  // --generation-reserve 0: the router counts prompts only, so it places all three requests at once.
  nodes.start_router({"--generation-reserve", "0", "--max-attempts", "1"});
  const std::vector<std::string> rank_flags = {"--cache-pages", "16", "--group-ep", "2", "--group-step-deadline-ms",
                                               "10000"};
  ProcessGuard& leader = nodes.start_decode(rank_flags);
  std::vector<std::string> lines;
  const std::string group_ep = wait_match(leader, std::regex("GROUP (.*)"), lines)[1];
  std::vector<std::string> member_args = {"--model", model, "--instance", "d", "--group-rank", "1",
                                          "--group-endpoint", group_ep, "--threads", "1"};
  member_args.insert(member_args.end(), rank_flags.begin(), rank_flags.end());
  nodes.start("k3-decode", member_args, "decode/d");
  nodes.start_prefill(wait_match(leader, std::regex("READY (.*)"), lines)[1]);
  nodes.wait_healthy();
  const int port = nodes.port();
  // The group's room is the sum of its ranks' (EP): 2 x 16 pages.
  CHECK(k3::test::metric_or(k3::test::read_metrics(port), "k3_cluster_node_cache_free_pages{node=\"decode/d\"}") == 32);

  // 200 + 100 tokens need 19 pages on one rank; each has 16 (the router sees 32 for the group).
  StreamOutcome never = k3::test::stream_completion(port, prompt_of(200, 9), 100, 120s);
  INFO(k3::test::outcome_name(never.kind) << " " << never.status << " " << never.error);
  CHECK(never.kind != StreamOutcome::Kind::Done);
  CHECK_THAT(never.error, Catch::Contains("no rank of the group can ever hold 200 + 100 tokens") &&
                             Catch::Contains("rank 0 has 16 of 16 cache pages free") &&
                             Catch::Contains("rank 1 has 16 of 16 cache pages free") && Catch::Contains("needs 19"));

  // A and B: 64 + 160 tokens, 14 pages on a rank; C: 32 + 64 tokens, 6 pages. Sent together: whichever two
  // are written first take a rank each (A and B one each, or C one and A or B the other), and the third,
  // written to the rank holding the fewest, fits neither rank's own pages (14 + 14 and 14 + 6 exceed 16)
  // though the group has room in total: it waits until its rank's request ended.
  const std::vector<std::vector<int32_t>> prompts = {prompt_of(64, 1), prompt_of(64, 2), prompt_of(32, 3)};
  const std::vector<int> max_tokens = {160, 160, 64};
  std::vector<std::future<StreamOutcome>> streams;
  for (size_t i = 0; i < prompts.size(); ++i)
    streams.push_back(std::async(std::launch::async, [&, i] {
      return k3::test::stream_completion(port, prompts[i], max_tokens[i], 180s);
    }));
  const std::smatch waits = wait_match(leader, std::regex("WAITING ([0-9]+) (.*)"), lines);
  const std::string waiting = waits[1];
  CHECK_THAT(waits[2].str(), (Catch::Contains("rank 0 has") || Catch::Contains("rank 1 has")) &&
                                 Catch::Contains("promised to its requests") && Catch::Contains("needs"));
  // It starts only after a request ended on the leader (DONE), on the rank that freed.
  std::vector<std::string> after;
  const std::string rank = waits[2].str().substr(waits[2].str().find("rank ") + 5, 1);
  wait_match(leader, std::regex("JOINED " + waiting + " " + rank), after);
  bool done_before = false;
  for (const auto& l : after) done_before = done_before || l.rfind("DONE ", 0) == 0;
  CHECK(done_before);
  for (size_t i = 0; i < streams.size(); ++i) {
    const StreamOutcome o = streams[i].get();
    INFO("request " << i << ": " << k3::test::outcome_name(o.kind) << " " << o.error);
    CHECK(o.kind == StreamOutcome::Kind::Done);
    CHECK(o.ids == k3::test::k3_generate_tokens(model, prompts[i], max_tokens[i]));
  }
  CHECK(k3::test::metric_sum(k3::test::read_metrics(port), "k3_cluster_request_failures_total") <= 1);  // the refused one
}
