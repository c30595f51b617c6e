// k3-decode: one decode DP rank (see decode_rank.h for the request flow).
// stdout protocol (one line each, flushed; tests and the launcher read them):
//   READY <endpoint>              the control endpoint prefill stages connect to (--decode-endpoint)
//   STATE <id> <state>            every request state the transfer driver observed
//   DONE <id> <finish> <ids>      a request ended here: finish stop|length|aborted, tokens comma-separated
//   IDLE <free> <capacity>        transfer pool bytes, printed when the last live request ended
// A rank group (--group-dcp N or --group-ep N, docs/RANKS.md) is started as one process per rank:
// rank 0 (the leader: control plane, transfer regions of the group) binds the group's communicator and
// prints "GROUP <endpoint>" before it waits for the others; ranks 1.. are started with that endpoint.
//   IMPORTED <id> <position> <bytes> region|command   a rank took a request: its slice (DCP) or the whole
//                                 request (EP) read from its own transfer region, or sent in the leader's command
//   WAITING <id> <why>            the leader holds a ready request until its ranks have room (why names them)
//   JOINED <id> <rank>            the leader started a request on the group (EP: on that rank; DCP: 0, every rank)
//   GROUP_FAILED <status> + FREE <free pages> <pages> <free slots> <slots>   the group failed (a rank
//                                 died or missed the step deadline); the process then exits with 1
#include <CLI/CLI.hpp>
#include <signal.h>
#include <spdlog/spdlog.h>

#include <atomic>
#include <cstdio>
#include <optional>
#include <sstream>

#include "common/config/config.h"
#include "common/model/weights.h"
#include "common/tokenizer/tokenizer.h"
#include "common/core/parse.h"
#include "common/protocol/metrics_endpoint.h"
#include "decode_node/decode_rank.h"
#include "decode_node/group_collectives.h"
#include "decode_node/group_leader.h"
#include "decode_node/group_member.h"
#include "transfer/comm_ucx.h"
#include "transfer/control_keys.h"
#include "transfer/net_interface.h"

#include "common/core/node_process.h"
#include "common/io/load_progress.h"
#include "kernels/backend_flags.h"

using namespace k3;

