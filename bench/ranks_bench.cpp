// `k3-bench ranks`: one decode group of rank processes (engine/rank_model.h), and the time of a decode step
// split into compute and each collective kind.
//   k3-bench ranks --dcp 8 --heads 8 --batch 4 --context 512 --steps 20
//   k3-bench ranks --ep 4 --batch 4
//   k3-bench ranks --backend cuda --k3-heads --dcp 2 --batch 64     (both ranks on GPU 0, UCX via the host)
//   k3-bench ranks --backend cuda --k3-heads --dcp 8 --gpus 8 --collectives nccl
// On the GPU every collective first waits for the rank's queued kernels, so "compute" is the kernels'
// time and each collective column the exchange alone (plus waiting for the slowest rank).
// The bench starts the group itself: it runs again as each rank (hidden --child-rank), rank 0 binds the
// communicator's bootstrap endpoint. Caches are left as allocated with their lengths set (no prefill):
// timing only. "collectives" includes waiting for the slowest rank to arrive (CPU ranks share cores).
//   k3-bench ranks --capacity --preset k3 --dcp 8 --pool-gib 100
// prints instead the context tokens a group's cache pools hold, from the rank cache layout: one request,
// DCP1 vs DCPn, per-rank pool budget --pool-gib.
#include <CLI/CLI.hpp>

#include <algorithm>
#include <cstdio>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "bench/bench_commands.h"
#include "bench/rank_children.h"
#include "common/model/weights.h"
#include "deploy/child_process.h"
#include "engine/kv_cache.h"
#include "engine/rank_model.h"
#include "decode_node/group_collectives.h"
#include "kernels/backend.h"
#include "kernels/backend_select.h"
#include "transfer/comm_ucx.h"

