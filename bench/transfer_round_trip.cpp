// The protocol round trip of `k3-bench transfer` (transfer_round_trip.h): this process is the router and
// the single prefill stage, a forked child the decode instance.
#include "bench/transfer_round_trip.h"

#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <string>
#include <vector>

#include "bench/child_pipe.h"
#include "transfer/ucx_decode_driver.h"
#include "transfer/ucx_prefill_driver.h"

namespace k3::bench {
namespace {

using namespace k3::transfer;
using Clock = std::chrono::steady_clock;

CacheLayout tiny_model() {
  CacheLayout m;
  m.layers = {LayerCache::Kda, LayerCache::Mla};
  m.mla_row_bytes = 64;
  m.kda_heads = 8;
  m.kda_conv_rows = 3;
  m.kda_conv_head_bytes = 8;
  m.kda_state_head_bytes = 64;
  return m;
}

protocol::CompatInfo compat_for(std::vector<uint32_t> pp) {
  protocol::CompatInfo c;
  c.model_hash = 1;
  c.page_size = 16;
  c.layout.pp_partition = std::move(pp);
  return c;
}

// The decode instance of the round trip. Reads the router's endpoint from `in_fd`, reports its own bound
// endpoint on `out_fd` (it binds a port of its own choosing: no race for a port picked in advance).
[[noreturn]] void run_decode_child(int in_fd, int out_fd) {
  std::vector<uint8_t> router_ep;
  if (!recv_blob(in_fd, router_ep)) ::_exit(1);
  const std::string router_endpoint(router_ep.begin(), router_ep.end());
  DecodeDriverConfig cfg;
  cfg.side = {.instance_id = "d", .model = tiny_model(), .kda_head_sliced = true, .timeouts = {}};
  cfg.ranks = {0};
  cfg.page_size = 16;
  cfg.num_pages = 16;
  cfg.num_slots = 2;
  cfg.compat = compat_for({});
  cfg.router_endpoint = router_endpoint;  // bind_endpoint: the default tcp://127.0.0.1:* (no port race)
  zmq::context_t zctx;
  auto d = DecodeDriver::create(cfg, zctx, nullptr);
  if (d.is_ok()) {
    if (Status s = (*d)->connect_router(); !s.is_ok()) d = s;
  }
  if (!d.is_ok()) {
    std::fprintf(stderr, "round trip: decode driver: %s\n", d.status().to_string().c_str());
    ::_exit(1);
  }
  if (!send_blob(out_fd, std::vector<uint8_t>((*d)->endpoint().begin(), (*d)->endpoint().end()))) ::_exit(1);
  for (;;) {
    auto actions = (*d)->step(Millis(100));
    if (!actions.is_ok()) ::_exit(1);
    auto& dd = *d;
    for (const Action& a : *actions) {
      if (auto* r = std::get_if<ReadyAction>(&a)) {
        (void)dd->send_to_router(protocol::Tokens{.request_id = r->request_id, .token_ids = {r->first_token}});
        dd->apply([&](DecodeSide& s, Millis now) { return s.on_finished(r->request_id, now); });
      }
    }
  }
}

}  // namespace

// COMPUTE_DONE -> TOKENS of `iters` requests, in microseconds (sorted). The parent is the router and
// the (single) prefill stage; the decode instance is a child process. Nothing spins: the stage sleeps
// in its driver's poll until its writes are flushed and TRANSFER_DONE is sent, then the router sleeps
// in its poll until TOKENS arrives.
Result<std::vector<double>> protocol_round_trip(int iters) {
  // Fork first, while this process has no threads: a child forked after the ZeroMQ context exists
  // inherits locks its I/O threads may hold and can hang before it binds (on the 16-core GPU host this
  // stopped most runs: "the decode child did not start"). The router endpoint goes down a pipe instead.
  int to_child[2], from_child[2];
  if (::pipe(to_child) != 0) return io_error("round trip: pipe");
  if (::pipe(from_child) != 0) {
    ::close(to_child[0]);
    ::close(to_child[1]);
    return io_error("round trip: pipe");
  }
  std::fflush(nullptr);
  pid_t child = ::fork();
  if (child == 0) {
    ::prctl(PR_SET_PDEATHSIG, SIGKILL);
    ::close(to_child[1]);
    ::close(from_child[0]);
    run_decode_child(to_child[0], from_child[1]);
  }
  ::close(to_child[0]);
  ::close(from_child[1]);
  struct Reap {
    pid_t pid;
    int to, from;
    ~Reap() {
      ::close(to);
      ::close(from);
      ::kill(pid, SIGKILL);
      ::waitpid(pid, nullptr, 0);
    }
  } reap{child, to_child[1], from_child[0]};
  const int fds[2] = {from_child[0], -1};
  zmq::context_t zctx;
  ControlOptions ropt;
  ropt.name = "router";
  K3_ASSIGN_OR_RETURN(auto router, ControlServer::bind(zctx, "tcp://127.0.0.1:*", ropt));
  if (!send_blob(to_child[1], std::vector<uint8_t>(router->endpoint().begin(), router->endpoint().end())))
    return Status{Code::Unavailable, "round trip: the decode child exited before it started"};
  std::vector<uint8_t> ep_bytes;
  if (!wait_readable(fds[0], std::chrono::seconds(20)) || !recv_blob(fds[0], ep_bytes))
    return Status{Code::Unavailable, "round trip: the decode child did not start (see its error above)"};
  const std::string decode_ep(ep_bytes.begin(), ep_bytes.end());

  const auto model = tiny_model();
  PrefillDriverConfig cfg;
  cfg.side = {.instance_id = "p", .stage = 0, .model = model, .prefill = {.partition = {2}},
              .decode_kda_head_sliced = true, .timeouts = {}};
  cfg.compat = compat_for({2});
  cfg.decodes = {{.instance = "d", .endpoint = decode_ep}};
  K3_ASSIGN_OR_RETURN(auto prefill, PrefillDriver::create(cfg, zctx, nullptr));
  const auto deadline = Clock::now() + std::chrono::seconds(30);
  while (!(prefill->decode_ready() && router->liveness().alive("decode/d"))) {
    if (Clock::now() > deadline)
      return Status{Code::DeadlineExceeded, std::string("round trip: no ") +
                                                (prefill->decode_ready() ? "decode heartbeat at the router" : "REGISTER from decode") +
                                                " within 30 s"};
    K3_TRY(prefill->step(Millis(10)).status());
    K3_TRY(router->poll(std::chrono::milliseconds(10)).status());
  }
  std::vector<double> us;
  const uint32_t tokens = 16;
  for (int i = 0; i < iters + 10; ++i) {
    const uint64_t id = 1 + i;
    K3_TRY(router->send("decode/d", protocol::encode(protocol::Claim{.request_id = id, .prompt_len = tokens,
                                                                     .decode_ranks = {0}, .prefill_instance = "p",
                                                                     .num_prefill_stages = 1})));
    // CLAIM is off the critical path. As the router does, wait for decode's CLAIM_ACK before the prefill
    // starts: a COMPUTE_DONE that overtakes its CLAIM is ignored by design (lazy_alloc.h) and the request
    // would never end (this bench used to sleep 2 ms instead, and failed when decode was slower).
    bool acked = false;
    const auto ack_give_up = Clock::now() + std::chrono::seconds(10);
    while (!acked) {
      if (Clock::now() > ack_give_up)
        return Status{Code::DeadlineExceeded, "round trip: no CLAIM_ACK for request " + std::to_string(id)};
      K3_ASSIGN_OR_RETURN(auto ev, router->poll(std::chrono::milliseconds(100)));
      for (auto& e : ev) {
        if (e.kind != ControlEventKind::Message) continue;
        auto m = protocol::decode(e.payload);
        if (!m.is_ok()) continue;
        if (auto* a = std::get_if<protocol::ClaimAck>(&m.value()); a && a->request_id == id) {
          if (!a->ok) return Status{Code::Internal, "round trip: decode refused CLAIM " + std::to_string(id) + ": " + a->reason};
          acked = true;
        }
      }
    }
    Actions submitted;
    if (!prefill->submit(protocol::Prefill{.request_id = id, .token_ids = std::vector<int32_t>(tokens, 1),
                                           .decode_instance = "d", .decode_ranks = {0}},
                         submitted))
      return Status{Code::Internal, "round trip: the prefill stage refused request " + std::to_string(id)};
    auto src = pack_stage_source(model, cfg.side.prefill, 0, tokens);
    std::vector<uint8_t> bytes(src.total_bytes, 0x5A);
    const auto t0 = Clock::now();
    const auto give_up = t0 + std::chrono::seconds(10);
    (void)prefill->stage_computed(id, src, std::move(bytes), 7);
    // The stage's part: ADDRS in, puts + flush, TRANSFER_DONE out (all inside step()).
    for (;;) {
      const auto st = prefill->side().state(id);
      if (!st || protocol::is_terminal(*st)) break;
      if (Clock::now() > give_up)
        return Status{Code::DeadlineExceeded, "round trip: request " + std::to_string(id) + " stuck in " +
                                                  protocol::state_name(*st) + " at the prefill stage"};
      K3_TRY(prefill->step(Millis(100)).status());
    }
    bool got = false;
    while (!got) {
      if (Clock::now() > give_up)
        return Status{Code::DeadlineExceeded, "round trip: no TOKENS for request " + std::to_string(id) + " within 10 s"};
      K3_ASSIGN_OR_RETURN(auto ev, router->poll(std::chrono::milliseconds(100)));
      for (auto& e : ev) {
        if (e.kind != ControlEventKind::Message) continue;
        auto m = protocol::decode(e.payload);
        if (m.is_ok())
          if (auto* t = std::get_if<protocol::Tokens>(&m.value())) got |= t->request_id == id;
      }
    }
    const double dt = std::chrono::duration<double, std::micro>(Clock::now() - t0).count();
    if (i >= 10) us.push_back(dt);  // first requests warm the endpoints and caches
  }
  std::sort(us.begin(), us.end());
  return us;
}

}  // namespace k3::bench
