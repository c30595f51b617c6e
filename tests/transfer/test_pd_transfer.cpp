// Prefill -> decode over real processes on 127.0.0.1: ZeroMQ control plane, UCX puts, the lazy-alloc
// state machines and the layer-indexed plans. This process plays the router.
//  - 16 prefill stages -> 1 decode rank, and 1 stage -> 8 decode ranks (DCP interleave + KDA head
//    slicing): every destination byte checked by the decode process from the relayout rules, random
//    layer patterns, partitions and token counts.
//  - ABORT injected at every state on either side, SIGKILL at every state, deadline expiry: the
//    survivor ends the request (within the heartbeat window for a death) and its pool / held
//    sources return exactly to the start.
//  - stages that stream from a source arena (and from one too small, falling back to images of their own).
// K3_TEST_MEMORY=cuda runs all of it with GPU memory on both sides (decode regions, prefill sources).
#include <catch2/catch.hpp>

#include <cstdlib>
#include <random>

#include "common/protocol/frame.h"
#include "tests/transfer/pd_scenario.h"
#include "tests/transfer/process_guard.h"
#include "tests/transfer/test_router.h"
#include "transfer/ucx_driver_common.h"
#include "transfer/zmq_channel.h"

using namespace k3::transfer;
using namespace std::chrono_literals;
using k3::test::ProcessGuard;
namespace protocol = k3::protocol;

