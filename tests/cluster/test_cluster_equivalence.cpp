// The disaggregated path end to end with real processes on 127.0.0.1: k3-prefill stages (PP 1, 2, 4,
// chunk sizes that split prompts unevenly) and one k3-decode rank, every request's KV/state crossing the
// real transfer layer (ZeroMQ control, UCX puts). This process plays the router: CLAIM to decode, PREFILL
// to every stage, TOKENS back. Greedy tokens must equal the monolithic Engine's token for token.
// Fault: the decode process dies while the stages hold a request's computed KV: every stage frees it.
// Choices: a request for n = 3 samples decodes 3 sequences forked from its one transfer; each equals the
// engine's draws under its choice seed, and the pool goes back to full after they end or are aborted.
#include <catch2/catch.hpp>

#include <nlohmann/json.hpp>
#include <signal.h>

#include <functional>
#include <map>
#include <optional>
#include <random>
#include <set>
#include <sstream>

#include "common/config/config.h"
#include "engine/engine.h"
#include "common/model/weights.h"
#include "common/protocol/frame.h"
#include "tests/support/generate_reference.h"
#include "tests/support/run_command.h"
#include "tests/support/control_keys.h"
#include "tests/transfer/process_guard.h"
#include "tests/transfer/test_router.h"
#include "transfer/zmq_channel.h"

using namespace k3;
using namespace k3::transfer;
using namespace std::chrono_literals;
using k3::test::ProcessGuard;

