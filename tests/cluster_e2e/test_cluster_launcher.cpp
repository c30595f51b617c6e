// k3-cluster end to end: a spec with a free port (PP2 prefill, DP1 decode, model generated on first
// use), OpenAI requests over HTTP. Greedy tokens (return_token_ids) equal `k3-generate --json` token
// for token, concurrent requests too; streaming works; killing the decode process mid-stream gives the
// client an error event within 5 s, then /health says 503 and so do new requests; the launcher
// reports the crash, and on SIGTERM stops every other child and leaves no process behind.
//
// K3_TEST_BACKEND=cuda runs the clusters with "backend": "cuda" (router, both prefill stages and the
// decode rank on the one GPU) and compares the first test case with `k3-generate --backend cuda` at
// the cluster's prefill chunk size (tests/cuda/run_engine_on_gpu_host.sh does); default cpu.
#include <catch2/catch.hpp>

#include <nlohmann/json.hpp>
#include <signal.h>

#include <cstdlib>
#include <fstream>
#include <future>
#include <map>
#include <set>
#include <random>
#include <thread>

#include "tests/cluster_e2e/cluster_launch.h"
#include "tests/cluster_e2e/plain_completion.h"
#include "tests/router/http_client.h"
#include "tests/support/generate_reference.h"
#include "tests/support/run_command.h"
#include "tests/transfer/process_guard.h"

using namespace std::chrono_literals;
using nlohmann::json;
using k3::test::HttpConnection;
using k3::test::HttpReply;
using k3::test::token_ids_of;
using k3::test::ProcessGuard;

namespace {

const std::string kBin = K3_BIN_DIR;

// The backend every node and the k3-generate reference run on: K3_TEST_BACKEND (cpu | cuda), default cpu.
std::string test_backend() {
  const char* b = std::getenv("K3_TEST_BACKEND");
  const std::string kind = b && *b ? b : "cpu";
  REQUIRE((kind == "cpu" || kind == "cuda"));
  return kind;
}

bool process_alive(pid_t pid) { return ::kill(pid, 0) == 0; }

// k3-cluster from a spec in a temp dir whose model dir does not exist yet (generated on first use).
struct LaunchedCluster {
  k3::test::TempDir dir{"cluster-e2e"};
  std::unique_ptr<ProcessGuard> proc;
  std::map<std::string, pid_t> pids;  // child name -> pid
  int port = 0;
  std::string model;
  int chunk = 0;

