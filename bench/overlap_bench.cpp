// `k3-bench overlap`: how much of the KV/state transfer of one long prompt hides behind prefill compute,
// with real processes on 127.0.0.1: k3-decode and k3-prefill stages (started with --timing), this
// process playing the router (CLAIM, PREFILL, TOKENS).
//   k3-bench overlap --model DIR --prompt 8192 --stages 2 --chunk 512 --runs 3
// Each round runs the prompt twice, alternately:
//  - with transfer: CLAIM to decode, PREFILL to every stage, until decode's first TOKENS. TTFT = PREFILL
//    sent -> first TOKENS received;
//  - transfer skipped: no CLAIM, so decode never allocates and no stage writes (each stage's COMPUTE_DONE
//    is ignored by decode; the bench ABORTs the request afterwards). TTFT = PREFILL sent -> the last
//    stage's compute end, which is when it holds the first token.
// From the stages' TIMING lines (steady clock = CLOCK_MONOTONIC, shared by the processes of one host):
// hidden share = write time of all stages that lies before the last stage's compute end / all write time
// (the writes after it are on the critical path to the first token). Write time is the stages' write
// batches (puts + flush: one per chunk when the stages stream, one per request with --no-stream), so idle
// time between a streaming stage's batches does not count as transfer time; the write rate is the batches'
// bytes over that time.
// --group-dcp N / --group-ep N: decode is a rank group of N processes (a leader and N - 1 members, each
// owning its transfer region; on the cuda backend device memory, so the stages' puts go GPU to GPU); the
// CLAIM and PREFILL name the group's ranks as the router does (DCP: ranks 0..N-1, each written its slice;
// EP: rank 0, the request written whole into one rank's region).
#include <CLI/CLI.hpp>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <map>
#include <memory>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "bench/bench_commands.h"
#include "common/config/config.h"
#include "common/protocol/frame.h"
#include "deploy/child_process.h"
#include "transfer/zmq_channel.h"

namespace k3::bench {
namespace {

using Clock = std::chrono::steady_clock;
using namespace std::chrono_literals;

struct OverlapOptions {
  std::string model;
  std::string backend = "cpu";
  int prompt = 4096;
  int stages = 1;
  int chunk = 256;
  int runs = 3;            // rounds after one warm-up round (each round: with and without transfer)
  int threads = 0;         // per node process (0: the node's default)
  int timeout_s = 600;     // per request
  bool no_stream = false;  // k3-prefill --no-stream: write after the whole prompt (the design before streaming)
  int max_inflight_chunks = 0;   // k3-prefill --max-inflight-chunks (0: its default)
  int group_dcp = 1, group_ep = 1;   // decode as a rank group (at most one of them > 1)
  int group_size() const { return group_dcp * group_ep; }
  // The ranks a CLAIM / PREFILL names: the DCP group's, or the EP group's leader.
  std::vector<uint32_t> decode_ranks() const {
    std::vector<uint32_t> r;
    for (int i = 0; i < group_dcp; ++i) r.push_back(static_cast<uint32_t>(i));
    return r;
  }
  std::string node_log_level = "warn";
};

int64_t now_us() {
  return std::chrono::duration_cast<std::chrono::microseconds>(Clock::now().time_since_epoch()).count();
}

struct Span {
  int64_t begin = 0, end = 0;
  int64_t length() const { return end - begin; }
};

// One request's spans, by stage, from the TIMING lines.
struct RequestSpans {
  int64_t sent_us = 0;   // the PREFILLs went out
  std::map<int, Span> compute, writes_done;
  std::map<int, std::vector<Span>> writes;   // each stage's write batches
  uint64_t write_bytes = 0;                   // all stages' write batches
};

class OverlapRig {
 public:
  static std::unique_ptr<OverlapRig> start(const OverlapOptions& o);
  // One request; returns TTFT in us and fills `spans`. Throws on failure or timeout.
  int64_t run(uint64_t id, const std::vector<int32_t>& prompt, bool transfer, RequestSpans& spans);