namespace {

const std::string kBin = K3_BIN_DIR;
// K3_CLUSTER_LOG=debug shows the nodes' logs on stderr.
std::string log_level() {
  const char* v = std::getenv("K3_CLUSTER_LOG");
  return v ? v : "warn";
}
constexpr int kMaxTokens = 6;

// A generated model per preset, made once for every test of this file (read-only afterwards).
struct TinyModel {
  k3::test::TempDir dir{"cluster-model"};
  ModelConfig cfg;
  WeightStore weights;
  explicit TinyModel(const std::string& preset) {
    auto r = k3::test::run_command(kBin + "/k3-genweights --preset " + preset + " --seed 11 --out '" + dir.path() +
                                   "/m' >&2");
    if (r.exit_code != 0) throw std::runtime_error("k3-genweights failed");
    cfg = load_model_config(path() + "/config.json").value();
    weights = load_weights(path(), cfg).value();
  }
  std::string path() const { return dir.path() + "/m"; }
};
const TinyModel& model_of(const std::string& preset) {
  static std::map<std::string, std::unique_ptr<TinyModel>> made;
  auto& m = made[preset];
  if (!m) m = std::make_unique<TinyModel>(preset);
  return *m;
}
const TinyModel& tiny_model() { return model_of("k3-tiny"); }

// The reference: the monolithic engine, greedy, no stop ids (the decode node runs with --ignore-eos).
std::vector<int32_t> engine_tokens(const TinyModel& model, const std::vector<int32_t>& prompt,
                                   int max_tokens = kMaxTokens, const protocol::SamplingParams& sp = {}) {
  auto be = make_cpu_backend({.threads = 1});
  EngineOptions eo;
  eo.cache = {.max_seqs = 1, .page_size = 16, .num_pages = 64};
  auto engine = Engine::create(*be, model.cfg, model.weights, eo).value();
  GenerateRequest rq{.prompt = prompt, .max_tokens = max_tokens};
  rq.sampling = {.temperature = sp.temperature, .top_k = sp.top_k, .top_p = sp.top_p, .seed = sp.seed};
  return engine->generate(std::span(&rq, 1)).value()[0].tokens;
}

// The same through the k3-generate CLI (--json), the user-facing reference.
std::vector<int32_t> generate_cli_tokens(const std::vector<int32_t>& prompt) {
  return k3::test::k3_generate_tokens(tiny_model().path(), prompt, kMaxTokens);
}

// The router's side of the control plane (tests/transfer/test_router.h) plus what these tests read back.
struct Router : k3::test::TestRouter {
  std::map<uint64_t, std::vector<int32_t>> tokens;
  std::map<uint64_t, protocol::FinishReason> finish;
  std::map<std::pair<uint64_t, uint32_t>, std::vector<int32_t>> choice_tokens;   // by (request, choice)
  std::map<std::pair<uint64_t, uint32_t>, protocol::FinishReason> choice_finish;
  std::map<uint64_t, std::vector<protocol::AbortReason>> failed;
  std::optional<protocol::DecodeRoom> decode_room;   // from decode's latest heartbeat
  explicit Router(transfer::ControlKeys keys) : TestRouter(200ms, std::move(keys)) {
    on_message = [this](const std::string&, const protocol::Message& m) {
      if (auto* h = std::get_if<protocol::Heartbeat>(&m); h && h->role == protocol::Role::Decode) decode_room = h->room;
      if (auto* t = std::get_if<protocol::Tokens>(&m)) {
        const std::pair<uint64_t, uint32_t> key{t->request_id, t->choice};
        CHECK(choice_finish.count(key) == 0);  // nothing after a choice's last message
        auto& c = choice_tokens[key];
        c.insert(c.end(), t->token_ids.begin(), t->token_ids.end());
        if (t->finish != protocol::FinishReason::None) choice_finish[key] = t->finish;
        if (t->choice > 0) return;
        CHECK(finish.count(t->request_id) == 0);  // nothing after the last message
        auto& v = tokens[t->request_id];
        v.insert(v.end(), t->token_ids.begin(), t->token_ids.end());
        if (t->finish != protocol::FinishReason::None) finish[t->request_id] = t->finish;
      }
      if (auto* f = std::get_if<protocol::Failed>(&m)) failed[f->request_id].push_back(f->cause);
    };
  }
};

struct ClusterSpec {
  std::string preset = "k3-tiny";
  int stages = 2;
  std::string partition;  // empty: the even split
  int chunk = 7;
  int max_tokens = kMaxTokens;  // decode --max-tokens
  int prefill_slots = 8;        // k3-prefill --max-requests (local cache slots per stage)
  // Sampling of every request: in the PREFILLs (first token) and decode's flags (the other tokens:
  // these tests' CLAIMs carry no sampling params, so decode falls back to its flags).
  protocol::SamplingParams sampling;
  // decode --no-cache-in-pool: a separate engine cache that each transferred request is copied into
  // (the default on the cpu backend is the cache in the transfer pool: one copy).
  bool separate_cache = false;
  int decode_cache_pages = 0;   // decode --cache-pages (0: its default)
  // CLAIMs carry `sampling` (with max_tokens set: decode then follows it, not its flags), e.g. for n > 1.
  bool claim_sampling = false;
  std::vector<std::string> prefill_flags;   // more k3-prefill flags (e.g. --no-stream, --max-inflight-chunks)
};

// Control-plane keys of every process a test starts, as k3-cluster writes them.
k3::test::TestControlKeys cluster_keys(int stages) {
  std::vector<std::string> names = {"router", "decode/d"};
  for (int st = 0; st < stages; ++st) names.push_back("prefill/p/" + std::to_string(st));
  return k3::test::TestControlKeys(names);
}

struct Cluster {
  k3::test::TestControlKeys keys;
  Router router{keys.load("router")};
  ClusterSpec spec;
  std::unique_ptr<ProcessGuard> decode;
  std::vector<std::unique_ptr<ProcessGuard>> stages;  // by stage index
  std::set<uint64_t> claimed;
  std::vector<std::string> held;                      // each stage's last HELD line
  std::vector<std::map<uint64_t, int>> write_batches; // per stage: TIMING writes lines per request (--timing)
  std::vector<std::string> decode_said;               // decode's stdout (shown when a wait fails)

