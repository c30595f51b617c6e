#include "common/protocol/compat.h"

#include <string>

namespace k3::protocol {
namespace {

// Appends fields as "name=value;" so two configs that differ in any listed field hash differently.
class HashText {
 public:
  template <class T> HashText& add(const char* name, const T& v) {
    text_ += name;
    text_ += '=';
    if constexpr (std::is_same_v<T, std::string>) text_ += v;
    else if constexpr (std::is_same_v<T, std::vector<int>> || std::is_same_v<T, std::vector<uint32_t>>) {
      for (auto x : v) text_ += std::to_string(x) + ',';
    } else text_ += std::to_string(v);
    text_ += ';';
    return *this;
  }
  uint64_t hash() const { return fnv1a64(text_); }
 private:
  std::string text_;
};

std::string layout_text(const ParallelLayout& l) {
  std::string s = "dp=" + std::to_string(l.dp_size) + " dcp=" + std::to_string(l.dcp_size) + " pp=[";
  for (size_t i = 0; i < l.pp_partition.size(); ++i) s += (i ? "," : "") + std::to_string(l.pp_partition[i]);
  return s + "]";
}

}  // namespace

uint64_t fnv1a64(std::string_view bytes, uint64_t seed) {
  uint64_t h = seed;
  for (unsigned char c : bytes) {
    h ^= c;
    h *= 0x100000001b3ull;
  }
  return h;
}

uint64_t model_config_hash(const ModelConfig& c) {
  // Only fields that change weights' shapes, layer kinds or cache layout; not eos ids or sampling knobs.
  return HashText()
      .add("model_type", c.model_type).add("hidden_size", c.hidden_size)
      .add("num_hidden_layers", c.num_hidden_layers).add("vocab_size", c.vocab_size)
      .add("kda.num_heads", c.kda.num_heads).add("kda.head_dim", c.kda.head_dim)
      .add("kda.conv", c.kda.short_conv_kernel_size).add("kda.kda_layers", c.kda.kda_layers)
      .add("kda.full_attn_layers", c.kda.full_attn_layers)
      .add("num_attention_heads", c.num_attention_heads).add("q_lora_rank", c.q_lora_rank)
      .add("kv_lora_rank", c.kv_lora_rank).add("qk_nope_head_dim", c.qk_nope_head_dim)
      .add("qk_rope_head_dim", c.qk_rope_head_dim).add("v_head_dim", c.v_head_dim)
      .add("num_experts", c.num_experts).add("num_experts_per_token", c.num_experts_per_token)
      .add("num_shared_experts", c.num_shared_experts).add("moe_intermediate_size", c.moe_intermediate_size)
      .add("routed_expert_hidden_size", c.routed_expert_hidden_size)
      .add("first_k_dense_replace", c.first_k_dense_replace).add("intermediate_size", c.intermediate_size)
      .add("attn_res_block_size", c.attn_res_block_size)
      .add("num_nextn_predict_layers", c.num_nextn_predict_layers)
      .hash();
}

uint64_t layout_hash(const ParallelLayout& l) { return fnv1a64(layout_text(l)); }

uint64_t compat_hash(const CompatInfo& c) {
  return HashText()
      .add("model", c.model_hash)
      .add("kv_dtype", int(c.kv_dtype))
      .add("state_dtype", int(c.state_dtype))
      .add("page_size", c.page_size)
      .add("layout", layout_hash(c.layout))
      .hash();
}

Status check_compat(const CompatInfo& ours, const CompatInfo& theirs, CompatScope scope) {
  const auto differs = [](const char* field, const std::string& a, const std::string& b) {
    return invalid_argument(std::string(field) + " differs: ours " + a + ", theirs " + b);
  };
  if (ours.model_hash != theirs.model_hash)
    return differs("model", std::to_string(ours.model_hash), std::to_string(theirs.model_hash));
  if (ours.kv_dtype != theirs.kv_dtype)
    return differs("kv_dtype", dtype_name(ours.kv_dtype), dtype_name(theirs.kv_dtype));
  if (ours.state_dtype != theirs.state_dtype)
    return differs("state_dtype", dtype_name(ours.state_dtype), dtype_name(theirs.state_dtype));
  if (ours.page_size != theirs.page_size)
    return differs("page_size", std::to_string(ours.page_size), std::to_string(theirs.page_size));
  if (scope == CompatScope::SameInstance && !(ours.layout == theirs.layout))
    return differs("layout", layout_text(ours.layout), layout_text(theirs.layout));
  return Status::ok();
}

Status check_registration(const CompatInfo& ours, const Register& r, CompatScope scope) {
  const std::string who = std::string(role_name(r.role)) + " '" + r.instance_id + "' rank " +
                          std::to_string(r.rank) + " stage " + std::to_string(r.stage);
  if (r.instance_id.empty()) return invalid_argument("registration of " + who + ": instance_id is empty");
  if (r.compat_hash != compat_hash(r.compat))
    return invalid_argument("registration of " + who +
                            ": compat_hash does not match its components (corrupt or different hash version)");
  const ParallelLayout& l = r.compat.layout;
  if (l.dp_size == 0 || l.dcp_size == 0)
    return invalid_argument("registration of " + who + ": layout dp_size/dcp_size must be > 0");
  if (r.role == Role::Prefill) {
    if (l.pp_partition.empty())
      return invalid_argument("registration of " + who + ": prefill layout has no pp_partition");
    if (r.stage >= l.pp_partition.size())
      return invalid_argument("registration of " + who + ": stage " + std::to_string(r.stage) +
                              " >= number of PP stages " + std::to_string(l.pp_partition.size()));
  }
  if (r.role == Role::Decode && r.rank >= l.dp_size * l.dcp_size)
    return invalid_argument("registration of " + who + ": rank >= dp_size*dcp_size = " +
                            std::to_string(l.dp_size * l.dcp_size));
  Status s = check_compat(ours, r.compat, scope);
  if (!s.is_ok()) return invalid_argument("registration of " + who + " refused: " + s.message());
  return Status::ok();
}

}  // namespace k3::protocol