  explicit LaunchedCluster(int chunk = 5, json prefill = json(), const std::string& placement = "least-loaded")
      : chunk(chunk) {
    model = dir.path() + "/model";
    if (prefill.is_null()) prefill = json::array({{{"id", "p"}, {"stages", 2}, {"chunk_size", chunk}}});
    const json spec = {{"model", model},
                       {"generate", {{"preset", "k3-tiny"}, {"seed", 3}}},
                       {"router", {{"host", "127.0.0.1"}, {"port", 0}, {"placement", placement}}},
                       {"prefill", prefill},
                       {"decode", json::array({{{"id", "d"}, {"ranks", 1}}})},
                       {"threads", 1},
                       {"backend", test_backend()},
                       {"timeouts", {{"heartbeat_ms", 200}, {"heartbeat_misses", 3}, {"startup_s", 240}}},
                       // These tests check the degraded cluster a lost node leaves (restarts: test_cluster_heal.cpp).
                       {"restart", {{"enabled", false}}}};
    std::ofstream(dir.path() + "/spec.json") << spec.dump(2);
    k3::test::LaunchedCluster launched = k3::test::launch_cluster(dir.path() + "/spec.json");
    proc = std::move(launched.proc);
    pids = std::move(launched.pids);
    port = launched.port;
  }
  ~LaunchedCluster() { stop(); }
  // SIGTERM: clean exit, every child gone.
  int stop() {
    if (!proc) return -1;
    ::kill(proc->pid(), SIGTERM);
    const int code = proc->wait_exit(20s);
    proc.reset();
    return code;
  }
};

json completion_body(const std::vector<int32_t>& prompt, int max_tokens, bool stream) {
  return {{"model", "model"}, {"prompt", prompt}, {"max_tokens", max_tokens}, {"temperature", 0},
          {"ignore_eos", true}, {"return_token_ids", true}, {"stream", stream}};
}

// Any thread (no Catch macro); the main thread checks the reply with token_ids_of.
HttpReply post(int port, const json& body, std::chrono::milliseconds timeout = 120s) {
  return k3::test::post_json(port, "/v1/completions", body, timeout);
}

// The token ids of every data chunk of an SSE body; `done` tells whether it ended with [DONE].
std::vector<int32_t> stream_token_ids(const std::string& body, bool& done, bool& error) {
  std::vector<int32_t> ids;
  done = body.find("data: [DONE]") != std::string::npos;
  error = false;
  size_t at = 0;
  while ((at = body.find("data: {", at)) != std::string::npos) {
    const size_t end = body.find("\n\n", at);
    const json chunk = json::parse(body.substr(at + 6, end - at - 6));
    at = end;
    if (chunk.contains("error")) error = true;
    if (!chunk.contains("choices")) continue;
    for (const auto& ch : chunk.at("choices"))
      if (ch.contains("token_ids")) for (int32_t t : ch.at("token_ids")) ids.push_back(t);
  }
  return ids;
}

// k3-generate's tokens on the cluster's backend and prefill chunking (`extra`: sampling flags).
std::vector<int32_t> generate(const LaunchedCluster& c, const std::vector<int32_t>& prompt, int max_tokens,
                              const std::string& extra = "") {
  return k3::test::k3_generate_tokens(c.model, prompt, max_tokens,
                                      "--backend " + test_backend() + " --prefill-chunk " + std::to_string(c.chunk) + extra);
}

}  // namespace