  explicit Cluster(ClusterSpec s) : keys(cluster_keys(s.stages)), spec(std::move(s)) {
    const std::string model = model_of(spec.preset).path();
    const std::string router_ep = router.server->endpoint();
    std::vector<std::string> decode_args{"--model", model, "--router-endpoint", router_ep, "--ignore-eos",
                                         "--max-tokens", std::to_string(spec.max_tokens),
                                         "--temperature", std::to_string(spec.sampling.temperature),
                                         "--top-k", std::to_string(spec.sampling.top_k),
                                         "--top-p", std::to_string(spec.sampling.top_p),
                                         "--seed", std::to_string(spec.sampling.seed), "--threads", "1",
                                         "--heartbeat-ms", "200", "--log-level", log_level(),
                                         "--control-key", keys.files.keypair("decode/d"),
                                         "--control-public-keys", keys.files.public_keys()};
    if (spec.separate_cache) decode_args.push_back("--no-cache-in-pool");
    if (spec.decode_cache_pages > 0) decode_args.insert(decode_args.end(), {"--cache-pages", std::to_string(spec.decode_cache_pages)});
    decode = std::make_unique<ProcessGuard>(kBin + "/k3-decode", decode_args);
    auto ep = decode->wait_for("READY ", 60s);
    REQUIRE(ep);
    // Last stage first: each stage needs the LISTEN endpoint of the next.
    stages.resize(spec.stages);
    held.assign(spec.stages, "");
    write_batches.assign(spec.stages, {});
    std::string next;
    for (int st = spec.stages - 1; st >= 0; --st) {
      std::vector<std::string> args = {"--model", model, "--stage", std::to_string(st), "--stages",
                                       std::to_string(spec.stages), "--chunk-size", std::to_string(spec.chunk),
                                       "--decode-endpoint", *ep, "--router-endpoint", router_ep, "--threads", "1",
                                       "--heartbeat-ms", "200", "--log-level", log_level(),
                                       "--max-requests", std::to_string(spec.prefill_slots)};
      const auto key_flags = keys.flags("prefill/p/" + std::to_string(st));
      args.insert(args.end(), key_flags.begin(), key_flags.end());
      if (!spec.partition.empty()) args.insert(args.end(), {"--partition", spec.partition});
      args.insert(args.end(), spec.prefill_flags.begin(), spec.prefill_flags.end());
      if (st > 0) args.insert(args.end(), {"--listen", "tcp://127.0.0.1:*"});
      if (!next.empty()) args.insert(args.end(), {"--next-endpoint", next});
      stages[st] = std::make_unique<ProcessGuard>(kBin + "/k3-prefill", args);
      if (st > 0) {
        auto listen = stages[st]->wait_for("LISTEN ", 60s);
        REQUIRE(listen);
        next = *listen;
      }
    }
    router.parties = {"decode/d"};
    for (int st = 0; st < spec.stages; ++st) {
      REQUIRE(stages[st]->wait_for("DECODE_READY", 60s));
      router.parties.push_back("prefill/p/" + std::to_string(st));
    }
    wait_until([&] {
      for (auto& p : router.parties)
        if (!router.up.count(p)) return false;
      return true;
    }, 30s, "every node registered with the router");
  }

