// Any prefill instance feeds any decode rank: k3-cluster with P=2 single-stage prefill instances and D=3
// decode ranks serves concurrent requests whose greedy tokens equal k3-generate, and the router's
// per-(prefill, decode) counters show every decode rank fed by both prefill instances. P=1 with D=3
// serves too (each decode rank gets requests from the one prefill instance), there with every node
// bound to 0.0.0.0 and announced at 127.0.0.1 (network.bind_host / advertise_host).
#include <catch2/catch.hpp>

#include <nlohmann/json.hpp>
#include <signal.h>

#include <fstream>
#include <future>
#include <map>
#include <random>
#include <regex>

#include "tests/cluster_e2e/cluster_launch.h"
#include "tests/cluster_e2e/plain_completion.h"
#include "tests/router/http_client.h"
#include "tests/support/generate_reference.h"
#include "tests/support/run_command.h"

using namespace std::chrono_literals;
using nlohmann::json;
using k3::test::HttpConnection;
using k3::test::HttpReply;
using k3::test::token_ids_of;

namespace {

constexpr int kChunk = 8;

struct Cluster {
  k3::test::TempDir dir{"any-to-any"};
  std::string model;
  k3::test::LaunchedCluster c;

  Cluster(int prefills, int decodes, json network = json()) {
    model = dir.path() + "/model";
    json prefill = json::array();
    for (int i = 0; i < prefills; ++i) prefill.push_back({{"id", "p" + std::to_string(i)}, {"stages", 1}, {"chunk_size", kChunk}});
    json spec = {{"model", model},
                       {"generate", {{"preset", "k3-tiny"}, {"seed", 5}}},
                       {"router", {{"host", "127.0.0.1"}, {"port", 0}, {"placement", "round-robin"}}},
                       {"prefill", prefill},
                       {"decode", json::array({{{"id", "d"}, {"ranks", decodes}}})},
                       {"threads", 1},
                       {"timeouts", {{"heartbeat_ms", 200}, {"heartbeat_misses", 5}, {"startup_s", 240}}},
                       {"restart", {{"enabled", false}}}};
    if (!network.is_null()) spec["network"] = network;
    std::ofstream(dir.path() + "/spec.json") << spec.dump(2);
    c = k3::test::launch_cluster(dir.path() + "/spec.json");
  }
  ~Cluster() {
    if (!c.proc) return;
    ::kill(c.proc->pid(), SIGTERM);
    c.proc->wait_exit(30s);
  }
};

// Any thread (no Catch macro); the main thread checks the reply with token_ids_of.
HttpReply post(int port, const json& body) { return k3::test::post_json(port, "/v1/completions", body, 180s); }

// k3_cluster_pair_finished_total by (prefill instance, decode node), from the router's /metrics.
std::map<std::pair<std::string, std::string>, long> finished_by_pair(int port) {
  HttpConnection h(port);
  h.send_request("GET", "/metrics");
  const HttpReply r = h.read_reply(30s);
  REQUIRE(r.status == 200);
  std::map<std::pair<std::string, std::string>, long> out;
  const std::regex line(R"re(k3_cluster_pair_finished_total\{prefill="([^"]+)",node="([^"]+)"\} (\d+))re");
  for (std::sregex_iterator it(r.body.begin(), r.body.end(), line), end; it != end; ++it)
    out[{(*it)[1].str(), (*it)[2].str()}] = std::stol((*it)[3].str());
  return out;
}

// Sends `n` requests at once and checks each one's greedy tokens against k3-generate.
void serve_concurrently(const Cluster& cl, int n, uint32_t seed) {
  const int vocab = k3::test::model_vocab(cl.model);
  std::mt19937 rng(seed);
  std::vector<std::vector<int32_t>> prompts;
  std::vector<std::future<HttpReply>> replies;
  constexpr int kMax = 6;
  for (int i = 0; i < n; ++i) {
    const std::vector<int32_t> p = k3::test::random_tokens(rng, vocab, 3 + (i * 5) % 17);
    prompts.push_back(p);
    const json body = {{"model", "model"}, {"prompt", p},         {"max_tokens", kMax},       {"temperature", 0},
                       {"ignore_eos", true}, {"return_token_ids", true}};
    replies.push_back(std::async(std::launch::async, [port = cl.c.port, body] { return post(port, body); }));
  }
  for (int i = 0; i < n; ++i) {
    INFO("request " << i << " of " << n << " at once");
    CHECK(token_ids_of(replies[i].get()) ==
          k3::test::k3_generate_tokens(cl.model, prompts[i], kMax, "--prefill-chunk " + std::to_string(kChunk)));
  }
}

}  // namespace