 private:
  explicit OverlapRig(const OverlapOptions& o) : o_(o) {}
  void pump(std::chrono::milliseconds wait);
  void expect(bool ok, const std::string& what) const {
    if (!ok) throw std::runtime_error(what);
  }
  std::vector<std::string> common_args() const;

  OverlapOptions o_;
  zmq::context_t zctx_;
  std::unique_ptr<transfer::ControlServer> router_;
  std::unique_ptr<deploy::ChildProcess> decode_;
  std::vector<std::unique_ptr<deploy::ChildProcess>> members_;  // a rank group's ranks 1..N-1
  std::vector<std::unique_ptr<deploy::ChildProcess>> stages_;  // by stage
  std::map<uint64_t, RequestSpans> spans_;
  std::map<uint64_t, int64_t> first_token_us_;
  std::map<uint64_t, bool> claim_acked_;
  std::vector<std::string> held_;                              // each stage's last HELD line
};

std::vector<std::string> OverlapRig::common_args() const {
  // A stage heartbeats between chunks only, and a long prompt's late chunks can take seconds on a loaded
  // CPU: ten missed beats before a peer counts as dead keeps the measurement from failing on that.
  std::vector<std::string> a = {"--model", o_.model, "--router-endpoint", router_->endpoint(), "--insecure-control-plane",
                                "--backend", o_.backend, "--log-level", o_.node_log_level, "--heartbeat-misses", "10"};
  if (o_.threads > 0) a.insert(a.end(), {"--threads", std::to_string(o_.threads)});
  return a;
}

std::unique_ptr<OverlapRig> OverlapRig::start(const OverlapOptions& o) {
  std::unique_ptr<OverlapRig> rig(new OverlapRig(o));
  transfer::ControlOptions ropt;
  ropt.name = "router";
  ropt.heartbeat.misses = 10;   // as the nodes' --heartbeat-misses (common_args)
  auto router = transfer::ControlServer::bind(rig->zctx_, "tcp://127.0.0.1:*", ropt);
  rig->expect(router.is_ok(), "router socket: " + router.status().to_string());
  rig->router_ = std::move(router).value();
  std::error_code ec;
  const auto bin = std::filesystem::read_symlink("/proc/self/exe", ec).parent_path();
  // Pools for the whole prompt plus a margin (16-token pages on both sides).
  const std::string pages = std::to_string(o.prompt / 16 + 32);
  std::vector<std::string> dargs = rig->common_args();
  dargs.insert(dargs.end(), {"--ignore-eos", "--max-tokens", "1", "--pool-pages", pages, "--pool-slots", "2",
                             "--max-requests", "2", "--cache-pages", pages});
  // A rank group: the same flags on every rank; the leader registers the group's N global ranks.
  std::vector<std::string> group;
  if (o.group_dcp > 1) group = {"--group-dcp", std::to_string(o.group_dcp)};
  if (o.group_ep > 1) group = {"--group-ep", std::to_string(o.group_ep)};
  if (o.group_size() > 1) {
    dargs.insert(dargs.end(), group.begin(), group.end());
    dargs.insert(dargs.end(), {"--dp-size", std::to_string(o.group_size())});
  }
  auto d = deploy::ChildProcess::start("decode/d", (bin / "k3-decode").string(), dargs);
  rig->expect(d.is_ok(), "k3-decode: " + d.status().to_string());
  rig->decode_ = std::move(d).value();
  auto wait_decode_line = [&](const std::string& prefix) {
    for (auto deadline = Clock::now() + 300s; Clock::now() < deadline;)
      if (auto line = rig->decode_->read_line(200ms); line && line->rfind(prefix, 0) == 0) return line->substr(prefix.size());
    throw std::runtime_error("k3-decode did not print " + prefix);
  };
  if (o.group_size() > 1) {
    // The leader binds the group's communicator and waits for its members before it prints READY.
    const std::string group_ep = wait_decode_line("GROUP ");
    for (int i = 1; i < o.group_size(); ++i) {
      std::vector<std::string> margs = {"--model", o.model, "--backend", o.backend, "--log-level", o.node_log_level,
                                        "--insecure-control-plane", "--group-rank", std::to_string(i), "--group-endpoint", group_ep,
                                        "--max-requests", "2", "--cache-pages", pages};
      if (o.threads > 0) margs.insert(margs.end(), {"--threads", std::to_string(o.threads)});
      margs.insert(margs.end(), group.begin(), group.end());
      auto m = deploy::ChildProcess::start("decode/d/" + std::to_string(i), (bin / "k3-decode").string(), margs);
      rig->expect(m.is_ok(), "k3-decode member " + std::to_string(i) + ": " + m.status().to_string());
      rig->members_.push_back(std::move(m).value());
    }
  }
  const std::optional<std::string> ep = wait_decode_line("READY ");
  rig->stages_.resize(o.stages);
  rig->held_.assign(o.stages, "");
  std::string next;
  for (int s = o.stages - 1; s >= 0; --s) {  // last first: each stage needs the next one's LISTEN endpoint
    std::vector<std::string> args = rig->common_args();
    args.insert(args.end(), {"--stage", std::to_string(s), "--stages", std::to_string(o.stages), "--chunk-size",
                             std::to_string(o.chunk), "--decode-endpoint", *ep, "--timing", "--max-requests", "2",
                             "--cache-pages", pages});
    if (s > 0) args.insert(args.end(), {"--listen", "tcp://127.0.0.1:*"});
    if (!next.empty()) args.insert(args.end(), {"--next-endpoint", next});
    if (o.no_stream) args.push_back("--no-stream");
    if (o.max_inflight_chunks > 0) args.insert(args.end(), {"--max-inflight-chunks", std::to_string(o.max_inflight_chunks)});
    auto p = deploy::ChildProcess::start("prefill/p/" + std::to_string(s), (bin / "k3-prefill").string(), args);
    rig->expect(p.is_ok(), "k3-prefill: " + p.status().to_string());
    rig->stages_[s] = std::move(p).value();
    if (s > 0) {
      std::optional<std::string> listen;
      for (auto deadline = Clock::now() + 300s; !listen && Clock::now() < deadline;)
        if (auto line = rig->stages_[s]->read_line(200ms); line && line->rfind("LISTEN ", 0) == 0) listen = line->substr(7);
      rig->expect(listen.has_value(), "stage " + std::to_string(s) + " did not print LISTEN");
      next = *listen;
    }
  }
  for (int s = 0; s < o.stages; ++s) {
    bool ready = false;
    for (auto deadline = Clock::now() + 300s; !ready && Clock::now() < deadline;)
      if (auto line = rig->stages_[s]->read_line(200ms)) ready = *line == "DECODE_READY";
    rig->expect(ready, "stage " + std::to_string(s) + " did not print DECODE_READY");
  }
  // Every party's heartbeat reached the router: sends to them go through.
  for (auto deadline = Clock::now() + 60s;;) {
    bool all = rig->router_->liveness().alive("decode/d");
    for (int s = 0; s < o.stages; ++s) all = all && rig->router_->liveness().alive("prefill/p/" + std::to_string(s));
    if (all) break;
    rig->expect(Clock::now() < deadline, "not every node registered with the bench's router within 60 s");
    rig->pump(20ms);
  }
  return rig;
}

void OverlapRig::pump(std::chrono::milliseconds wait) {
  auto ev = router_->poll(wait);
  expect(ev.is_ok(), "router poll: " + ev.status().to_string());
  const int64_t t = now_us();
  for (auto& e : *ev) {
    if (e.kind != transfer::ControlEventKind::Message) continue;
    auto m = protocol::decode(e.payload);
    if (!m.is_ok()) continue;
    if (auto* tk = std::get_if<protocol::Tokens>(&m.value()); tk && !tk->token_ids.empty())
      first_token_us_.try_emplace(tk->request_id, t);
    if (auto* a = std::get_if<protocol::ClaimAck>(&m.value())) {
      expect(a->ok, "decode refused CLAIM " + std::to_string(a->request_id) + ": " + a->reason);
      claim_acked_[a->request_id] = true;
    }
    if (auto* f = std::get_if<protocol::Failed>(&m.value()))
      std::fprintf(stderr, "overlap: request %llu FAILED at %s: %s\n", static_cast<unsigned long long>(f->request_id),
                   e.peer.c_str(), f->detail.c_str());
  }
  // Every node's stdout is read (a full pipe would stall it): TIMING and HELD lines are kept.
  for (int s = 0; s < static_cast<int>(stages_.size()); ++s)
    for (const std::string& line : stages_[s]->drain()) {
      std::istringstream in(line);
      std::string word, span;
      uint64_t id = 0;
      Span sp;
      if (line.rfind("HELD ", 0) == 0) held_[s] = line.substr(5);
      if (!(in >> word >> id >> span >> sp.begin >> sp.end) || word != "TIMING") continue;
      if (span == "compute") spans_[id].compute[s] = sp;
      else if (span == "writes_done") spans_[id].writes_done[s] = sp;
      else if (span == "writes") {
        spans_[id].writes[s].push_back(sp);
        uint64_t bytes = 0;
        if (in >> bytes) spans_[id].write_bytes += bytes;
      }
    }
  (void)decode_->drain();
  for (auto& m : members_) (void)m->drain();
}

int64_t OverlapRig::run(uint64_t id, const std::vector<int32_t>& prompt, bool transfer, RequestSpans& spans) {
  const auto give_up = Clock::now() + std::chrono::seconds(o_.timeout_s);
  const std::string what = "request " + std::to_string(id) + (transfer ? " (with transfer)" : " (transfer skipped)");
  const int last = o_.stages - 1;
  if (transfer) {
    // As the router does: CLAIM first and wait for its ACK, off the timed path.
    auto sent = router_->send("decode/d", protocol::encode(protocol::Claim{
                                              .request_id = id, .prompt_len = static_cast<uint32_t>(prompt.size()),
                                              .decode_ranks = o_.decode_ranks(), .prefill_instance = "p",
                                              .num_prefill_stages = static_cast<uint32_t>(o_.stages)}));
    expect(sent.is_ok(), "CLAIM: " + sent.to_string());
    while (!claim_acked_.count(id)) {
      expect(Clock::now() < give_up, what + ": no CLAIM_ACK");
      pump(20ms);
    }
  }
  const int64_t t0 = now_us();
  for (int s = 0; s < o_.stages; ++s) {
    auto sent = router_->send("prefill/p/" + std::to_string(s),
                              protocol::encode(protocol::Prefill{.request_id = id, .token_ids = prompt,
                                                                 .decode_instance = "d", .decode_ranks = o_.decode_ranks()}));
    expect(sent.is_ok(), "PREFILL to stage " + std::to_string(s) + ": " + sent.to_string());
  }
  auto done = [&] {
    const RequestSpans& r = spans_[id];
    if (static_cast<int>(r.compute.size()) != o_.stages) return false;
    return !transfer || (first_token_us_.count(id) && static_cast<int>(r.writes_done.size()) == o_.stages);
  };
  while (!done()) {
    expect(Clock::now() < give_up, what + ": not finished within " + std::to_string(o_.timeout_s) + " s");
    pump(2ms);
  }
  spans = spans_[id];
  spans.sent_us = t0;
  spans_.erase(id);
  const int64_t ttft = transfer ? first_token_us_.at(id) - t0 : spans.compute.at(last).end - t0;
  if (!transfer) {
    // Nothing was allocated or written: the ABORT only frees what the stages hold.
    for (int s = 0; s < o_.stages; ++s) {
      const Status sent = router_->send("prefill/p/" + std::to_string(s),
                                        protocol::encode(protocol::Abort{.request_id = id,
                                                                         .reason = protocol::AbortReason::ClientCancelled,
                                                                         .origin_role = protocol::Role::Router}));
      expect(sent.is_ok(), what + ": ABORT to stage " + std::to_string(s) + ": " + sent.to_string());
    }
  }
  // The next request starts on idle stages.
  for (;;) {
    bool idle = true;
    for (const std::string& h : held_) idle = idle && h == "0 0";
    if (idle) break;
    expect(Clock::now() < give_up, what + ": the stages did not release it");
    pump(5ms);
  }
  return ttft;
}

// Time of `writes` before `limit`.
int64_t before(const Span& writes, int64_t limit) {
  return std::max<int64_t>(0, std::min(writes.end, limit) - writes.begin);
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : v.size() % 2 ? v[v.size() / 2] : (v[v.size() / 2 - 1] + v[v.size() / 2]) / 2;
}

int run_overlap(const OverlapOptions& o) {
  auto cfg = load_model_config(o.model + "/config.json");
  if (!cfg.is_ok()) return std::fprintf(stderr, "overlap: %s\n", cfg.status().to_string().c_str()), 1;
  if (o.stages > cfg->num_hidden_layers)
    return std::fprintf(stderr, "overlap: --stages %d > the model's %d layers\n", o.stages, cfg->num_hidden_layers), 1;
  if (o.group_dcp > 1 && o.group_ep > 1)
    return std::fprintf(stderr, "overlap: --group-dcp and --group-ep are exclusive (a group is DCP or EP)\n"), 1;
  if (o.prompt >= cfg->max_position_embeddings)
    return std::fprintf(stderr, "overlap: --prompt %d leaves no position for the first token (the model has %lld)\n", o.prompt,
                        static_cast<long long>(cfg->max_position_embeddings)), 1;
  std::mt19937 rng(7);
  std::uniform_int_distribution<int32_t> tok(0, cfg->vocab_size - 1);
  std::vector<int32_t> prompt(o.prompt);
  for (int32_t& t : prompt) t = tok(rng);
  try {
    auto rig = OverlapRig::start(o);
    const std::string decode = o.group_dcp > 1   ? "a DCP" + std::to_string(o.group_dcp) + " group"
                               : o.group_ep > 1 ? "an EP" + std::to_string(o.group_ep) + " group"
                                                : "one rank";
    std::printf("overlap: %s, %d-token prompt, %d stage(s), chunk %d, backend %s, %s, decode %s\n", o.model.c_str(),
                o.prompt, o.stages, o.chunk, o.backend.c_str(),
                o.no_stream ? "writes after the whole prompt (--no-stream)" : "streaming", decode.c_str());
    // tail: TTFT minus the time to the last stage's compute end (cache export, ADDRS round trip, writes,
    // TRANSFER_DONE, decode's import and the first TOKENS); it is what the transfer adds to the first token.
    // MB and GB/s: the bytes of every stage's write batches, and those bytes over the batches' time.
    std::printf("%-5s %-9s %10s %12s %10s %12s %12s %8s %10s %8s\n", "round", "transfer", "TTFT ms", "compute ms",
                "tail ms", "writes ms", "exposed ms", "hidden", "MB", "GB/s");
    std::vector<double> with_ms, skip_ms, hidden, tail_ms, own_ratio, rate;
    uint64_t id = 1;
    for (int round = 0; round <= o.runs; ++round) {
      for (bool transfer : {false, true}) {
        RequestSpans sp;
        const int64_t ttft = rig->run(id++, prompt, transfer, sp);
        const int64_t compute_end = sp.compute.at(o.stages - 1).end;
        int64_t first_begin = sp.compute.begin()->second.begin;
        for (auto& [s, c] : sp.compute) first_begin = std::min(first_begin, c.begin);
        int64_t writes = 0, hid = 0;
        for (auto& [s, batches] : sp.writes)
          for (const Span& w : batches) {
            writes += w.length();
            hid += before(w, compute_end);
          }
        const double share = writes > 0 ? static_cast<double>(hid) / static_cast<double>(writes) : 0;
        const int64_t tail = ttft - (compute_end - sp.sent_us);
        const double gbps = writes > 0 ? static_cast<double>(sp.write_bytes) / (static_cast<double>(writes) * 1e3) : 0;
        std::printf("%-5s %-9s %10.1f %12.1f %10.2f %12.2f %12.2f %8s %10.3f %8.2f\n",
                    round == 0 ? "warm" : std::to_string(round).c_str(), transfer ? "yes" : "skipped", ttft / 1e3,
                    (compute_end - first_begin) / 1e3, tail / 1e3, writes / 1e3, (writes - hid) / 1e3,
                    transfer ? std::to_string(share).substr(0, 5).c_str() : "-", sp.write_bytes / 1e6, gbps);
        std::fflush(stdout);
        if (round == 0) continue;
        (transfer ? with_ms : skip_ms).push_back(ttft / 1e3);
        if (transfer) hidden.push_back(share);
        if (transfer) tail_ms.push_back(tail / 1e3);
        if (transfer) own_ratio.push_back(static_cast<double>(ttft) / static_cast<double>(ttft - tail));
        if (transfer) rate.push_back(gbps);
      }
    }
    const double w = median(with_ms), s = median(skip_ms);
    std::printf("median TTFT with transfer %.1f ms, transfer skipped %.1f ms: ratio %.3fx (target <= 1.05x)\n", w, s,
                s > 0 ? w / s : 0);
    std::printf("median hidden share of the write time %.3f (target >= 0.9); median tail after compute %.2f ms\n",
                median(hidden), median(tail_ms));
    // The same ratio within each transfer run (TTFT / its own time to the compute end): on a loaded machine
    // the compute time varies between runs by more than the transfer costs, this does not.
    std::printf("median TTFT / same-run compute end %.4fx\n", median(own_ratio));
    std::printf("median write rate %.2f GB/s (the write batches' bytes over their time)\n", median(rate));
  } catch (const std::exception& e) {
    std::fprintf(stderr, "overlap: %s\n", e.what());
    return 1;
  }
  return 0;
}

}  // namespace

void add_overlap_command(CLI::App& app) {
  auto* cmd = app.add_subcommand("overlap", "share of the KV/state transfer hidden behind prefill compute, and TTFT "
                                            "with transfer vs transfer skipped (real k3-prefill / k3-decode processes)");
  auto o = std::make_shared<OverlapOptions>();
  cmd->add_option("--model", o->model, "model directory (k3-genweights output)")->required();
  cmd->add_option("--backend", o->backend, "cpu or cuda (every node)")->check(CLI::IsMember({"cpu", "cuda"}));
  cmd->add_option("--prompt", o->prompt, "prompt tokens (default 4096)")->check(CLI::Range(1, 1 << 20));
  cmd->add_option("--stages", o->stages, "prefill pipeline stages (default 1)")->check(CLI::Range(1, 64));
  cmd->add_option("--chunk", o->chunk, "prefill chunk size (default 256)")->check(CLI::PositiveNumber);
  cmd->add_option("--runs", o->runs, "rounds after the warm-up (default 3)")->check(CLI::PositiveNumber);
  cmd->add_option("--threads", o->threads, "CPU threads per node (default: the node's)")->check(CLI::NonNegativeNumber);
  cmd->add_option("--node-log-level", o->node_log_level, "the nodes' --log-level (default warn; their stderr is ours)");
  cmd->add_option("--timeout-s", o->timeout_s, "per-request limit (default 600)")->check(CLI::PositiveNumber);
  cmd->add_flag("--no-stream", o->no_stream, "stages write after the whole prompt (k3-prefill --no-stream)");
  cmd->add_option("--max-inflight-chunks", o->max_inflight_chunks, "the stages' --max-inflight-chunks (default: theirs)")
      ->check(CLI::PositiveNumber);
  cmd->add_option("--group-dcp", o->group_dcp, "decode as a DCP rank group of N processes (default 1: one rank)")
      ->check(CLI::Range(1, 64));
  cmd->add_option("--group-ep", o->group_ep, "decode as an EP rank group of N processes (default 1: one rank)")
      ->check(CLI::Range(1, 64));
  cmd->callback([o] {
    const int rc = run_overlap(*o);
    if (rc != 0) throw CLI::RuntimeError(rc);
  });
}

}  // namespace k3::bench
