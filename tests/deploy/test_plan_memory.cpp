// k3-plan memory: the K3 figures the production notes quote (docs/DEPLOY.md "Sizing memory") come out of
// the planner's arithmetic and out of the CLI's --json, and bad topologies are refused by name.
#include <catch2/catch.hpp>
#include <nlohmann/json.hpp>

#include "deploy/memory_plan.h"
#include "tests/support/run_command.h"

using namespace k3;
using k3::test::run_command;

namespace {

nlohmann::json plan_json(const std::string& flags) {
  auto r = run_command(std::string(K3_BIN_DIR) + "/k3-plan memory " + flags + " --json");
  REQUIRE(r.exit_code == 0);
  return nlohmann::json::parse(r.out);
}

uint64_t kda_state_at(const nlohmann::json& j, int tp) {
  for (const auto& k : j.at("kda_per_request"))
    if (k.at("tp") == tp) return k.at("state_bytes_per_request").get<uint64_t>();
  FAIL("no KDA state entry at TP" << tp);
  return 0;
}

}  // namespace

TEST_CASE("k3-plan memory --preset k3 --json prints the K3 cache figures", "[deploy][plan]") {
  const auto j = plan_json("--preset k3");
  CHECK(j.at("model").at("kda_layers") == 69);
  CHECK(j.at("model").at("mla_layers") == 24);
  // MLA latent KV: 24 layers x 576 values x 2 B (fp8: 1 B).
  CHECK(j.at("mla_kv_bytes_per_token").at("bf16") == 27648);
  CHECK(j.at("mla_kv_bytes_per_token").at("fp8") == 13824);
  // KDA state: 69 layers x (96 / TP) heads x 128 x 128 x 4 B: ~54 MB at TP8, ~434 MB at TP1.
  CHECK(kda_state_at(j, 8) == 54263808);
  CHECK(kda_state_at(j, 1) == 434110464);
  CHECK(kda_state_at(j, 8) / 1000000 == 54);
  CHECK(kda_state_at(j, 1) / 1000000 == 434);
  // Drafter: 5 layers x 2 x 16 heads x 64 x 1 B; ceil((2048 + 2*6 + 64) / 64) = 34 pages per request.
  const auto& d = j.at("draft");
  CHECK(d.at("kv_bytes_per_token") == 10240);
  CHECK(d.at("pages_per_request") == 34);
  // DP16 script: 24 requests per rank, multiplier 3 -> 156,864 slots, ~1.50 GiB.
  CHECK(d.at("pool_slots_per_rank") == 156864);
  CHECK(d.at("pool_bytes_per_rank").get<double>() / (1024.0 * 1024 * 1024) == Approx(1.50).margin(0.005));
}

TEST_CASE("k3-plan memory reproduces the DP2 draft pool and the fp8 choice", "[deploy][plan]") {
  // DP2 script: 32 requests per rank, multiplier 4 -> 278,784 slots, ~2.66 GiB.
  const auto j = plan_json("--preset k3 --decode-dp 2 --draft-requests 32 --draft-multiplier 4 --kv-dtype fp8");
  CHECK(j.at("draft").at("pool_slots_per_rank") == 278784);
  CHECK(j.at("draft").at("pool_bytes_per_rank").get<double>() / (1024.0 * 1024 * 1024) == Approx(2.66).margin(0.005));
  CHECK(j.at("decode_rank").at("kv_bytes_per_token") == 13824);
  CHECK(j.at("mla_kv_bytes_per_token").at("used") == "fp8");
}

