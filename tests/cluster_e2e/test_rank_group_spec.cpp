// The spec fields of a decode rank group (dp / dcp / ep / kv_partitions / step_deadline_ms / collectives /
// gpu): the decode
// DP ranks they give (global ranks advance by the group size), refusals that name the field, and the
// router's --pair with a DCP group (the ranks a CLAIM names).
#include <catch2/catch.hpp>

#include <nlohmann/json.hpp>

#include "deploy/cluster_spec.h"
#include "router/cluster_placement.h"
#include "tests/support/run_command.h"

using nlohmann::json;
using namespace k3;

namespace {

json with_decode(const json& d) {
  return {{"model", "m"}, {"prefill", json::array({{{"stages", 2}}})}, {"decode", json::array({d})}};
}

std::string error_of(const json& j) {
  auto s = deploy::parse_cluster_spec(j);
  return s.is_ok() ? std::string() : s.status().message();
}

}  // namespace

TEST_CASE("cluster spec: decode rank groups", "[cluster_e2e][ranks]") {
  auto s = deploy::parse_cluster_spec(with_decode({{"id", "d"}, {"dp", 2}, {"dcp", 8}, {"kv_partitions", 16}}));
  REQUIRE(s.is_ok());
  auto procs = deploy::decode_processes(*s);
  REQUIRE(procs.size() == 2);
  CHECK(procs[0].instance == "d-0");
  CHECK(procs[1].instance == "d-1");
  CHECK(procs[0].rank == 0);
  CHECK(procs[1].rank == 8);  // d-0 holds global ranks 0..7
  CHECK(procs[1].group_size() == 8);
  CHECK(procs[1].kv_partitions == 16);
  CHECK(procs[1].step_deadline_ms == 2000);

  auto e = deploy::parse_cluster_spec(with_decode({{"id", "e"}, {"ranks", 2}, {"ep", 4}, {"step_deadline_ms", 3000}}));
  REQUIRE(e.is_ok());
  procs = deploy::decode_processes(*e);
  CHECK(procs[1].rank == 4);
  CHECK(procs[1].ep == 4);
  CHECK(procs[1].dcp == 1);
  CHECK(procs[1].step_deadline_ms == 3000);

  CHECK(procs[1].collectives == "ucx");  // the default: host memory, ranks may share a GPU
  CHECK(procs[1].gpu == 0);

  // GPU rank groups: NCCL between one GPU per rank, each DP rank's group from its own first device.
  json g = with_decode({{"id", "g"}, {"dp", 2}, {"dcp", 4}, {"collectives", "nccl"}, {"gpu", 2}});
  g["backend"] = "cuda";
  auto gs = deploy::parse_cluster_spec(g);
  REQUIRE(gs.is_ok());
  procs = deploy::decode_processes(*gs);
  CHECK(procs[0].collectives == "nccl");
  CHECK(procs[1].gpu == 2);
  CHECK(procs[1].device_of(3) == 5);  // NCCL: one GPU per rank
  CHECK(deploy::decode_processes(*s)[1].device_of(3) == 0);  // UCX: the ranks share the group's GPU

  // A plain decode rank is one process, as before.
  auto plain = deploy::parse_cluster_spec(with_decode({{"ranks", 2}}));
  REQUIRE(plain.is_ok());
  CHECK(deploy::decode_processes(*plain)[1].rank == 1);
  CHECK(deploy::decode_processes(*plain)[1].group_size() == 1);
}

TEST_CASE("cluster spec: bad decode group fields are refused by name", "[cluster_e2e][ranks]") {
  CHECK_THAT(error_of(with_decode({{"dp", 2}, {"ranks", 2}})), Catch::Contains("decode[0].dp"));
  CHECK_THAT(error_of(with_decode({{"dcp", 2}, {"ep", 2}})), Catch::Contains("decode[0].ep"));
  CHECK_THAT(error_of(with_decode({{"dcp", 0}})), Catch::Contains("decode[0].dcp"));
  CHECK_THAT(error_of(with_decode({{"dcp", 4}, {"kv_partitions", 6}})), Catch::Contains("decode[0].kv_partitions"));
  CHECK_THAT(error_of(with_decode({{"ep", 4}, {"step_deadline_ms", 1}})), Catch::Contains("decode[0].step_deadline_ms"));
  CHECK_THAT(error_of(with_decode({{"dcp", "8"}})), Catch::Contains("decode[0].dcp"));
  CHECK_THAT(error_of(with_decode({{"tp", 2}})), Catch::Contains("decode[0].tp"));
  CHECK_THAT(error_of(with_decode({{"dcp", 2}, {"collectives", "mpi"}})), Catch::Contains("decode[0].collectives"));
  CHECK_THAT(error_of(with_decode({{"dcp", 2}, {"collectives", "nccl"}})), Catch::Contains("needs \"backend\": \"cuda\""));
  json one = with_decode({{"collectives", "nccl"}});
  one["backend"] = "cuda";
  CHECK_THAT(error_of(one), Catch::Contains("is for rank groups"));
  CHECK_THAT(error_of(with_decode({{"dcp", 2}, {"gpu", 1}})), Catch::Contains("decode[0].gpu"));
  json neg = with_decode({{"dcp", 2}, {"gpu", -1}});
  neg["backend"] = "cuda";
  CHECK_THAT(error_of(neg), Catch::Contains("decode[0].gpu"));
}

TEST_CASE("router --pair: a DCP group's ranks", "[cluster_e2e][ranks]") {
  auto p = router::parse_cluster_pair("p0:2:d-1:8:8");
  REQUIRE(p.is_ok());
  CHECK(p->decode_rank == 8);
  CHECK(p->dcp == 8);
  CHECK(router::decode_group_ranks(*p) == std::vector<uint32_t>{8, 9, 10, 11, 12, 13, 14, 15});
  auto plain = router::parse_cluster_pair("p:2:d:3");
  REQUIRE(plain.is_ok());
  CHECK(router::decode_group_ranks(*plain) == std::vector<uint32_t>{3});
  CHECK_THAT(router::parse_cluster_pair("p:2:d:0:0").status().message(), Catch::Contains("DCP"));
  CHECK_THAT(router::parse_cluster_pair("p:2:d:0:x").status().message(), Catch::Contains("DCP"));
  CHECK_THAT(router::parse_cluster_pair("p:2:d:0:8:1").status().message(), Catch::Contains("4 or 5 parts"));
}

TEST_CASE("k3-decode: a group's collectives that cannot run are refused by name", "[cluster_e2e][ranks]") {
  k3::test::TempDir dir("group-collectives");
  const std::string bin = K3_BIN_DIR, model = dir.path() + "/model";
  REQUIRE(k3::test::run_command(bin + "/k3-genweights --preset k3-tiny --quiet --out '" + model + "'").exit_code == 0);
  auto refused = [&](const std::string& flags) {
    const auto r = k3::test::run_command(bin + "/k3-decode --model '" + model + "' --threads 1 --insecure-control-plane " + flags + " 2>&1");
    INFO(flags << " -> " << r.out);
    CHECK(r.exit_code != 0);
    return r.out;
  };
  CHECK_THAT(refused("--group-dcp 2 --group-collectives mpi"), Catch::Contains("--group-collectives: 'mpi' is not ucx or nccl"));
  CHECK_THAT(refused("--group-dcp 2 --group-collectives nccl"), Catch::Contains("--group-collectives nccl needs --backend cuda"));
}
