// The memory planner behind `k3-plan memory`: from a model config, a topology and the GPU memory, the
// bytes every part of a deployment needs (docs/DEPLOY.md "Sizing memory"):
//   - weights per rank by role: each prefill PP stage (its layers; the embedding on the first stage, the
//     final norm and lm_head on the last), and a decode rank (the whole model); dense tensors split over
//     the tensor-parallel degree, the per-head attention weights and KDA states of a decode rank over
//     max(TP, DCP) (a DCP rank runs its share of the heads), routed experts over the expert-parallel degree;
//   - MLA latent KV bytes per token (bf16 and fp8), KDA recurrent-state and conv-state bytes per request
//     at each TP degree that divides the KDA heads;
//   - the speculative drafter's KV bytes per token and its sliding-window page pool (pages per request,
//     pool slots and bytes per decode rank);
//   - what is left for caches on each rank, the KV tokens that fit and the concurrent requests at a
//     given context length.
// Byte sizes of one cache row / state come from CacheLayout (one definition); weight shapes from
// expected_tensors. Pure arithmetic: nothing is allocated.
#pragma once
#include <nlohmann/json.hpp>

#include <cstdint>
#include <string>
#include <vector>

#include "common/config/config.h"
#include "common/core/status.h"
#include "prefill_node/source_arena_size.h"

namespace k3::deploy {

// The speculative drafter's cache (defaults: the published K3 DSpark drafter and the pool rule of the
// production scripts). layers = 0: no drafter.
struct DraftCacheSpec {
  int layers = 0;
  int kv_heads = 16;
  int head_dim = 64;
  int kv_bytes = 1;              // bytes per element (fp8)
  int window = 2048;             // sliding-window attention span in tokens
  int verify_width = 6;          // gamma + 1 rows verified per step
  int page = 64;                 // tokens per pool page
  int requests_per_rank = 24;    // decode requests a rank runs at once
  int multiplier = 3;            // pool copies: transfer and retry lifetimes of one request overlap under PD
};

struct MemoryPlanInput {
  ModelConfig cfg;
  std::string model_name;          // for the report
  int prefill_stages = 1;          // PP degree of one prefill instance
  std::string partition;           // layers per stage, "7,5,7"; empty: even split (k3-prefill's rule)
  int prefill_tp = 1;
  int decode_tp = 1;               // attention/dense tensor parallelism inside a decode group
  int decode_dcp = 1;              // decode context parallelism: each rank keeps 1/dcp of a request's KV rows
                                   // and runs 1/dcp of the heads (with TP: the same GPUs, max(tp, dcp))
  int decode_ep = 1;               // expert parallelism: routed experts split over this many ranks
  int decode_dp = 1;               // decode ranks (data parallel) in the deployment
  bool kv_fp8 = false;             // MLA KV stored in fp8 (else bf16)
  int weight_bytes = 2;            // bytes per dense weight element (bf16)
  double expert_bits = 4.25;       // bits per routed expert weight (MXFP4: 4 bits + an 8-bit scale per 32)
  uint64_t gpu_memory_bytes = 0;   // per GPU; 0: only sizes, no capacity
  double utilization = 0.90;       // share of GPU memory the process may use (the rest: activations, workspace)
  int64_t context_tokens = 32768;  // context length for the concurrent-request figure
  DraftCacheSpec draft;
  // Each prefill stage's source arena (k3-prefill --source-arena-mib), allocated up front on its GPU.
  uint64_t prefill_source_arena_bytes = uint64_t(prefill::kDefaultSourceArenaMiBDevice) << 20;
};

struct KdaStateAtTp {
  int tp = 1;
  uint64_t state_bytes = 0;  // recurrent state, all KDA layers, one request, one rank
  uint64_t conv_bytes = 0;   // short-conv cache, the same
};

struct RankCapacity {
  uint64_t weight_bytes = 0;
  uint64_t fixed_cache_bytes = 0;    // pools sized up front (the drafter's pool)
  int64_t free_bytes = 0;            // usable memory - weights - fixed pools (negative: does not fit)
  uint64_t kv_bytes_per_token = 0;   // MLA KV rows this rank keeps per token of a request
  uint64_t state_bytes_per_request = 0;  // KDA state + conv this rank keeps per request
  int64_t kv_tokens = 0;             // KV tokens that fit in free_bytes (no states)
  int64_t max_requests = 0;          // requests of context_tokens that fit (states + KV)
};

struct PrefillStagePlan {
  int stage = 0;
  int layer_begin = 0, layer_end = 0;
  int kda_layers = 0, mla_layers = 0;
  RankCapacity rank;
};

struct MemoryPlan {
  MemoryPlanInput in;
  int kda_layers = 0, mla_layers = 0;
  uint64_t mla_kv_bytes_per_token_bf16 = 0;
  uint64_t mla_kv_bytes_per_token_fp8 = 0;
  std::vector<KdaStateAtTp> kda_by_tp;        // every TP degree in {1,2,4,...} dividing the KDA heads
  uint64_t draft_kv_bytes_per_token = 0;
  uint64_t draft_pages_per_request = 0;
  uint64_t draft_bytes_per_request = 0;
  uint64_t draft_pool_slots_per_rank = 0;
  uint64_t draft_pool_bytes_per_rank = 0;
  uint64_t total_weight_bytes = 0;            // whole model at the given dtypes
  std::vector<PrefillStagePlan> prefill;
  RankCapacity decode;
  int64_t decode_logical_kv_tokens = 0;       // kv_tokens x dcp: a DCP group's tokens of one sequence
  bool fits = true;                           // every rank has free_bytes > 0 (when gpu_memory_bytes > 0)
};

// Validates the topology against the config (errors name the flag-like field: "decode_tp must divide ...").
Result<MemoryPlan> plan_memory(const MemoryPlanInput& in);
nlohmann::json memory_plan_json(const MemoryPlan& p);
std::string memory_plan_text(const MemoryPlan& p);

}  // namespace k3::deploy