  // Router traffic plus every process's stdout (so no pipe fills up). read_line truncates its timeout to
  // whole milliseconds before polling, so 2ms is the shortest wait that reads.
  void pump() {
    router.pump(5ms);
    if (decode->running())
      while (auto line = decode->read_line(2ms)) {
        decode_said.push_back(*line);
        if (line->rfind("STATE ", 0) == 0 && line->find(" CLAIMED") != std::string::npos)
          claimed.insert(std::stoull(line->substr(6)));
      }
    for (int st = 0; st < spec.stages; ++st)
      while (auto line = stages[st]->read_line(2ms)) {
        if (line->rfind("HELD ", 0) == 0) held[st] = line->substr(5);
        if (std::istringstream in(*line); line->rfind("TIMING ", 0) == 0) {
          std::string word, span;
          uint64_t id = 0;
          if (in >> word >> id >> span && span == "writes") ++write_batches[st][id];
        }
      }
  }
  void wait_until(const std::function<bool()>& done, std::chrono::milliseconds timeout, const std::string& what) {
    const auto deadline = std::chrono::steady_clock::now() + timeout;
    while (!done()) {
      INFO("waiting for " << what);
      if (std::chrono::steady_clock::now() >= deadline) {
        std::string said;
        for (size_t i = decode_said.size() > 40 ? decode_said.size() - 40 : 0; i < decode_said.size(); ++i)
          said += decode_said[i] + "\n";
        std::string h;
        for (auto& x : held) h += "[" + x + "] ";
        INFO("decode said (last 40 lines):\n" << said << "stages HELD: " << h);
        REQUIRE(false);
      }
      REQUIRE(std::chrono::steady_clock::now() < deadline);
      pump();
    }
  }
  // CLAIM to decode; PREFILL to every stage once decode recorded the CLAIM (CLAIM and PREFILL travel on
  // different sockets, and decode ignores a COMPUTE_DONE that overtakes its CLAIM).
  void submit(const std::map<uint64_t, std::vector<int32_t>>& prompts) {
    for (auto& [id, p] : prompts)
      router.send("decode/d", protocol::Claim{.request_id = id, .prompt_len = uint32_t(p.size()), .decode_ranks = {0},
                                              .prefill_instance = "p", .num_prefill_stages = uint32_t(spec.stages),
                                              .sampling = spec.claim_sampling ? spec.sampling : protocol::SamplingParams{}});
    wait_until([&] {
      for (auto& [id, p] : prompts)
        if (!claimed.count(id)) return false;
      return true;
    }, 20s, "CLAIMED");
    for (auto& [id, p] : prompts) prefill(id, p);
  }
  void prefill(uint64_t id, const std::vector<int32_t>& prompt) {
    protocol::Prefill m{.request_id = id, .token_ids = prompt, .sampling = spec.sampling, .decode_instance = "d",
                        .decode_ranks = {0}};
    for (int st = 0; st < spec.stages; ++st) router.send("prefill/p/" + std::to_string(st), m);
  }
  void wait_finished(const std::vector<uint64_t>& ids) {
    wait_until([&] {
      for (uint64_t id : ids)
        if (!router.finish.count(id) && !router.failed.count(id)) return false;
      return true;
    }, 120s, "TOKENS with a finish reason");
  }
};

std::vector<int32_t> random_prompt(std::mt19937& rng, int len, int vocab) {
  std::vector<int32_t> p(len);
  for (auto& t : p) t = std::uniform_int_distribution<int32_t>(0, vocab - 1)(rng);
  return p;
}

void check_equivalence(const ClusterSpec& spec, uint64_t first_id) {
  const TinyModel& model = model_of(spec.preset);
  const int vocab = model.cfg.vocab_size;
  std::mt19937 rng(static_cast<uint32_t>(first_id));
  Cluster c(spec);
  const int ch = spec.chunk;
  // Sequential single requests, then concurrent groups; lengths from 1 to several chunks.
  std::vector<std::vector<int>> waves = {{1}, {ch + 1}, {ch, 3 * ch + 2, 2}, {ch - 1, 2 * ch + 3, 5, 4 * ch + 1},
                                         {3, 2 * ch, 1, ch + 2, 3 * ch - 1, 6}};
  uint64_t id = first_id;
  for (const auto& wave : waves) {
    std::map<uint64_t, std::vector<int32_t>> prompts;
    std::vector<uint64_t> ids;
    for (int len : wave) {
      prompts[id] = random_prompt(rng, len, vocab);
      ids.push_back(id++);
    }
    c.submit(prompts);
    c.wait_finished(ids);
    for (auto& [rid, prompt] : prompts) {
      INFO("request " << rid << " prompt length " << prompt.size() << " stages " << spec.stages << " chunk " << ch);
      CHECK(c.router.failed.count(rid) == 0);
      CHECK(c.router.finish[rid] == protocol::FinishReason::Length);
      CHECK(c.router.tokens[rid] == engine_tokens(model, prompt, kMaxTokens, spec.sampling));
      if (rid == first_id && spec.preset == "k3-tiny" && spec.sampling.temperature == 0) CHECK(c.router.tokens[rid] == generate_cli_tokens(prompt));
    }
  }
  // Every stage freed every request's held KV once its transfer finished.
  c.wait_until([&] {
    for (auto& h : c.held)
      if (h != "0 0") return false;
    return true;
  }, 10s, "every stage holds nothing");
  // SIGTERM: every node shuts down cleanly (exit status 0).
  ::kill(c.decode->pid(), SIGTERM);
  for (auto& st : c.stages) ::kill(st->pid(), SIGTERM);
  CHECK(c.decode->wait_exit(10s) == 0);
  for (auto& st : c.stages) CHECK(st->wait_exit(10s) == 0);
}

}  // namespace

