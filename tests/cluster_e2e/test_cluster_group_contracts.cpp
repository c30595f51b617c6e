// The contracts a decode rank group stands for, served through k3-cluster: 16 concurrent greedy requests
// to four DP2 clusters of the same model (single decode processes, one process with kv_partitions 2, DCP2
// groups, EP2 groups), each cluster's tokens against the computation it must equal. K3_TEST_BACKEND=cuda
// runs every process on GPU 0 (tests/cuda/run_rank_groups_on_gpu_host.sh); K3_TEST_MODEL serves another
// model directory (tests/cuda/run_rank_groups_small_on_gpu_host.sh passes k3-small); K3_TEST_LOG_DIR keeps
// the nodes' logs; K3_TEST_GROUP_RUNS (e.g. "dcp2,ep2"; all four by default: single, kv2, dcp2, ep2) runs only
// those clusters, to look into one of them on a GPU host, and compares only the pairs that both ran;
// K3_TEST_DEFAULT_WINDOWS=1 keeps the deploy files' liveness window and step deadline for a given model
// on the GPU.
#include <catch2/catch.hpp>

#include <nlohmann/json.hpp>
#include <signal.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <future>
#include <map>
#include <set>
#include <sstream>

#include "common/config/config.h"
#include "common/tokenizer/tokenizer.h"
#include "tests/cluster_e2e/cluster_launch.h"
#include "tests/cluster_e2e/plain_completion.h"
#include "tests/cluster_e2e/stream_load.h"
#include "tests/router/http_client.h"
#include "tests/support/run_command.h"

using namespace std::chrono_literals;
using nlohmann::json;
using k3::test::HttpReply;

namespace {

// What a cluster served for one prompt: its greedy tokens and the logprobs (top 5) of each.
struct Served {
  std::vector<int32_t> tokens;
  json logprobs;
};

// Prompt i of the K3-head-shape runs: 9 + 3 i token ids.
std::vector<std::vector<int32_t>> group_prompts(int requests) {
  std::vector<std::vector<int32_t>> prompts;
  for (int i = 0; i < requests; ++i) {
    std::vector<int32_t> p;
    for (int t = 0; t < 9 + 3 * i; ++t) p.push_back(static_cast<int32_t>((i * 131 + t * 17) % 500 + 1));
    prompts.push_back(p);
  }
  return prompts;
}

// The prompts as concurrent greedy requests of 8 tokens with logprobs; both DP groups served some.
std::vector<Served> serve_greedy(const k3::test::LaunchedCluster& c, const std::vector<std::vector<int32_t>>& prompts) {
  static constexpr int kMax = 8;
  std::vector<std::future<HttpReply>> replies;
  const int port = c.port;
  for (const auto& p : prompts)
    replies.push_back(std::async(std::launch::async, [port, &p] {
      return k3::test::post_json(port, "/v1/completions",
                                 {{"model", "k3-tiny"}, {"prompt", p}, {"max_tokens", kMax}, {"temperature", 0},
                                  {"logprobs", 5}, {"ignore_eos", true}, {"return_token_ids", true}});
    }));
  std::vector<Served> out;
  for (size_t i = 0; i < replies.size(); ++i) {
    INFO("request " << i);
    const HttpReply r = replies[i].get();
    INFO(r.body);
    REQUIRE(r.status == 200);
    out.push_back({k3::test::token_ids_of(r), json::parse(r.body).at("choices").at(0).at("logprobs")});
    REQUIRE(out.back().tokens.size() == static_cast<size_t>(kMax));
  }
  const auto m = k3::test::read_metrics(c.port);
  for (const char* node : {"decode/d-0", "decode/d-1"})
    CHECK(k3::test::metric_or(m, std::string("k3_cluster_placements_total{node=\"") + node + "\"}") >= 1);
  return out;
}

// `got` against `want` (another run's tokens for the same prompts); prints how many requests agreed whole
// and where the others parted: the request, the token, and want's token's logprob gap to got's choice
// when it is among got's top 5 ("not in top 5" otherwise). exact: every request must agree whole.
// Either way the first token must agree: it is the prefill's, on the same path in both runs.
void compare_tokens(const std::vector<Served>& got, const std::vector<std::vector<int32_t>>& want,
                    const std::string& model, const std::string& what, const std::string& reference, bool exact) {
  const k3::Tokenizer tok = k3::Tokenizer::load(model).value();
  REQUIRE(got.size() == want.size());
  int whole = 0;
  std::string parted;
  for (size_t i = 0; i < got.size(); ++i) {
    INFO(what << " against " << reference << ", request " << i);
    REQUIRE(got[i].tokens.size() == want[i].size());
    size_t t = 0;
    while (t < want[i].size() && got[i].tokens[t] == want[i][t]) ++t;
    if (t == want[i].size()) {
      ++whole;
      continue;
    }
    INFO("parted at token " << t << ": took " << got[i].tokens[t] << ", " << reference << " " << want[i][t]);
    CHECK(t > 0);
    const json& top = got[i].logprobs.at("top_logprobs").at(t);
    // Logprobs are keyed by token text: an id past the tokenizer (a padding row) has none to look up.
    const bool has_text = tok.assigns(want[i][t]);
    const std::string theirs = has_text ? tok.decode(std::vector<int32_t>{want[i][t]}).value() : "";
    std::string gap = has_text ? "not in top 5" : "a token without text";
    if (has_text && top.contains(theirs))
      gap = "gap " + std::to_string(got[i].logprobs.at("token_logprobs").at(t).get<double>() - top.at(theirs).get<double>());
    parted += " " + std::to_string(i) + "@" + std::to_string(t) + " (" + gap + ")";
  }
  std::printf("GROUP-TOKENS %s: %d of %zu requests equal %s whole; parted:%s\n", what.c_str(), whole, got.size(),
              reference.c_str(), parted.empty() ? " none" : parted.c_str());
  std::fflush(stdout);
  if (exact) CHECK(whole == static_cast<int>(got.size()));
}

// k3-tiny-h8 with K3's head shapes (KDA D = 128, MLA latent 512 + rope 64, d_n = d_v = 128) and dense
// routing, generated into `dir`/model: the shapes the GPU's fused decode kernels take.
std::string k3_heads_model(const std::string& dir) {
  k3::ModelConfig cfg = k3::with_k3_head_shapes(k3::preset_config("k3-tiny-h8").value());
  // Every expert on every token (k = E): random weights put near ties in the top-k choice, where the
  // rounding of a merge done in another order (the group's attention partitions) picks another expert.
  cfg.num_experts_per_token = cfg.num_experts;
  // K3's vocabulary width: a row of logits (640 KiB) outgrows UCX's eager sends, as a K3 group's do, so a
  // message between ranks that nobody receives blocks here as it would there.
  cfg.vocab_size = 163840;
  REQUIRE(k3::validate(cfg).is_ok());
  std::filesystem::create_directories(dir + "/cfg");
  std::ofstream(dir + "/cfg/config.json") << k3::model_config_to_json(cfg);
  const std::string gen = std::string(K3_BIN_DIR) + "/k3-genweights";
  REQUIRE(k3::test::run_command(gen + " --config '" + dir + "/cfg/config.json' --quiet --out '" + dir + "/model'").exit_code == 0);
  return dir + "/model";
}

}  // namespace

