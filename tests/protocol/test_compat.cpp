// Compatibility hash and the registration check: a mismatch names the field that differs.
#include <catch2/catch.hpp>

#include "common/protocol/compat.h"

using namespace k3;
using namespace k3::protocol;

namespace {

ModelConfig tiny_config() {
  ModelConfig c;
  c.hidden_size = 64;
  c.num_hidden_layers = 4;
  c.vocab_size = 100;
  c.kda.num_heads = 4;
  c.kda.head_dim = 16;
  c.kda.kda_layers = {1, 2, 3};
  c.kda.full_attn_layers = {4};
  c.num_attention_heads = 4;
  c.kv_lora_rank = 32;
  c.qk_rope_head_dim = 8;
  c.qk_nope_head_dim = 16;
  c.v_head_dim = 16;
  return c;
}

CompatInfo decode_compat() {
  return {.model_hash = model_config_hash(tiny_config()), .kv_dtype = DType::BF16, .state_dtype = DType::F32,
          .page_size = 64, .layout = {.dp_size = 1, .dcp_size = 4, .pp_partition = {}}};
}

Register registration(Role role, CompatInfo c) {
  Register r{.role = role, .instance_id = "node-a", .rank = 0, .stage = 0, .compat = c};
  r.compat_hash = compat_hash(c);
  return r;
}

std::string refusal(const CompatInfo& ours, const CompatInfo& theirs, CompatScope scope) {
  Status s = check_compat(ours, theirs, scope);
  REQUIRE_FALSE(s.is_ok());
  CHECK(s.code() == Code::InvalidArgument);
  return s.message();
}

}  // namespace

TEST_CASE("fnv1a64 matches published vectors", "[compat]") {
  CHECK(fnv1a64("") == 0xcbf29ce484222325ull);
  CHECK(fnv1a64("a") == 0xaf63dc4c8601ec8cull);
  CHECK(fnv1a64("foobar") == 0x85944171f73967e8ull);
}

TEST_CASE("model hash changes with every shape field and ignores non-shape fields", "[compat]") {
  const uint64_t base = model_config_hash(tiny_config());
  CHECK(model_config_hash(tiny_config()) == base);  // deterministic
  std::vector<std::function<void(ModelConfig&)>> shape_edits = {
      [](ModelConfig& c) { c.hidden_size++; },           [](ModelConfig& c) { c.num_hidden_layers++; },
      [](ModelConfig& c) { c.kda.num_heads++; },         [](ModelConfig& c) { c.kda.head_dim++; },
      [](ModelConfig& c) { c.kda.kda_layers = {1, 2}; }, [](ModelConfig& c) { c.kda.full_attn_layers = {3, 4}; },
      [](ModelConfig& c) { c.kv_lora_rank++; },          [](ModelConfig& c) { c.qk_rope_head_dim++; },
      [](ModelConfig& c) { c.num_experts++; },           [](ModelConfig& c) { c.kda.short_conv_kernel_size++; },
      [](ModelConfig& c) { c.vocab_size++; },            [](ModelConfig& c) { c.attn_res_block_size++; },
  };
  for (size_t i = 0; i < shape_edits.size(); ++i) {
    ModelConfig c = tiny_config();
    shape_edits[i](c);
    INFO("edit " << i);
    CHECK(model_config_hash(c) != base);
  }
  ModelConfig c = tiny_config();
  c.eos_token_ids = {7};
  c.rms_norm_eps = 1e-3f;
  CHECK(model_config_hash(c) == base);
}

TEST_CASE("compat mismatch names the differing field", "[compat]") {
  const CompatInfo ours = decode_compat();
  CHECK(check_compat(ours, ours, CompatScope::SameInstance).is_ok());

  CompatInfo t = ours;
  t.model_hash ^= 1;
  CHECK(refusal(ours, t, CompatScope::Cluster).rfind("model differs", 0) == 0);
  t = ours;
  t.kv_dtype = DType::F16;
  const std::string dt = refusal(ours, t, CompatScope::Cluster);
  CHECK(dt.rfind("kv_dtype differs", 0) == 0);
  CHECK(dt.find("BF16") != std::string::npos);
  CHECK(dt.find("F16") != std::string::npos);
  t = ours;
  t.state_dtype = DType::BF16;
  CHECK(refusal(ours, t, CompatScope::Cluster).rfind("state_dtype differs", 0) == 0);
  t = ours;
  t.page_size = 32;
  CHECK(refusal(ours, t, CompatScope::Cluster).rfind("page_size differs: ours 64, theirs 32", 0) == 0);
  t = ours;
  t.layout.dcp_size = 8;
  CHECK(check_compat(ours, t, CompatScope::Cluster).is_ok());  // prefill/decode layouts differ by design
  CHECK(refusal(ours, t, CompatScope::SameInstance).rfind("layout differs", 0) == 0);
}

TEST_CASE("compat hash covers every component", "[compat]") {
  const CompatInfo c = decode_compat();
  const uint64_t h = compat_hash(c);
  CompatInfo t = c;
  t.model_hash++;
  CHECK(compat_hash(t) != h);
  t = c;
  t.kv_dtype = DType::F32;
  CHECK(compat_hash(t) != h);
  t = c;
  t.state_dtype = DType::BF16;
  CHECK(compat_hash(t) != h);
  t = c;
  t.page_size++;
  CHECK(compat_hash(t) != h);
  t = c;
  t.layout.pp_partition = {2, 2};
  CHECK(compat_hash(t) != h);
  CHECK(layout_hash({.dp_size = 1, .dcp_size = 12, .pp_partition = {}}) !=
        layout_hash({.dp_size = 11, .dcp_size = 2, .pp_partition = {}}));
}

TEST_CASE("registration checks", "[compat]") {
  const CompatInfo ours = decode_compat();
  CHECK(check_registration(ours, registration(Role::Decode, ours), CompatScope::SameInstance).is_ok());

  SECTION("stale compat hash") {
    Register r = registration(Role::Decode, ours);
    r.compat_hash ^= 1;
    Status s = check_registration(ours, r, CompatScope::Cluster);
    REQUIRE_FALSE(s.is_ok());
    CHECK(s.message().find("compat_hash does not match") != std::string::npos);
  }
  SECTION("mismatched page size is refused and named") {
    CompatInfo theirs = ours;
    theirs.page_size = 16;
    Status s = check_registration(ours, registration(Role::Prefill, [&] {
      theirs.layout = {.dp_size = 1, .dcp_size = 1, .pp_partition = {2, 2}};
      return theirs;
    }()), CompatScope::Cluster);
    REQUIRE_FALSE(s.is_ok());
    CHECK(s.message().find("refused: page_size differs") != std::string::npos);
  }
  SECTION("prefill stage beyond its partition") {
    CompatInfo theirs = ours;
    theirs.layout = {.dp_size = 1, .dcp_size = 1, .pp_partition = {2, 2}};
    Register r = registration(Role::Prefill, theirs);
    r.stage = 2;
    Status s = check_registration(ours, r, CompatScope::Cluster);
    REQUIRE_FALSE(s.is_ok());
    CHECK(s.message().find("stage 2 >= number of PP stages 2") != std::string::npos);
  }
  SECTION("decode rank beyond dp*dcp") {
    Register r = registration(Role::Decode, ours);
    r.rank = 4;
    CHECK_FALSE(check_registration(ours, r, CompatScope::SameInstance).is_ok());
  }
  SECTION("empty instance id") {
    Register r = registration(Role::Decode, ours);
    r.instance_id.clear();
    CHECK_FALSE(check_registration(ours, r, CompatScope::SameInstance).is_ok());
  }
}