TEST_CASE("k3-cluster serves OpenAI requests whose greedy tokens equal k3-generate, concurrently and streamed",
          "[cluster_e2e]") {
  LaunchedCluster c(5);
  REQUIRE(c.pids.count("router"));
  REQUIRE(c.pids.count("decode/d"));
  REQUIRE(c.pids.count("prefill/p/0"));
  REQUIRE(c.pids.count("prefill/p/1"));
  {
    HttpConnection h(c.port);
    h.send_request("GET", "/health");
    CHECK(h.read_reply().status == 200);
  }
  const int vocab = k3::test::model_vocab(c.model);
  std::mt19937 rng(21);
  auto prompt_of = [&](int len) { return k3::test::random_tokens(rng, vocab, len); };
  constexpr int kMax = 8;
  // Lengths from 1 to several chunks (chunk 5), one after the other.
  for (int len : {1, 7, 16}) {
    const auto prompt = prompt_of(len);
    INFO("prompt length " << len);
    CHECK(token_ids_of(post(c.port, completion_body(prompt, kMax, false))) == generate(c, prompt, kMax));
  }
  // Several at once, two sharing a prefix.
  std::vector<std::vector<int32_t>> prompts = {prompt_of(3), prompt_of(12), prompt_of(9), prompt_of(21)};
  prompts.push_back(prompts[1]);
  prompts.back().push_back(5);
  std::vector<std::future<HttpReply>> replies;
  for (const auto& p : prompts) replies.push_back(std::async(std::launch::async, [&c, p] { return post(c.port, completion_body(p, kMax, false)); }));
  for (size_t i = 0; i < prompts.size(); ++i) {
    INFO("concurrent request " << i);
    CHECK(token_ids_of(replies[i].get()) == generate(c, prompts[i], kMax));
  }
  // 16 at once, every other one sampled (temperature 0.8, its own seed): the (seed, step) rule is
  // the same on every node, so the sampled tokens equal k3-generate's as well; and every fourth with the
  // presence and frequency penalties (over the tokens generated so far, the first from the last prefill
  // stage, the rest from decode), which must count the same tokens on every node.
  {
    std::vector<std::vector<int32_t>> ps;
    std::vector<std::string> flags;
    std::vector<std::future<HttpReply>> rs;
    for (int i = 0; i < 16; ++i) {
      ps.push_back(prompt_of(1 + (i * 7) % 23));
      json body = completion_body(ps.back(), kMax, false);
      flags.emplace_back();
      if (i % 2) {
        body["temperature"] = 0.8;
        body["seed"] = 100 + i;
        flags.back() = " --temperature 0.8 --seed " + std::to_string(100 + i);
      }
      if (i % 4 >= 2) {
        body["presence_penalty"] = 0.7;
        body["frequency_penalty"] = 1.5;
        flags.back() += " --presence-penalty 0.7 --frequency-penalty 1.5";
      }
      rs.push_back(std::async(std::launch::async, [&c, body] { return post(c.port, body); }));
    }
    for (int i = 0; i < 16; ++i) {
      INFO("request " << i << " of 16 concurrent" << flags[i]);
      CHECK(token_ids_of(rs[i].get()) == generate(c, ps[i], kMax, flags[i]));
    }
  }
  // The penalties at work: negative ones pull a greedy request back to the tokens it already generated
  // (k3-tiny's greedy text does not repeat within 24 tokens; with them it does), and the cluster's tokens
  // are still k3-generate's under the same penalties.
  {
    const auto pp = prompt_of(5);
    json body = completion_body(pp, 24, false);
    body["presence_penalty"] = -2;
    body["frequency_penalty"] = -2;
    const std::vector<int32_t> penalized = token_ids_of(post(c.port, body));
    CHECK(penalized == generate(c, pp, 24, " --presence-penalty -2 --frequency-penalty -2"));
    const std::vector<int32_t> plain = generate(c, pp, 24);
    const std::set<int32_t> distinct_plain(plain.begin(), plain.end()), distinct(penalized.begin(), penalized.end());
    INFO("distinct tokens of 24: greedy " << distinct_plain.size() << ", with the penalties " << distinct.size());
    CHECK(distinct.size() < distinct_plain.size());
  }
  // logit_bias on every draw, the first (the last prefill stage's) included: +100 makes token 7 certain
  // even when sampled, and the cluster's tokens are k3-generate's with the same bias.
  {
    const auto bp = prompt_of(4);
    json body = completion_body(bp, 6, false);
    body["logit_bias"] = {{"7", 100}, {"9", -100}};
    body["temperature"] = 1.0;
    body["seed"] = 3;
    const std::vector<int32_t> biased = token_ids_of(post(c.port, body));
    CHECK(biased == std::vector<int32_t>(6, 7));
    CHECK(biased == generate(c, bp, 6, " --temperature 1 --seed 3 --logit-bias 7:100,9:-100"));
  }
  // Streaming: the chunks' token ids in order are the same tokens; the stream ends with [DONE].
  const auto sp = prompt_of(6);
  const HttpReply s = post(c.port, completion_body(sp, kMax, true));
  REQUIRE(s.status == 200);
  CHECK(s.headers.at("content-type").find("text/event-stream") != std::string::npos);
  bool done = false, error = false;
  CHECK(stream_token_ids(s.body, done, error) == generate(c, sp, kMax));
  CHECK(done);
  CHECK_FALSE(error);
  // A client that leaves mid-stream: the router aborts the request on the nodes and forgets it; the
  // cluster keeps serving with the same tokens.
  {
    HttpConnection h(c.port);
    h.send_request("POST", "/v1/completions", completion_body(prompt_of(8), 3000, true).dump());
    std::string got;
    const auto until = std::chrono::steady_clock::now() + 60s;
    while (got.find("\"token_ids\"") == std::string::npos) {
      REQUIRE(std::chrono::steady_clock::now() < until);
      got += h.read_some(200ms);
    }
    h.close();
    auto in_flight = [&] {
      HttpConnection m(c.port);
      m.send_request("GET", "/metrics");
      const std::string body = m.read_reply().body;
      const auto at = body.find("\nk3_cluster_requests_in_flight ");
      return at == std::string::npos ? -1L : std::atol(body.c_str() + at + 31);
    };
    const auto t0 = std::chrono::steady_clock::now();
    while (in_flight() != 0) {
      REQUIRE(std::chrono::steady_clock::now() - t0 < 10s);
      std::this_thread::sleep_for(100ms);
    }
    const auto again = prompt_of(4);
    CHECK(token_ids_of(post(c.port, completion_body(again, kMax, false))) == generate(c, again, kMax));
  }
  // The node metrics are on /metrics.
  {
    HttpConnection h(c.port);
    h.send_request("GET", "/metrics");
    const HttpReply m = h.read_reply();
    CHECK(m.body.find("k3_cluster_nodes_registered 3") != std::string::npos);
    CHECK(m.body.find("k3_cluster_node_up{node=\"decode/d\"} 1") != std::string::npos);
  }
  // Ctrl-C semantics: SIGTERM stops the launcher cleanly and no child is left.
  const auto pids = c.pids;
  CHECK(c.stop() == 0);
  for (const auto& [name, pid] : pids) {
    INFO(name);
    CHECK_FALSE(process_alive(pid));
  }
}

