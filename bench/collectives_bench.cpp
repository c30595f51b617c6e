// `k3-bench collectives`: the bandwidth of the collectives a GPU decode group runs (transfer/nccl/comm_nccl.h:
// all-gather, reduce-scatter and all-reduce in rank order, all-to-all, all-to-all(v)), one process per
// GPU, in the columns nccl-tests prints, so bench/torch_collectives.py (PyTorch's NCCL collectives, the
// anchor) can be read beside it:
//   k3-bench collectives --gpus 8 --min-bytes 1K --max-bytes 256M
// size: bytes of one rank's whole buffer (all-gather: its output; reduce-scatter: its input; all-to-all:
// what it sends). time: the slowest rank's mean over --iters calls after --warmup (each call of the
// interface is blocking: it includes one stream synchronisation). algbw = size / time; busbw = algbw x
// (n - 1) / n (all-reduce: 2 (n - 1) / n), nccl-tests' convention for what crosses the links.
// all_to_allv sends rank p's i-th block 1/2 .. 3/2 of the even share (sizes differ per pair).
#include <CLI/CLI.hpp>
#include <sys/wait.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <map>
#include <string>
#include <vector>

#include "bench/bench_commands.h"
#include "bench/rank_children.h"
#include "decode_node/group_collectives.h"
#include "kernels/backend_select.h"
#include "transfer/comm_ucx.h"

