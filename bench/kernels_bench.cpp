// `k3-bench kernels` (see kernels_bench.h). Method (docs/PERF.md, "What we measure against"): ceilings
// measured in the same run; floor = max(bytes / copy BW, FLOPs / GEMM rate); decode-size kernels
// are CUDA-graph replays timed one by one with events (median of >= 200), rotating over input
// sets larger than the 60 MB L2; prefill-size kernels are eager calls, median of 10 after warm-up.
#include "bench/kernels_bench.h"

#include <cstdio>
#include <memory>

void k3::bench::add_kernels_options(CLI::App& app, KernelsBenchOptions& o) {
  app.add_option("--device", o.device, "CUDA device");
  app.add_option("--ref", o.ref_json, "reference timings from bench/fla_reference.py");
  app.add_option("--json", o.out_json, "write our numbers here");
  app.add_flag("--quick", o.quick, "fewer repetitions");
  app.add_flag("--with-mma", o.with_mma, "also time the mma.sync MLA decode kernel at H >= 64 (_mma rows)");
  app.add_option("--decode-batches", o.decode_batches, "KDA decode batch sizes (H = 96, D = 128)")
      ->check(CLI::PositiveNumber);
  app.add_flag("--kda-scan-rows", o.kda_scan_rows,
               "also time KDA prefill rows with the wgmma scan held to 64- and to 32-row blocks and to a head per "
               "block (_wg64, _wg32, _wg128 rows)");
  app.add_flag("--kda-scan-mma", o.kda_scan_mma,
               "also time the main KDA prefill rows with the scan's wide grid on mma.sync (_mma rows)");
  app.add_option("--mla-splits", o.mla_splits,
                 "also time the H >= 64 MLA decode rows with the context cut into each of these split counts (_sN rows)")
      ->delimiter(',')
      ->check(CLI::Range(1, 64));
  app.add_option("--mla-invariant-splits", o.mla_invariant_splits,
                 "also time the MLA decode rows in batch-invariant mode with each of these split sizes in tokens (_invN rows)")
      ->delimiter(',')
      ->check(CLI::PositiveNumber);
  app.add_flag("--mla-main-rows", o.mla_main_rows,
               "MLA decode: only each shape's default, batch-invariant (_inv) and --mla-*splits rows, plus four "
               "long-context shapes of 1 to 8 requests");
  app.add_option("--only", o.only,
                 "comma-separated kernel families to time after the ceilings: kda_chunk, kda_decode, mla_decode, "
                 "lse_merge (default: all)");
}

void k3::bench::add_kernels_command(CLI::App& app) {
  auto opts = std::make_shared<KernelsBenchOptions>();
  auto* cmd = app.add_subcommand("kernels", "H200 kernel table: ceilings, KDA prefill/decode, MLA decode, LSE merge");
  add_kernels_options(*cmd, *opts);
  cmd->callback([opts] {
    const int rc = run_kernels_bench(*opts);
    if (rc != 0) throw CLI::RuntimeError(rc);
  });
}

#ifndef K3_HAVE_CUDA
int k3::bench::run_kernels_bench(const KernelsBenchOptions&) {
  std::fprintf(stderr, "k3-bench kernels: this build has no CUDA backend\n");
  return 2;
}
k3::bench::BenchCeilings k3::bench::measure_bench_ceilings(Backend&, bool) { return {}; }
#else
#include <cuda_runtime.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <ctime>
#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>
#include <numeric>
#include <random>
#include <vector>

#include "bench/kernel_timing.h"
#include "bench/mla_decode_rows.h"
#include "kernels/cuda/cuda_backend.h"
#include "kernels/cuda/cuda_check.h"

