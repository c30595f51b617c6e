// Decode rank groups served by k3-cluster: deploy/cluster-dcp.json (two prefill PP2 instances + one decode
// instance of DP2 x DCP8 on k3-tiny-h8) and deploy/cluster-ep.json (DP2 x EP4 on k3-tiny). Concurrent
// requests over HTTP, greedy and seeded, with prompts longer than the group so every DCP rank holds
// tokens, give the tokens of k3-generate; every rank imports what it decodes from its own transfer region
// (nothing forwarded); logprobs equal local mode's and json_schema output holds to its schema on both
// groups. A rank killed mid-stream ends every request of its group with an
// error within 5 s, the other group serves on with the right tokens, the survivors' caches and
// transfer pools are all free, and the group forms again (restarted by k3-cluster) and serves.
// DCP8 runs as the spec file says (21 processes: router, 4 prefill stages, 2 x 8 decode ranks); they sleep
// on events, and the whole case takes ~20 s on the 2-core machine.
#include <catch2/catch.hpp>

#include <nlohmann/json.hpp>
#include <signal.h>

#include <filesystem>
#include <fstream>
#include <future>
#include <map>
#include <regex>
#include <set>
#include <thread>

#include "common/config/config.h"
#include "engine/kv_cache.h"
#include "engine/rank_layout.h"
#include "kernels/backend.h"
#include "tests/cluster_e2e/cluster_launch.h"
#include "tests/cluster_e2e/plain_completion.h"
#include "tests/cluster_e2e/stream_load.h"
#include "tests/router/http_client.h"
#include "tests/router/router_process.h"
#include "tests/support/generate_reference.h"
#include "tests/support/run_command.h"
#include "tests/transfer/process_guard.h"

using namespace std::chrono_literals;
using nlohmann::json;
using k3::test::HttpConnection;
using k3::test::HttpReply;
using k3::test::StreamOutcome;
using Clock = std::chrono::steady_clock;