namespace k3::bench {
namespace {

struct RanksOptions {
  std::string preset = "k3-tiny";
  int heads = 0;  // KDA and MLA heads (0: the preset's)
  int dcp = 1, ep = 1, kv_partitions = 0;  // 0: = dcp
  int batch = 4, context = 512, steps = 20, warmup = 2;
  int child_rank = -1;
  std::string endpoint;
  std::string backend = "cpu", collectives = "ucx";
  int gpus = 1;           // rank r on GPU r % gpus
  bool k3_heads = false;  // with_k3_head_shapes (the GPU's fused kernels need KDA D = 64 or 128)
  bool capacity = false;
  double pool_gib = 100;
};

ModelConfig bench_config(const RanksOptions& o) {
  ModelConfig c = preset_config(o.preset).value();
  if (o.heads > 0) c.kda.num_heads = c.num_attention_heads = c.num_key_value_heads = o.heads;
  if (o.k3_heads) c = with_k3_head_shapes(c);
  return c;
}

RankLayout layout_of(const RanksOptions& o, int rank) {
  return {.dcp = o.dcp, .ep = o.ep, .kv_partitions = o.kv_partitions > 0 ? o.kv_partitions : o.dcp, .rank = rank};
}

int run_child(const RanksOptions& o) {
  const RankLayout g = layout_of(o, o.child_rank);
  auto comm = transfer::UcxComm::create(g.rank, g.size(), o.endpoint, {}, [](const std::string& ep) {
    std::printf("BOUND %s\n", ep.c_str());
    std::fflush(stdout);
  });
  if (!comm.is_ok()) return std::fprintf(stderr, "rank %d: %s\n", g.rank, comm.status().to_string().c_str()), 1;
  const ModelConfig cfg = bench_config(o);
  const int device = g.rank % std::max(1, o.gpus);
  auto made = make_backend({.kind = o.backend, .device = device, .threads = 1});
  if (!made.is_ok()) return std::fprintf(stderr, "rank %d: %s\n", g.rank, made.status().to_string().c_str()), 1;
  auto be = std::move(*made);
  auto kind = decode::parse_group_collectives(o.collectives);
  if (!kind.is_ok()) return std::fprintf(stderr, "%s\n", kind.status().to_string().c_str()), 2;
  auto nccl = decode::make_group_collectives(*kind, **comm, device, std::chrono::seconds(60));
  if (!nccl.is_ok()) return std::fprintf(stderr, "rank %d: %s\n", g.rank, nccl.status().to_string().c_str()), 1;
  Comm& forward = *nccl ? **nccl : static_cast<Comm&>(**comm);
  const CacheOptions copt{.max_seqs = o.batch, .page_size = 16,
                          .num_pages = o.batch * ((o.context + o.steps + o.warmup) / g.dcp / 16 + 2)};
  auto model = RankModel::create(*be, cfg, random_weights(cfg, 1, DType::F32), g, forward, copt);
  if (!model.is_ok()) return std::fprintf(stderr, "rank %d: %s\n", g.rank, model.status().to_string().c_str()), 1;
  RankModel& m = **model;
  std::vector<SeqCache> seqs(o.batch);
  std::vector<RankItem> items(o.batch);
  for (int b = 0; b < o.batch; ++b) {
    seqs[b] = m.caches().open().value();
    const int64_t rows = dcp_rows_on(g, o.context);
    if (auto s = m.caches().reserve(seqs[b], rows); !s.is_ok()) return std::fprintf(stderr, "%s\n", s.to_string().c_str()), 1;
    seqs[b].num_tokens = rows;
    items[b] = {.seq = &seqs[b], .position = o.context};
  }
  std::mt19937 rng(7);
  std::vector<int32_t> toks(o.batch);
  for (int s = 0; s < o.warmup + o.steps; ++s) {
    if (s == o.warmup) m.reset_times();
    for (auto& t : toks) t = static_cast<int32_t>(rng() % cfg.vocab_size);
    auto lg = m.decode_step(items, toks);
    if (!lg.is_ok()) return std::fprintf(stderr, "rank %d: %s\n", g.rank, lg.status().to_string().c_str()), 1;
  }
  const CollectiveTimes& t = m.times();
  const double n = std::max<uint64_t>(1, t.steps), ms = 1e3 / n;
  std::printf("RESULT %d %.3f %.3f %.3f %.3f %.3f %.3f %.0f\n", g.rank, t.step * ms, (t.step - t.collectives()) * ms,
              t.all_gather * ms, t.all_to_all * ms, t.all_to_allv * ms, t.all_reduce * ms, t.bytes / n);
  std::fflush(stdout);
  return 0;
}

int run_group(const RanksOptions& o) {
  const RankLayout g0 = layout_of(o, 0);
  if (auto s = validate_rank_layout(g0, bench_config(o)); !s.is_ok())
    return std::fprintf(stderr, "k3-bench ranks: %s\n", s.to_string().c_str()), 2;
  auto args = [&](int r, const std::string& ep) {
    std::vector<std::string> a{"ranks", "--child-rank", std::to_string(r), "--endpoint", ep, "--preset", o.preset,
                                    "--heads", std::to_string(o.heads), "--dcp", std::to_string(o.dcp), "--ep",
                                    std::to_string(o.ep), "--kv-partitions", std::to_string(g0.kv_partitions),
                                    "--batch", std::to_string(o.batch), "--context", std::to_string(o.context),
                                    "--steps", std::to_string(o.steps), "--backend", o.backend, "--gpus",
                                    std::to_string(o.gpus), "--collectives", o.collectives};
    if (o.k3_heads) a.push_back("--k3-heads");
    return a;
  };
  auto started = start_rank_children(g0.size(), args);
  if (!started.is_ok()) return std::fprintf(stderr, "k3-bench ranks: %s\n", started.status().to_string().c_str()), 1;
  auto& ranks = *started;
  const std::string where = o.backend == "cpu" ? "CPU backend 1 thread per rank"
                                               : "CUDA backend, rank r on GPU r % " + std::to_string(o.gpus) +
                                                     ", collectives over " + o.collectives;
  std::printf("# %s%s, %s, batch %d per %s, context %d, %d steps (after %d warm-up), %s\n", o.preset.c_str(),
              o.k3_heads ? " with K3's head shapes" : "", to_string(g0).c_str(), o.batch, o.ep > 1 ? "rank" : "group",
              o.context, o.steps, o.warmup, where.c_str());
  std::printf("%-5s %9s %11s %11s %11s %12s %11s %12s\n", "rank", "step_ms", "compute_ms", "all_gather", "all_to_all",
              "all_to_allv", "all_reduce", "bytes/step");
  int failed = 0;
  for (auto& r : ranks) {
    std::optional<std::string> res;
    while (!res) {
      auto line = r->read_line(std::chrono::seconds(300));
      if (!line) break;
      if (line->rfind("RESULT ", 0) == 0) res = line->substr(7);
    }
    if (!res) {
      ++failed;
      continue;
    }
    int rank = 0;
    double v[7] = {};
    std::sscanf(res->c_str(), "%d %lf %lf %lf %lf %lf %lf %lf", &rank, &v[0], &v[1], &v[2], &v[3], &v[4], &v[5], &v[6]);
    std::printf("%-5d %9.3f %11.3f %11.3f %11.3f %12.3f %11.3f %12.0f\n", rank, v[0], v[1], v[2], v[3], v[4], v[5], v[6]);
  }
  for (auto& r : ranks) r->wait_exit(std::chrono::seconds(10));
  return failed ? 1 : 0;
}

// Context tokens one request can hold in a group whose every rank has `budget` bytes of cache pool:
// per rank, one KDA slot (its heads' conv + state for every KDA layer) and MLA rows of every MLA layer
// for 1/n of the tokens.
int run_capacity(const RanksOptions& o) {
  const ModelConfig cfg = bench_config(o);
  const double budget = o.pool_gib * double(1ull << 30);
  std::printf("# %s: context tokens of one request, per-rank cache pool %.1f GiB (bf16 rows and conv, fp32 state)\n",
              o.preset.c_str(), o.pool_gib);
  std::printf("%-6s %18s %18s %18s %16s\n", "group", "MLA bytes/token", "KDA bytes/request", "tokens per group",
              "x one rank");
  double one = 0;
  for (int n : {1, o.dcp}) {
    const RankLayout g{.dcp = n, .kv_partitions = n};
    if (auto s = validate_rank_layout(g, cfg); !s.is_ok()) return std::fprintf(stderr, "%s\n", s.to_string().c_str()), 2;
    auto lay = CacheLayout::from_config(rank_cache_config(cfg, g), {.kv = DType::BF16, .conv = DType::BF16, .state = DType::F32});
    if (!lay.is_ok()) return std::fprintf(stderr, "%s\n", lay.status().to_string().c_str()), 2;
    double row = 0, kda = 0;
    for (auto c : lay->layers) {
      if (c == LayerCache::Kda) kda += double(lay->kda_conv_bytes() + lay->kda_state_bytes());
      else row += double(lay->mla_row_bytes);
    }
    const double per_rank_tokens = std::floor((budget - kda) / row);
    const double tokens = per_rank_tokens * n;
    if (n == 1) one = tokens;
    std::printf("DCP%-3d %18.0f %18.0f %18.0f %15.2fx\n", n, row, kda, tokens, tokens / one);
  }
  return 0;
}

}  // namespace

void add_ranks_command(CLI::App& app) {
  auto opt = std::make_shared<RanksOptions>();
  auto* cmd = app.add_subcommand("ranks", "a decode group of rank processes (DCP or EP) on the CPU or GPUs: step time "
                                          "split into compute and collectives; --capacity: context per group");
  cmd->add_option("--preset", opt->preset, "model preset");
  cmd->add_option("--heads", opt->heads, "KDA and MLA heads (0: the preset's; DCP needs them divisible by --dcp)");
  cmd->add_option("--dcp", opt->dcp, "DCP ranks");
  cmd->add_option("--ep", opt->ep, "EP ranks");
  cmd->add_option("--kv-partitions", opt->kv_partitions, "MLA partials per request (0: = dcp)");
  cmd->add_option("--batch", opt->batch, "requests (per group with DCP, per rank with EP)");
  cmd->add_option("--context", opt->context, "tokens already cached per request");
  cmd->add_option("--steps", opt->steps, "timed decode steps");
  cmd->add_option("--backend", opt->backend, "each rank's backend: cpu or cuda")->check(CLI::IsMember({"cpu", "cuda"}));
  cmd->add_option("--gpus", opt->gpus, "cuda: rank r runs on GPU r % gpus (1: every rank on GPU 0)")
      ->check(CLI::PositiveNumber);
  cmd->add_option("--collectives", opt->collectives, "the forward's collectives: ucx (host memory) or nccl (one GPU "
                  "per rank)")->check(CLI::IsMember({"ucx", "nccl"}));
  cmd->add_flag("--k3-heads", opt->k3_heads, "K3's head sizes at the preset's width of heads (KDA D = 128, MLA "
                "latent 512): the shapes the GPU's fused kernels take");
  cmd->add_flag("--capacity", opt->capacity, "print the context a group's pools hold instead of timing");
  cmd->add_option("--pool-gib", opt->pool_gib, "per-rank cache pool for --capacity");
  cmd->add_option("--child-rank", opt->child_rank)->group("");
  cmd->add_option("--endpoint", opt->endpoint)->group("");
  cmd->callback([opt] {
    int rc = opt->capacity ? run_capacity(*opt) : opt->child_rank >= 0 ? run_child(*opt) : run_group(*opt);
    if (rc != 0) throw CLI::RuntimeError(rc);
  });
}

}  // namespace k3::bench