namespace k3::bench {
namespace {

struct CollectivesOptions {
  int gpus = 1;
  std::string min_bytes = "1K", max_bytes = "256M";
  int factor = 4, iters = 20, warmup = 5;
  int child_rank = -1;
  std::string endpoint;
};

const std::vector<std::string> kOps = {"all_gather", "reduce_scatter", "all_reduce", "all_to_all", "all_to_allv"};

Result<size_t> parse_bytes(const std::string& s) {
  if (s.empty()) return invalid_argument("empty size");
  size_t mult = 1, digits = s.size();
  switch (s.back()) {
    case 'K': mult = 1ull << 10; --digits; break;
    case 'M': mult = 1ull << 20; --digits; break;
    case 'G': mult = 1ull << 30; --digits; break;
    default: break;
  }
  try {
    const unsigned long long v = std::stoull(s.substr(0, digits));
    return size_t(v) * mult;
  } catch (...) {
    return invalid_argument("size '" + s + "' is not a number of bytes (K, M, G suffixes)");
  }
}

// Bytes of rank `from`'s block for rank `to` in the uneven all-to-all: 1/2 .. 3/2 of `even`, in 16-byte units.
size_t uneven_block(size_t even, int from, int to, int n) {
  const size_t units = std::max<size_t>(1, even / 16);
  const size_t k = (size_t(from) * 7 + size_t(to) * 3) % size_t(n);
  return 16 * std::max<size_t>(1, units / 2 + units * k / std::max(1, n - 1));
}

int run_child(const CollectivesOptions& o) {
  const int n = o.gpus, rank = o.child_rank;
  auto ucx = transfer::UcxComm::create(rank, n, o.endpoint, {}, [](const std::string& ep) {
    std::printf("BOUND %s\n", ep.c_str());
    std::fflush(stdout);
  });
  if (!ucx.is_ok()) return std::fprintf(stderr, "rank %d: %s\n", rank, ucx.status().to_string().c_str()), 1;
  auto be = make_backend({.kind = "cuda", .device = rank});
  if (!be.is_ok()) return std::fprintf(stderr, "rank %d: %s\n", rank, be.status().to_string().c_str()), 1;
  auto nccl = decode::make_group_collectives(decode::GroupCollectives::Nccl, **ucx, rank, std::chrono::seconds(60));
  if (!nccl.is_ok()) return std::fprintf(stderr, "rank %d: %s\n", rank, nccl.status().to_string().c_str()), 1;
  Comm& c = **nccl;
  const size_t lo = parse_bytes(o.min_bytes).value(), hi = parse_bytes(o.max_bytes).value();
  for (size_t size = lo; size <= hi; size *= size_t(o.factor)) {
    const size_t block = std::max<size_t>(16, size / size_t(n) / 16 * 16), whole = block * size_t(n);
    Tensor in = (*be)->alloc({int64_t(whole)}, DType::U8), out = (*be)->alloc({int64_t(whole)}, DType::U8);
    std::vector<size_t> send(n), recv(n);
    size_t send_total = 0, recv_total = 0;
    for (int q = 0; q < n; ++q) {
      send[q] = uneven_block(block, rank, q, n);
      recv[q] = uneven_block(block, q, rank, n);
      send_total += send[q];
      recv_total += recv[q];
    }
    Tensor vin = (*be)->alloc({int64_t(send_total)}, DType::U8), vout = (*be)->alloc({int64_t(recv_total)}, DType::U8);
    (*be)->synchronize();
    auto bytes = [](const Tensor& t, size_t count) { return std::span<std::byte>(static_cast<std::byte*>(t.data()), count); };
    auto floats = [](const Tensor& t, size_t count) { return std::span<float>(static_cast<float*>(t.data()), count / 4); };
    for (const std::string& op : kOps) {
      auto call = [&]() -> Status {
        if (op == "all_gather") return c.all_gather(bytes(in, block), bytes(out, whole));
        if (op == "reduce_scatter") return c.reduce_scatter_sum(floats(in, whole), floats(out, block));
        if (op == "all_reduce") return c.all_reduce_sum(floats(in, whole));
        if (op == "all_to_all") return c.all_to_all(bytes(in, whole), bytes(out, whole));
        return c.all_to_allv(bytes(vin, send_total), send, bytes(vout, recv_total), recv);
      };
      for (int i = 0; i < o.warmup; ++i)
        if (Status s = call(); !s.is_ok()) return std::fprintf(stderr, "rank %d %s: %s\n", rank, op.c_str(), s.to_string().c_str()), 1;
      if (Status s = c.barrier(); !s.is_ok()) return 1;
      const auto t0 = std::chrono::steady_clock::now();
      for (int i = 0; i < o.iters; ++i)
        if (Status s = call(); !s.is_ok()) return std::fprintf(stderr, "rank %d %s: %s\n", rank, op.c_str(), s.to_string().c_str()), 1;
      const double us = std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count() / o.iters;
      std::printf("RESULT %s %zu %.3f\n", op.c_str(), op == "all_to_allv" ? send_total : whole, us);
      std::fflush(stdout);
    }
  }
  std::printf("DONE\n");
  std::fflush(stdout);
  return 0;
}

int run_group(const CollectivesOptions& o) {
  for (const std::string& s : {o.min_bytes, o.max_bytes})
    if (auto b = parse_bytes(s); !b.is_ok()) return std::fprintf(stderr, "k3-bench collectives: %s\n", b.status().to_string().c_str()), 2;
  if (o.factor < 2) return std::fprintf(stderr, "k3-bench collectives: --factor must be >= 2\n"), 2;
  if (!decode::nccl_built()) return std::fprintf(stderr, "k3-bench collectives: this build has no NCCL\n"), 2;
  auto args = [&](int r, const std::string& ep) {
    return std::vector<std::string>{"collectives", "--child-rank", std::to_string(r), "--endpoint", ep, "--gpus",
                                    std::to_string(o.gpus), "--min-bytes", o.min_bytes, "--max-bytes", o.max_bytes,
                                    "--factor", std::to_string(o.factor), "--iters", std::to_string(o.iters),
                                    "--warmup", std::to_string(o.warmup)};
  };
  auto started = start_rank_children(o.gpus, args);
  if (!started.is_ok()) return std::fprintf(stderr, "k3-bench collectives: %s\n", started.status().to_string().c_str()), 1;
  // (op, size) -> the slowest rank's time
  std::map<std::pair<std::string, size_t>, double> slowest;
  std::vector<std::pair<std::string, size_t>> order;
  bool failed = false;
  for (auto& r : *started) {
    for (;;) {
      auto line = r->read_line(std::chrono::seconds(300));
      if (!line) {
        failed = true;
        break;
      }
      if (*line == "DONE") break;
      char op[32];
      size_t size = 0;
      double us = 0;
      if (std::sscanf(line->c_str(), "RESULT %31s %zu %lf", op, &size, &us) != 3) continue;
      const auto key = std::make_pair(std::string(op), size);
      if (!slowest.count(key)) order.push_back(key);
      slowest[key] = std::max(slowest[key], us);
    }
  }
  for (auto& r : *started)
    if (!r->wait_exit(std::chrono::seconds(30)) || !WIFEXITED(r->wait_status()) || WEXITSTATUS(r->wait_status()) != 0)
      failed = true;
  if (failed || order.empty())
    return std::fprintf(stderr, "k3-bench collectives: a rank failed (its error is above)\n"), 1;
  const int n = o.gpus;
  std::printf("# k3 NcclComm, %d GPU(s), one process each, %d iterations after %d warm-up; time = slowest rank\n", n,
              o.iters, o.warmup);
  std::printf("%-15s %12s %12s %12s %12s\n", "op", "size_B", "time_us", "algbw_GB/s", "busbw_GB/s");
  for (const auto& key : order) {
    const double us = slowest[key], alg = double(key.second) / us / 1e3;
    const double f = key.first == "all_reduce" ? 2.0 * (n - 1) / n : double(n - 1) / n;
    std::printf("%-15s %12zu %12.2f %12.2f %12.2f\n", key.first.c_str(), key.second, us, alg, alg * f);
  }
  return 0;
}

}  // namespace

void add_collectives_command(CLI::App& app) {
  auto opt = std::make_shared<CollectivesOptions>();
  auto* cmd = app.add_subcommand("collectives", "bandwidth of the NCCL collectives of a GPU decode group, one process "
                                                "per GPU, in nccl-tests' columns");
  cmd->add_option("--gpus", opt->gpus, "GPUs = rank processes")->check(CLI::Range(1, 64));
  cmd->add_option("--min-bytes", opt->min_bytes, "smallest size (K, M, G suffixes; default 1K)");
  cmd->add_option("--max-bytes", opt->max_bytes, "largest size (default 256M)");
  cmd->add_option("--factor", opt->factor, "size step (default 4)");
  cmd->add_option("--iters", opt->iters, "timed calls per size")->check(CLI::PositiveNumber);
  cmd->add_option("--warmup", opt->warmup, "untimed calls first")->check(CLI::NonNegativeNumber);
  cmd->add_option("--child-rank", opt->child_rank)->group("");
  cmd->add_option("--endpoint", opt->endpoint)->group("");
  cmd->callback([opt] {
    const int rc = opt->child_rank >= 0 ? run_child(*opt) : run_group(*opt);
    if (rc != 0) throw CLI::RuntimeError(rc);
  });
}

}  // namespace k3::bench
