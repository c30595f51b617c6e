// One process of the prefill->decode tests: a decode instance (all ranks of one group) or one
// prefill stage, driven by the real drivers over ZeroMQ + UCX. Prints what the test checks:
//   READY <endpoint>                   decode: its advertised control endpoint; prefill: "-"
//   DECODE_READY <endpoint>            prefill: decode's REGISTER (worker address, rkeys) arrived, with the
//                                      control endpoint it announced
//   STATE <id> <state>                 every state the driver observed
//   VERIFIED <id> <ok> <bytes> <why>   decode: destination bytes checked against the relayout rules
//   ENDED <id> <state> <cause>         the request ended on this side
//   IDLE <free> <capacity>             decode: pool bytes once nothing is live; prefill: <held sources> 0
//   P <prometheus sample>              metrics, printed with IDLE
// Options (key value pairs): role decode|prefill, router EP, decode EP (prefill), layers PATTERN,
// heads H, ranks N, sliced 0|1, bind EP and advertise HOST (decode), partition a,b,c, stage s, hb_ms, misses, compute_wait_ms,
// transfer_wait_ms, addrs_wait_ms, quarantine_ms, die_at STATE, abort_at STATE, stall_at STATE,
// stall_ms MS.
// memory host|cuda: where decode's regions and the stage's source images live (cuda: GPU memory).
// stream 1 (prefill): the stage streams (stream_started, the image filled in place, rows_computed, then
// stream_computed) instead of handing over its exported bytes; arena_bytes N: its source arena (default none).
#include <signal.h>
#include <spdlog/spdlog.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <span>
#include <map>
#include <sstream>
#include <thread>

#include "tests/transfer/pd_scenario.h"
#include "transfer/ucx_decode_driver.h"
#include "transfer/ucx_prefill_driver.h"

#ifdef K3_TRANSFER_HAVE_CUDA
#include <cuda_runtime.h>
#endif

using namespace k3::transfer;
using namespace k3::test::pd;
using k3::protocol::RequestState;