TEST_CASE("cluster PP=2 (even split), chunk 7: tokens equal the monolithic engine", "[cluster]") {
  check_equivalence({.stages = 2, .partition = "", .chunk = 7}, 100);
}

TEST_CASE("cluster PP=2 streaming a prompt of several chunks: one write batch per chunk, k3-generate's tokens", "[cluster][stream]") {
  // Batches: a stage writes each chunk's rows once ADDRS is back, the rows computed before it in one go, and
  // the KDA state after the last chunk; with --max-inflight-chunks 1 compute waits for every flush.
  for (const std::vector<std::string>& flags : {std::vector<std::string>{"--timing"},
                                               {"--timing", "--max-inflight-chunks", "1"}, {"--timing", "--no-stream"}}) {
    Cluster c({.stages = 2, .partition = "", .chunk = 4, .prefill_flags = flags});
    std::mt19937 rng(61);
    const auto prompt = random_prompt(rng, 16 * 4 + 3, tiny_model().cfg.vocab_size);   // 17 chunks
    c.submit({{1200, prompt}});
    c.wait_finished({1200});
    c.wait_until([&] { return c.held[0] == "0 0" && c.held[1] == "0 0"; }, 10s, "every stage holds nothing");
    INFO("k3-prefill " << flags.back());
    CHECK(c.router.tokens[1200] == generate_cli_tokens(prompt));
    if (flags.back() == "--no-stream") {
      for (int st = 0; st < 2; ++st) CHECK(c.write_batches[st][1200] == 1);
    } else {   // rows in several batches, then the state (unless ADDRS came after nearly every chunk: load)
      CHECK(std::max(c.write_batches[0][1200], c.write_batches[1][1200]) >= 3);
    }
  }
}

TEST_CASE("cluster PP=1, chunk 5: tokens equal the monolithic engine", "[cluster]") {
  check_equivalence({.stages = 1, .partition = "", .chunk = 5}, 200);
}

TEST_CASE("cluster PP=4 (3,1,2,2), chunk 6: tokens equal the monolithic engine", "[cluster]") {
  check_equivalence({.stages = 4, .partition = "3,1,2,2", .chunk = 6}, 300);
}

TEST_CASE("cluster PP=3 with 2 cache slots per stage: concurrent requests wait for a slot, tokens still equal",
          "[cluster]") {
  check_equivalence({.stages = 3, .partition = "", .chunk = 4, .prefill_slots = 2}, 500);
}

TEST_CASE("cluster PP=2, sampled (temperature 0.9, top-k 40, seed 17): tokens equal the engine's draws", "[cluster]") {
  check_equivalence({.stages = 2, .partition = "5,3", .chunk = 5,
                     .sampling = {.temperature = 0.9f, .top_p = 1.f, .top_k = 40, .seed = 17}}, 600);
}