TEST_CASE("plan_memory: capacity follows from weights, KV per token and state per request", "[deploy][plan]") {
  deploy::MemoryPlanInput in;
  auto cfg = preset_config("k3");
  REQUIRE(cfg.is_ok());
  in.cfg = *cfg;
  in.model_name = "k3";
  in.decode_tp = 8;
  in.decode_dcp = 8;
  in.decode_ep = 16;
  in.decode_dp = 16;
  in.gpu_memory_bytes = 141ull * 1000 * 1000 * 1000;
  in.context_tokens = 131072;
  in.draft.layers = 5;
  auto p = deploy::plan_memory(in);
  REQUIRE(p.is_ok());
  const auto& r = p->decode;
  // Each DCP8 rank keeps one token row in eight: 27,648 / 8 = 3,456 B per token.
  CHECK(r.kv_bytes_per_token == 3456);
  CHECK(r.fixed_cache_bytes == p->draft_pool_bytes_per_rank);
  REQUIRE(r.free_bytes > 0);
  CHECK(r.free_bytes == int64_t(141e9 * 0.9) - int64_t(r.weight_bytes + r.fixed_cache_bytes));
  CHECK(r.kv_tokens == r.free_bytes / 3456);
  CHECK(p->decode_logical_kv_tokens == r.kv_tokens * 8);
  const uint64_t per_request = r.state_bytes_per_request + 131072ull * 3456;
  CHECK(r.max_requests == r.free_bytes / int64_t(per_request));
  // The whole model's weights are split: experts over EP16, dense tensors over TP8.
  CHECK(r.weight_bytes < p->total_weight_bytes / 8);

  // k3serve's DCP group without TP: each DCP8 rank runs 1/8 of the heads, so it keeps 1/8 of the KDA
  // state and of the per-head attention weights, as with TP8 (and the other dense tensors whole).
  deploy::MemoryPlanInput dcp_only = in;
  dcp_only.decode_tp = 1;
  auto d = deploy::plan_memory(dcp_only);
  REQUIRE(d.is_ok());
  CHECK(d->decode.state_bytes_per_request == r.state_bytes_per_request);
  CHECK(d->decode.state_bytes_per_request * 8 == p->kda_by_tp.front().state_bytes + p->kda_by_tp.front().conv_bytes);
  CHECK(d->decode.kv_bytes_per_token == 3456);
  deploy::MemoryPlanInput whole = dcp_only;
  whole.decode_dcp = 1;
  auto w = deploy::plan_memory(whole);
  REQUIRE(w.is_ok());
  CHECK(d->decode.weight_bytes < w->decode.weight_bytes);  // the per-head attention weights cut by 8
  CHECK(d->decode.weight_bytes > r.weight_bytes);          // the other dense tensors whole, not cut by TP
  CHECK(w->decode.state_bytes_per_request == 8 * d->decode.state_bytes_per_request);

  // PP stages cover every layer once; the first has the embedding, the last the head.
  in.prefill_stages = 4;
  auto pp = deploy::plan_memory(in);
  REQUIRE(pp.is_ok());
  REQUIRE(pp->prefill.size() == 4);
  for (const auto& s : pp->prefill) CHECK(s.rank.fixed_cache_bytes == uint64_t(1) << 30);   // the source arena
  CHECK(pp->prefill.front().layer_begin == 0);
  CHECK(pp->prefill.back().layer_end == 93);
  int kda = 0, mla = 0;
  for (const auto& s : pp->prefill) kda += s.kda_layers, mla += s.mla_layers;
  CHECK(kda == 69);
  CHECK(mla == 24);
}

TEST_CASE("k3-plan memory refuses bad topologies by name", "[deploy][plan]") {
  const std::string bin = std::string(K3_BIN_DIR) + "/k3-plan memory ";
  CHECK(run_command(bin + "--preset k3 --decode-tp 5 2>&1").out.find("decode_tp = 5 must divide") != std::string::npos);
  CHECK(run_command(bin + "--preset k3 --decode-dcp 5 2>&1").out.find("decode_dcp = 5 must divide") != std::string::npos);
  CHECK(run_command(bin + "--preset k3 --decode-ep 6 2>&1").out.find("decode_ep = 6 must divide num_experts") !=
        std::string::npos);
  CHECK(run_command(bin + "--preset nope 2>&1").out.find("unknown preset 'nope'") != std::string::npos);
  CHECK(run_command(bin + "--preset k3 --prefill-stages 2 --partition 50,50 2>&1").exit_code == 2);
  CHECK(run_command(bin + "--preset k3 --gpu-memory 12XB 2>&1").out.find("--gpu-memory") != std::string::npos);
}