namespace {
std::map<std::string, std::string> args;
std::string arg(const std::string& k, const std::string& def = "") {
  auto it = args.find(k);
  return it == args.end() ? def : it->second;
}
long num(const std::string& k, long def) { return std::stol(arg(k, std::to_string(def))); }

void say(const std::string& s) {
  std::printf("%s\n", s.c_str());
  std::fflush(stdout);
}

void print_metrics(const k3::protocol::MetricsRegistry& m) {
  std::istringstream in(m.prometheus_text());
  std::string line;
  while (std::getline(in, line))
    if (!line.empty() && line[0] != '#') say("P " + line);
}

// Model, dtypes and page size agree cluster-wide; the layout is the role's own.
k3::protocol::CompatInfo compat(std::vector<uint32_t> pp_partition, uint32_t dcp) {
  k3::protocol::CompatInfo c;
  c.model_hash = 42;
  c.page_size = 4;
  c.layout.pp_partition = std::move(pp_partition);
  c.layout.dcp_size = dcp;
  return c;
}

ProtocolTimeouts timeouts() {
  ProtocolTimeouts t;
  t.compute_wait = Millis(num("compute_wait_ms", 20000));
  t.transfer_wait = Millis(num("transfer_wait_ms", 20000));
  t.addrs_wait = Millis(num("addrs_wait_ms", 20000));
  t.quarantine = Millis(num("quarantine_ms", 500));
  return t;
}

HeartbeatConfig heartbeat() { return {std::chrono::milliseconds(num("hb_ms", 100)), static_cast<int>(num("misses", 3))}; }

// Failure injection shared by both roles: die / abort / stall when a request reaches a named state.
struct Injection {
  std::string die_at = arg("die_at"), abort_at = arg("abort_at"), stall_at = arg("stall_at");
  std::vector<uint64_t> pending_aborts;
  void on_state(uint64_t id, RequestState st) {
    const std::string name = k3::protocol::state_name(st);
    say("STATE " + std::to_string(id) + " " + name);
    if (name == die_at) ::kill(::getpid(), SIGKILL);
    if (name == abort_at) pending_aborts.push_back(id);
    if (name == stall_at && num("stall_ms", 0) > 0) std::this_thread::sleep_for(std::chrono::milliseconds(num("stall_ms", 0)));
  }
};

void report_ended(const Actions& actions) {
  for (const Action& a : actions)
    if (auto* e = std::get_if<RequestEndedAction>(&a))
      say("ENDED " + std::to_string(e->request_id) + " " + k3::protocol::state_name(e->state) + " " +
          (e->state == RequestState::Finished ? "-" : k3::protocol::abort_reason_name(e->cause)));
}

bool ended_or_released(const Actions& actions) {
  for (const Action& a : actions)
    if (std::holds_alternative<RequestEndedAction>(a) || std::holds_alternative<ReleasedAction>(a)) return true;
  return false;
}

MemoryType memory_arg() { return arg("memory", "host") == "cuda" ? MemoryType::Cuda : MemoryType::Host; }

// The region's bytes on the host (a GPU region is copied down first), and back to the poison byte.
std::vector<uint8_t> region_bytes(std::span<uint8_t> mem) {
  std::vector<uint8_t> out(mem.size());
#ifdef K3_TRANSFER_HAVE_CUDA
  if (memory_arg() == MemoryType::Cuda) {
    if (cudaMemcpy(out.data(), mem.data(), mem.size(), cudaMemcpyDeviceToHost) != cudaSuccess) std::abort();
    return out;
  }
#endif
  std::copy(mem.begin(), mem.end(), out.begin());
  return out;
}
// Host bytes into a held image (device memory with memory cuda).
void fill_image(uint8_t* dst, const std::vector<uint8_t>& bytes) {
#ifdef K3_TRANSFER_HAVE_CUDA
  if (memory_arg() == MemoryType::Cuda) {
    if (cudaMemcpy(dst, bytes.data(), bytes.size(), cudaMemcpyHostToDevice) != cudaSuccess) std::abort();
    return;
  }
#endif
  std::copy(bytes.begin(), bytes.end(), dst);
}

void repoison(std::span<uint8_t> mem) {
#ifdef K3_TRANSFER_HAVE_CUDA
  if (memory_arg() == MemoryType::Cuda) {
    if (cudaMemset(mem.data(), 0xEE, mem.size()) != cudaSuccess) std::abort();
    return;
  }
#endif
  std::fill(mem.begin(), mem.end(), 0xEE);
}

int run_decode() {
  const auto model = model_from_pattern(arg("layers"), num("heads", 8));
  const uint32_t n = num("ranks", 1);
  const bool sliced = num("sliced", 1) != 0;
  Injection inj;
  DecodeDriverConfig cfg;
  cfg.side = {.instance_id = "d", .model = model, .kda_head_sliced = sliced, .timeouts = timeouts()};
  for (uint32_t r = 0; r < n; ++r) cfg.ranks.push_back(r);
  cfg.page_size = 4;
  cfg.num_pages = 32;
  cfg.num_slots = 2;
  cfg.compat = compat({}, n);
  cfg.router_endpoint = arg("router");
  cfg.bind_endpoint = arg("bind", cfg.bind_endpoint);
  cfg.advertise_host = arg("advertise");
  cfg.heartbeat = heartbeat();
  cfg.on_state = [&](uint64_t id, RequestState st) { inj.on_state(id, st); };
  cfg.pool_memory = memory_arg();
  k3::protocol::MetricsRegistry metrics;
  zmq::context_t zctx;
  auto d_or = DecodeDriver::create(cfg, zctx, &metrics);
  if (!d_or.is_ok()) {
    std::fprintf(stderr, "decode: %s\n", d_or.status().to_string().c_str());
    return 1;
  }
  auto d = std::move(d_or).value();
  if (auto s = d->connect_router(); !s.is_ok()) {
    std::fprintf(stderr, "decode: %s\n", s.to_string().c_str());
    return 1;
  }
  say("READY " + d->advertised_endpoint());
  uint64_t free0 = 0, cap = 0;
  for (uint32_t r : d->ranks()) {
    free0 += d->pool(r).free_bytes();
    cap += d->pool(r).capacity_bytes();
  }
  for (;;) {
    auto step = d->step(Millis(200));
    if (!step.is_ok()) return 1;
    Actions all = std::move(step).value();
    for (uint64_t id : std::exchange(inj.pending_aborts, {})) {
      Actions a = d->apply([&](DecodeSide& s, Millis now) {
        return s.on_abort(k3::protocol::Abort{.request_id = id, .reason = AbortReason::ClientCancelled,
                                              .origin_role = Role::Router}, now);
      });
      all.insert(all.end(), a.begin(), a.end());
    }
    for (const Action& a : Actions(all)) {
      auto* ready = std::get_if<ReadyAction>(&a);
      if (!ready) continue;
      const auto* alloc = d->side().allocation(ready->request_id);
      if (alloc) {
        Verdict total;
        for (uint32_t i = 0; i < n; ++i) {
          auto host = region_bytes(d->memory(i));
          auto v = verify_rank(model, d->pool(i).geometry(), (*alloc)[i], host, i, n, sliced, ready->prompt_len, 0xEE);
          total.bytes_checked += v.bytes_checked;
          if (!v.ok && total.ok) total = {false, total.bytes_checked, v.first_error};
        }
        say("VERIFIED " + std::to_string(ready->request_id) + " " + (total.ok ? "1 " : "0 ") +
            std::to_string(total.bytes_checked) + " " + (total.first_error.empty() ? "-" : total.first_error));
        for (uint32_t i = 0; i < n; ++i) repoison(d->memory(i));  // the next request starts clean
      }
      Actions f = d->apply([&](DecodeSide& s, Millis now) { return s.on_finished(ready->request_id, now); });
      all.insert(all.end(), f.begin(), f.end());
    }
    report_ended(all);
    if (ended_or_released(all) && d->side().num_live() == 0) {
      uint64_t free = 0;
      for (uint32_t r : d->ranks()) free += d->pool(r).free_bytes();
      say("IDLE " + std::to_string(free) + " " + std::to_string(free0));
      print_metrics(metrics);
      (void)cap;
    }
  }
}

int run_prefill() {
  const auto model = model_from_pattern(arg("layers"), num("heads", 8));
  PrefillLayout layout;
  std::stringstream ps(arg("partition"));
  for (std::string x; std::getline(ps, x, ',');) layout.partition.push_back(std::stoul(x));
  const uint32_t stage = num("stage", 0);
  Injection inj;
  PrefillDriverConfig cfg;
  cfg.side = {.instance_id = "p", .stage = stage, .model = model, .prefill = layout,
              .decode_kda_head_sliced = num("sliced", 1) != 0, .timeouts = timeouts()};
  cfg.compat = compat(layout.partition, 1);
  cfg.decodes = {{.instance = "d", .endpoint = arg("decode")}};
  cfg.router_endpoint = arg("router");
  cfg.heartbeat = heartbeat();
  cfg.writer.force_staging = num("staging", 0) != 0;
  cfg.writer.staging_slot_bytes = 256;
  cfg.source_memory = memory_arg();
  cfg.source_arena_bytes = static_cast<size_t>(num("arena_bytes", 0));
  const bool stream = num("stream", 0) != 0;
  PrefillDriver* self = nullptr;
  cfg.on_state = [&](uint64_t id, RequestState st) {
    // At TRANSFERRING the abort must land before the writes: the driver applies it around them.
    if (st == RequestState::Transferring && k3::protocol::state_name(st) == inj.abort_at) {
      say("STATE " + std::to_string(id) + " TRANSFERRING");
      self->inject_abort(id);
      return;
    }
    inj.on_state(id, st);
  };
  k3::protocol::MetricsRegistry metrics;
  zmq::context_t zctx;
  auto p_or = PrefillDriver::create(cfg, zctx, &metrics);
  if (!p_or.is_ok()) {
    std::fprintf(stderr, "prefill: %s\n", p_or.status().to_string().c_str());
    return 1;
  }
  auto p = std::move(p_or).value();
  self = p.get();
  say("READY -");
  bool announced = false;
  for (;;) {
    auto step = p->step(Millis(200));
    if (!step.is_ok()) return 1;
    Actions all = std::move(step->actions);
    if (!announced && p->decode_ready()) {
      announced = true;
      say("DECODE_READY " + p->registered_endpoint("d"));
    }
    for (uint64_t id : std::exchange(inj.pending_aborts, {})) {
      Actions a = p->inject_abort(id);
      all.insert(all.end(), a.begin(), a.end());
    }
    for (const auto& req : step->accepted) {
      if (inj.stall_at == "PREFILLING" && num("stall_ms", 0) == 0) continue;  // never computes
      auto src = pack_stage_source(model, layout, stage, req.token_ids.size());
      auto bytes = fill_source(model, src);
      const bool last = stage + 1 == layout.num_stages();
      const std::optional<int32_t> first = last ? std::optional<int32_t>(7) : std::nullopt;
      if (!stream) {
        Actions a = p->stage_computed(req.request_id, src, std::move(bytes), first);
        all.insert(all.end(), a.begin(), a.end());
        continue;
      }
      // Streaming: the whole image at once, as one chunk.
      Actions a = p->stream_started(req.request_id, src);
      all.insert(all.end(), a.begin(), a.end());
      uint8_t* image = p->stream_buffer(req.request_id);
      if (!image) continue;   // not held: the request was aborted, naming why
      fill_image(image, bytes);
      a = p->rows_computed(req.request_id, static_cast<uint32_t>(req.token_ids.size()));
      all.insert(all.end(), a.begin(), a.end());
      a = p->stream_computed(req.request_id, src, first);
      all.insert(all.end(), a.begin(), a.end());
    }
    // An abort injected at COMPUTE_DONE lands before the next step can bring ADDRS.
    for (uint64_t id : std::exchange(inj.pending_aborts, {})) {
      Actions a = p->inject_abort(id);
      all.insert(all.end(), a.begin(), a.end());
    }
    report_ended(all);
    if (ended_or_released(all) && p->side().num_live() == 0) {
      say("IDLE " + std::to_string(p->sources_held()) + " 0");
      print_metrics(metrics);
    }
  }
}
}  // namespace

int main(int argc, char** argv) {
  spdlog::set_level(spdlog::level::warn);
  for (int i = 1; i + 1 < argc; i += 2) args[argv[i]] = argv[i + 1];
  if (arg("role") == "decode") return run_decode();
  if (arg("role") == "prefill") return run_prefill();
  std::fprintf(stderr, "role decode|prefill required\n");
  return 2;
}
