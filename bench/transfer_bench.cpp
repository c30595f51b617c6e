// k3-bench transfer: in one run, over loopback,
//  1. ucx_perftest -t ucp_put_bw (server + client started here) for each message size;
//  2. our write path (UcxWriter: ucp_put_nbx + endpoint flush per write, i.e. one request's
//     completion semantics; --lists-in-flight N keeps N lists posted, each with its own flush) into a
//     registered region of a child process, same sizes;
//  3. the fixed cost of one request's protocol round trip through the real drivers:
//     COMPUTE_DONE -> ADDRS -> puts (tiny model) + flush -> TRANSFER_DONE -> decode ready -> TOKENS
//     (transfer_round_trip.cpp).
// Prints both bandwidths and their ratio per size, then the round-trip percentiles.
#include <dlfcn.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <optional>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "bench/bench_commands.h"
#include "bench/child_pipe.h"
#include "bench/transfer_round_trip.h"
#include "common/core/free_port.h"
#include "prefill_node/source_arena_size.h"
#include "transfer/ucx_writer.h"
#ifdef K3_TRANSFER_HAVE_CUDA
#include "transfer/cuda/cuda_memory.h"
#endif

namespace k3::bench {
namespace {

using namespace k3::transfer;
using Clock = std::chrono::steady_clock;

#ifndef K3_UCX_PERFTEST
#define K3_UCX_PERFTEST "ucx_perftest"
#endif

struct Options {
  std::vector<size_t> sizes;
  size_t bytes_per_size = size_t{512} << 20;  // iterations = this / size, clamped
  int rt_iters = 300;
  std::string perftest = K3_UCX_PERFTEST;  // the perftest of the UCX we link
  std::string memory = "host";  // where source and destination live: host | cuda (both sides)
  size_t writes_per_flush = 1;    // RemoteWrites per write() call (one flush each)
  size_t lists_in_flight = 1;     // write lists posted before the oldest one's flush is waited for
  size_t repeats = 1;             // perftest and ours measured this many times each, alternately; medians shown
  // Every put of a list copies the same source range to the same destination range, as perftest's
  // puts all use its one buffer: the bytes touched are then those of one put (16 MiB puts stay in the
  // GPU's L2), where distinct ranges stream writes_per_flush times as many through device memory.
  bool same_range = false;
  bool no_batch_hint = false;  // puts without UCP_OP_ATTR_FLAG_MULTI_SEND (WriterOptions::batch_hint)
  int64_t busy_poll_us = -1;   // WriterOptions::busy_poll; -1: k3-prefill's default for the memory
  bool peer_errors = false;  // diagnostic: drops puts to tcp (~0.2 GB/s) on UCX 1.13 and 1.22
  // Diagnostics for --memory cuda (docs/PERF.md, "Device memory"): create each process's UCX context before
  // its CUDA context (the old order), and put without the source registration's memory handle.
  bool ucx_before_cuda = false;
  bool no_source_memh = false;
};

size_t iters_for(const Options& o, size_t size) {
  return std::clamp<size_t>(o.bytes_per_size / size, 20, 5000);
}

// The folder of the libucp this binary loaded: ucx_perftest runs against the same UCX (the wheel's
// perftest finds its libraries only through the loader path).
std::string loaded_ucx_libdir() {
  Dl_info info{};
  if (::dladdr(reinterpret_cast<void*>(&ucp_get_version), &info) == 0 || !info.dli_fname) return {};
  std::string path = info.dli_fname;
  const auto slash = path.rfind('/');
  return slash == std::string::npos ? std::string() : path.substr(0, slash);
}

// ucx_perftest put bandwidth in GB/s (1e9 B/s), or nullopt when it could not run.
std::optional<double> perftest_put_bw(const Options& o, size_t size) {
  const int port = free_tcp_port();
  const std::string n = std::to_string(iters_for(o, size));
  const std::string s = std::to_string(size), p = std::to_string(port);
  if (const std::string dir = loaded_ucx_libdir(); !dir.empty()) {
    const char* old = std::getenv("LD_LIBRARY_PATH");
    if (!old || std::string(old).rfind(dir, 0) != 0)
      ::setenv("LD_LIBRARY_PATH", (dir + (old && *old ? ":" + std::string(old) : "")).c_str(), 1);
  }
  std::fflush(nullptr);
  pid_t server = ::fork();
  if (server == 0) {
    ::prctl(PR_SET_PDEATHSIG, SIGKILL);
    std::freopen("/dev/null", "w", stdout);
    std::freopen("/dev/null", "w", stderr);
    ::execlp(o.perftest.c_str(), o.perftest.c_str(), "-t", "ucp_put_bw", "-s", s.c_str(), "-n", n.c_str(), "-p",
             p.c_str(), "-m", o.memory.c_str(), static_cast<char*>(nullptr));
    ::_exit(127);
  }
  std::optional<double> bw;
  for (int attempt = 0; attempt < 20 && !bw; ++attempt) {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    const std::string cmd = o.perftest + " 127.0.0.1 -t ucp_put_bw -s " + s + " -n " + n + " -p " + p + " -m " + o.memory + " 2>/dev/null";
    FILE* f = ::popen(cmd.c_str(), "r");
    if (!f) break;
    char line[1024];
    while (std::fgets(line, sizeof line, f)) {
      if (std::strncmp(line, "Final:", 6) != 0) continue;
      std::istringstream in(line + 6);
      double iters, p50, avg, overall, bw_avg, bw_overall;
      if (in >> iters >> p50 >> avg >> overall >> bw_avg >> bw_overall) bw = bw_overall * 1048576.0 / 1e9;
    }
    ::pclose(f);
  }
  ::kill(server, SIGKILL);
  ::waitpid(server, nullptr, 0);
  return bw;
}

// --- our path: a child process owns a registered region and sleeps on progress ----------------
struct Target {
  pid_t pid = -1;
  std::vector<uint8_t> worker_address, rkey;
  uint64_t base = 0, length = 0;
};

// Registers the bench's destination/source region: host memory allocated by UCX (a shared-memory segment
// on one host, as the decode pools are), or device memory (cudaMalloc + registration, reached over cuda_ipc).
struct Region {
  std::unique_ptr<UcxMemory> mem;
#ifdef K3_TRANSFER_HAVE_CUDA
  std::unique_ptr<CudaBuffer> device;
#endif
};
Result<Region> make_region(const std::shared_ptr<UcxContext>& ctx, size_t bytes, bool cuda) {
  Region r;
  if (!cuda) {
    K3_ASSIGN_OR_RETURN(r.mem, UcxMemory::allocate(ctx, bytes));
    return r;
  }
#ifdef K3_TRANSFER_HAVE_CUDA
  if (!ctx->supports(MemoryType::Cuda)) return unsupported("--memory cuda: this UCX has no CUDA transport loaded");
  K3_ASSIGN_OR_RETURN(r.device, CudaBuffer::create(bytes));
  K3_TRY(r.device->fill(0x3C));
  K3_ASSIGN_OR_RETURN(r.mem, UcxMemory::map(ctx, r.device->data(), bytes, MemoryType::Cuda));
  return r;
#else
  return unsupported("--memory cuda needs a CUDA build (-DK3_CUDA=ON)");
#endif
}

// With device memory the CUDA context is made current before the UCX context, as ucx_perftest does.
Status cuda_context_first(bool cuda, bool ucx_before_cuda) {
  if (ucx_before_cuda) return Status::ok();
  return prepare_memory_type(cuda ? MemoryType::Cuda : MemoryType::Host, 0, "--memory cuda");
}

[[noreturn]] void run_target(int out_fd, size_t bytes, bool cuda, bool ucx_before_cuda) {
  if (Status s = cuda_context_first(cuda, ucx_before_cuda); !s.is_ok()) {
    std::fprintf(stderr, "transfer bench target: %s\n", s.to_string().c_str());
    ::_exit(1);
  }
  auto ctx = UcxContext::create(UCP_FEATURE_RMA | UCP_FEATURE_TAG).value();
  auto worker = UcxWorker::create(ctx).value();
  auto region = make_region(ctx, bytes, cuda);
  if (!region.is_ok()) {
    std::fprintf(stderr, "transfer bench target: %s\n", region.status().to_string().c_str());
    ::_exit(1);
  }
  auto& mem = region->mem;
  uint64_t base = reinterpret_cast<uint64_t>(mem->base()), len = mem->length();
  if (!send_blob(out_fd, worker->address()) || !send_blob(out_fd, mem->packed_rkey().value()) ||
      !write_all(out_fd, &base, 8) || !write_all(out_fd, &len, 8))
    ::_exit(1);
  // Serve (sleeping on the event fd) until the parent kills us; PR_SET_PDEATHSIG covers a parent crash.
  for (;;) (void)worker->wait_until([] { return false; }, std::chrono::milliseconds(1000));
}

std::optional<Target> start_target(size_t bytes, bool cuda, bool ucx_before_cuda) {
  int fds[2];
  if (::pipe(fds) != 0) return std::nullopt;
  std::fflush(nullptr);
  pid_t pid = ::fork();
  if (pid == 0) {
    ::prctl(PR_SET_PDEATHSIG, SIGKILL);
    ::close(fds[0]);
    run_target(fds[1], bytes, cuda, ucx_before_cuda);
  }
  ::close(fds[1]);
  Target t;
  t.pid = pid;
  bool ok = recv_blob(fds[0], t.worker_address) && recv_blob(fds[0], t.rkey) && read_all(fds[0], &t.base, 8) &&
            read_all(fds[0], &t.length, 8);
  ::close(fds[0]);
  if (!ok) {
    ::kill(pid, SIGKILL);
    ::waitpid(pid, nullptr, 0);
    return std::nullopt;
  }
  return t;
}


int run(const Options& o) {
  const size_t max_size = *std::max_element(o.sizes.begin(), o.sizes.end());
  // Both regions hold writes_per_flush runs of the largest size (up to 1 GiB), so every size is timed with
  // the same number of puts per flush.
  const size_t region_bytes = std::max(max_size, std::min(max_size * o.writes_per_flush, size_t{1} << 30));
  const bool cuda = o.memory == "cuda";
  // Children are forked before this process touches CUDA (a forked CUDA context is unusable): the
  // target first, then the round trip's decode child; the write path last.
  auto target = start_target(region_bytes, cuda, o.ucx_before_cuda);  // the target sleeps on its event fd, like a decode rank
  if (!target) {
    std::fprintf(stderr, "transfer bench: could not start the target process\n");
    return 1;
  }
  struct Reap {
    pid_t pid;
    ~Reap() {
      ::kill(pid, SIGKILL);
      ::waitpid(pid, nullptr, 0);
    }
  } reap{target->pid};
  // A failed round trip is reported (exit status 1) but does not hide the bandwidth table.
  int rc = 0;
  auto rt = protocol_round_trip(o.rt_iters);
  if (!rt.is_ok() || rt->empty()) {
    std::fprintf(stderr, "protocol round trip failed: %s\n",
                 rt.is_ok() ? "no requests timed" : rt.status().to_string().c_str());
    rc = 1;
  } else {
    auto pct = [&](double q) { return (*rt)[std::min(rt->size() - 1, size_t(q * rt->size()))]; };
    std::printf("protocol round trip COMPUTE_DONE->ADDRS->puts+flush->TRANSFER_DONE->TOKENS (%zu requests): "
                "p50 %.0f us, p90 %.0f us, p99 %.0f us\n",
                rt->size(), pct(0.5), pct(0.9), pct(0.99));
  }
  // The writer's data-plane context as the prefill driver makes it (ucx_prefill_driver.cpp): no peer
  // error mode, so UCX keeps shared-memory RMA (docs/PERF.md).
  if (Status s = cuda_context_first(cuda, o.ucx_before_cuda); !s.is_ok()) {
    std::fprintf(stderr, "transfer bench: %s\n", s.to_string().c_str());
    return 1;
  }
  auto ctx = UcxContext::create(UCP_FEATURE_RMA | UCP_FEATURE_TAG).value();
  auto worker = UcxWorker::create(ctx).value();
  auto ep = worker->connect(target->worker_address, o.peer_errors).value();
  auto rkey = RemoteKey::unpack(ep, target->rkey, target->base, target->length).value();
  std::shared_ptr<const SourceReader> reader = std::make_shared<HostSourceReader>();
#ifdef K3_TRANSFER_HAVE_CUDA
  if (cuda) reader = std::make_shared<CudaSourceReader>();
#endif
  WriterOptions wopts;
  wopts.batch_hint = !o.no_batch_hint;
  wopts.busy_poll =
      std::chrono::microseconds(o.busy_poll_us >= 0 ? o.busy_poll_us : prefill::default_transfer_busy_poll_us(cuda));
  auto writer = UcxWriter::create(worker, reader, wopts).value();
  // The source is registered once too, as a prefill stage registers its KV pool.
  auto src_region = make_region(ctx, region_bytes, cuda);  // per * size <= region_bytes below
  if (!src_region.is_ok()) {
    std::fprintf(stderr, "transfer bench: %s\n", src_region.status().to_string().c_str());
    return 1;
  }
  const uint8_t* src = src_region->mem->base();
  const UcxMemory* src_reg = o.no_source_memh ? nullptr : src_region->mem.get();

  std::printf("%-10s %8s %14s %14s %8s%s\n", "size", "iters", "perftest GB/s", "k3 GB/s", "ratio",
              o.repeats > 1 ? "   perftest min-max   k3 min-max" : "");
  for (size_t size : o.sizes) {
    const size_t iters = iters_for(o, size);
    // writes_per_flush runs of `size` bytes (distinct source and destination ranges) per write() call.
    const size_t per = std::max<size_t>(1, std::min(o.writes_per_flush, target->length / size));
    std::vector<RemoteWrite> w;
    for (size_t k = 0; k < per; ++k) {
      const size_t at = o.same_range ? 0 : k * size;
      w.push_back({src + at, target->base + at, size});
    }
    for (int i = 0; i < 3; ++i) (void)writer->write(*rkey, w, {}, src_reg);
    const size_t calls = std::max<size_t>(1, iters / per);
    // One timed pass of `calls` write lists; GB/s, or nullopt after a failed write.
    auto measure_ours = [&]() -> std::optional<double> {
      // Up to lists_in_flight lists posted at once: the next one's puts go while the oldest one's flush
      // completes, as perftest's puts never wait for a flush (1: post, then wait, as write() does).
      std::deque<std::unique_ptr<UcxWriter::InFlight>> flying;
      auto finish_oldest = [&] {
        const Status s = writer->wait(*flying.front());
        flying.pop_front();
        if (!s.is_ok()) std::fprintf(stderr, "write: %s\n", s.to_string().c_str());
        return s.is_ok();
      };
      const auto t0 = Clock::now();
      for (size_t i = 0; i < calls; ++i) {
        if (flying.size() >= o.lists_in_flight && !finish_oldest()) return std::nullopt;
        auto list = writer->post(*rkey, w, {}, src_reg);
        if (!list.is_ok()) {
          std::fprintf(stderr, "write: %s\n", list.status().to_string().c_str());
          return std::nullopt;
        }
        flying.push_back(std::move(list).value());
      }
      while (!flying.empty())
        if (!finish_oldest()) return std::nullopt;
      const double secs = std::chrono::duration<double>(Clock::now() - t0).count();
      return double(size) * per * calls / secs / 1e9;
    };
    // Alternating the two keeps a slow spell of the machine from landing on one side only.
    std::vector<double> refs, ourss;
    for (size_t r = 0; r < o.repeats; ++r) {
      if (auto ref = perftest_put_bw(o, size)) refs.push_back(*ref);
      auto ours = measure_ours();
      if (!ours) return 1;
      ourss.push_back(*ours);
    }
    auto median = [](std::vector<double> v) {
      std::sort(v.begin(), v.end());
      return v.size() % 2 ? v[v.size() / 2] : (v[v.size() / 2 - 1] + v[v.size() / 2]) / 2;
    };
    const double ours = median(ourss), ref = refs.empty() ? 0 : median(refs);
    char name[32];
    if (size >= (1u << 20)) std::snprintf(name, sizeof name, "%zu MiB", size >> 20);
    else std::snprintf(name, sizeof name, "%zu KiB", size >> 10);
    char spread[96] = "";
    if (o.repeats > 1 && !refs.empty())
      std::snprintf(spread, sizeof spread, "   %7.1f-%-7.1f   %7.1f-%-7.1f", *std::min_element(refs.begin(), refs.end()),
                    *std::max_element(refs.begin(), refs.end()), *std::min_element(ourss.begin(), ourss.end()),
                    *std::max_element(ourss.begin(), ourss.end()));
    if (!refs.empty())
      std::printf("%-10s %8zu %14.2f %14.2f %8.2f%s\n", name, iters, ref, ours, ours / ref, spread);
    else
      std::printf("%-10s %8zu %14s %14.2f %8s\n", name, iters, "n/a", ours, "n/a");
    std::fflush(stdout);
  }
  return rc;
}

}  // namespace

void add_transfer_command(CLI::App& app) {
  auto opts = std::make_shared<Options>();
  auto* cmd = app.add_subcommand("transfer", "ucx_perftest vs our UCX write path over loopback, and the "
                                             "protocol round trip's fixed cost");
  cmd->add_option("--sizes", opts->sizes, "message sizes in bytes (default 4 KiB .. 64 MiB, x4 steps)");
  cmd->add_option("--bytes-per-size", opts->bytes_per_size, "bytes moved per size (sets iterations)");
  cmd->add_option("--rt-iters", opts->rt_iters, "requests timed for the round trip");
  cmd->add_option("--perftest", opts->perftest, "ucx_perftest binary");
  cmd->add_option("--memory", opts->memory, "where both sides' buffers live: host (UCX-allocated) or cuda "
                                            "(device memory, cuda_ipc between the processes)")
      ->check(CLI::IsMember({"host", "cuda"}));
  cmd->add_option("--writes-per-flush", opts->writes_per_flush,
                  "puts of one size per write() call, i.e. per endpoint flush (a request's plan is one list)")
      ->check(CLI::PositiveNumber);
  cmd->add_option("--lists-in-flight", opts->lists_in_flight,
                  "write lists posted before the oldest one's flush is waited for (default 1: each write() waits "
                  "for its own flush)")
      ->check(CLI::PositiveNumber);
  cmd->add_option("--repeats", opts->repeats,
                  "measure perftest and ours this many times each, alternately, and print the medians with "
                  "their min-max (default 1)")
      ->check(CLI::PositiveNumber);
  cmd->add_flag("--same-range", opts->same_range,
                "every put of a list copies the same range (perftest's footprint: one put's bytes) instead of "
                "writes-per-flush distinct ranges");
  cmd->add_option("--busy-poll-us", opts->busy_poll_us,
                  "the writer's wait progresses without sleeping for up to this many microseconds before it "
                  "sleeps on the event fd (default: k3-prefill's, 1000 with --memory cuda, 0 with host memory)")
      ->check(CLI::NonNegativeNumber);
  cmd->add_flag("--no-batch-hint", opts->no_batch_hint,
                "put without UCX's batch hint (UCP_OP_ATTR_FLAG_MULTI_SEND; diagnostic: the earlier puts)");
  cmd->add_flag("--peer-errors", opts->peer_errors, "writer endpoint with UCP_ERR_HANDLING_MODE_PEER (diagnostic)");
  cmd->add_flag("--ucx-before-cuda", opts->ucx_before_cuda,
                "--memory cuda: create each process's UCX context before its CUDA context (diagnostic: the old order)");
  cmd->add_flag("--no-source-memh", opts->no_source_memh,
                "put without the source registration's memory handle (diagnostic: UCX detects each source)");
  cmd->callback([opts] {
    if (opts->sizes.empty())
      for (size_t s = size_t{4} << 10; s <= (size_t{64} << 20); s *= 4) opts->sizes.push_back(s);
    const int rc = run(*opts);
    if (rc != 0) throw CLI::RuntimeError(rc);
  });
}

}  // namespace k3::bench
