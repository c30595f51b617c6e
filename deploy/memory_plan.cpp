#include "deploy/memory_plan.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <sstream>

#include "common/config/cache_layout.h"
#include "common/model/weights.h"
#include "prefill_node/partition.h"

namespace k3::deploy {
namespace {

// Bytes of the weights of layers [begin, end) (+ embedding / head when the range touches the ends):
// dense tensors at weight_bytes per element over tp, except the per-head attention weights, over
// `heads` (the ranks sharing the heads), and routed experts at expert_bits over ep.
uint64_t weight_bytes(const MemoryPlanInput& in, int begin, int end, int tp, int heads, int ep) {
  double dense = 0, per_head = 0, experts = 0;
  for (const TensorSpec& t : expected_tensors(in.cfg, begin, end)) {
    double n = 1;
    for (auto d : t.shape) n *= static_cast<double>(d);
    if (t.name.find(".experts.") != std::string::npos) experts += n;
    else (is_per_head_weight(in.cfg, t.name) ? per_head : dense) += n * (t.f32_only ? 4 : in.weight_bytes);
  }
  return static_cast<uint64_t>(std::ceil(dense / tp + per_head / heads + experts * in.expert_bits / 8.0 / ep));
}

Status check_degree(int value, const char* field) {
  if (value < 1) return invalid_argument(std::string(field) + " must be >= 1, got " + std::to_string(value));
  return Status::ok();
}

// KDA and MLA layer counts of [begin, end).
void count_layers(const ModelConfig& cfg, int begin, int end, int& kda, int& mla) {
  kda = mla = 0;
  for (int l = begin; l < end; ++l) (cfg.layer_kind(l) == LayerKind::Kda ? kda : mla) += 1;
}

// Fills free bytes, KV tokens and concurrent requests of one rank.
void fill_capacity(const MemoryPlanInput& in, RankCapacity& r) {
  if (in.gpu_memory_bytes == 0) return;
  r.free_bytes = static_cast<int64_t>(static_cast<double>(in.gpu_memory_bytes) * in.utilization) -
                 static_cast<int64_t>(r.weight_bytes + r.fixed_cache_bytes);
  if (r.free_bytes <= 0) return;
  if (r.kv_bytes_per_token > 0) r.kv_tokens = r.free_bytes / static_cast<int64_t>(r.kv_bytes_per_token);
  const uint64_t per_request = r.state_bytes_per_request + uint64_t(in.context_tokens) * r.kv_bytes_per_token;
  if (per_request > 0) r.max_requests = r.free_bytes / static_cast<int64_t>(per_request);
}

std::string bytes_str(double b) {
  char buf[64];
  if (b >= 1024.0 * 1024 * 1024) std::snprintf(buf, sizeof buf, "%.2f GiB", b / (1024.0 * 1024 * 1024));
  else if (b >= 1024.0 * 1024) std::snprintf(buf, sizeof buf, "%.2f MiB", b / (1024.0 * 1024));
  else std::snprintf(buf, sizeof buf, "%.0f B", b);
  return buf;
}

nlohmann::json capacity_json(const RankCapacity& r) {
  return {{"weight_bytes", r.weight_bytes},         {"fixed_cache_bytes", r.fixed_cache_bytes},
          {"free_bytes", r.free_bytes},             {"kv_bytes_per_token", r.kv_bytes_per_token},
          {"state_bytes_per_request", r.state_bytes_per_request},
          {"kv_tokens", r.kv_tokens},               {"max_requests", r.max_requests}};
}

}  // namespace

Result<MemoryPlan> plan_memory(const MemoryPlanInput& in) {
  K3_TRY(validate(in.cfg));
  K3_TRY(check_degree(in.prefill_stages, "prefill_stages"));
  K3_TRY(check_degree(in.prefill_tp, "prefill_tp"));
  K3_TRY(check_degree(in.decode_tp, "decode_tp"));
  K3_TRY(check_degree(in.decode_dcp, "decode_dcp"));
  K3_TRY(check_degree(in.decode_ep, "decode_ep"));
  K3_TRY(check_degree(in.decode_dp, "decode_dp"));
  const int heads = in.cfg.kda.num_heads;
  for (auto [tp, field] : {std::pair{in.prefill_tp, "prefill_tp"}, std::pair{in.decode_tp, "decode_tp"},
                           std::pair{in.decode_dcp, "decode_dcp"}})
    if (heads % tp != 0 || in.cfg.num_attention_heads % tp != 0)
      return invalid_argument(std::string(field) + " = " + std::to_string(tp) + " must divide the KDA heads (" +
                              std::to_string(heads) + ") and the MLA heads (" +
                              std::to_string(in.cfg.num_attention_heads) + ")");
  if (in.decode_ep > in.cfg.num_experts || in.cfg.num_experts % in.decode_ep != 0)
    return invalid_argument("decode_ep = " + std::to_string(in.decode_ep) + " must divide num_experts (" +
                            std::to_string(in.cfg.num_experts) + ")");
  if (in.weight_bytes < 1) return invalid_argument("weight_bytes must be >= 1");
  if (!(in.expert_bits > 0)) return invalid_argument("expert_bits must be > 0");
  if (!(in.utilization > 0 && in.utilization <= 1)) return invalid_argument("utilization must be in (0, 1]");
  if (in.context_tokens < 1) return invalid_argument("context_tokens must be >= 1");
  const DraftCacheSpec& dr = in.draft;
  if (dr.layers < 0) return invalid_argument("draft.layers must be >= 0");
  if (dr.layers > 0 && (dr.kv_heads < 1 || dr.head_dim < 1 || dr.kv_bytes < 1 || dr.window < 1 ||
                        dr.verify_width < 1 || dr.page < 1 || dr.requests_per_rank < 1 || dr.multiplier < 1))
    return invalid_argument("draft: kv_heads, head_dim, kv_bytes, window, verify_width, page, requests_per_rank "
                            "and multiplier must all be >= 1");

  MemoryPlan p;
  p.in = in;
  const int L = in.cfg.num_hidden_layers;
  count_layers(in.cfg, 0, L, p.kda_layers, p.mla_layers);

  // Row and state sizes from the cache layout (U8 stands for a one-byte fp8 element).
  K3_ASSIGN_OR_RETURN(CacheLayout bf16, CacheLayout::from_config(in.cfg, CacheDtypes{}));
  K3_ASSIGN_OR_RETURN(CacheLayout fp8, CacheLayout::from_config(in.cfg, CacheDtypes{.kv = DType::U8}));
  p.mla_kv_bytes_per_token_bf16 = p.mla_layers * bf16.mla_row_bytes;
  p.mla_kv_bytes_per_token_fp8 = p.mla_layers * fp8.mla_row_bytes;
  const uint64_t kv_per_token = in.kv_fp8 ? p.mla_kv_bytes_per_token_fp8 : p.mla_kv_bytes_per_token_bf16;
  for (int tp = 1; tp <= heads; tp *= 2)
    if (heads % tp == 0)
      p.kda_by_tp.push_back({tp, p.kda_layers * bf16.kda_state_bytes() / tp, p.kda_layers * bf16.kda_conv_bytes() / tp});
  auto kda_at = [&](int layers, int tp) {
    return uint64_t(layers) * (bf16.kda_state_bytes() + bf16.kda_conv_bytes()) / tp;
  };

  // The drafter's sliding-window pool: pages per request = ceil((window + 2 * verify + page) / page); a pool
  // copy holds requests x pages plus one reserved page, and there are `multiplier` copies.
  if (dr.layers > 0) {
    p.draft_kv_bytes_per_token = uint64_t(dr.layers) * 2 * dr.kv_heads * dr.head_dim * dr.kv_bytes;
    p.draft_pages_per_request = (uint64_t(dr.window) + 2 * dr.verify_width + dr.page + dr.page - 1) / dr.page;
    p.draft_bytes_per_request = p.draft_pages_per_request * dr.page * p.draft_kv_bytes_per_token;
    p.draft_pool_slots_per_rank =
        uint64_t(dr.multiplier) * (uint64_t(dr.requests_per_rank) * p.draft_pages_per_request + 1) * dr.page;
    p.draft_pool_bytes_per_rank = p.draft_pool_slots_per_rank * p.draft_kv_bytes_per_token;
  }

  p.total_weight_bytes = weight_bytes(in, 0, L, 1, 1, 1);

  // Prefill stages.
  K3_ASSIGN_OR_RETURN(std::vector<int> partition, prefill::parse_partition(in.partition, in.prefill_stages, L));
  for (int s = 0; s < in.prefill_stages; ++s) {
    PrefillStagePlan st;
    st.stage = s;
    st.layer_begin = prefill::stage_begin(partition, s);
    st.layer_end = st.layer_begin + partition[s];
    count_layers(in.cfg, st.layer_begin, st.layer_end, st.kda_layers, st.mla_layers);
    st.rank.weight_bytes = weight_bytes(in, st.layer_begin, st.layer_end, in.prefill_tp, in.prefill_tp, 1);
    st.rank.kv_bytes_per_token = st.mla_layers * (in.kv_fp8 ? fp8 : bf16).mla_row_bytes;
    st.rank.state_bytes_per_request = kda_at(st.kda_layers, in.prefill_tp);
    st.rank.fixed_cache_bytes = in.prefill_source_arena_bytes;
    fill_capacity(in, st.rank);
    p.fits = p.fits && (in.gpu_memory_bytes == 0 || st.rank.free_bytes > 0);
    p.prefill.push_back(st);
  }

  // A decode rank: the whole model, its share of the KV rows (1/dcp), its heads' states and per-head
  // weights (1/max(tp, dcp)): a DCP rank runs 1/dcp of the heads, and TP with DCP are the same GPUs.
  const int head_share = std::max(in.decode_tp, in.decode_dcp);
  p.decode.weight_bytes = weight_bytes(in, 0, L, in.decode_tp, head_share, in.decode_ep);
  p.decode.fixed_cache_bytes = p.draft_pool_bytes_per_rank;
  p.decode.kv_bytes_per_token = (kv_per_token + in.decode_dcp - 1) / in.decode_dcp;
  p.decode.state_bytes_per_request = kda_at(p.kda_layers, head_share);
  fill_capacity(in, p.decode);
  p.decode_logical_kv_tokens = p.decode.kv_tokens * in.decode_dcp;
  p.fits = p.fits && (in.gpu_memory_bytes == 0 || p.decode.free_bytes > 0);
  return p;
}

nlohmann::json memory_plan_json(const MemoryPlan& p) {
  const MemoryPlanInput& in = p.in;
  nlohmann::json kda = nlohmann::json::array();
  for (const auto& k : p.kda_by_tp)
    kda.push_back({{"tp", k.tp}, {"state_bytes_per_request", k.state_bytes}, {"conv_bytes_per_request", k.conv_bytes}});
  nlohmann::json stages = nlohmann::json::array();
  for (const auto& s : p.prefill) {
    nlohmann::json j = capacity_json(s.rank);
    j["stage"] = s.stage;
    j["layers"] = {s.layer_begin, s.layer_end};
    j["kda_layers"] = s.kda_layers;
    j["mla_layers"] = s.mla_layers;
    stages.push_back(j);
  }
  nlohmann::json decode = capacity_json(p.decode);
  decode["logical_kv_tokens"] = p.decode_logical_kv_tokens;
  return {
      {"model", {{"name", in.model_name}, {"layers", in.cfg.num_hidden_layers}, {"kda_layers", p.kda_layers},
                 {"mla_layers", p.mla_layers}, {"total_weight_bytes", p.total_weight_bytes}}},
      {"topology", {{"prefill_stages", in.prefill_stages}, {"prefill_tp", in.prefill_tp}, {"decode_tp", in.decode_tp},
                    {"decode_dcp", in.decode_dcp}, {"decode_ep", in.decode_ep}, {"decode_dp", in.decode_dp}}},
      {"gpu", {{"memory_bytes", in.gpu_memory_bytes}, {"utilization", in.utilization}}},
      {"context_tokens", in.context_tokens},
      {"mla_kv_bytes_per_token", {{"bf16", p.mla_kv_bytes_per_token_bf16}, {"fp8", p.mla_kv_bytes_per_token_fp8},
                                  {"used", in.kv_fp8 ? "fp8" : "bf16"}}},
      {"kda_per_request", kda},
      {"draft", {{"layers", in.draft.layers}, {"kv_bytes_per_token", p.draft_kv_bytes_per_token},
                 {"pages_per_request", p.draft_pages_per_request}, {"bytes_per_request", p.draft_bytes_per_request},
                 {"pool_slots_per_rank", p.draft_pool_slots_per_rank},
                 {"pool_bytes_per_rank", p.draft_pool_bytes_per_rank},
                 {"pool_slots_total", p.draft_pool_slots_per_rank * in.decode_dp}}},
      {"prefill_stages", stages},
      {"decode_rank", decode},
      {"fits", p.fits}};
}

std::string memory_plan_text(const MemoryPlan& p) {
  const MemoryPlanInput& in = p.in;
  std::ostringstream o;
  o << "model " << in.model_name << ": " << in.cfg.num_hidden_layers << " layers (" << p.kda_layers << " KDA, "
    << p.mla_layers << " MLA), weights " << bytes_str(double(p.total_weight_bytes)) << "\n";
  o << "MLA KV per token: " << p.mla_kv_bytes_per_token_bf16 << " B bf16, " << p.mla_kv_bytes_per_token_fp8
    << " B fp8 (using " << (in.kv_fp8 ? "fp8" : "bf16") << ")\n";
  for (const auto& k : p.kda_by_tp)
    o << "KDA per request at TP" << k.tp << ": state " << k.state_bytes << " B (" << bytes_str(double(k.state_bytes))
      << "), conv " << k.conv_bytes << " B\n";
  if (in.draft.layers > 0)
    o << "draft KV per token: " << p.draft_kv_bytes_per_token << " B; " << p.draft_pages_per_request
      << " pages of " << in.draft.page << " per request (" << bytes_str(double(p.draft_bytes_per_request))
      << "); pool per rank " << p.draft_pool_slots_per_rank << " slots (" << bytes_str(double(p.draft_pool_bytes_per_rank))
      << "), " << p.draft_pool_slots_per_rank * in.decode_dp << " slots over DP" << in.decode_dp << "\n";
  auto rank_line = [&](const RankCapacity& r) {
    o << "weights " << bytes_str(double(r.weight_bytes));
    if (in.gpu_memory_bytes > 0) {
      if (r.free_bytes <= 0) o << ", DOES NOT FIT (" << bytes_str(double(-r.free_bytes)) << " over)";
      else
        o << ", free " << bytes_str(double(r.free_bytes)) << ", " << r.kv_tokens << " KV tokens, " << r.max_requests
          << " requests of " << in.context_tokens << " tokens";
    }
    o << "\n";
  };
  for (const auto& s : p.prefill) {
    o << "prefill stage " << s.stage << " layers [" << s.layer_begin << ", " << s.layer_end << "): ";
    rank_line(s.rank);
  }
  o << "decode rank (TP" << in.decode_tp << " DCP" << in.decode_dcp << " EP" << in.decode_ep << "): ";
  rank_line(p.decode);
  return o.str();
}

}  // namespace k3::deploy