// On K3's head shapes (k3_heads_model; the GPU's decode kernels need KDA D = 64 or 128), or on the model
// directory K3_TEST_MODEL names (the GPU script passes k3-small), on the backend K3_TEST_BACKEND names (cpu
// by default; cuda: every process on GPU 0, the groups' collectives through the host): 16 concurrent
// greedy requests to four DP2 clusters whose decode ranks are: single processes (the monolithic engine,
// the reference); one process with kv_partitions 2 (a DCP group of one); DCP2 groups; EP2 groups.
// On the CPU each equals the reference whole. On a GPU the exact contracts are checked: EP2 == the
// monolithic engine (EPn == EP1 == monolithic) and DCP2 == the one process with kv_partitions 2 (DCPn ==
// DCP1 with the same partitions), whole; the partitions' merged attention rounds differently from the
// one-pass engine (bf16), which random weights amplify, so where those two part is only reported.
TEST_CASE("k3-cluster with K3 head shapes: DP2 x DCP2 and DP2 x EP2 groups serve 16 concurrent requests with "
          "the tokens of the computation they stand for",
          "[cluster_e2e][ranks]") {
  const char* b = std::getenv("K3_TEST_BACKEND");
  const std::string backend = b && *b ? b : "cpu";
  REQUIRE((backend == "cpu" || backend == "cuda"));
  const bool cpu = backend == "cpu";
  k3::test::TempDir models("cluster-k3-heads-model");
  const char* given = std::getenv("K3_TEST_MODEL");
  const std::string model = given && *given ? std::string(given) : k3_heads_model(models.path());
  const auto prompts = group_prompts(16);
  struct Run {
    const char* name;  // K3_TEST_GROUP_RUNS's name for it
    const char* file;
    int dcp, ep, kv;
    std::string what;
  };
  std::vector<Run> runs = {{"single", "cluster-dcp.json", 0, 0, 0, "single processes"},
                           {"kv2", "cluster-dcp.json", 1, 0, 2, "one process with kv_partitions 2"},
                           {"dcp2", "cluster-dcp.json", 2, 0, 0, "DCP2 groups"},
                           {"ep2", "cluster-ep.json", 0, 2, 0, "EP2 groups"}};
  std::set<std::string> chosen;
  if (const char* only = std::getenv("K3_TEST_GROUP_RUNS"); only && *only) {
    std::istringstream names(only);
    for (std::string name; std::getline(names, name, ',');) {
      INFO("K3_TEST_GROUP_RUNS names '" << name << "' (known: single, kv2, dcp2, ep2)");
      REQUIRE(std::any_of(runs.begin(), runs.end(), [&](const Run& r) { return name == r.name; }));
      chosen.insert(name);
    }
  }
  std::erase_if(runs, [&](const Run& r) { return !chosen.empty() && !chosen.count(r.name); });
  REQUIRE(!runs.empty());
  std::map<std::string, std::vector<Served>> served;
  for (const Run& r : runs) {
    const std::string what = "DP2 x " + r.what + " on " + backend;
    INFO(what);
    const auto t0 = std::chrono::steady_clock::now();
    k3::test::TempDir dir("cluster-k3-heads-groups");
    std::ifstream in(std::string(K3_SOURCE_DIR) + "/deploy/" + r.file);
    json spec = json::parse(in);
    spec["model"] = model;
    spec["router"]["port"] = 0;
    spec["router"]["served_model_name"] = "k3-tiny";
    spec["backend"] = backend;
    json& d = spec["decode"][0];
    d.erase("dcp");
    d.erase("ep");
    if (r.dcp) d["dcp"] = r.dcp;
    if (r.ep) d["ep"] = r.ep;
    if (r.kv) d["kv_partitions"] = r.kv;
    const char* default_windows = std::getenv("K3_TEST_DEFAULT_WINDOWS");
    if (given && !cpu && !(default_windows && *default_windows == '1')) {
      // A given model on the GPU (k3-small: 93 layers) with 7 to 9 processes time-slicing one GPU: a step
      // over host collectives can take seconds while the prefill stages compute, so the liveness window
      // (10 s) and the group's step deadline (30 s) are sized for that host, not for a production one.
      // K3_TEST_DEFAULT_WINDOWS=1 keeps the deploy files' (600 ms, 2 s).
      spec["timeouts"]["heartbeat_ms"] = 500;
      spec["timeouts"]["heartbeat_misses"] = 20;
      if (r.dcp || r.ep) d["step_deadline_ms"] = 30000;
    }
    std::ofstream(dir.path() + "/spec.json") << spec.dump(2);
    // K3_TEST_LOG_DIR keeps every node's log lines (at info) under <dir>/<run>/ (k3-cluster --log-dir): the
    // GPU scripts copy them out to tell why a run failed.
    std::vector<std::string> extra;
    if (const char* logs = std::getenv("K3_TEST_LOG_DIR"); logs && *logs) {
      std::string sub = r.what;
      std::replace(sub.begin(), sub.end(), ' ', '_');
      extra = {"--log-dir", std::string(logs) + "/" + sub, "--log-level", "info"};
    }
    k3::test::LaunchedCluster c = k3::test::launch_cluster(dir.path() + "/spec.json", 300s, extra);
    const int group = std::max({r.dcp, r.ep, 1});
    CHECK(c.pids.size() == static_cast<size_t>(1 + 2 * group + 4));
    served[r.what] = serve_greedy(c, prompts);
    ::kill(c.proc->pid(), SIGTERM);
    c.proc->wait_exit(30s);
    std::printf("GROUP-RUN %s: %.1f s\n", what.c_str(),
                std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  }
  // got's tokens against want's, where both clusters ran.
  const auto compare = [&](const std::string& got, const std::string& want, const std::string& reference, bool exact) {
    if (!served.count(got) || !served.count(want)) {
      std::printf("GROUP-TOKENS DP2 x %s on %s: not compared with %s (K3_TEST_GROUP_RUNS left one out)\n",
                  got.c_str(), backend.c_str(), want.c_str());
      return;
    }
    std::vector<std::vector<int32_t>> tokens;
    for (const Served& s : served.at(want)) tokens.push_back(s.tokens);
    compare_tokens(served.at(got), tokens, model, "DP2 x " + got + " on " + backend, reference + " on " + backend,
                   exact);
  };
  const std::string monolithic = "the single processes (monolithic engine)";
  compare("EP2 groups", "single processes", monolithic, true);
  compare("DCP2 groups", "one process with kv_partitions 2", "the one process with kv_partitions 2", true);
  compare("DCP2 groups", "single processes", monolithic, cpu);
  compare("one process with kv_partitions 2", "single processes", monolithic, cpu);
}