namespace {

const std::string kExe = k3::test::helper_path("k3-test-peer-pd");

struct Line {
  std::string text;
  Clock::time_point at;
};

// The router: a ControlServer the nodes connect to; forwards every FAILED as ABORT to all parties.
struct Router : k3::test::TestRouter {
  Router() : TestRouter(100ms) {}
  void wait_up(const std::vector<std::string>& names, std::chrono::milliseconds timeout) {
    const auto deadline = Clock::now() + timeout;
    for (;;) {
      bool all = true;
      for (auto& n : names) all &= up.count(n) != 0;
      if (all) return;
      REQUIRE(Clock::now() < deadline);
      pump(20ms);
    }
  }
};

// Reads `proc` lines while keeping the router's heartbeats going; returns the first line starting with prefix.
std::optional<Line> expect_line(Router& router, ProcessGuard& proc, const std::string& prefix,
                                std::chrono::milliseconds timeout, std::vector<std::string>* seen = nullptr) {
  const auto deadline = Clock::now() + timeout;
  while (Clock::now() < deadline) {
    router.pump(0ms);
    auto line = proc.read_line(20ms);
    if (!line) continue;
    if (seen) seen->push_back(*line);
    if (line->rfind(prefix, 0) == 0) return Line{line->substr(prefix.size()), Clock::now()};
  }
  return std::nullopt;
}

struct Topology {
  std::string layers;
  std::vector<uint32_t> partition;
  uint32_t ranks = 1;
  uint32_t heads = 8;
  std::vector<std::string> decode_extra, prefill_extra;  // extra key value args
};

// Where both peers keep their bytes: K3_TEST_MEMORY=cuda puts decode's regions and the stages' source
// images in GPU memory (tests/cuda/run_transfer_faults_on_gpu_host.sh); default host.
std::string test_memory() {
  const char* m = std::getenv("K3_TEST_MEMORY");
  const std::string kind = m && *m ? m : "host";
  REQUIRE((kind == "host" || kind == "cuda"));
  return kind;
}

struct Cluster {
  Router router;
  Topology topo;
  std::unique_ptr<ProcessGuard> decode;
  std::vector<std::unique_ptr<ProcessGuard>> stages;
  std::string decode_endpoint;          // what the decode printed as READY (its advertised endpoint)
  std::vector<std::string> registered;  // per stage: the control endpoint the decode's REGISTER announced
  explicit Cluster(Topology t) : topo(std::move(t)) {
    std::vector<std::string> common = {"layers", topo.layers, "heads", std::to_string(topo.heads), "router",
                                       router.server->endpoint(), "memory", test_memory()};
    std::vector<std::string> dargs = {"role", "decode", "ranks", std::to_string(topo.ranks)};
    dargs.insert(dargs.end(), common.begin(), common.end());
    dargs.insert(dargs.end(), topo.decode_extra.begin(), topo.decode_extra.end());
    decode = std::make_unique<ProcessGuard>(kExe, dargs);
    auto ready = decode->wait_for("READY ", 20s);
    REQUIRE(ready);
    decode_endpoint = *ready;
    std::string part;
    for (auto p : topo.partition) part += (part.empty() ? "" : ",") + std::to_string(p);
    for (uint32_t s = 0; s < topo.partition.size(); ++s) {
      std::vector<std::string> pargs = {"role", "prefill", "decode", *ready, "partition", part, "stage", std::to_string(s)};
      pargs.insert(pargs.end(), common.begin(), common.end());
      pargs.insert(pargs.end(), topo.prefill_extra.begin(), topo.prefill_extra.end());
      stages.push_back(std::make_unique<ProcessGuard>(kExe, pargs));
    }
    std::vector<std::string> names = {"decode/d"};
    for (uint32_t s = 0; s < topo.partition.size(); ++s) {
      auto reg = expect_line(router, *stages[s], "DECODE_READY ", 30s);
      REQUIRE(reg);
      registered.push_back(reg->text);
      names.push_back("prefill/p/" + std::to_string(s));
    }
    router.parties = names;
    router.wait_up(names, 20s);
  }
  std::vector<uint32_t> decode_ranks() const {
    std::vector<uint32_t> r;
    for (uint32_t i = 0; i < topo.ranks; ++i) r.push_back(i);
    return r;
  }
  void claim(uint64_t id, uint32_t tokens) {
    router.send("decode/d", protocol::Claim{.request_id = id, .prompt_len = tokens, .decode_ranks = decode_ranks(),
                                            .prefill_instance = "p",
                                            .num_prefill_stages = static_cast<uint32_t>(topo.partition.size())});
  }
  void prefill(uint64_t id, uint32_t tokens) {
    protocol::Prefill p{.request_id = id, .token_ids = std::vector<int32_t>(tokens, 1), .decode_instance = "d",
                        .decode_ranks = decode_ranks()};
    for (uint32_t s = 0; s < topo.partition.size(); ++s) router.send("prefill/p/" + std::to_string(s), p);
  }
};

std::vector<uint32_t> random_partition(std::mt19937& rng, uint32_t layers, uint32_t stages) {
  std::vector<uint32_t> p(stages, 1);
  for (uint32_t extra = layers - stages; extra > 0; --extra) p[std::uniform_int_distribution<uint32_t>(0, stages - 1)(rng)]++;
  return p;
}

std::string random_layers(std::mt19937& rng, uint32_t n) {
  std::string s;
  for (uint32_t i = 0; i < n; ++i) s += std::uniform_int_distribution<int>(0, 3)(rng) == 0 ? 'M' : 'K';
  s[n / 2] = 'M';  // at least one of each kind
  s[0] = 'K';
  return s;
}

// Every line of the decode's IDLE report with its metric samples ("P name{labels} value").
std::map<std::string, double> metrics_after_idle(Router& router, ProcessGuard& proc) {
  std::map<std::string, double> m;
  for (;;) {
    auto line = proc.read_line(200ms);
    if (!line || line->rfind("P ", 0) != 0) break;
    auto sp = line->rfind(' ');
    m[line->substr(2, sp - 2)] = std::stod(line->substr(sp + 1));
  }
  return m;
}

// The metrics a stage printed with its last IDLE (it prints them each time it has nothing live).
std::map<std::string, double> last_stage_metrics(ProcessGuard& stage) {
  std::map<std::string, double> m, block;
  while (auto line = stage.read_line(500ms)) {
    if (line->rfind("IDLE ", 0) == 0) block.clear();
    if (line->rfind("P ", 0) != 0) continue;
    const auto sp = line->rfind(' ');
    block[line->substr(2, sp - 2)] = std::stod(line->substr(sp + 1));
    m = block;
  }
  return m;
}

// Returns each stage's metrics from its last IDLE report.
std::vector<std::map<std::string, double>> run_requests(Cluster& c, std::mt19937& rng, int requests, uint32_t max_tokens) {
  const auto model = k3::test::pd::model_from_pattern(c.topo.layers, c.topo.heads);
  uint64_t total_bytes = 0;
  for (int i = 0; i < requests; ++i) {
    const uint64_t id = 1000 + i;
    const uint32_t tokens = std::uniform_int_distribution<uint32_t>(1, max_tokens)(rng);
    INFO("request " << id << " tokens " << tokens << " layers " << c.topo.layers);
    c.claim(id, tokens);
    // CLAIM and PREFILL travel on different sockets; a COMPUTE_DONE that overtakes its CLAIM is
    // ignored by decode (no CLAIM ack in the protocol yet), so the router waits for CLAIMED.
    std::vector<std::string> seen;
    REQUIRE(expect_line(c.router, *c.decode, "STATE " + std::to_string(id) + " CLAIMED", 10s, &seen));
    c.prefill(id, tokens);
    auto verified = expect_line(c.router, *c.decode, "VERIFIED ", 30s, &seen);
    std::string trace;
    for (auto& l : seen) trace += l + "\n";
    INFO("decode said:\n" << trace);
    REQUIRE(verified);
    std::istringstream v(verified->text);
    uint64_t vid = 0, bytes = 0;
    int ok = 0;
    v >> vid >> ok >> bytes;
    INFO(verified->text);
    CHECK(vid == id);
    CHECK(ok == 1);
    const uint64_t want = k3::test::pd::expected_bytes(model, c.topo.ranks, true, tokens);
    CHECK(bytes == want);
    total_bytes += want;
    auto ended = expect_line(c.router, *c.decode, "ENDED ", 10s);
    REQUIRE(ended);
    CHECK(ended->text == std::to_string(id) + " FINISHED -");
    auto idle = expect_line(c.router, *c.decode, "IDLE ", 10s);
    REQUIRE(idle);
    std::istringstream is(idle->text);
    uint64_t free = 0, start = 0;
    is >> free >> start;
    CHECK(free == start);
    auto metrics = metrics_after_idle(c.router, *c.decode);
    const double stages = c.topo.partition.size();
    CHECK(metrics["k3_transfers_total"] == stages * (i + 1));
    CHECK(metrics["k3_transfer_bytes_total"] == double(total_bytes));
    CHECK(metrics["k3_request_transitions_total{from=\"DECODING\",to=\"FINISHED\"}"] == i + 1);
    CHECK(metrics["k3_request_transitions_total{from=\"CLAIMED\",to=\"COMPUTE_DONE\"}"] == i + 1);
    // Every region the stages wrote lives where the test asked (GPU memory with K3_TEST_MEMORY=cuda).
    for (uint32_t r = 0; r < c.topo.ranks; ++r)
      CHECK(metrics["k3_transfer_region_bytes{memory=\"" + test_memory() + "\",region=\"" + std::to_string(r) + "\"}"] > 0);
  }
  // Every byte a stage put came from where the test asked (its source images in GPU memory with
  // K3_TEST_MEMORY=cuda), none staged through the host.
  std::vector<std::map<std::string, double>> stage_metrics;
  for (size_t s = 0; s < c.stages.size(); ++s) {
    INFO("stage " << s);
    auto m = last_stage_metrics(*c.stages[s]);
    CHECK(m["k3_transfer_source_bytes_total{memory=\"" + test_memory() + "\"}"] > 0);
    CHECK(m.count("k3_transfer_source_bytes_total{memory=\"host-staged\"}") == 0);
    stage_metrics.push_back(std::move(m));
  }
  return stage_metrics;
}

}  // namespace

