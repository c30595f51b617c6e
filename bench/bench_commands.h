// The subcommands of k3-bench. Each lives in its own bench/<name>_bench.cpp and adds itself to the app;
// k3_bench.cpp calls every add_* below (add a line there when adding a bench).
#pragma once
#include <CLI/CLI.hpp>

namespace k3::bench {

// `k3-bench transfer`: ucx_perftest vs our UCX write path, plus the protocol round trip's fixed cost.
void add_transfer_command(CLI::App& app);

// `k3-bench serve`: concurrent /v1/completions streams against a router (bench/serve_bench.cpp).
void add_serve_command(CLI::App& app);

// `k3-bench soak`: overload + client disconnects + a node SIGKILLed mid-run (bench/soak_bench.cpp).
void add_soak_command(CLI::App& app);
// `k3-bench profile`: capacity profile for k3-plan ratio (bench/profile_bench.cpp).
void add_profile_command(CLI::App& app);
// `k3-bench ratio`: measured goodput of several P:D splits against k3-plan ratio (bench/ratio_bench.cpp).
void add_ratio_command(CLI::App& app);
// `k3-bench engine`: whole-model decode / prefill on one GPU against the roofline (bench/engine_bench.cpp).
void add_engine_command(CLI::App& app);
// `k3-bench ranks`: a DCP or EP decode group of rank processes (CPU or GPU), step time split into collectives
// (bench/ranks_bench.cpp).
void add_ranks_command(CLI::App& app);
// `k3-bench collectives`: the NCCL collectives of a GPU decode group, one process per GPU, in nccl-tests'
// columns (bench/collectives_bench.cpp; bench/torch_collectives.py is the anchor).
void add_collectives_command(CLI::App& app);
// `k3-bench overlap`: the transfer's share hidden behind prefill compute and TTFT with vs without the
// transfer, with real k3-prefill / k3-decode processes (bench/overlap_bench.cpp).
void add_overlap_command(CLI::App& app);

}  // namespace k3::bench