TEST_CASE("k3-cluster: decode killed mid-stream gives the client an error event within 5 s, then 503", "[cluster_e2e]") {
  LaunchedCluster c(4);
  const int vocab = k3::test::model_vocab(c.model);
  std::vector<int32_t> prompt(10);
  for (size_t i = 0; i < prompt.size(); ++i) prompt[i] = static_cast<int32_t>((i * 37 + 11) % vocab);
  HttpConnection h(c.port);
  h.send_request("POST", "/v1/completions", completion_body(prompt, 1500, true).dump());
  // Wait for a few streamed token chunks.
  std::string got;
  const auto deadline = std::chrono::steady_clock::now() + 120s;
  auto count = [&](const std::string& needle) {
    size_t n = 0;
    for (size_t at = got.find(needle); at != std::string::npos; at = got.find(needle, at + 1)) ++n;
    return n;
  };
  while (count("\"token_ids\"") < 3) {
    REQUIRE(std::chrono::steady_clock::now() < deadline);
    got += h.read_some(200ms);
  }
  REQUIRE(got.find("[DONE]") == std::string::npos);
  ::kill(c.pids.at("decode/d"), SIGKILL);
  const auto killed = std::chrono::steady_clock::now();
  while (got.find("\"error\"") == std::string::npos) {
    INFO(got.substr(got.size() > 2000 ? got.size() - 2000 : 0));
    REQUIRE(std::chrono::steady_clock::now() - killed < 5s);
    got += h.read_some(100ms);
  }
  CHECK(std::chrono::steady_clock::now() - killed < 5s);
  // The launcher reports the crash and keeps the rest up: the router is degraded (no complete pair),
  // so /health and new requests get 503 promptly.
  CHECK(c.proc->wait_for("CHILD_EXITED decode/d", 10s));
  {
    // The client's error can come from a prefill stage's FAILED before the router's own heartbeats
    // declare the decode dead; /health turns 503 within the heartbeat window.
    const auto t0 = std::chrono::steady_clock::now();
    int status = 0;
    while (std::chrono::steady_clock::now() - t0 < 5s) {
      HttpConnection h2(c.port);
      h2.send_request("GET", "/health");
      status = h2.read_reply(10s).status;
      if (status == 503) break;
      std::this_thread::sleep_for(100ms);
    }
    CHECK(status == 503);
  }
  {
    const auto t0 = std::chrono::steady_clock::now();
    const HttpReply r = post(c.port, completion_body(prompt, 4, false), 10s);
    CHECK(r.status == 503);
    CHECK(json::parse(r.body).at("error").is_object());
    CHECK(std::chrono::steady_clock::now() - t0 < 2s);
  }
  {
    HttpConnection h3(c.port);
    h3.send_request("GET", "/metrics");
    const HttpReply m = h3.read_reply();
    CHECK(m.body.find("k3_cluster_node_up{node=\"decode/d\"} 0") != std::string::npos);
    CHECK(m.body.find("k3_cluster_node_failures_total{node=\"decode/d\"} 1") != std::string::npos);
  }
  // Ctrl-C: everything stops, non-zero because a child had crashed, no process left.
  const auto pids = c.pids;
  CHECK(c.stop() == 1);
  for (const auto& [name, pid] : pids) {
    INFO(name);
    CHECK_FALSE(process_alive(pid));
  }
}

