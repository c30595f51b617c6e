#include "engine/rank_layout.h"

namespace k3 {

namespace {
std::string n(int v) { return std::to_string(v); }
}  // namespace

Status validate_rank_layout(const RankLayout& g, const ModelConfig& cfg) {
  if (g.dcp < 1) return invalid_argument("rank layout: dcp must be >= 1, got " + n(g.dcp));
  if (g.ep < 1) return invalid_argument("rank layout: ep must be >= 1, got " + n(g.ep));
  if (g.dcp > 1 && g.ep > 1)
    return invalid_argument("rank layout: dcp = " + n(g.dcp) + " and ep = " + n(g.ep) +
                            " together are not supported (a decode group is DCP or EP)");
  if (g.rank < 0 || g.rank >= g.size())
    return invalid_argument("rank layout: rank " + n(g.rank) + " is outside the group 0.." + n(g.size() - 1));
  // The rank-sliced forward is written for K3's layers: a full-rank KDA output gate and SiTU experts.
  if (!cfg.kda.use_full_rank_gate || cfg.uses_silu())
    return invalid_argument(std::string("rank layout: decode rank groups serve K3-family models; this one has ") +
                            (cfg.uses_silu() ? "SiLU experts" : "a low-rank KDA output gate") +
                            " (Kimi Linear): serve it with single decode ranks");
  if (g.kv_partitions < 1) return invalid_argument("rank layout: kv_partitions must be >= 1, got " + n(g.kv_partitions));
  if (g.kv_partitions % g.dcp != 0)
    return invalid_argument("rank layout: kv_partitions = " + n(g.kv_partitions) + " is not a multiple of dcp = " +
                            n(g.dcp) + " (each rank merges whole partitions)");
  if (cfg.kda.num_heads % g.dcp != 0)
    return invalid_argument("rank layout: linear_attn_config.num_heads = " + n(cfg.kda.num_heads) +
                            " KDA heads do not split evenly over dcp = " + n(g.dcp) + " ranks");
  if (cfg.num_attention_heads % g.dcp != 0)
    return invalid_argument("rank layout: num_attention_heads = " + n(cfg.num_attention_heads) +
                            " MLA heads do not split evenly over dcp = " + n(g.dcp) + " ranks");
  if (cfg.num_experts % g.ep != 0)
    return invalid_argument("rank layout: num_experts = " + n(cfg.num_experts) +
                            " routed experts do not split evenly over ep = " + n(g.ep) + " ranks");
  return Status::ok();
}

int64_t dcp_rows_on(const RankLayout& g, int64_t num_tokens) {
  const int i = g.dcp_rank();
  if (num_tokens <= i) return 0;
  return (num_tokens - i + g.dcp - 1) / g.dcp;
}

ModelConfig rank_cache_config(const ModelConfig& cfg, const RankLayout& g) {
  ModelConfig c = cfg;
  c.kda.num_heads = cfg.kda.num_heads / g.dcp;
  return c;
}

std::string to_string(const RankLayout& g) {
  return "rank " + n(g.rank) + " of dcp " + n(g.dcp) + " x ep " + n(g.ep) + " (kv_partitions " + n(g.kv_partitions) + ")";
}

}  // namespace k3