namespace {

void say(const std::string& s) { say_line(s); }
int fail(const Status& s) { return fail_status("k3-decode", s); }

// The kernels this rank runs on its registry, and its /metrics where --metrics-listen asked for one
// (printed as METRICS <url>; null without); a rank, a group's leader and its members alike.
Result<std::unique_ptr<protocol::MetricsEndpoint>> serve_metrics(protocol::MetricsRegistry& m, const Backend& be,
                                                                 const std::optional<protocol::ListenAddress>& at) {
  protocol::metric::report_kernels(m, be.name(), be.batch_invariant());
  if (!at) return std::unique_ptr<protocol::MetricsEndpoint>();
  K3_ASSIGN_OR_RETURN(auto endpoint, protocol::MetricsEndpoint::start(*at, m));
  say("METRICS " + endpoint->url());
  return endpoint;
}

// The serving loop of a decode rank or a group leader (same surface): driver events, decode steps,
// the router's heartbeats, DONE / IDLE lines. Returns the error that ended it (ok on a stop signal).
template <class Node>
Status serve(Node& d, const Backend& be, const decode::DecodeRankOptions& o, std::chrono::milliseconds idle_wait,
             const std::optional<protocol::ListenAddress>& metrics_at) {
  const std::atomic<bool>& g_stop = install_stop_signals();
  K3_ASSIGN_OR_RETURN(auto metrics_endpoint, serve_metrics(d.metrics(), be, metrics_at));
  // Peers are told the advertised endpoint (the bound port on a host they can reach), as in the REGISTER.
  say("READY " + d.driver().advertised_endpoint());
  size_t live = 0;
  // The router's admission input, load signal and memory gauges: a HEARTBEAT with the rank's room
  // (capacity and free pages/slots of the transfer pool and the decode cache) and the running batch,
  // right away (the router admits nothing onto this rank before it knows the capacity) and then every
  // heartbeat interval.
  auto last_load = std::chrono::steady_clock::now() - o.heartbeat.interval;
  uint64_t load_seq = 0;
  while (!g_stop) {
    Status run = d.run_once(idle_wait);
    if (!o.router_endpoint.empty() && std::chrono::steady_clock::now() - last_load >= o.heartbeat.interval) {
      last_load = std::chrono::steady_clock::now();
      // A lost heartbeat only delays the gauges: the next one carries the same state.
      (void)d.driver().send_to_router(protocol::Heartbeat{.role = protocol::Role::Decode, .instance_id = o.instance_id,
                                                          .rank = o.rank, .seq = ++load_seq,
                                                          .free_bytes = d.pool_free_bytes(),
                                                          .num_running = static_cast<uint32_t>(d.num_running()),
                                                          .room = d.room()});
    }
    auto done = d.take_finished();
    for (const auto& f : done) {
      std::string ids;
      for (int32_t t : f.tokens) ids += (ids.empty() ? "" : ",") + std::to_string(t);
      const char* why = f.finish == protocol::FinishReason::Stop ? "stop"
                        : f.finish == protocol::FinishReason::Length ? "length" : "aborted";
      say("DONE " + std::to_string(f.request_id) + " " + why + " " + (ids.empty() ? "-" : ids));
    }
    const size_t now_live = d.driver().side().num_live();
    if (live > 0 && now_live == 0)
      say("IDLE " + std::to_string(d.pool_free_bytes()) + " " + std::to_string(d.pool_capacity_bytes()));
    live = now_live;
    // A wait cut short by a stop signal (the group leader's hook) is the stop, not a failure.
    if (!run.is_ok()) return g_stop && run.code() == Code::Aborted ? Status::ok() : run;
  }
  return Status::ok();
}

struct GroupFlags {
  int dcp = 1, ep = 1, rank = 0, kv_partitions = 0;
  std::string endpoint;        // rank 0: where to bind (default tcp://<--interface>:*); others: rank 0's
  int step_deadline_ms = 2000;
  int startup_s = 180;
  decode::GroupCollectives collectives = decode::GroupCollectives::Ucx;
  int size() const { return dcp * ep; }
};

// A rank of a group: forms the communicator, then leads (rank 0) or follows.
int run_group(const GroupFlags& gf, const std::string& interface, decode::DecodeRankOptions& o, Backend& be,
              const ModelConfig& cfg, const WeightStore& weights,
              const std::optional<protocol::ListenAddress>& metrics_at) {
  const RankLayout layout{.dcp = gf.dcp, .ep = gf.ep, .kv_partitions = gf.kv_partitions > 0 ? gf.kv_partitions : gf.dcp,
                          .rank = gf.rank};
  if (Status st = validate_rank_layout(layout, cfg); !st.is_ok()) return fail(st);
  if (gf.rank > 0 && gf.endpoint.empty()) return fail(invalid_argument("--group-endpoint is required for --group-rank > 0"));
  transfer::UcxCommOptions co;
  co.timeout = std::chrono::seconds(gf.startup_s);  // start-up of many processes on few cores is slow
  auto comm = transfer::UcxComm::create(gf.rank, gf.size(), gf.rank == 0 ? (gf.endpoint.empty() ? "tcp://" + interface + ":*" : gf.endpoint) : gf.endpoint,
                                        co, [](const std::string& ep) { say("GROUP " + ep); });
  if (!comm.is_ok()) return fail(comm.status());
  auto collectives = decode::make_group_collectives(gf.collectives, **comm, o.cuda_device, std::chrono::seconds(gf.startup_s));
  if (!collectives.is_ok()) return fail(collectives.status());
  Comm& forward_comm = *collectives ? **collectives : static_cast<Comm&>(**comm);
  // One deadline for the group's messages and its forward's collectives alike (over NCCL too: there a
  // call past it aborts the communicator, comm_nccl.h).
  const decode::GroupDeadlines deadlines{
      .startup = std::chrono::seconds(gf.startup_s), .step = std::chrono::milliseconds(gf.step_deadline_ms),
      .set = [c = comm->get(), f = &forward_comm](std::chrono::milliseconds limit) {
        c->set_timeout(limit);
        f->set_timeout(limit);
      }};
  deadlines.use(deadlines.startup);
  if (gf.rank > 0) {
    // A member's own /metrics: its steps and collectives (the leader speaks for the group to the router).
    // Declared before the worker, which counts into it until it goes.
    protocol::MetricsRegistry member_metrics;
    auto worker = decode::GroupWorker::create(be, cfg, weights, layout, forward_comm, o.cache);
    if (!worker.is_ok()) return fail(worker.status());
    (*worker)->publish_to(member_metrics);
    auto metrics_endpoint = serve_metrics(member_metrics, be, metrics_at);
    if (!metrics_endpoint.is_ok()) return fail(metrics_endpoint.status());
    // Every member owns its transfer region (DCP: its slices; EP: the requests placed on it): the leader
    // names its geometry, the rank answers with it.
    auto req = decode::recv_region_request(**comm, 0);
    if (!req.is_ok()) return fail(req.status());
    // Beats to the leader from here on, whatever this rank is doing (member_liveness.h).
    auto beacon_to = decode::recv_group_liveness(**comm, 0);
    if (!beacon_to.is_ok()) return fail(beacon_to.status());
    auto beacon = decode::MemberBeacon::start(beacon_to->endpoint, gf.rank, beacon_to->interval);
    if (!beacon.is_ok()) return fail(beacon.status());
    auto region = decode::MemberRegion::create(cfg, be, layout, *req, o.ucx_net_devices, o.cuda_device);
    if (!region.is_ok()) return fail(region.status());
    if (Status st = decode::send_region_offer(**comm, 0, (*region)->offer()); !st.is_ok()) return fail(st);
    say("MEMBER " + std::to_string(gf.rank) + " of " + to_string(layout));
    return decode::run_group_member(**worker, **comm, region->get(), deadlines);
  }
  zmq::context_t zctx;
  auto leader = decode::GroupLeader::create({.rank = o,
                                             .layout = layout,
                                             .collectives = &forward_comm,
                                             .deadlines = deadlines,
                                             .liveness_bind = "tcp://" + interface + ":*"},
                                            be, cfg, weights, **comm, zctx);
  if (!leader.is_ok()) return fail(leader.status());
  // While the leader waits on its members it watches their beats and heartbeats to the router; the hook
  // is taken off before the leader goes. A stop signal ends such a wait at once (the group's first step
  // waits under the start-up deadline, minutes): the group's requests end as failed, and it stops.
  // The forward's collectives (NCCL's, when they are not the UCX communicator) wait under the same hook.
  struct WaitHook {
    Comm& comm;
    Comm& forward;
    ~WaitHook() {
      comm.set_while_waiting({});
      forward.set_while_waiting({});
    }
  } hook{**comm, forward_comm};
  const auto while_waiting = [l = leader->get(), &stop = install_stop_signals()]() -> Status {
    if (stop) return Status(Code::Aborted, "a stop signal came while the leader waited on its members");
    return l->while_waiting();
  };
  (*comm)->set_while_waiting(while_waiting);
  if (&forward_comm != comm->get()) forward_comm.set_while_waiting(while_waiting);
  deadlines.use(deadlines.step);
  // Idle, the leader ticks its members well within their receive deadline.
  const auto tick = std::chrono::milliseconds(std::max(10, gf.step_deadline_ms / 4));
  Status st = serve(**leader, be, o, tick, metrics_at);
  if (st.is_ok()) {
    // Members stopped by the same signal are gone: do not wait a step deadline on each.
    (*comm)->set_timeout(std::chrono::milliseconds(200));
    (*leader)->stop_members();
    say("STOPPED");
    return 0;
  }
  decode::say_group_failed(st, (*leader)->worker().caches());
  // The FAILED messages of the group's requests are queued on the router connection: let them leave, and
  // let the transfer memory of the group's requests come free (stages that were writing answer the ABORT).
  // Meanwhile the leader takes no new request and tells no stage its regions (the members' are gone): the
  // router and the stages hear it again here, and must not place on it or write to it.
  (*leader)->driver().close_to_new_requests("decode group " + o.instance_id + " failed: " + st.message());
  // (A stage answers the ABORT between its chunks: on a loaded host that can take a second.)
  const auto until = std::chrono::steady_clock::now() + std::chrono::milliseconds(2000);
  while (std::chrono::steady_clock::now() < until && (*leader)->driver().side().num_live() > 0)
    (void)(*leader)->driver().step(std::chrono::milliseconds(100));
  say("IDLE " + std::to_string((*leader)->pool_free_bytes()) + " " + std::to_string((*leader)->pool_capacity_bytes()));
  return fail(st);
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"k3-decode: one decode DP rank. Receives every request's KV/state from the prefill stages over UCX "
               "(control over ZeroMQ), decodes all running requests as one batch per step and streams TOKENS to "
               "the router."};
  std::string model_dir, stop_text, log_level = "warn";
  decode::DecodeRankOptions o;
  int hb_ms = 200, hb_misses = 3;   // the router's defaults: it expects a heartbeat this often
  long compute_ms = 300000, transfer_ms = 300000;
  bool ignore_eos = false;
  app.add_option("--model", model_dir, "model directory (config.json, model.safetensors, tokenizer)")->required();
  app.add_option("--rank", o.rank, "global decode rank (the id of the region prefill writes to; default 0)");
  uint32_t dp_size = 0;
  app.add_option("--dp-size", dp_size, "decode DP ranks in the deployment (default: --rank + 1)");
  app.add_option("--instance", o.instance_id, "decode instance id (control name decode/<id>; default d)");
  std::string bind_endpoint, interface = "127.0.0.1", key_file, public_keys_file;
  bool insecure = false;
  app.add_option("--interface", interface,
                 "IPv4 address of the interface the control socket and the UCX data plane listen on "
                 "(default 127.0.0.1: local runs are not reachable from other hosts)");
  app.add_option("--bind", bind_endpoint, "control endpoint to bind (default tcp://<--interface>:*, port printed as READY)");
  std::string advertise_host;
  app.add_option("--advertise-host", advertise_host,
                 "host (address or name) peers reach this rank's control endpoint at, printed in READY and announced in "
                 "its REGISTER with the bound port (default: the bound host; required when --bind is tcp://0.0.0.0:...)");
  app.add_option("--control-key", key_file, transfer::kControlKeyHelp);
  app.add_option("--control-public-keys", public_keys_file, transfer::kControlPublicKeysHelp);
  app.add_flag("--insecure-control-plane", insecure, transfer::kInsecureControlHelp);
  app.add_option("--router-endpoint", o.router_endpoint, "router control endpoint (CLAIM / ABORT in, TOKENS out)");
  app.add_option("--page-size", o.page_size, "tokens per transfer pool page (= k3-prefill --transfer-page-size; default 16)")
      ->check(CLI::PositiveNumber);
  app.add_option("--pool-pages", o.num_pages, "transfer pool pages (default 256)")->check(CLI::PositiveNumber);
  app.add_option("--pool-slots", o.num_slots, "transfer pool KDA slots = requests transferring or decoding (default 8)")
      ->check(CLI::PositiveNumber);
  app.add_option("--max-requests", o.cache.max_seqs, "decode cache slots (running batch limit, default 8)")
      ->check(CLI::PositiveNumber);
  app.add_option("--cache-pages", o.cache.num_pages, "decode MLA cache pages (default 256)")->check(CLI::PositiveNumber);
  app.add_option("--cache-page-size", o.cache.page_size, "tokens per decode MLA cache page (default 16)")
      ->check(CLI::PositiveNumber);
  bool cache_in_pool = false, no_cache_in_pool = false;
  app.add_flag("--cache-in-pool", cache_in_pool,
               "place the decode cache in the transfer pool: decode from the pages the transfer wrote (one copy per "
               "request; on --backend cuda the pool is device memory, written over cuda_ipc); --pool-pages / "
               "--pool-slots / --page-size then size it and --max-requests / --cache-pages / --cache-page-size are "
               "unused. The default for a single rank; rank groups keep a separate decode cache");
  app.add_flag("--no-cache-in-pool", no_cache_in_pool,
               "keep a separate decode cache (sized by --max-requests / --cache-pages / --cache-page-size) and copy each "
               "transferred request into it");
  app.add_option("--max-tokens", o.max_tokens, "generated tokens per request, the first included (default 16)")
      ->check(CLI::PositiveNumber);
  app.add_flag("--ignore-eos", ignore_eos, "do not stop at the tokenizer's end-of-sequence tokens");
  app.add_option("--stop-ids", stop_text, "extra stop token ids, comma-separated");
  app.add_option("--temperature", o.sampling.temperature, "decode-step temperature (0 = greedy, default)")
      ->check(CLI::Range(0.f, 100.f));
  app.add_option("--top-k", o.sampling.top_k, "decode-step top-k (0 = off)")->check(CLI::NonNegativeNumber);
  app.add_option("--top-p", o.sampling.top_p, "decode-step top-p (1 = off)")->check(CLI::Range(0.f, 1.f));
  app.add_option("--seed", o.sampling.seed, "decode-step sampling seed (default 0; the router must give PREFILLs the same seed)");
  BackendFlags backend_flags;
  add_backend_flags(app, backend_flags);
  app.add_option("--heartbeat-ms", hb_ms, "control heartbeat interval; the router's --heartbeat-ms or less (default 200, the router's default)")->check(CLI::PositiveNumber);
  app.add_option("--heartbeat-misses", hb_misses, "missed heartbeats before a peer is dead (default 3)")
      ->check(CLI::PositiveNumber);
  app.add_option("--compute-timeout-ms", compute_ms, "CLAIM -> first COMPUTE_DONE wait (default 300000)")
      ->check(CLI::PositiveNumber);
  app.add_option("--transfer-timeout-ms", transfer_ms, "allocation -> every TRANSFER_DONE wait (default 300000)")
      ->check(CLI::PositiveNumber);
  app.add_option("--log-level", log_level, "spdlog level: trace, debug, info, warn (default), error");
  GroupFlags gf;
  auto* o_dcp = app.add_option("--group-dcp", gf.dcp, "ranks of this DP group sharing each request's context (DCP; 1 = none)")
      ->check(CLI::Range(1, 256));
  app.add_option("--group-ep", gf.ep, "ranks of this DP group sharing the routed experts (EP; 1 = none)")
      ->check(CLI::Range(1, 256))->excludes(o_dcp);
  app.add_option("--group-rank", gf.rank, "this process's index in its group (0 = the leader, which the router and the "
                 "prefill stages talk to)")->check(CLI::NonNegativeNumber);
  app.add_option("--group-endpoint", gf.endpoint, "the group communicator: rank 0 binds it (default tcp://<--interface>:*, "
                 "printed as GROUP), the other ranks connect to it");
  app.add_option("--kv-partitions", gf.kv_partitions, "DCP: MLA partial attentions merged per request (a multiple of "
                 "--group-dcp; default --group-dcp; without a group, one rank computing what a DCP group of that "
                 "size does)")->check(CLI::NonNegativeNumber);
  app.add_option("--group-step-deadline-ms", gf.step_deadline_ms, "deadline of each collective once the group formed: "
                 "a rank dead or hung this long fails the group (default 2000)")->check(CLI::Range(50, 600000));
  app.add_option("--group-startup-s", gf.startup_s, "how long the ranks wait for the group to form, its UCX "
                 "communicator and (with --group-collectives nccl) its NCCL one (default 180)")
      ->check(CLI::Range(1, 3600));
  std::string collectives_name = "ucx";
  app.add_option("--group-collectives", collectives_name,
                 "what the group's forward exchanges activations over: ucx (host memory; GPU ranks stage through "
                 "the host, and several ranks may share one GPU) or nccl (between the ranks' GPUs, one GPU per rank; "
                 "--backend cuda). Every rank of a group must give the same (default ucx)");
  std::string metrics_listen;
  app.add_option("--metrics-listen", metrics_listen,
                 "HOST:PORT where GET /metrics serves everything this rank counts (transfer, pools, preemptions; "
                 "port 0 picks one, printed as METRICS <url>; a group's leader: the group's; every rank of a group: its "
                 "own steps and collectives, k3_rank_*); default off");
  CLI11_PARSE(app, argc, argv);
  spdlog::set_level(spdlog::level::from_str(log_level));
  std::optional<protocol::ListenAddress> metrics_at;
  if (!metrics_listen.empty()) {
    auto at = protocol::parse_listen_address(metrics_listen, "--metrics-listen");
    if (!at.is_ok()) return fail(at.status());
    metrics_at = *at;
  }