TEST_CASE("k3-cluster: two prefill instances share a decode rank; a dead prefill stage sends requests to the other "
          "(retried when no token was streamed)",
          "[cluster_e2e]") {
  LaunchedCluster c(0, json::array({{{"id", "a"}, {"stages", 2}, {"chunk_size", 4}}, {{"id", "b"}, {"stages", 1}, {"chunk_size", 6}}}),
                    "round-robin");
  REQUIRE(c.pids.count("prefill/a/1"));
  REQUIRE(c.pids.count("prefill/b/0"));
  const int vocab = k3::test::model_vocab(c.model);
  std::mt19937 rng(5);
  auto prompt_of = [&](int len) { return k3::test::random_tokens(rng, vocab, len); };
  constexpr int kMax = 6;
  // Round-robin alternates the instances: both give the reference tokens.
  for (int len : {5, 11, 2, 9}) {
    const auto p = prompt_of(len);
    CHECK(token_ids_of(post(c.port, completion_body(p, kMax, false))) == k3::test::k3_generate_tokens(c.model, p, kMax));
  }
  // Instance a's stage 0 freezes (no heartbeats): requests placed there before the router notices get
  // no token; once it is declared dead they are placed again on b, with the same tokens.
  ::kill(c.pids.at("prefill/a/0"), SIGSTOP);
  std::vector<std::vector<int32_t>> prompts = {prompt_of(4), prompt_of(7), prompt_of(10), prompt_of(6)};
  std::vector<std::future<HttpReply>> replies;
  for (const auto& p : prompts)
    replies.push_back(std::async(std::launch::async, [&c, p] { return post(c.port, completion_body(p, kMax, false), 60s); }));
  for (size_t i = 0; i < prompts.size(); ++i) {
    INFO("request " << i << " sent while a stage of instance a was frozen");
    CHECK(token_ids_of(replies[i].get()) == k3::test::k3_generate_tokens(c.model, prompts[i], kMax));
  }
  auto metrics = [&] {
    HttpConnection m(c.port);
    m.send_request("GET", "/metrics");
    return m.read_reply().body;
  };
  CHECK(metrics().find("k3_cluster_node_up{node=\"prefill/a/0\"} 0") != std::string::npos);
  CHECK(metrics().find("k3_cluster_retries_total 0") == std::string::npos);  // at least one retry
  // Then it dies for good: reported by the launcher; new requests keep going to b.
  ::kill(c.pids.at("prefill/a/0"), SIGKILL);
  CHECK(c.proc->wait_for("CHILD_EXITED prefill/a/0", 10s));
  {
    HttpConnection h(c.port);
    h.send_request("GET", "/health");
    CHECK(h.read_reply().status == 200);  // pair b is complete
  }
  for (int len : {3, 8, 13}) {
    const auto p = prompt_of(len);
    const auto t1 = std::chrono::steady_clock::now();
    CHECK(token_ids_of(post(c.port, completion_body(p, kMax, false))) == k3::test::k3_generate_tokens(c.model, p, kMax));
    CHECK(std::chrono::steady_clock::now() - t1 < 30s);
  }
  const auto pids = c.pids;
  CHECK(c.stop() == 1);
  for (const auto& [name, pid] : pids) {
    INFO(name);
    CHECK_FALSE(process_alive(pid));
  }
}
