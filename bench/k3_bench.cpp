// k3-bench: benchmarks, each a subcommand (transfer: bench/transfer_bench.cpp; kernels:
// bench/kernels_bench.cpp; serve: bench/serve_bench.cpp; soak: bench/soak_bench.cpp;
// engine: bench/engine_bench.cpp; profile: bench/profile_bench.cpp; ratio: bench/ratio_bench.cpp;
// ranks: bench/ranks_bench.cpp; collectives: bench/collectives_bench.cpp; overlap: bench/overlap_bench.cpp).
#include <CLI/CLI.hpp>

#include "bench/bench_commands.h"
#include "bench/kernels_bench.h"

int main(int argc, char** argv) {
  CLI::App app{"k3serve benchmarks"};
  app.require_subcommand(1);
  k3::bench::add_transfer_command(app);
  k3::bench::add_kernels_command(app);
  k3::bench::add_serve_command(app);
  k3::bench::add_soak_command(app);
  k3::bench::add_engine_command(app);
  k3::bench::add_profile_command(app);
  k3::bench::add_ratio_command(app);
  k3::bench::add_ranks_command(app);
  k3::bench::add_collectives_command(app);
  k3::bench::add_overlap_command(app);
  CLI11_PARSE(app, argc, argv);
  return 0;
}