TEST_CASE("cluster k3-tiny-93 on the production partition (16 stages), chunk 9: tokens equal the engine", "[cluster]") {
  std::string part;
  for (int i = 0; i < 7; ++i) part += "7,5,";
  part += "6,3";
  check_equivalence({.preset = "k3-tiny-93", .stages = 16, .partition = part, .chunk = 9}, 400);
}

TEST_CASE("cluster PP=2, decode with a separate cache (--no-cache-in-pool): tokens equal the monolithic engine", "[cluster]") {
  check_equivalence({.stages = 2, .partition = "", .chunk = 7, .separate_cache = true}, 1000);
}

TEST_CASE("k3-decode on the cpu backend keeps its cache in the transfer pool unless --no-cache-in-pool", "[cluster]") {
  for (bool separate : {false, true}) {
    INFO((separate ? "--no-cache-in-pool" : "the default"));
    Cluster c({.stages = 1, .partition = "", .chunk = 8, .separate_cache = separate, .decode_cache_pages = 100});
    c.wait_until([&] { return c.router.decode_room.has_value(); }, 10s, "a decode heartbeat with its room");
    const protocol::DecodeRoom room = *c.router.decode_room;
    if (separate) {
      CHECK(room.cache_pages == 100);              // the flag sizes a cache of its own
    } else {
      CHECK(room.cache_pages == room.pool_pages);  // the engine's pages are the pool's (--cache-pages unused)
      CHECK(room.cache_seqs == room.pool_slots);
      CHECK(room.cache_page_size == room.pool_page_size);
    }
    CHECK(room.pool_pages == 256);
  }
}

TEST_CASE("decode dies while the stages hold a request's KV: every stage frees it and reports FAILED", "[cluster]") {
  Cluster c({.preset = "k3-tiny", .stages = 2, .partition = "", .chunk = 4});
  std::mt19937 rng(4);
  // No CLAIM: decode ignores the COMPUTE_DONEs, so each stage holds its computed KV waiting for ADDRS.
  c.prefill(900, random_prompt(rng, 19, tiny_model().cfg.vocab_size));
  c.wait_until([&] { return c.held[0] == "1 0" && c.held[1] == "1 0"; }, 30s, "both stages hold the request's KV");
  c.decode->kill_now();
  const auto killed = std::chrono::steady_clock::now();
  c.wait_until([&] { return c.held[0] == "0 0" && c.held[1] == "0 0"; }, 10s, "both stages freed the request's KV");
  CHECK(std::chrono::steady_clock::now() - killed < 5s);
  c.wait_until([&] { return c.router.failed.count(900) > 0; }, 5s, "FAILED for the request at the router");
}