namespace k3::bench {

namespace {

using cuda::CudaBackend;

struct Ceilings {
  double copy_bytes_per_us = 0;  // read + write
  double gemm_flops_per_us = 0;
};

Ceilings measure_ceilings(CudaBackend& be, bool quick, std::vector<Line>& lines) {
  Ceilings c;
  const cudaStream_t s = be.stream();
  {
    const int64_t n = int64_t(1) << 30;  // 1 GiB each way
    Tensor a = be.alloc({n}, DType::U8), b = be.alloc({n}, DType::U8);
    fill_uniform(a.data(), n / 4, false, -1.f, 1.f, 1, s);
    const double us = time_eager(s, 2, quick ? 3 : 10, [&] {
      K3_CUDA_OK(cudaMemcpyAsync(b.data(), a.data(), size_t(n), cudaMemcpyDeviceToDevice, s));
    });
    c.copy_bytes_per_us = 2.0 * double(n) / us;
    lines.push_back({.name = "ceiling_copy_1GiB", .us = us, .bytes = 2.0 * double(n)});
  }
  {
    const int64_t n = 8192;
    Tensor x = be.alloc({n, n}, DType::BF16), w = be.alloc({n, n}, DType::BF16), y = be.alloc({n, n}, DType::BF16);
    fill(be, x, -1.f, 1.f, 2);
    fill(be, w, -1.f, 1.f, 3);
    const double us = time_eager(s, 3, quick ? 3 : 10, [&] { be.gemm({.x = x, .w = w, .y = y}); });
    c.gemm_flops_per_us = 2.0 * double(n) * n * n / us;
    lines.push_back({.name = "ceiling_gemm_bf16_8192", .us = us, .flops = 2.0 * double(n) * n * n});
  }
  return c;
}

// N sequences of `len` tokens each; `ckpt` > 0 also writes the state every `ckpt` tokens into slots
// (the prefix-cache checkpoints), counted as extra bytes written. `softplus`: gates without K3's lower
// bound (Kimi Linear's form, down to -100 here), which take the run-sum variant of the prep launch.
// `split` false: CudaBackend::set_kda_chunk_split(false), each sequence one chain of chunks even
// where the plan would cut it into segments ("_nosplit").
void kda_chunk_case(CudaBackend& be, int64_t N, int64_t len, int64_t H, int ckpt, bool softplus, bool quick,
                    std::vector<Line>& lines, bool split = true, const std::string& suffix = "") {
  const int64_t D = 128, T = N * len;
  Tensor q = be.alloc({T, H, D}, DType::BF16), k = be.alloc({T, H, D}, DType::BF16), v = be.alloc({T, H, D}, DType::BF16);
  Tensor g = be.alloc({T, H, D}, DType::F32), beta = be.alloc({T, H}, DType::F32);
  Tensor state = be.alloc({N, H, D, D}, DType::F32), o = be.alloc({T, H, D}, DType::BF16);
  fill(be, q, -1.f, 1.f, 10);
  fill(be, k, -1.f, 1.f, 11);
  fill(be, v, -1.f, 1.f, 12);
  if (softplus) fill(be, g, -100.f, -0.001f, 13);
  else fill(be, g, -5.f, -0.01f, 13);
  fill(be, beta, 0.f, 1.f, 14);
  fill(be, state, -0.1f, 0.1f, 15);
  Tensor q2 = q.reshape({T * H, D}), k2 = k.reshape({T * H, D});
  be.l2norm({.x = q2, .y = q2, .eps = 1e-6f, .scale = 1.f / std::sqrt(float(D))});
  be.l2norm({.x = k2, .y = k2, .eps = 1e-6f});
  std::vector<int32_t> slot_ids(N), cu_h(N + 1);
  std::iota(slot_ids.begin(), slot_ids.end(), 0);
  for (int64_t n = 0; n <= N; ++n) cu_h[n] = int32_t(n * len);
  Tensor slots = dev_ints(be, slot_ids), cu = dev_ints(be, cu_h);
  ops::KdaParams p{.q = q, .k = k, .v = v, .g = g, .beta = beta, .state = state, .slots = slots, .cu_seqlens = cu, .o = o,
                   .bounded_gate = !softplus};
  const int64_t per_seq = ckpt > 0 ? len / ckpt : 0, num_ckpt = N * per_seq;
  Tensor ckpts;
  if (ckpt > 0) {
    ckpts = be.alloc({num_ckpt, H, D, D}, DType::F32);
    std::vector<int32_t> table(static_cast<size_t>(num_ckpt));
    std::iota(table.begin(), table.end(), 0);
    p.checkpoints = ckpts;
    p.checkpoint_slots = be.from_host(Tensor::from_i32({N, per_seq}, table), DType::I32);
    p.checkpoint_interval = ckpt;
  }
  const bool was_split = be.kda_chunk_split();
  be.set_kda_chunk_split(split);
  const double us = time_eager(be.stream(), 2, quick ? 3 : 10, [&] { be.kda_chunk(p); });
  be.set_kda_chunk_split(was_split);
  const double C = 64, chunks = N * std::ceil(double(len) / 64);
  std::string name = N == 1 ? "kda_chunk_T" + std::to_string(T) + "_H" + std::to_string(H)
                            : "kda_chunk_N" + std::to_string(N) + "x" + std::to_string(len) + "_H" + std::to_string(H);
  if (ckpt > 0) name += "_ckpt" + std::to_string(ckpt);
  if (softplus) name += "_softplus";
  if (!split) name += "_nosplit";
  name += suffix;
  Line l{.name = name, .us = us};
  l.bytes = double(T) * H * D * (2 + 2 + 2 + 4 + 2) + double(T) * H * 4 + 2.0 * N * H * D * D * 4 +
            double(num_ckpt) * H * D * D * 4;
  l.flops = chunks * H * 2.0 * (5 * C * C * D + 3 * C * D * D);
  if (ckpt == 0 && !softplus && split && suffix.empty()) l.refs = {{"fla chunk_kda", l.name}};
  lines.push_back(l);
}

void kda_decode_case(CudaBackend& be, int64_t B, int64_t H, bool quick, std::vector<Line>& lines) {
  const int64_t D = 128, W = 4, P = H * D;
  const double state_bytes = double(B) * H * D * D * 4;
  const int64_t R = std::max<int64_t>(1, int64_t(std::ceil(256.0 * (1 << 20) / state_bytes)));  // rotate past L2
  const int64_t slots_n = B * R;
  Tensor state = be.alloc({slots_n, H, D, D}, DType::F32), cache = be.alloc({slots_n, W - 1, 3 * P}, DType::BF16);
  Tensor qkv = be.alloc({B, 3 * P}, DType::BF16), conv_w = be.alloc({3 * P, W}, DType::F32);
  Tensor f = be.alloc({B, P}, DType::BF16), b = be.alloc({B, H}, DType::BF16), o = be.alloc({B, H, D}, DType::BF16);
  Tensor a_log = be.alloc({H}, DType::F32), dt = be.alloc({P}, DType::F32);
  fill(be, state, -0.1f, 0.1f, 20);
  fill(be, cache, -1.f, 1.f, 21);
  fill(be, qkv, -1.f, 1.f, 22);
  fill(be, conv_w, -0.5f, 0.5f, 23);
  fill(be, f, -2.f, 2.f, 24);
  fill(be, b, -2.f, 2.f, 25);
  fill(be, a_log, -0.5f, 0.5f, 26);
  fill(be, dt, -0.5f, 0.5f, 27);
  std::vector<Tensor> slot_sets;
  std::vector<std::function<void()>> variants;
  for (int64_t r = 0; r < R; ++r) {
    std::vector<int32_t> ids(B);
    std::iota(ids.begin(), ids.end(), int32_t(r * B));
    slot_sets.push_back(dev_ints(be, ids));
  }
  for (int64_t r = 0; r < R; ++r)
    variants.push_back([&, r] {
      be.kda_decode({.qkv = qkv, .conv_w = conv_w, .conv_cache = cache, .f = f, .a_log = a_log, .dt_bias = dt, .b = b,
                     .state = state, .slots = slot_sets[r], .o = o, .heads = int(H)});
    });
  const double us = time_graphs(be.stream(), quick ? 50 : 300, variants);
  Line l{.name = "kda_decode_B" + std::to_string(B) + "_H" + std::to_string(H), .us = us};
  l.bytes = 2 * state_bytes + double(B) * 3 * P * 2 * (1 + 2 * (W - 1)) + double(B) * P * 2 * 2 + 3.0 * P * W * 4 +
            P * 4.0;
  l.flops = double(B) * H * 8.0 * D * D;
  l.refs = {{"fla fused_recurrent_kda", "kda_decode_B" + std::to_string(B) + "_H" + std::to_string(H)}};
  lines.push_back(l);
  // The same state bytes moved by a plain device copy, timed the same way (replays rotating over the slot
  // sets: set r copied onto set r + 1): how close to the 1 GiB copy rate a copy of this size comes, i.e.
  // what of the kernel's gap at small batches any launch of this size pays.
  if (R < 2) return;
  std::vector<std::function<void()>> copies;
  const size_t set_bytes = size_t(state_bytes);
  for (int64_t r = 0; r < R; ++r)
    copies.push_back([&, r] {
      char* base = static_cast<char*>(state.data());
      K3_CUDA_OK(cudaMemcpyAsync(base + size_t((r + 1) % R) * set_bytes, base + size_t(r) * set_bytes, set_bytes,
                                 cudaMemcpyDeviceToDevice, be.stream()));
    });
  const double copy_us = time_graphs(be.stream(), quick ? 50 : 300, copies);
  lines.push_back({.name = "copy_as_kda_decode_B" + std::to_string(B) + "_H" + std::to_string(H), .us = copy_us,
                   .bytes = 2 * state_bytes});
}

void lse_merge_case(CudaBackend& be, int64_t N, int64_t B, int64_t H, int64_t D, bool quick, std::vector<Line>& lines) {
  Tensor parts = be.alloc({N, B, H, D}, DType::F32), lse = be.alloc({N, B, H}, DType::F32);
  Tensor o = be.alloc({B, H, D}, DType::BF16), ol = be.alloc({B, H}, DType::F32);
  fill(be, parts, -1.f, 1.f, 40);
  fill(be, lse, -3.f, 3.f, 41);
  const double us = time_graphs(be.stream(), quick ? 50 : 200, {[&] {
    be.lse_merge({.o_parts = parts, .lse_parts = lse, .o = o, .lse = ol});
  }});
  Line l{.name = "lse_merge_N" + std::to_string(N) + "_B" + std::to_string(B) + "_H" + std::to_string(H) + "_D" +
                 std::to_string(D),
         .us = us};
  l.bytes = double(N) * B * H * (D * 4 + 4) + double(B) * H * (D * 2 + 4);
  l.flops = 3.0 * N * B * H * D;
  l.refs = {{"torch", l.name}};
  lines.push_back(l);
}

std::string today() {
  const std::time_t t = std::time(nullptr);
  char buf[32];
  std::strftime(buf, sizeof buf, "%Y-%m-%d %H:%M UTC", std::gmtime(&t));
  return buf;
}

}  // namespace

int run_kernels_bench(const KernelsBenchOptions& opts) {
  for (size_t at = 0; at < opts.only.size();) {
    const size_t end = std::min(opts.only.find(',', at), opts.only.size());
    const std::string family = opts.only.substr(at, end - at);
    if (family != "kda_chunk" && family != "kda_decode" && family != "mla_decode" && family != "lse_merge") {
      std::fprintf(stderr, "k3-bench kernels: --only: unknown kernel family '%s' (kda_chunk, kda_decode, mla_decode, lse_merge)\n",
                   family.c_str());
      return 2;
    }
    at = end + 1;
  }
  std::string why;
  auto owned = make_cuda_backend(opts.device, &why);
  if (!owned) {
    std::fprintf(stderr, "k3-bench kernels: no CUDA backend: %s\n", why.c_str());
    return 2;
  }
  auto& be = static_cast<CudaBackend&>(*owned);
  std::vector<Line> lines;
  const Ceilings c = measure_ceilings(be, opts.quick, lines);
  const auto wanted = [&](const std::string& family) {
    if (opts.only.empty()) return true;
    const std::string list = "," + opts.only + ",";
    return list.find("," + family + ",") != std::string::npos;
  };
  if (wanted("kda_chunk")) {
    for (auto [N, len, H, ckpt, softplus] : std::vector<std::array<int64_t, 5>>{{1, 8192, 96, 0, 0},
                                                                                {1, 8192, 96, 64, 0},
                                                                                {1, 8192, 96, 256, 0},
                                                                                {1, 32768, 32, 0, 0},
                                                                                {1, 65536, 4, 0, 0},
                                                                                {256, 100, 96, 0, 0},
                                                                                {1, 8192, 96, 0, 1},
                                                                                {1, 32768, 32, 0, 1},
                                                                                {256, 100, 96, 0, 1}})
      kda_chunk_case(be, N, len, H, int(ckpt), softplus != 0, opts.quick, lines);
    // The wide-grid scan held to one form: shapes whose grid is wide (the T = 32768, H = 32 row is
    // not: it runs the narrow mma.sync scan whatever the switches say), one just past the 32-row
    // scan's one-wave boundary among them.
    const std::vector<std::array<int64_t, 4>> wide_cases = {
        {1, 8192, 96, 0}, {1, 8192, 96, 64}, {1, 8192, 96, 256}, {2, 8192, 64, 0}, {256, 100, 96, 0}};
    auto held_rows = [&](const std::string& suffix) {
      for (auto [N, len, H, ckpt] : wide_cases)
        kda_chunk_case(be, N, len, H, int(ckpt), false, opts.quick, lines, true, suffix);
    };
    if (opts.kda_scan_rows) {
      for (int wg_rows : {64, 32, 128}) {
        be.set_kda_chunk_scan_wg_rows(wg_rows);
        held_rows("_wg" + std::to_string(wg_rows));
      }
      be.set_kda_chunk_scan_wg_rows(0);
    }
    if (opts.kda_scan_mma) {
      be.set_kda_chunk_scan_wgmma(false);
      held_rows("_mma");
      be.set_kda_chunk_scan_wgmma(true);
    }
    // Few heads, long sequences: the segmented scan beside one chain per sequence.
    for (auto [len, H] : std::vector<std::array<int64_t, 2>>{{65536, 4}, {32768, 8}, {131072, 1}}) {
      if (H != 4) kda_chunk_case(be, 1, len, H, 0, false, opts.quick, lines);
      kda_chunk_case(be, 1, len, H, 0, false, opts.quick, lines, false);
    }
  }
  if (wanted("kda_decode"))
    for (int B : opts.decode_batches) kda_decode_case(be, B, 96, opts.quick, lines);
  std::vector<std::array<int64_t, 3>> mla_shapes{
      {96, 32, 4096}, {96, 64, 8192}, {96, 128, 16384}, {64, 64, 8192}, {16, 64, 8192}, {16, 128, 16384}};
  if (opts.mla_main_rows)  // few requests with long contexts: where few splits cost latency
    for (auto shape : std::vector<std::array<int64_t, 3>>{{96, 1, 16384}, {96, 4, 16384}, {96, 1, 65536}, {96, 8, 32768}})
      mla_shapes.push_back(shape);
  if (wanted("mla_decode"))
    for (auto [H, B, ctx] : mla_shapes) {
      mla_decode_case(be, B, H, ctx, opts.quick, lines);
      mla_decode_case(be, B, H, ctx, opts.quick, lines, {.invariant = true});
      for (int n : opts.mla_invariant_splits)
        mla_decode_case(be, B, H, ctx, opts.quick, lines, {.invariant = true, .invariant_split = n});
      if (H >= 64) {
        mla_decode_case(be, B, H, ctx, opts.quick, lines, {.roles = true});
        mla_decode_case(be, B, H, ctx, opts.quick, lines, {.invariant = true, .roles = true});
        mla_decode_case(be, B, H, ctx, opts.quick, lines, {.roles = true, .hot_pages = 16});
        for (int n : opts.mla_splits) mla_decode_case(be, B, H, ctx, opts.quick, lines, {.splits = n});
      }
      if (H >= 64 && !opts.mla_main_rows) {
        mla_decode_case(be, B, H, ctx, opts.quick, lines, {.lazy = false});
        mla_decode_case(be, B, H, ctx, opts.quick, lines, {.t48 = 1});
        mla_decode_case(be, B, H, ctx, opts.quick, lines, {.t48 = 1, .hot_pages = 16});
        for (int halves : {1, 0}) {
          mla_decode_case(be, B, H, ctx, opts.quick, lines, {.halves = halves});
          mla_decode_case(be, B, H, ctx, opts.quick, lines, {.halves = halves, .hot_pages = 16});
        }
        mla_decode_case(be, B, H, ctx, opts.quick, lines, {.seesaw = false, .hot_pages = 16});
        if (H > 64) mla_decode_case(be, B, H, ctx, opts.quick, lines, {.cluster = true});
        mla_decode_case(be, B, H, ctx, opts.quick, lines, {.seesaw = false});
        if (H % 64 != 0) mla_decode_case(be, B, H, ctx, opts.quick, lines, {.seesaw = false, .t32 = 1});
        mla_decode_case(be, B, H, ctx, opts.quick, lines, {.seesaw = false, .t32 = 2});
        mla_decode_case(be, B, H, ctx, opts.quick, lines, {.split_s = true, .seesaw = false});
        mla_decode_case(be, B, H, ctx, opts.quick, lines, {.tma = false, .seesaw = false});
      }
      if (H >= 64 && opts.with_mma) mla_decode_case(be, B, H, ctx, opts.quick, lines, {.wgmma = false});
    }
  if (wanted("lse_merge")) lse_merge_case(be, 8, 128, 96, 512, opts.quick, lines);

  nlohmann::json ref = nlohmann::json::object();
  if (!opts.ref_json.empty()) {
    std::ifstream in(opts.ref_json);
    if (in) {
      try {
        in >> ref;
      } catch (const std::exception& e) {
        std::fprintf(stderr, "k3-bench kernels: cannot parse %s: %s\n", opts.ref_json.c_str(), e.what());
      }
    } else {
      std::fprintf(stderr, "k3-bench kernels: no reference file %s\n", opts.ref_json.c_str());
    }
  }
  for (Line& l : lines) {
    l.floor_us = std::max(l.bytes / c.copy_bytes_per_us, l.flops / c.gemm_flops_per_us);
    for (Ref& r : l.refs)
      if (ref.contains(r.key) && ref[r.key].is_number()) r.us = ref[r.key].get<double>();
  }

  std::printf("\n## k3-bench kernels — %s, %d SMs, %s\n", be.device_name().c_str(), be.num_sms(), today().c_str());
  std::printf("ceilings: copy %.0f GB/s (read+write), bf16 GEMM %.0f TFLOP/s\n\n", c.copy_bytes_per_us / 1e3,
              c.gemm_flops_per_us / 1e6);
  std::printf("| kernel | ours (us) | MB moved | GFLOP | floor (us) | floor/ours | achieved GB/s | reference | ref (us) | ref/ours |\n");
  std::printf("|---|---:|---:|---:|---:|---:|---:|---|---:|---:|\n");
  nlohmann::json out = nlohmann::json::object();
  out["device"] = be.device_name();
  out["date"] = today();
  out["copy_GBps"] = c.copy_bytes_per_us / 1e3;
  out["gemm_TFLOPs"] = c.gemm_flops_per_us / 1e6;
  const auto ref_cols = [](const Ref* r, double ours) {
    if (!r) return std::string("- | - | -");
    if (r->us <= 0) return r->label + " | - | -";
    return r->label + " | " + std::to_string(r->us).substr(0, 7) + " | " + std::to_string(r->us / ours).substr(0, 5);
  };
  for (const Line& l : lines) {
    const bool ceiling = l.name.rfind("ceiling", 0) == 0;
    std::printf("| %s | %.1f | %.1f | %.2f | %s | %s | %.0f | %s |\n", l.name.c_str(), l.us, l.bytes / 1e6,
                l.flops / 1e9, ceiling ? "-" : std::to_string(l.floor_us).substr(0, 7).c_str(),
                ceiling ? "-" : std::to_string(l.floor_us / l.us).substr(0, 5).c_str(), l.bytes / l.us / 1e3,
                ref_cols(l.refs.empty() ? nullptr : &l.refs[0], l.us).c_str());
    for (size_t i = 1; i < l.refs.size(); ++i)  // further references: a row each, same "ours"
      std::printf("| %s (same) | %.1f | | | | | | %s |\n", l.name.c_str(), l.us, ref_cols(&l.refs[i], l.us).c_str());
    nlohmann::json refs = nlohmann::json::array();
    for (const Ref& r : l.refs) refs.push_back({{"label", r.label}, {"key", r.key}, {"us", r.us}});
    out["lines"].push_back({{"name", l.name}, {"us", l.us}, {"bytes", l.bytes}, {"flops", l.flops},
                            {"floor_us", l.floor_us}, {"refs", refs}});
  }
  if (!opts.out_json.empty()) std::ofstream(opts.out_json) << out.dump(2) << "\n";
  return 0;
}

BenchCeilings measure_bench_ceilings(Backend& backend, bool quick) {
  std::vector<Line> lines;
  const Ceilings c = measure_ceilings(static_cast<CudaBackend&>(backend), quick, lines);
  return {.copy_bytes_per_us = c.copy_bytes_per_us, .gemm_flops_per_us = c.gemm_flops_per_us};
}

}  // namespace k3::bench
#endif  // K3_HAVE_CUDA