namespace {

// The spec file with a model dir in `dir`, a free port, and (when > 0) the DCP size replaced.
std::string write_spec(const std::string& file, const std::string& dir, int dcp) {
  std::ifstream in(std::string(K3_SOURCE_DIR) + "/deploy/" + file);
  json spec = json::parse(in);
  spec["model"] = dir + "/model";
  spec["router"]["port"] = 0;
  spec["router"]["served_model_name"] = "k3-tiny";
  if (dcp > 0) spec["decode"][0]["dcp"] = dcp;
  std::ofstream(dir + "/spec.json") << spec.dump(2);
  return dir + "/spec.json";
}

// Runs on std::async threads: no Catch macro here; the main thread checks the reply with token_ids_of.
HttpReply complete(int port, const std::vector<int32_t>& prompt, int max_tokens, float temperature, uint64_t seed) {
  return k3::test::post_json(port, "/v1/completions",
                             {{"model", "k3-tiny"}, {"prompt", prompt}, {"max_tokens", max_tokens},
                              {"temperature", temperature}, {"seed", seed}, {"ignore_eos", true},
                              {"return_token_ids", true}});
}

// Prompts of 9..37 tokens: longer than any group here, so every DCP rank holds some of each prompt.
std::vector<std::vector<int32_t>> long_prompts() {
  std::vector<std::vector<int32_t>> out;
  for (int len : {9, 17, 23, 37}) {
    std::vector<int32_t> p;
    for (int i = 0; i < len; ++i) p.push_back(static_cast<int32_t>((len * 31 + i * 7) % 500 + 1));
    out.push_back(p);
  }
  return out;
}

// Logprobs and structured output on the groups, as a plain decode rank serves them: the leader takes them
// from the logits it samples (after the DCP merge or the EP gather) with the helpers a decode rank uses.
// Logprobs equal local mode's (a plain k3-router on the same model) within 1e-3 (DCP merges its attention
// partials in another order than the one-pass engine: rounding, not a different model), with the same
// tokens and alternatives; json_schema output parses and holds to its schema. Both DP groups get requests.
void check_group_features(int port, const std::string& model) {
  k3::test::RouterProcess local({"--model", model, "--port", "0", "--served-model-name", "k3-tiny", "--threads", "1"});
  const json lp_body{{"model", "k3-tiny"},   {"prompt", std::vector<int32_t>{5, 17, 99, 3, 41, 7, 250, 12, 9}},
                     {"max_tokens", 5},      {"temperature", 0},
                     {"logprobs", 2},        {"ignore_eos", true}};
  const auto post = [](int to, const std::string& path, const json& body) {
    const HttpReply r = k3::test::post_json(to, path, body);
    INFO(path << " " << body.dump() << " -> " << r.status << " " << r.body);
    REQUIRE(r.status == 200);
    return json::parse(r.body).at("choices").at(0);
  };
  const json want = post(local.port(), "/v1/completions", lp_body).at("logprobs");
  for (int i = 0; i < 2; ++i) {  // round-robin: one request per group
    const json got = post(port, "/v1/completions", lp_body).at("logprobs");
    INFO("group logprobs " << got.dump() << "\nlocal " << want.dump());
    REQUIRE(got.at("tokens") == want.at("tokens"));
    REQUIRE(got.at("token_logprobs").size() == want.at("token_logprobs").size());
    for (size_t t = 0; t < want.at("token_logprobs").size(); ++t) {
      CHECK(got["token_logprobs"][t].get<double>() == Approx(want["token_logprobs"][t].get<double>()).margin(1e-3));
      CHECK(got["token_logprobs"][t].get<double>() <= 0);
      const json& a = got.at("top_logprobs").at(t);
      const json& b = want.at("top_logprobs").at(t);
      REQUIRE(a.size() == b.size());
      for (const auto& [token, value] : b.items()) {
        REQUIRE(a.contains(token));
        CHECK(a[token].get<double>() == Approx(value.get<double>()).margin(1e-3));
      }
    }
  }
  const json schema{{"type", "object"},
                    {"properties", {{"kind", {{"enum", {"cat", "dog"}}}},
                                    {"alive", {{"type", "boolean"}}},
                                    {"name", {{"type", "string"}, {"maxLength", 6}}}}},
                    {"required", {"kind", "alive", "name"}},
                    {"additionalProperties", false}};
  for (int i = 0; i < 2; ++i) {
    const json body{{"model", "k3-tiny"},
                    {"messages", json::array({{{"role", "user"}, {"content", "a pet, as JSON " + std::to_string(i)}}})},
                    {"max_tokens", 200}, {"temperature", 0.8}, {"seed", 3 + i},
                    {"response_format", {{"type", "json_schema"}, {"json_schema", {{"name", "pet"}, {"schema", schema}}}}}};
    const json choice = post(port, "/v1/chat/completions", body);
    const std::string text = choice.at("message").at("content");
    INFO("json_schema output: " << text);
    CHECK(choice.at("finish_reason") == "stop");
    const json doc = json::parse(text, nullptr, false);
    REQUIRE(doc.is_object());
    CHECK(doc.size() == 3);
    CHECK((doc.value("kind", "") == "cat" || doc.value("kind", "") == "dog"));
    CHECK(doc.contains("alive"));
    CHECK(doc["alive"].is_boolean());
    REQUIRE(doc.contains("name"));
    REQUIRE(doc["name"].is_string());
    CHECK(doc["name"].get<std::string>().size() <= 6 * 4);  // at most 6 characters of up to 4 UTF-8 bytes
  }
}

// Concurrent greedy and seeded requests == k3-generate; both DP groups served some.
void check_tokens(const k3::test::LaunchedCluster& c, const std::string& model) {
  const auto prompts = long_prompts();
  constexpr int kMax = 6;
  struct Case {
    size_t prompt;
    float temperature;
    uint64_t seed;
  };
  std::vector<Case> cases;
  for (size_t i = 0; i < prompts.size(); ++i) cases.push_back({i, 0.f, 0});
  for (size_t i = 0; i < prompts.size(); ++i) cases.push_back({i, 0.75f, 11 + i});
  std::vector<std::future<HttpReply>> replies;
  const int port = c.port;
  for (const Case& k : cases)
    replies.push_back(std::async(std::launch::async, [port, &prompts, k] {
      return complete(port, prompts[k.prompt], kMax, k.temperature, k.seed);
    }));
  for (size_t i = 0; i < cases.size(); ++i) {
    INFO("prompt " << cases[i].prompt << " (" << prompts[cases[i].prompt].size() << " tokens), temperature "
                   << cases[i].temperature << ", seed " << cases[i].seed);
    CHECK(k3::test::token_ids_of(replies[i].get()) ==
          k3::test::k3_generate_tokens(model, prompts[cases[i].prompt], kMax, cases[i].temperature, cases[i].seed));
  }
  // The group leader draws with the same logit biases and penalties (over the same streamed tokens) as
  // k3-generate: one such request per prompt, round robin over both groups.
  std::vector<std::future<HttpReply>> adjusted;
  for (const auto& p : prompts)
    adjusted.push_back(std::async(std::launch::async, [port, p, kMax] {
      return k3::test::post_json(port, "/v1/completions",
                                 {{"model", "k3-tiny"}, {"prompt", p}, {"max_tokens", kMax}, {"temperature", 0.75},
                                  {"seed", 21}, {"ignore_eos", true}, {"return_token_ids", true},
                                  {"logit_bias", {{"7", 5}, {"11", -3}}}, {"frequency_penalty", -1.5}});
    }));
  for (size_t i = 0; i < prompts.size(); ++i) {
    INFO("prompt " << i << " with logit_bias and frequency_penalty");
    CHECK(k3::test::token_ids_of(adjusted[i].get()) ==
          k3::test::k3_generate_tokens(model, prompts[i], kMax,
                                       "--temperature 0.75 --seed 21 --logit-bias 7:5,11:-3 --frequency-penalty -1.5"));
  }
  const auto m = k3::test::read_metrics(c.port);
  for (const char* node : {"decode/d-0", "decode/d-1"})
    CHECK(k3::test::metric_or(m, std::string("k3_cluster_placements_total{node=\"") + node + "\"}") >= 1);
}

// Streams on both groups, a member of decode/d-0 SIGKILLed once both groups decode: d-0's streams end
// with an error event within 5 s, d-1's finish with k3-generate's tokens, the survivors free everything.
void check_rank_death(k3::test::LaunchedCluster& c, const std::string& model, int group_size) {
  const auto prompts = long_prompts();
  constexpr int kMax = 600;   // long enough that d-0's streams still run when its member's death is noticed
  std::vector<std::future<std::pair<StreamOutcome, Clock::time_point>>> streams;
  const int port = c.port;
  for (const auto& p : prompts)
    streams.push_back(std::async(std::launch::async, [port, p] {
      StreamOutcome o = k3::test::stream_completion(port, p, kMax, 120s);
      return std::make_pair(o, Clock::now());
    }));
  // Both groups decode (their leaders' heartbeats report running requests) before the kill.
  const auto until = Clock::now() + 120s;
  for (;;) {
    const auto m = k3::test::read_metrics(port);
    if (k3::test::metric_or(m, "k3_cluster_node_running{node=\"decode/d-0\"}") >= 1 &&
        k3::test::metric_or(m, "k3_cluster_node_running{node=\"decode/d-1\"}") >= 1)
      break;
    REQUIRE(Clock::now() < until);
    std::this_thread::sleep_for(50ms);
  }
  // Then a little longer, so that d-0's requests have streamed tokens: one that has streamed none when its
  // group fails is placed again and finishes elsewhere (the router's retry), which is not what is tested here.
  std::this_thread::sleep_for(500ms);
  const std::string victim = "decode/d-0/" + std::to_string(group_size - 1);
  REQUIRE(c.pids.count(victim));
  const auto killed_at = Clock::now();
  REQUIRE(::kill(c.pids.at(victim), SIGKILL) == 0);
  int failed = 0, finished = 0;
  std::string ends;   // each stream's outcome and when it ended, relative to the kill
  for (size_t i = 0; i < streams.size(); ++i) {
    auto [o, end] = streams[i].get();
    ends += " " + std::to_string(i) + ":" + k3::test::outcome_name(o.kind) + "@" +
            std::to_string(std::chrono::duration<double>(end - killed_at).count()) + "s/" + std::to_string(o.tokens);
    INFO("stream " << i << ": " << k3::test::outcome_name(o.kind) << " " << o.error << " after "
                   << std::chrono::duration<double>(end - killed_at).count() << " s from the kill");
    if (o.kind == StreamOutcome::Kind::ErrorEvent) {
      ++failed;
      CHECK(end - killed_at < 5s);
      CHECK(o.tokens < static_cast<size_t>(kMax));
    } else {
      REQUIRE(o.kind == StreamOutcome::Kind::Done);
      ++finished;
      CHECK(o.ids == k3::test::k3_generate_tokens(model, prompts[i], kMax));
    }
  }
  INFO("streams (outcome@seconds after the kill/tokens):" << ends);
  CHECK(failed >= 1);    // d-0's requests
  CHECK(finished >= 1);  // d-1's requests

  // The survivors of d-0 report what they hold after closing everything: all pages and slots free; the
  // leader's transfer pool is whole again.
  std::map<std::string, std::string> free_lines, idle_lines;
  const auto lines_until = Clock::now() + 30s;
  while (free_lines.size() < static_cast<size_t>(group_size - 1) && Clock::now() < lines_until) {
    auto line = c.proc->read_line(500ms);
    if (!line) continue;
    std::smatch hit;
    if (std::regex_match(*line, hit, std::regex("NODE (decode/d-0[^ ]*) FREE (.*)"))) free_lines[hit[1]] = hit[2];
    if (std::regex_match(*line, hit, std::regex("NODE decode/d-0 IDLE ([0-9]+) ([0-9]+)"))) idle_lines["d-0"] = hit[1].str() + " " + hit[2].str();
  }
  INFO("FREE lines of " << free_lines.size() << " survivors");
  CHECK(free_lines.size() == static_cast<size_t>(group_size - 1));
  for (const auto& [node, f] : free_lines) {
    INFO(node << " FREE " << f);
    int fp = 0, np = 0, fs = 0, ns = 0;
    REQUIRE(std::sscanf(f.c_str(), "%d %d %d %d", &fp, &np, &fs, &ns) == 4);
    CHECK(fp == np);
    CHECK(fs == ns);
  }
  if (idle_lines.count("d-0")) {
    unsigned long long fr = 0, cap = 0;
    std::sscanf(idle_lines["d-0"].c_str(), "%llu %llu", &fr, &cap);
    CHECK(fr == cap);
  }
  // The other group still serves new requests.
  const auto m = k3::test::read_metrics(port);
  CHECK(k3::test::metric_or(m, "k3_cluster_node_up{node=\"decode/d-1\"}", 1) == 1);
  CHECK(k3::test::token_ids_of(complete(port, prompts[1], 4, 0.f, 0)) == k3::test::k3_generate_tokens(model, prompts[1], 4));

  // The group forms again: k3-cluster restarts its processes (the leader binds the same group endpoint, the
  // members find it, the prefill stages register the new regions), and requests placed on it are served
  // with k3-generate's tokens.
  std::vector<std::vector<int32_t>> want;
  for (const auto& p : prompts) want.push_back(k3::test::k3_generate_tokens(model, p, 4));
  const auto before = k3::test::read_metrics(port);
  const double placed_before = k3::test::metric_or(before, "k3_cluster_placements_total{node=\"decode/d-0\"}");
  const auto reformed_until = Clock::now() + 120s;
  for (;;) {
    REQUIRE(Clock::now() < reformed_until);
    std::vector<std::future<HttpReply>> again;
    for (const auto& p : prompts)
      again.push_back(std::async(std::launch::async, [port, p] { return complete(port, p, 4, 0.f, 0); }));
    for (size_t i = 0; i < again.size(); ++i) {
      INFO("prompt " << i << " after the group's restart");
      CHECK(k3::test::token_ids_of(again[i].get()) == want[i]);
    }
    const auto now = k3::test::read_metrics(port);
    // Served there, not retried elsewhere after a failed attempt on it.
    CHECK(k3::test::metric_or(now, "k3_cluster_retries_total") == k3::test::metric_or(before, "k3_cluster_retries_total"));
    if (k3::test::metric_or(now, "k3_cluster_placements_total{node=\"decode/d-0\"}") > placed_before) break;
    std::this_thread::sleep_for(500ms);
  }
}

// One rank's IMPORTED line (k3-cluster --verbose echoes every child's stdout on stderr).
struct Imported {
  int rank = 0;
  int64_t position = 0;
  uint64_t bytes = 0;
  std::string source;
};

// What the ranks of both groups imported, from the launcher's log: every rank prints IMPORTED for each
// request it took, saying whether it read it from its own region or got it in the leader's command.
// Waits until every request seen on a group's leader was imported by all `group_size` ranks (EP: 1).
std::map<std::pair<std::string, uint64_t>, std::vector<Imported>> read_imports(const std::string& log, int group_size,
                                                                                size_t min_requests) {
  const std::regex imported("k3-cluster: decode/(d-[01])(?:/([0-9]+))?: IMPORTED ([0-9]+) ([0-9]+) ([0-9]+) (region|command)");
  std::map<std::pair<std::string, uint64_t>, std::vector<Imported>> out;
  for (const auto until = Clock::now() + 30s;; std::this_thread::sleep_for(200ms)) {
    out.clear();
    std::ifstream in(log);
    for (std::string line; std::getline(in, line);) {
      std::smatch m;
      if (!std::regex_match(line, m, imported)) continue;
      out[{m[1], std::stoull(m[3])}].push_back({.rank = m[2].matched ? std::stoi(m[2]) : 0, .position = std::stoll(m[4]),
                                                .bytes = std::stoull(m[5]), .source = m[6]});
    }
    const bool whole = out.size() >= min_requests &&
                       std::all_of(out.begin(), out.end(), [&](const auto& kv) {
                         return kv.second.size() >= static_cast<size_t>(group_size);
                       });
    if (whole || Clock::now() > until) return out;
  }
}

// The prefill stages wrote every rank's share straight into that rank's own region, so nothing was
// forwarded: DCP, every rank of the group imported every request from its region, exactly its slice's
// bytes (its rows p % N == rank and its KDA heads); EP, one rank imported each request from its own
// region, exactly the whole request's bytes, and the members did so for some (not all on the leader).
void check_direct_transfer(const std::string& log, const std::string& model, int dcp, int ep, size_t requests) {
  const auto imports = read_imports(log, dcp, requests);
  CHECK(imports.size() >= requests);
  const k3::ModelConfig cfg = k3::load_model_config(model + "/config.json").value();
  auto be = k3::make_cpu_backend({.threads = 1});
  std::set<int> ep_ranks;
  for (const auto& [key, ranks] : imports) {
    INFO("group " << key.first << ", request " << key.second);
    std::set<int> seen;
    for (const Imported& i : ranks) {
      INFO("rank " << i.rank << ": " << i.bytes << " bytes from " << i.source);
      seen.insert(i.rank);
      ep_ranks.insert(i.rank);
      CHECK(i.source == "region");
      const k3::RankLayout g{.dcp = dcp, .ep = ep, .kv_partitions = dcp, .rank = i.rank};
      const k3::CacheLayout layout = k3::cache_layout(k3::rank_cache_config(cfg, g), *be).value();
      std::vector<uint32_t> layers;
      for (uint32_t l = 0; l < layout.num_main_layers(); ++l) layers.push_back(l);
      CHECK(i.bytes == layout.pack(layers, static_cast<uint64_t>(k3::dcp_rows_on(g, i.position))).total_bytes);
    }
    CHECK(seen.size() == static_cast<size_t>(dcp));
  }
  if (ep > 1) CHECK(ep_ranks.size() >= 2);
}

// K3_TEST_LOG_DIR: the launcher's log (every node's lines, --verbose) is copied there as <name>.log
// when the run ends, failed checks and all (a destructor), before its temporary directory goes: to
// tell why a run failed.
struct KeepLog {
  std::string log, name;
  ~KeepLog() {
    const char* dir = std::getenv("K3_TEST_LOG_DIR");
    if (!dir || !*dir) return;
    std::error_code ec;
    std::filesystem::create_directories(dir, ec);
    std::filesystem::copy_file(log, std::string(dir) + "/" + name + ".log",
                               std::filesystem::copy_options::overwrite_existing, ec);
  }
};

// `dcp` 0: the spec file's.
void run_dcp(int dcp) {
  k3::test::TempDir dir("cluster-dcp");
  const std::string spec = write_spec("cluster-dcp.json", dir.path(), dcp);
  if (dcp == 0) dcp = 8;
  const std::string log = dir.path() + "/cluster.log";
  const KeepLog keep{log, "cluster-dcp"};
  k3::test::LaunchedCluster c = k3::test::launch_cluster(spec, 300s, {"--verbose"}, log);
  CHECK(c.pids.size() == static_cast<size_t>(1 + 2 * dcp + 4));  // router, 2 groups of dcp, 2 x PP2 prefill
  check_tokens(c, dir.path() + "/model");
  check_direct_transfer(log, dir.path() + "/model", dcp, 1, 8);
  check_group_features(c.port, dir.path() + "/model");
  check_rank_death(c, dir.path() + "/model", dcp);
  ::kill(c.proc->pid(), SIGTERM);
  c.proc->wait_exit(30s);
}

}  // namespace