TEST_CASE("16 prefill stages -> 1 decode rank: every destination byte is the source byte", "[pd][process]") {
  std::mt19937 rng(1603);
  const uint32_t layers = std::uniform_int_distribution<uint32_t>(20, 30)(rng);
  Topology t{.layers = random_layers(rng, layers), .partition = random_partition(rng, layers, 16), .ranks = 1};
  Cluster c(t);
  run_requests(c, rng, 3, 40);
}

TEST_CASE("streamed from a source arena: every byte lands, the arena is whole again when idle; a full one falls back",
          "[pd][process][arena]") {
  // One MiB holds every image of these prompts; 256 bytes holds none, so each stage makes every image
  // outside it (counted) and the bytes still land.
  const uint64_t arena = GENERATE(uint64_t{1} << 20, uint64_t{256});
  std::mt19937 rng(2202);
  const uint32_t layers = 12;
  Topology t{.layers = random_layers(rng, layers), .partition = random_partition(rng, layers, 2), .ranks = 1,
             .prefill_extra = {"stream", "1", "arena_bytes", std::to_string(arena)}};
  Cluster c(t);
  auto stage_metrics = run_requests(c, rng, 3, 40);
  for (size_t s = 0; s < c.stages.size(); ++s) {
    INFO("stage " << s << ", arena " << arena);
    auto& m = stage_metrics[s];
    CHECK(m["k3_transfer_source_arena_free_bytes"] == double(arena));
    CHECK(m["k3_transfer_source_arena_overflow_total"] == (arena == 256 ? 3 : 0));
  }
}

TEST_CASE("a decode bound to every interface announces its advertised endpoint in REGISTER; prefill reads it",
          "[pd][process]") {
  std::mt19937 rng(1604);
  Topology t{.layers = "KKMK", .partition = {2, 2}, .ranks = 1,
             .decode_extra = {"bind", "tcp://0.0.0.0:*", "advertise", "127.0.0.1"}};
  Cluster c(t);
  INFO("READY " << c.decode_endpoint);
  CHECK(c.decode_endpoint.rfind("tcp://127.0.0.1:", 0) == 0);
  REQUIRE(c.registered.size() == 2);
  for (const auto& r : c.registered) CHECK(r == c.decode_endpoint);  // not the bound tcp://0.0.0.0:PORT
  run_requests(c, rng, 1, 20);
}