namespace {
// The decode transfer pool's IDLE report says it is full again.
bool pool_full(const Cluster& c) {
  for (auto& l : c.decode_said)
    if (l.rfind("IDLE ", 0) == 0) {
      std::istringstream in(l.substr(5));
      uint64_t free = 0, cap = 0;
      in >> free >> cap;
      if (free == cap && cap > 0) return true;
    }
  return false;
}

void check_abort_mid_stream(bool separate_cache, uint32_t n = 1) {
  ClusterSpec spec{.stages = 2, .partition = "", .chunk = 4, .max_tokens = 1000000, .separate_cache = separate_cache};
  if (n > 1) {
    spec.sampling = {.temperature = 0.f, .max_tokens = 1000000, .n = n};
    spec.claim_sampling = true;
  }
  Cluster c(spec);
  std::mt19937 rng(8);
  const auto prompt = random_prompt(rng, 10, tiny_model().cfg.vocab_size);
  c.submit({{700, prompt}});
  c.wait_until([&] { return c.router.tokens[700].size() >= 4; }, 30s, "a few streamed tokens");
  const protocol::Abort abort{.request_id = 700, .reason = protocol::AbortReason::ClientCancelled,
                              .origin_role = protocol::Role::Router};
  for (auto& p : c.router.parties) c.router.send(p, abort);
  auto said = [&](const std::string& prefix) {
    for (auto& l : c.decode_said)
      if (l.rfind(prefix, 0) == 0) return true;
    return false;
  };
  c.wait_until([&] { return said("DONE 700 aborted"); }, 10s, "decode dropped the request");
  c.wait_until([&] { return pool_full(c); }, 10s, "decode's transfer pool back to full");
  CHECK(c.router.finish.count(700) == 0);  // aborted: no final TOKENS
  CHECK(c.router.failed.count(700) == 0);  // the router's own ABORT is not reported back as a failure
  // What streamed before the abort is the engine's output, token for token.
  const auto got = c.router.tokens[700];
  CHECK(got == engine_tokens(tiny_model(), prompt, static_cast<int>(got.size())));
  for (uint32_t i = 1; i < n; ++i) {  // greedy: every choice draws the same tokens
    const auto& more = c.router.choice_tokens[{700, i}];
    CHECK(more == engine_tokens(tiny_model(), prompt, static_cast<int>(more.size())));
  }
}

// n = 3 samples of each prompt: one transfer, three sequences; each choice is the engine's draw under
// ops::choice_seed(seed, i), and nothing is held once every choice ended.
void check_choices(bool separate_cache) {
  const protocol::SamplingParams sp{.temperature = 0.9f, .top_p = 1.f, .top_k = 40, .seed = 17,
                                    .max_tokens = kMaxTokens, .n = 3};
  Cluster c({.stages = 2, .partition = "5,3", .chunk = 5, .sampling = sp, .separate_cache = separate_cache,
             .claim_sampling = true});
  std::mt19937 rng(12);
  std::map<uint64_t, std::vector<int32_t>> prompts;
  for (uint64_t id : {800, 801}) prompts[id] = random_prompt(rng, id == 800 ? 13 : 16, tiny_model().cfg.vocab_size);
  c.submit(prompts);
  c.wait_until([&] { return c.router.choice_finish.size() == 2 * sp.n; }, 120s, "every choice finished");
  for (auto& [id, prompt] : prompts) {
    std::set<std::vector<int32_t>> distinct;
    for (uint32_t i = 0; i < sp.n; ++i) {
      INFO("request " << id << " choice " << i << (separate_cache ? " (separate cache)" : ""));
      protocol::SamplingParams own = sp;
      own.seed = ops::choice_seed(sp.seed, i);
      CHECK(c.router.choice_finish[{id, i}] == protocol::FinishReason::Length);
      CHECK(c.router.choice_tokens[{id, i}] == engine_tokens(tiny_model(), prompt, kMaxTokens, own));
      distinct.insert(c.router.choice_tokens[{id, i}]);
    }
    CHECK(distinct.size() > 1);  // the seed streams differ
    CHECK(c.router.failed.count(id) == 0);
  }
  c.wait_until([&] { return pool_full(c); }, 10s, "decode's transfer pool back to full");
}
}  // namespace

TEST_CASE("n = 3 choices from one transfer, separate decode cache: each equals the engine under its choice seed, the pool empties",
          "[cluster][choices]") {
  check_choices(/*separate_cache=*/true);
}

TEST_CASE("n = 3 choices, decode cache in the transfer pool: forked caches, the pool empties", "[cluster][choices]") {
  check_choices(/*separate_cache=*/false);
}

TEST_CASE("router ABORT mid-stream of n = 3 choices: every choice dropped, the pool returns to full",
          "[cluster][choices]") {
  check_abort_mid_stream(false, 3);  // the cache in the transfer pool (the default)
  check_abort_mid_stream(true, 3);   // a separate decode cache
}

TEST_CASE("router ABORT mid-stream, decode cache in the transfer pool (the default): the pool returns to full",
          "[cluster]") {
  check_abort_mid_stream(false);
}

TEST_CASE("router ABORT mid-stream, separate decode cache: decode drops the request and its pool returns to full",
          "[cluster]") {
  check_abort_mid_stream(true);
}