TEST_CASE("any to any: 2 prefill instances feed 3 decode ranks, tokens equal k3-generate", "[cluster_e2e]") {
  Cluster cl(2, 3);
  for (const char* n : {"prefill/p0/0", "prefill/p1/0", "decode/d-0", "decode/d-1", "decode/d-2"}) {
    INFO(n);
    REQUIRE(cl.c.pids.count(n));
  }
  serve_concurrently(cl, 12, 31);
  const auto by_pair = finished_by_pair(cl.c.port);
  long total = 0;
  for (const auto& [pair, n] : by_pair) total += n;
  CHECK(total == 12);
  // Every decode rank served requests computed by each prefill instance: no fixed pairs.
  for (const char* d : {"decode/d-0", "decode/d-1", "decode/d-2"})
    for (const char* p : {"p0", "p1"}) {
      INFO(p << " -> " << d);
      CHECK(by_pair.count({p, d}) == 1);
    }
}

// argv of a running process.
std::vector<std::string> cmdline(pid_t pid) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/cmdline");
  std::vector<std::string> out;
  std::string arg;
  while (std::getline(in, arg, '\0')) out.push_back(arg);
  return out;
}

std::vector<std::string> values_of(const std::vector<std::string>& argv, const std::string& flag) {
  std::vector<std::string> v;
  for (size_t i = 0; i + 1 < argv.size(); ++i)
    if (argv[i] == flag) v.push_back(argv[i + 1]);
  return v;
}

TEST_CASE("any to any: 1 prefill instance feeds 3 decode ranks, nodes bound to 0.0.0.0 announced at 127.0.0.1",
          "[cluster_e2e]") {
  Cluster cl(1, 3, {{"bind_host", "0.0.0.0"}, {"advertise_host", "127.0.0.1"}});
  // Sockets bind every interface; peers were handed the advertised address.
  CHECK(cl.c.control.rfind("tcp://127.0.0.1:", 0) == 0);
  const auto router = cmdline(cl.c.pids.at("router"));
  CHECK(values_of(router, "--cluster-endpoint").at(0).rfind("tcp://0.0.0.0:", 0) == 0);
  CHECK(values_of(router, "--advertise-host") == std::vector<std::string>{"127.0.0.1"});
  for (const char* d : {"decode/d-0", "decode/d-1", "decode/d-2"}) {
    const auto argv = cmdline(cl.c.pids.at(d));
    INFO(d);
    CHECK(values_of(argv, "--bind").at(0).rfind("tcp://0.0.0.0:", 0) == 0);
  }
  const auto stage = cmdline(cl.c.pids.at("prefill/p0/0"));
  const auto eps = values_of(stage, "--decode-endpoint");
  CHECK(eps.size() == 3);
  for (const auto& ep : eps) {
    INFO(ep);
    CHECK(ep.rfind("tcp://127.0.0.1:", 0) == 0);
  }
  serve_concurrently(cl, 6, 32);
  const auto by_pair = finished_by_pair(cl.c.port);
  for (const char* d : {"decode/d-0", "decode/d-1", "decode/d-2"}) {
    INFO(d);
    CHECK(by_pair.count({"p0", d}) == 1);
  }
}
