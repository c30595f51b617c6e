// A decode instance's transfer endpoint: runs the lazy-alloc DecodeSide against real sockets and
// memory. It owns one registered pool region per rank of its group (mapped once with ucp_mem_map,
// published with packed rkeys in its REGISTER), a ControlServer for the prefill stages and a
// ControlClient to the router, and executes the state machine's actions.
//
// A rank of the group may own its region in its own process (a decode rank group, docs/RANKS.md): the
// rank maps it with its own UCX worker and hands this driver a MemoryRegion (base, length, packed rkey,
// its worker's address); the driver keeps only that rank's RankPool (the bookkeeping of pages and slots)
// and lists the region, with its worker, in the REGISTER, so prefill writes straight into that process.
// Host pools are allocated by UCX (UcxMemory::allocate) so that writers on the same host reach them
// through shared memory. Device pools (pool_memory Cuda: the decode engine's caches on a GPU) are one
// cudaMalloc per region, registered once; writers on the same host reach them over cuda_ipc.
#pragma once
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "transfer/lazy_alloc_decode.h"
#include "transfer/ucx_driver_common.h"
#include "transfer/ucx_memory.h"
#include "transfer/zmq_channel.h"

namespace k3::transfer {

struct DecodeDriverConfig {
  DecodeSideConfig side;                 // instance id, model layout, KDA slicing, timeouts
  std::vector<uint32_t> ranks;           // global ranks of the group this process serves
  // Further regions of ranks[0] (region ids, not ranks), each able to hold whole requests: a request is
  // allocated in ranks[0]'s own region or in one of these (DecodeSideConfig::region_order picks). An EP
  // group's members each own one, so prefill writes a request straight into the rank that will decode it.
  std::vector<uint32_t> alternate_regions;
  // Regions that other processes own (region_id = the rank or the alternate, worker_address set); every
  // other region is allocated here. Each must have the length of its geometry.
  std::vector<protocol::MemoryRegion> hosted_elsewhere;
  uint32_t page_size = 16;
  uint32_t num_pages = 64;               // per rank
  uint32_t num_slots = 4;                // per rank
  uint8_t poison = 0xEE;                 // fill of fresh pool memory (tests detect unwritten bytes)
  // Where the regions this process allocates live. Cuda: device memory of cuda_device (CUDA builds with a
  // CUDA-aware UCX only; refused otherwise, naming why). memory() then spans device memory, which only the
  // engine's kernels may touch.
  MemoryType pool_memory = MemoryType::Host;
  int cuda_device = 0;
  protocol::CompatInfo compat;
  std::string bind_endpoint = "tcp://127.0.0.1:*";
  // The host peers dial this process at, announced in its REGISTER (control_endpoint) with the bound
  // port; empty: the bound host, refused when that is a wildcard (transfer/advertise_endpoint.h).
  std::string advertise_host;
  std::string router_endpoint;           // empty: no router connection (the host injects CLAIMs)
  HeartbeatConfig heartbeat;
  std::optional<ControlKeys> control_keys;  // CURVE on both sockets; nullopt = plaintext (opt-out)
  std::string ucx_net_devices;           // UCX_NET_DEVICES for the data plane (e.g. "lo"); empty = UCX's choice
  StateHook on_state;                    // may be empty
};

class DecodeDriver {
 public:
  static Result<std::unique_ptr<DecodeDriver>> create(DecodeDriverConfig cfg, zmq::context_t& zctx,
                                                      protocol::MetricsRegistry* metrics);
  ~DecodeDriver();

  // Connects to the router (DecodeDriverConfig::router_endpoint; nothing without one). The router takes the
  // node as up from its first heartbeat on, so the host calls this once it can serve: a decode rank whose
  // engine is built after the driver (its caches live in the driver's region) would otherwise go silent for
  // the whole build (seconds on a GPU) and be taken for dead.
  Status connect_router();

  const std::string& endpoint() const { return server_->endpoint(); }
  // Where peers reach the control socket (the REGISTER's control_endpoint): endpoint() with the
  // advertised host.
  const std::string& advertised_endpoint() const { return reg_.control_endpoint; }
  // One round of the event loop: sleeps up to `max_wait` on the sockets and the UCX event fd,
  // applies what arrived and the timers. Returns every action the state machine emitted (already
  // executed: messages sent, memory released by the pool handles).
  Result<Actions> step(Millis max_wait);
  // Applies a locally originated input (e.g. on_finished, an injected ABORT) and executes its actions.
  Actions apply(const std::function<Actions(DecodeSide&, Millis)>& input);

  // Stops taking work for good (the process is about to leave, e.g. its rank group failed): CLAIMs are
  // refused with `why`, and prefill stages get no REGISTER (the regions it lists may be gone with their
  // processes). Requests already here still end through the state machine.
  void close_to_new_requests(std::string why) { closed_why_ = std::move(why); }

  // Sends a message to the router (e.g. TOKENS once a ready request produced its first token).
  Status send_to_router(const protocol::Message& m);
  // Sends the control heartbeats that are due (to the prefill stages and the router) and reads nothing:
  // for a host computing for longer than a heartbeat interval between polls (a rank group's step).
  void heartbeat_if_due();

  DecodeSide& side() { return *side_; }
  // By region id: a rank's own region has the rank's id.
  RankPool& pool(uint32_t region) { return *pools_.at(region).pool; }
  // The region's registered pool bytes (host: allocated by UCX, a shared-memory segment on one host;
  // device memory when pool_memory is Cuda); empty for a region another process owns (hosted_elsewhere).
  std::span<uint8_t> memory(uint32_t region) {
    auto& m = pools_.at(region).mem;
    if (!m) return {};
    return {m->base(), m->length()};
  }
  const std::vector<uint32_t>& ranks() const { return cfg_.ranks; }
  // Every region's id: the ranks' own, then the alternates.
  std::vector<uint32_t> regions() const;
  const protocol::Register& registration() const { return reg_; }

 private:
  struct RankRegion {
    std::shared_ptr<void> device;     // the device allocation under mem (pool_memory Cuda); freed after mem
    std::unique_ptr<UcxMemory> mem;   // null when another process owns the region
    std::unique_ptr<RankPool> pool;
  };
  DecodeDriver(DecodeDriverConfig cfg, protocol::MetricsRegistry* m) : cfg_(std::move(cfg)), metrics_(m) {}
  void execute(const Actions& actions);
  void on_message(const ControlEvent& e, bool from_router, Actions& out);
  void note_states(const Actions& actions);
  void note_request(uint64_t request_id);
  void acknowledge_claim(const protocol::Claim& claim, const Actions& actions);
  bool send_to(const Peer& p, const protocol::Message& m);  // false: not sent (logged)

  DecodeDriverConfig cfg_;
  protocol::MetricsRegistry* metrics_;
  std::shared_ptr<UcxContext> ctx_;
  std::shared_ptr<UcxWorker> worker_;
  std::map<uint32_t, RankRegion> pools_;   // by region id
  std::unique_ptr<DecodeSide> side_;
  std::unique_ptr<ControlServer> server_;
  std::unique_ptr<ControlClient> router_;
  ControlOptions router_options_;   // connect_router()'s (the server's name, heartbeat and keys)
  zmq::context_t* zctx_ = nullptr;
  protocol::Register reg_;
  std::map<uint64_t, protocol::RequestState> seen_;  // last state reported to on_state
  std::set<std::string> peers_heard_;                // prefill stages that spoke to this incarnation
  std::string closed_why_;                           // set: no new requests (close_to_new_requests)
};

}  // namespace k3::transfer
