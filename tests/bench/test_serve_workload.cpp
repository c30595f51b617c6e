// The prompt sets of `k3-bench serve --workload`: shared-prefix chats resend the system prompt and their
// earlier turns; unique has the same lengths and nothing in common; bad options are named.
#include <catch2/catch.hpp>

#include <set>

#include "bench/serve_workload.h"

using namespace k3::bench;

TEST_CASE("shared-prefix prompts are the system prompt plus each chat's growing history") {
  WorkloadOptions o{.kind = "shared-prefix", .requests = 10, .input_min = 5, .input_max = 9, .system_len = 64, .turns = 3,
                    .token_id_max = 1000, .seed = 3};
  auto p = make_workload(o);
  REQUIRE(p.size() == 10);
  const int chats = 4;   // ceil(10 / 3)
  for (const auto& q : p) REQUIRE(std::equal(p[0].begin(), p[0].begin() + 64, q.begin()));
  // Turn 2 of chat c extends its turn 1.
  for (int c = 0; c < chats; ++c) {
    const auto& t1 = p[c];
    const auto& t2 = p[chats + c];
    REQUIRE(t2.size() > t1.size());
    REQUIRE(std::equal(t1.begin(), t1.end(), t2.begin()));
  }
}

TEST_CASE("unique prompts have the shared-prefix lengths and share no leading block") {
  WorkloadOptions o{.kind = "shared-prefix", .requests = 8, .input_min = 5, .input_max = 9, .system_len = 64, .turns = 2,
                    .token_id_max = 1 << 20, .seed = 4};
  auto shared = make_workload(o);
  o.kind = "unique";
  auto unique = make_workload(o);
  REQUIRE(unique.size() == shared.size());
  std::set<std::vector<int32_t>> heads;
  for (size_t i = 0; i < unique.size(); ++i) {
    REQUIRE(unique[i].size() == shared[i].size());
    heads.insert(std::vector<int32_t>(unique[i].begin(), unique[i].begin() + 16));
  }
  REQUIRE(heads.size() == unique.size());
}

TEST_CASE("bad workload options are named") {
  REQUIRE_THROWS_WITH(make_workload({.kind = "chat"}), Catch::Contains("--workload 'chat'"));
  REQUIRE_THROWS_WITH(make_workload({.kind = "unique", .turns = 0}), Catch::Contains("--turns"));
}