TEST_CASE("1 prefill stage -> 8 decode ranks with DCP interleave and KDA head slicing", "[pd][process]") {
  std::mt19937 rng(108);
  const uint32_t layers = std::uniform_int_distribution<uint32_t>(6, 10)(rng);
  Topology t{.layers = random_layers(rng, layers), .partition = {layers}, .ranks = 8, .heads = 8};
  Cluster c(t);
  const auto stage_metrics = run_requests(c, rng, 3, 40);  // token counts below 8 leave some ranks without rows
  // The interleave's one-row puts went gathered (every destination byte was checked above).
  CHECK(stage_metrics.at(0).count("k3_transfer_gathered_puts_total"));
  CHECK(stage_metrics.at(0).at("k3_transfer_gathered_puts_total") * 2 <=
        stage_metrics.at(0).at("k3_transfer_planned_puts_total"));
}

namespace {

struct FailureCase {
  std::string name;
  std::vector<std::string> decode_args, prefill_args;
  bool claim = true;
  std::vector<std::string> decode_end;   // acceptable "ENDED 1000 ..." texts on decode (empty: not checked)
  std::vector<std::string> prefill_end;  // same on the prefill stage
  bool victim_is_decode = false;
  std::string die_state;                 // set when the victim SIGKILLs itself at this state
};

bool one_of(const std::string& s, const std::vector<std::string>& options) {
  for (auto& o : options)
    if (s == o) return true;
  return false;
}

void run_failure(const FailureCase& fc) {
  INFO("case: " << fc.name);
  Topology t{.layers = "KMKKM", .partition = {5}, .ranks = 2, .heads = 8};
  t.decode_extra = {"quarantine_ms", "500"};
  t.decode_extra.insert(t.decode_extra.end(), fc.decode_args.begin(), fc.decode_args.end());
  t.prefill_extra = fc.prefill_args;
  Cluster c(t);
  const uint64_t id = 1000;
  const uint32_t tokens = 9;
  std::vector<std::string> dseen, pseen;
  if (fc.claim) {
    c.claim(id, tokens);
    REQUIRE(expect_line(c.router, *c.decode, "STATE 1000 CLAIMED", 10s, &dseen));
  }
  c.prefill(id, tokens);
  ProcessGuard& victim = fc.victim_is_decode ? *c.decode : *c.stages[0];
  ProcessGuard& survivor = fc.victim_is_decode ? *c.stages[0] : *c.decode;
  std::optional<Clock::time_point> died_at;
  if (!fc.die_state.empty() && !(fc.victim_is_decode && fc.die_state == "CLAIMED")) {
    auto line = expect_line(c.router, victim, "STATE 1000 " + fc.die_state, 10s);
    REQUIRE(line);
    died_at = line->at;
  } else if (!fc.die_state.empty()) {
    died_at = Clock::now();  // decode died right after printing CLAIMED (already read)
  }
  auto check_side = [&](ProcessGuard& proc, const std::vector<std::string>& ends, bool is_decode, bool timed) {
    std::vector<std::string> seen;
    auto ended = expect_line(c.router, proc, "ENDED 1000 ", 15s, &seen);
    std::string trace;
    for (auto& l : seen) trace += l + "\n";
    INFO((is_decode ? "decode" : "prefill") << " said:\n" << trace);
    REQUIRE(ended);
    CHECK(one_of("1000 " + ended->text, ends));
    if (timed && died_at) {
      // Heartbeat window 100 ms x 3 after the last frame, plus scheduling slack on shared cores.
      CHECK(ended->at - *died_at <= 800ms);
    }
    auto idle = expect_line(c.router, proc, "IDLE ", 15s);
    REQUIRE(idle);
    std::istringstream is(idle->text);
    uint64_t a = 0, b = 0;
    is >> a >> b;
    CHECK(a == b);  // decode: free bytes back at the start; prefill: no source held (0 0)
    return is_decode ? metrics_after_idle(c.router, proc) : std::map<std::string, double>{};
  };
  if (!fc.decode_end.empty() && !(fc.victim_is_decode && !fc.die_state.empty())) {
    auto m = check_side(*c.decode, fc.decode_end, true, !fc.victim_is_decode);
    // Failures are counted by cause.
    for (const char* cause : {"peer_dead", "deadline", "client_cancelled"}) {
      if (fc.decode_end[0].find(cause) != std::string::npos)
        CHECK(m["k3_request_failures_total{cause=\"" + std::string(cause) + "\"}"] >= 1);
    }
  }
  if (!fc.prefill_end.empty() && !(!fc.victim_is_decode && !fc.die_state.empty()))
    check_side(*c.stages[0], fc.prefill_end, false, fc.victim_is_decode);
  (void)survivor;
}

}  // namespace

