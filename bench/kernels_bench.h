// `k3-bench kernels`: the H200 kernel table of docs/PERF.md in one run. Ceilings first (device
// copy bandwidth, bf16 GEMM rate), then our KDA chunked prefill, KDA decode, MLA decode and LSE
// merge, each with bytes, FLOPs, fraction of the floor and (when a reference JSON written by
// bench/fla_reference.py is given) the ratio to fla / PyTorch measured on the same card.
#pragma once
#include <CLI/CLI.hpp>
#include <string>
#include <vector>

namespace k3 {
class Backend;
}

namespace k3::bench {

// The two ceilings of a run on a CUDA backend: device-to-device copy (bytes read + written per us, of
// 1 GiB) and the bf16 GEMM rate of an 8192^3 product through the backend's GEMM (FLOP per us).
// CUDA builds only (bench/kernels_bench.cpp); `backend` must be the CUDA backend.
struct BenchCeilings {
  double copy_bytes_per_us = 0, gemm_flops_per_us = 0;
};
BenchCeilings measure_bench_ceilings(Backend& backend, bool quick);

struct KernelsBenchOptions {
  int device = 0;
  std::string ref_json;   // reference timings (bench/fla_reference.py --out); may be empty
  std::string out_json;   // where to write our numbers; may be empty
  bool quick = false;     // fewer repetitions (smoke runs)
  bool with_mma = false;  // also time the mma.sync MLA decode kernel at H >= 64 ("_mma" rows)
  std::vector<int> decode_batches = {1, 32, 256};  // KDA decode batch sizes
  bool kda_scan_rows = false;  // also time KDA prefill rows with the wgmma scan held to 64 / 32 rows ("_wg64", "_wg32")
  bool kda_scan_mma = false;  // also time the main KDA prefill rows with the wide scan on mma.sync ("_mma")
  std::string only;       // comma-separated kernel families to run (kda_chunk,kda_decode,mla_decode,lse_merge); empty = all
  std::vector<int> mla_splits;  // also time the H >= 64 MLA rows with the context cut into each of these split counts
  std::vector<int> mla_invariant_splits;  // also time the MLA rows batch-invariant with each of these split sizes
  bool mla_main_rows = false;   // MLA: only each shape's default, batch-invariant and --mla-*splits rows, and four
                                // long-context shapes of 1 to 8 requests
};

// Returns a process exit code; prints the table on stdout. Without a CUDA build: prints why, returns 2.
int run_kernels_bench(const KernelsBenchOptions& opts);

// CLI wiring: the options on any app, and the `kernels` subcommand for k3-bench (bench/k3_bench.cpp
// calls add_kernels_command(app) next to add_transfer_command).
void add_kernels_options(CLI::App& app, KernelsBenchOptions& opts);
void add_kernels_command(CLI::App& app);

}  // namespace k3::bench
