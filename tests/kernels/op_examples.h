// Small valid inputs + attributes for every registered op (shared by the CPU registry test and the
// CUDA registry test, which runs the same examples on both backends).
#pragma once
#include <catch2/catch.hpp>
#include <map>
#include <random>
#include <string>
#include <utility>

#include "tests/kernels/kernel_test_util.h"

namespace k3::test {

using Inputs = std::map<std::string, Tensor>;
using Attrs = std::map<std::string, std::string>;

// Small valid inputs + attributes for every registered op.
inline std::pair<Inputs, Attrs> example(const std::string& op, std::mt19937& rng) {
  if (op == "gemm") return {{{"x", randn({3, 8}, rng)}, {"w", randn({5, 8}, rng)}, {"y", randn({3, 5}, rng)}}, {{"alpha", "0.5"}, {"beta", "2"}}};
  if (op == "rmsnorm") return {{{"x", randn({3, 8}, rng)}, {"w", randn({8}, rng)}}, {{"eps", "1e-6"}}};
  if (op == "l2norm") return {{{"x", randn({3, 8}, rng)}}, {{"scale", "0.25"}}};
  if (op == "short_conv")
    return {{{"x", randn({5, 6}, rng)}, {"w", randn({6, 4}, rng)}, {"cache", randn({2, 3, 6}, rng)},
             {"slots", i32({2}, {1, 0})}, {"cu_seqlens", i32({3}, {0, 2, 5})}}, {}};
  if (op == "kda_gate")
    return {{{"f", randn({3, 8}, rng)}, {"a_log", randn({4}, rng)}, {"dt_bias", randn({8}, rng)}}, {{"heads", "2"}}};
  if (op == "kda_chunk" || op == "kda_recurrent") {
    Inputs in = {{"q", randn({6, 2, 4}, rng, 0.3f)}, {"k", randn({6, 2, 4}, rng, 0.3f)}, {"v", randn({6, 2, 3}, rng)},
                 {"g", uniform({6, 2, 4}, rng, -5.f, 0.f)}, {"beta", uniform({6, 2}, rng, 0.f, 1.f)},
                 {"state", randn({3, 2, 3, 4}, rng)}, {"slots", i32({2}, {2, 0})}, {"cu_seqlens", i32({3}, {0, 4, 6})}};
    return {in, op == "kda_chunk" ? Attrs{{"chunk_size", "3"}} : Attrs{}};
  }
  if (op == "kda_decode")
    return {{{"qkv", randn({2, 24}, rng)}, {"conv_w", randn({24, 4}, rng)}, {"conv_cache", randn({3, 3, 24}, rng)},
             {"f", randn({2, 8}, rng)}, {"a_log", randn({2}, rng)}, {"dt_bias", randn({8}, rng)},
             {"b", randn({2, 2}, rng)}, {"state", randn({3, 2, 4, 4}, rng)}, {"slots", i32({2}, {1, 2})}},
            {{"heads", "2"}}};
  if (op == "mla_prefill") return {{{"q", randn({2, 2, 6}, rng)}, {"k", randn({5, 2, 6}, rng)}, {"v", randn({5, 2, 4}, rng)}}, {}};
  if (op == "mla_decode")
    return {{{"q_lat", randn({2, 2, 4}, rng)}, {"q_rope", randn({2, 2, 2}, rng)}, {"kv_cache", randn({3, 2, 6}, rng)},
             {"block_table", i32({2, 2}, {2, 0, 1, -1})}, {"seq_lens", i32({2}, {3, 0})}},
            {{"scale", "0.4"}}};
  if (op == "lse_merge") return {{{"o_parts", randn({2, 2, 2, 3}, rng)}, {"lse_parts", randn({2, 2, 2}, rng)}}, {}};
  if (op == "attnres_mix")
    return {{{"candidates.0", randn({3, 4}, rng)}, {"candidates.1", randn({3, 4}, rng)}, {"query", randn({4}, rng)}}, {}};
  if (op == "situ") return {{{"g", randn({2, 5}, rng)}, {"u", randn({2, 5}, rng)}}, {{"beta", "4"}}};
  if (op == "router_topk") return {{{"logits", randn({3, 6}, rng)}, {"bias", randn({6}, rng)}}, {{"k", "2"}, {"scale", "2.5"}}};
  if (op == "moe_experts")
    return {{{"z", randn({3, 4}, rng)}, {"ids", i32({3, 2}, {0, 2, 1, 0, 2, 1})}, {"weights", uniform({3, 2}, rng, 0, 1)},
             {"w1", randn({3, 5, 4}, rng)}, {"w3", randn({3, 5, 4}, rng)}, {"w2", randn({3, 4, 5}, rng)}}, {}};
  if (op == "add") return {{{"a", randn({2, 3}, rng)}, {"b", randn({2, 3}, rng)}}, {}};
  if (op == "sigmoid_mul") return {{{"x", randn({2, 3}, rng)}, {"gate", randn({2, 3}, rng)}}, {}};
  if (op == "sigmoid") return {{{"x", randn({2, 3, 2}, rng)}}, {}};
  if (op == "embedding") return {{{"table", randn({5, 3}, rng)}, {"ids", i32({2}, {4, 1})}}, {}};
  if (op == "sample") return {{{"logits", randn({3, 10}, rng)}}, {{"temperature", "0.8"}, {"top_k", "5"}, {"seed", "7"}}};
  FAIL("no example for op " << op);
  return {};
}


}  // namespace k3::test