TEST_CASE("ABORT injected at every state on either side frees everything exactly once", "[pd][process][abort]") {
  const std::vector<std::string> any_end = {"1000 ABORTED client_cancelled", "1000 FINISHED -"};
  std::vector<FailureCase> cases = {
      {.name = "decode abort at CLAIMED", .decode_args = {"abort_at", "CLAIMED"},
       .decode_end = {"1000 ABORTED client_cancelled"}},
      {.name = "decode abort at TRANSFERRING", .decode_args = {"abort_at", "TRANSFERRING"},
       .decode_end = {"1000 ABORTED client_cancelled"}, .prefill_end = any_end},
      {.name = "decode abort at DECODING", .decode_args = {"abort_at", "DECODING"},
       .decode_end = {"1000 ABORTED client_cancelled"}, .prefill_end = {"1000 FINISHED -"}},
      {.name = "prefill abort at PREFILLING", .prefill_args = {"abort_at", "PREFILLING"},
       .decode_end = {"1000 ABORTED client_cancelled"}, .prefill_end = {"1000 ABORTED client_cancelled"}},
      {.name = "prefill abort at COMPUTE_DONE", .prefill_args = {"abort_at", "COMPUTE_DONE"},
       .decode_end = {"1000 ABORTED client_cancelled"}, .prefill_end = {"1000 ABORTED client_cancelled"}},
      {.name = "prefill abort at TRANSFERRING", .prefill_args = {"abort_at", "TRANSFERRING"},
       .decode_end = {"1000 ABORTED client_cancelled"}, .prefill_end = {"1000 ABORTED client_cancelled"}},
  };
  for (auto& fc : cases) run_failure(fc);
}

TEST_CASE("a peer SIGKILLed at every state is detected by heartbeat; the survivor frees everything",
          "[pd][process][kill]") {
  const std::vector<std::string> dead_decode = {"1000 FAILED peer_dead", "1000 FINISHED -", "1000 FAILED transfer_failed"};
  std::vector<FailureCase> cases = {
      {.name = "decode killed at CLAIMED", .decode_args = {"die_at", "CLAIMED"}, .prefill_end = {"1000 FAILED peer_dead"},
       .victim_is_decode = true, .die_state = "CLAIMED"},
      {.name = "decode killed at TRANSFERRING", .decode_args = {"die_at", "TRANSFERRING"}, .prefill_end = dead_decode,
       .victim_is_decode = true, .die_state = "TRANSFERRING"},
      {.name = "prefill killed at PREFILLING", .prefill_args = {"die_at", "PREFILLING"},
       .decode_end = {"1000 FAILED peer_dead"}, .die_state = "PREFILLING"},
      {.name = "prefill killed at COMPUTE_DONE", .prefill_args = {"die_at", "COMPUTE_DONE"},
       .decode_end = {"1000 FAILED peer_dead"}, .die_state = "COMPUTE_DONE"},
      {.name = "prefill killed at TRANSFERRING", .prefill_args = {"die_at", "TRANSFERRING"},
       .decode_end = {"1000 FAILED peer_dead"}, .die_state = "TRANSFERRING"},
  };
  for (auto& fc : cases) run_failure(fc);
}

TEST_CASE("deadline expiry on either wait frees everything", "[pd][process][deadline]") {
  std::vector<FailureCase> cases = {
      {.name = "decode compute wait expires", .decode_args = {"compute_wait_ms", "400"},
       .prefill_args = {"stall_at", "PREFILLING"}, .decode_end = {"1000 EXPIRED deadline"}},
      {.name = "prefill ADDRS wait expires", .prefill_args = {"addrs_wait_ms", "400"}, .claim = false,
       .prefill_end = {"1000 EXPIRED deadline"}},
      {.name = "decode transfer wait expires while the stage is stalled",
       .decode_args = {"transfer_wait_ms", "300", "misses", "30"},
       .prefill_args = {"stall_at", "TRANSFERRING", "stall_ms", "900", "misses", "30"},
       .decode_end = {"1000 EXPIRED deadline"}},
  };
  for (auto& fc : cases) run_failure(fc);
}