TEST_CASE("deploy/cluster-dcp.json and cluster-ep.json describe DP2 x DCP8 and DP2 x EP4 groups", "[cluster_e2e][ranks]") {
  for (const char* file : {"cluster-dcp.json", "cluster-ep.json"}) {
    std::ifstream in(std::string(K3_SOURCE_DIR) + "/deploy/" + file);
    const json spec = json::parse(in);
    CHECK(spec.at("prefill").size() == 2);
    CHECK(spec.at("decode").size() == 1);
    CHECK(spec.at("decode").at(0).at("dp") == 2);
  }
  std::ifstream dcp(std::string(K3_SOURCE_DIR) + "/deploy/cluster-dcp.json");
  const json d = json::parse(dcp);
  CHECK(d.at("decode").at(0).at("dcp") == 8);
  CHECK(d.at("generate").at("preset") == "k3-tiny-h8");
  std::ifstream ep(std::string(K3_SOURCE_DIR) + "/deploy/cluster-ep.json");
  CHECK(json::parse(ep).at("decode").at(0).at("ep") == 4);
}

TEST_CASE("k3-cluster: deploy/cluster-dcp.json (DP2 x DCP8, 16 decode processes) == k3-generate; a rank killed "
          "mid-stream fails only its group",
          "[cluster_e2e][ranks]") {
  run_dcp(0);
}

TEST_CASE("k3-cluster: deploy/cluster-ep.json (DP2 x EP4) == k3-generate; a rank killed mid-stream fails only its group",
          "[cluster_e2e][ranks]") {
  k3::test::TempDir dir("cluster-ep");
  const std::string spec = write_spec("cluster-ep.json", dir.path(), 0);
  const std::string log = dir.path() + "/cluster.log";
  const KeepLog keep{log, "cluster-ep"};
  k3::test::LaunchedCluster c = k3::test::launch_cluster(spec, 300s, {"--verbose"}, log);
  CHECK(c.pids.size() == static_cast<size_t>(1 + 2 * 4 + 4));
  check_tokens(c, dir.path() + "/model");
  check_direct_transfer(log, dir.path() + "/model", 1, 4, 8);
  check_group_features(c.port, dir.path() + "/model");
  check_rank_death(c, dir.path() + "/model", 4);
  ::kill(c.proc->pid(), SIGTERM);
  c.proc->wait_exit(30s);
}