  auto keys = transfer::control_keys_from_flags(key_file, public_keys_file, insecure);
  if (!keys.is_ok()) return fail(keys.status());
  o.control_keys = *keys;
  auto device = transfer::net_device_of(interface);
  if (!device.is_ok()) return fail(device.status());
  o.ucx_net_devices = *device;
  o.bind_endpoint = bind_endpoint.empty() ? "tcp://" + interface + ":*" : bind_endpoint;
  o.advertise_host = advertise_host;

  auto cfg = load_model_config(model_dir + "/config.json");
  if (!cfg.is_ok()) return fail(cfg.status());
  auto extra = parse_token_ids(stop_text, "--stop-ids");
  if (!extra.is_ok()) return fail(extra.status());
  o.stop_ids = *extra;
  {
    auto tok = Tokenizer::load(model_dir);
    if (!tok.is_ok()) return fail(Status(tok.status().code(), "tokenizer (for EOS and structured output): " + tok.status().message()));
    if (!ignore_eos)
      for (int32_t id : tok->eos_ids()) o.stop_ids.push_back(id);
    o.vocab = grammar::TokenVocab::from_tokenizer(*tok);
  }
  o.dp_size = dp_size == 0 ? o.rank + 1 : dp_size;
  if (o.rank >= o.dp_size)
    return fail(invalid_argument("--rank " + std::to_string(o.rank) + " must be < --dp-size " + std::to_string(o.dp_size)));
  o.heartbeat = {std::chrono::milliseconds(hb_ms), hb_misses};
  o.timeouts.compute_wait = transfer::Millis(compute_ms);
  o.timeouts.transfer_wait = transfer::Millis(transfer_ms);
  o.on_state = [](uint64_t id, protocol::RequestState st) {
    say("STATE " + std::to_string(id) + " " + protocol::state_name(st));
  };

