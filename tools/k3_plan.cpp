// k3-plan: sizing a deployment before running it (docs/DEPLOY.md).
//   k3-plan memory --preset k3 [--json] [--gpu-memory 141GiB] [--decode-tp 8 ...]   bytes per rank by role
//   k3-plan ratio --profile P.json --rate R --input N --output M --ttft-ms T --itl-ms I [--total N]
//                                                       prefill instances and decode ranks for an SLA
#include <CLI/CLI.hpp>

#include <cstdio>
#include <filesystem>
#include <fstream>

#include "common/core/parse.h"
#include "deploy/memory_plan.h"
#include "deploy/ratio_plan.h"
#include "prefill_node/source_arena_size.h"

using namespace k3;

namespace {

int fail(const std::string& msg) {
  std::fprintf(stderr, "k3-plan: %s\n", msg.c_str());
  return 2;
}

// --preset NAME or --config (a config.json or a model directory holding one).
Result<ModelConfig> load_config(const std::string& preset, const std::string& config, std::string& name) {
  if (!config.empty()) {
    std::string path = config;
    if (std::filesystem::is_directory(path)) path += "/config.json";
    name = config;
    return load_model_config(path);
  }
  name = preset;
  return preset_config(preset);
}

struct MemoryArgs {
  std::string preset = "k3", config, gpu_memory, kv_dtype = "bf16";
  bool json = false;
  int draft_layers = -1;  // -1: 5 for the k3 preset (its published drafter), else 0
  double source_arena_mib = prefill::kDefaultSourceArenaMiBDevice;   // MemoryPlanInput's default too
  deploy::MemoryPlanInput in;
};

void add_memory_command(CLI::App& app, MemoryArgs& a) {
  auto* m = app.add_subcommand("memory", "bytes per rank by role: weights, MLA KV per token, KDA state per request, "
                                         "the drafter's window pool, and what fits in the GPU memory");
  m->add_option("--preset", a.preset, "model preset: k3 (default), k3-small, k3-tiny, k3-tiny-93");
  m->add_option("--config", a.config, "a model config.json (or a model directory), instead of --preset");
  m->add_flag("--json", a.json, "print JSON instead of text");
  m->add_option("--gpu-memory", a.gpu_memory, "memory per GPU, e.g. 141GB or 80GiB (omitted: sizes only)");
  m->add_option("--utilization", a.in.utilization, "share of GPU memory a process uses (default 0.90)");
  m->add_option("--kv-dtype", a.kv_dtype, "MLA KV element type: bf16 (default) or fp8")->check(CLI::IsMember({"bf16", "fp8"}));
  m->add_option("--weight-bytes", a.in.weight_bytes, "bytes per dense weight element (default 2: bf16)");
  m->add_option("--expert-bits", a.in.expert_bits, "bits per routed-expert weight (default 4.25: MXFP4 group 32)");
  m->add_option("--context", a.in.context_tokens, "context tokens per request for the concurrency figure (default 32768)");
  m->add_option("--prefill-stages", a.in.prefill_stages, "PP stages of a prefill instance (default 1)");
  m->add_option("--partition", a.in.partition, "layers per prefill stage, e.g. 7,5,7 (default: even split)");
  m->add_option("--prefill-tp", a.in.prefill_tp, "tensor parallelism inside a prefill stage (default 1)");
  m->add_option("--source-arena-mib", a.source_arena_mib,
                "each prefill stage's source arena, as k3-prefill --source-arena-mib (default 1024, its GPU default)")
      ->check(CLI::NonNegativeNumber);
  m->add_option("--decode-tp", a.in.decode_tp, "tensor parallelism inside a decode group (default 1)");
  m->add_option("--decode-dcp", a.in.decode_dcp, "decode context parallelism (default 1)");
  m->add_option("--decode-ep", a.in.decode_ep, "expert parallelism over decode ranks (default 1)");
  m->add_option("--decode-dp", a.in.decode_dp, "decode ranks in the deployment (default 16)");
  m->add_option("--draft-layers", a.draft_layers, "drafter layers (default 5 for k3, 0 = no drafter otherwise)");
  m->add_option("--draft-kv-heads", a.in.draft.kv_heads, "drafter KV heads (default 16)");
  m->add_option("--draft-head-dim", a.in.draft.head_dim, "drafter head dim (default 64)");
  m->add_option("--draft-kv-bytes", a.in.draft.kv_bytes, "bytes per drafter KV element (default 1: fp8)");
  m->add_option("--draft-window", a.in.draft.window, "drafter sliding window in tokens (default 2048)");
  m->add_option("--draft-verify-width", a.in.draft.verify_width, "gamma + 1 (default 6)");
  m->add_option("--draft-page", a.in.draft.page, "tokens per drafter pool page (default 64)");
  m->add_option("--draft-requests", a.in.draft.requests_per_rank, "requests per decode rank the pool is sized for (default 24)");
  m->add_option("--draft-multiplier", a.in.draft.multiplier, "pool copies for overlapping transfer/retry lifetimes (default 3)");
}

int run_memory(MemoryArgs& a) {
  auto cfg = load_config(a.preset, a.config, a.in.model_name);
  if (!cfg.is_ok()) return fail(cfg.status().message());
  a.in.cfg = *cfg;
  a.in.kv_fp8 = a.kv_dtype == "fp8";
  a.in.prefill_source_arena_bytes = static_cast<uint64_t>(a.source_arena_mib * (1 << 20));
  a.in.draft.layers = a.draft_layers >= 0 ? a.draft_layers : (a.config.empty() && a.preset == "k3" ? 5 : 0);
  if (!a.gpu_memory.empty()) {
    auto bytes = parse_byte_size(a.gpu_memory, "--gpu-memory");
    if (!bytes.is_ok()) return fail(bytes.status().message());
    a.in.gpu_memory_bytes = *bytes;
  }
  auto plan = deploy::plan_memory(a.in);
  if (!plan.is_ok()) return fail(plan.status().message());
  if (a.json) std::printf("%s\n", deploy::memory_plan_json(*plan).dump(2).c_str());
  else std::printf("%s", deploy::memory_plan_text(*plan).c_str());
  return 0;
}

struct RatioArgs {
  std::string profile;
  deploy::RatioWorkload w;
  deploy::SharedCompute compute;
  double ttft_ms = 0, itl_ms = 0;
  int total = 0, prefill = 0, decode = 0;
  bool json = false;
};

void add_ratio_command(CLI::App& app, RatioArgs& a) {
  auto* r = app.add_subcommand("ratio", "prefill instances and decode ranks for a request rate under a TTFT/ITL SLA, "
                                        "from capacity profiles (docs/DEPLOY.md); the predicted goodput and what binds");
  r->add_option("--profile", a.profile, "capacity profile JSON (prefill seconds vs input tokens, decode ITL vs batch)")->required();
  r->add_option("--rate", a.w.rate, "requests per second")->required();
  r->add_option("--input", a.w.input_tokens, "input tokens per request")->required();
  r->add_option("--output", a.w.output_tokens, "output tokens per request")->required();
  r->add_option("--prefix-hit", a.w.prefix_hit, "share of input tokens found in the prefix cache (default 0)");
  r->add_option("--ttft-ms", a.ttft_ms, "time-to-first-token SLA")->required();
  r->add_option("--itl-ms", a.itl_ms, "inter-token latency SLA")->required();
  r->add_option("--total", a.total, "split this many processes between prefill and decode (default: the smallest P and D)");
  r->add_option("--prefill", a.prefill, "with --decode: predict this split instead of recommending one");
  r->add_option("--decode", a.decode, "with --prefill: predict this split");
  r->add_option("--cores", a.compute.cores,
                "cores all the P + D node processes share (default 0: each process has its own compute, e.g. a GPU)");
  r->add_option("--core-share", a.compute.share,
                "with --cores: fraction of each core's time the node processes get (default 1: nothing else runs there)");
  r->add_flag("--json", a.json, "print JSON");
}

int run_ratio(RatioArgs& a) {
  a.w.ttft_seconds = a.ttft_ms / 1000.0;
  a.w.itl_seconds = a.itl_ms / 1000.0;
  std::ifstream in(a.profile);
  if (!in) return fail("cannot read --profile " + a.profile);
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(in);
  } catch (const std::exception& e) {
    return fail(a.profile + ": " + e.what());
  }
  auto profile = deploy::parse_capacity_profile(j);
  if (!profile.is_ok()) return fail(profile.status().message());
  auto r = a.prefill > 0 || a.decode > 0 ? deploy::predict_ratio(*profile, a.w, a.prefill, a.decode, a.compute)
                                         : deploy::recommend_ratio(*profile, a.w, a.total, a.compute);
  if (!r.is_ok()) return fail(r.status().message());
  if (a.json) {
    std::printf("%s\n", deploy::ratio_prediction_json(*r).dump(2).c_str());
  } else {
    std::printf("P=%d prefill instance(s), D=%d decode rank(s): goodput %.3f req/s of %.3f offered; binding: %s\n"
                "prefill: %.3f s per request alone, %.3f req/s within the TTFT SLA, predicted TTFT %.3f s\n"
                "decode: batch %.0f per rank within the ITL SLA, %.3f req/s\n"
                "compute: a busy process runs at %.2f of its profiled speed, %.2f processes busy on average\n",
                r->prefill, r->decode, r->goodput, a.w.rate, r->binding.c_str(), r->prefill_seconds, r->prefill_capacity,
                r->ttft_seconds, r->decode_batch, r->decode_capacity, r->compute_speed, r->busy_processes);
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"k3-plan: size a k3serve deployment (memory per rank; prefill:decode counts for an SLA)"};
  app.require_subcommand(1);
  MemoryArgs mem;
  mem.in.decode_dp = 16;
  add_memory_command(app, mem);
  RatioArgs ratio;
  add_ratio_command(app, ratio);
  CLI11_PARSE(app, argc, argv);
  if (app.got_subcommand("ratio")) return run_ratio(ratio);
  return run_memory(mem);
}