  auto weights = load_weights(model_dir, *cfg);
  if (!weights.is_ok()) return fail(weights.status());
  // Outlives the upload, which a group's rank does inside run_group.
  LoadProgress load("k3-decode decode/" + o.instance_id + (gf.rank > 0 ? "/" + std::to_string(gf.rank) : "") + ": weights");
  weights->set_upload_observer(load.observer());
  auto bc = backend_flags.resolve();
  if (!bc.is_ok()) return fail(bc.status());
  auto backend = make_backend(*bc);
  if (!backend.is_ok()) return fail(backend.status());
  if (cache_in_pool && no_cache_in_pool) return fail(invalid_argument("--cache-in-pool and --no-cache-in-pool: give one"));
  // --kv-partitions alone: a group of one running the rank-sliced forward with that many MLA partitions
  // (what a DCP group of that size computes, on one process).
  const bool grouped = gf.size() > 1 || gf.rank > 0 || gf.kv_partitions > 1;
  // One copy of a transferred request wherever the region can hold the engine's caches: one rank, its
  // region in the backend's memory (host, or device memory of --device).
  o.cache_in_pool = cache_in_pool || (!no_cache_in_pool && !grouped);
  o.cuda_device = bc->device;
  if (grouped) {
    auto kind = decode::parse_group_collectives(collectives_name);
    if (!kind.is_ok()) return fail(kind.status());
    gf.collectives = *kind;
    if (gf.collectives == decode::GroupCollectives::Nccl && (*backend)->kind() != BackendKind::Cuda)
      return fail(invalid_argument("--group-collectives nccl needs --backend cuda (NCCL moves device memory)"));
    if (o.cache_in_pool)
      return fail(invalid_argument("--cache-in-pool: decode rank groups (--group-dcp / --group-ep) keep separate caches"));
    if (gf.rank >= gf.size())
      return fail(invalid_argument("--group-rank " + std::to_string(gf.rank) + " must be < the group size " +
                                   std::to_string(gf.size())));
    return run_group(gf, interface, o, **backend, *cfg, *weights, metrics_at);
  }
  zmq::context_t zctx;
  auto rank = decode::DecodeRank::create(o, **backend, *cfg, *weights, zctx);
  if (!rank.is_ok()) return fail(rank.status());
  load.finish();
  if (Status st = serve(**rank, **backend, o, std::chrono::milliseconds(50), metrics_at); !st.is_ok()) return fail(st);
  say("STOPPED");
  return 0;
}
