// k3-router: the OpenAI-compatible HTTP server. Two generation back ends behind the same API:
//  - local mode (default): the monolithic engine in this process (LocalEngineService);
//  - cluster mode (--cluster-endpoint): prefill/decode nodes over the ZeroMQ control plane
//    (ClusterService); the nodes get the bound endpoint (printed as "CLUSTER <endpoint>") as their
//    --router-endpoint, and --pair names which prefill instance feeds which decode rank.
#include <CLI/CLI.hpp>

#include <csignal>
#include <cstdio>
#include <filesystem>
#include <iostream>

#include "kernels/backend_select.h"
#include "router/api_handlers.h"
#include "router/cluster_service.h"
#include "router/http_server.h"
#include "router/local_engine_service.h"

using namespace k3;
using namespace k3::router;

namespace {

int fail(const std::string& what) {
  std::fprintf(stderr, "k3-router: %s\n", what.c_str());
  return 1;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"k3-router: OpenAI-compatible HTTP API (chat/completions, completions, models, health, metrics)"};
  std::string model_dir, served_name, api_key, host = "127.0.0.1";
  int port = 8000, max_queue = 64, threads = 0, max_running = 8, prefill_chunk = 256, default_max_tokens = 256;
  size_t max_body = 4 << 20;
  std::string cluster_endpoint, placement = "round-robin", backend = "cpu";
  int device = 0;
  std::vector<std::string> pair_texts;
  int hb_ms = 200, hb_misses = 3, claim_timeout_ms = 5000, affinity_tokens = 16, max_attempts = 2;
  uint64_t request_timeout_ms = 0;
  app.add_option("--model", model_dir, "model directory (config.json, model.safetensors, tiktoken.model)")->required();
  app.add_option("--served-model-name", served_name, "model id clients send (default: the model dir's name)");
  app.add_option("--host", host, "address to bind (default 127.0.0.1)");
  app.add_option("--port", port, "TCP port; 0 picks a free one (printed on stdout)")->check(CLI::Range(0, 65535));
  app.add_option("--api-key", api_key, "require 'Authorization: Bearer <key>' on /v1/*");
  app.add_option("--max-queue", max_queue, "waiting requests before 429")->check(CLI::Range(0, 1 << 20));
  app.add_option("--max-running", max_running, "requests decoded together (engine sequence slots)")->check(CLI::Range(1, 4096));
  app.add_option("--threads", threads, "CPU threads for the engine (0 = all cores)")->check(CLI::NonNegativeNumber);
  app.add_option("--backend", backend, kBackendFlagHelp)->check(CLI::IsMember({"cpu", "cuda"}));
  app.add_option("--device", device, kDeviceFlagHelp)->check(CLI::NonNegativeNumber);
  app.add_option("--prefill-chunk", prefill_chunk, "prompt tokens per prefill forward (0 = whole prompt)")->check(CLI::NonNegativeNumber);
  app.add_option("--max-body-bytes", max_body, "largest accepted request body (413 beyond)")->check(CLI::Range(size_t{1}, size_t{1} << 30));
  app.add_option("--default-max-tokens", default_max_tokens, "max_tokens when a request gives none")->check(CLI::Range(1, 1 << 20));
  auto* cluster = app.add_option_group("cluster", "cluster mode: generate on k3-prefill / k3-decode nodes");
  cluster->add_option("--cluster-endpoint", cluster_endpoint,
                      "bind this ZeroMQ control endpoint (e.g. tcp://127.0.0.1:5600, port * = pick one; printed as "
                      "'CLUSTER <endpoint>') and serve through the nodes that connect to it; without it the engine "
                      "runs in this process");
  cluster->add_option("--pair", pair_texts,
                      "PREFILL:STAGES:DECODE:RANK, repeatable: prefill instance PREFILL (stages 0..STAGES-1, "
                      "control names prefill/PREFILL/<s>) feeds decode instance DECODE (decode/DECODE) serving rank RANK");
  cluster->add_option("--placement", placement, "round-robin (default), least-loaded or prefix-affinity");
  cluster->add_option("--affinity-tokens", affinity_tokens, "prefix-affinity: leading prompt tokens hashed (default 16)")
      ->check(CLI::PositiveNumber);
  cluster->add_option("--heartbeat-ms", hb_ms, "control heartbeat interval; nodes must use the same or less (default 200)")
      ->check(CLI::PositiveNumber);
  cluster->add_option("--heartbeat-misses", hb_misses, "missed heartbeats before a node is dead (default 3)")
      ->check(CLI::PositiveNumber);
  cluster->add_option("--claim-timeout-ms", claim_timeout_ms, "CLAIM -> decode's CLAIM_ACK wait (default 5000)")
      ->check(CLI::PositiveNumber);
  cluster->add_option("--request-timeout-ms", request_timeout_ms, "protocol wait budget sent to the nodes (0 = theirs)");
  cluster->add_option("--max-attempts", max_attempts, "placements per request; retries only before any token (default 2)")
      ->check(CLI::PositiveNumber);
  CLI11_PARSE(app, argc, argv);

  // Signals are taken by sigwait below; block them before any thread starts so none receives them.
  sigset_t sigs;
  sigemptyset(&sigs);
  sigaddset(&sigs, SIGINT);
  sigaddset(&sigs, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &sigs, nullptr);
  std::signal(SIGPIPE, SIG_IGN);

  try {
    if (served_name.empty()) served_name = std::filesystem::path(model_dir).lexically_normal().filename().string();
    if (served_name.empty()) served_name = std::filesystem::path(model_dir).lexically_normal().parent_path().filename().string();
    std::unique_ptr<GenerationService> service;
    ClusterService* cluster_service = nullptr;
    std::shared_ptr<const Tokenizer> tokenizer;
    ModelConfig cfg;
    if (cluster_endpoint.empty()) {
      auto local = LocalEngineService::open(model_dir, {.max_running = max_running, .max_queue = max_queue,
                                                        .prefill_chunk = prefill_chunk, .threads = threads,
                                                        .backend = backend, .device = device});
      if (!local.is_ok()) return fail(local.status().to_string());
      tokenizer = (*local)->tokenizer();
      cfg = (*local)->config();
      service = std::move(local).value();
    } else {
      // The nodes hold the weights; the router needs only the config (limits) and the tokenizer.
      auto c = load_model_config(model_dir + "/config.json");
      if (!c.is_ok()) return fail(c.status().to_string());
      cfg = *c;
      auto tok = Tokenizer::load(model_dir);
      if (!tok.is_ok()) return fail(tok.status().to_string());
      tokenizer = std::make_shared<const Tokenizer>(std::move(tok).value());
      ClusterOptions co;
      co.endpoint = cluster_endpoint;
      for (const auto& t : pair_texts) {
        auto p = parse_cluster_pair(t);
        if (!p.is_ok()) return fail(p.status().message());
        co.pairs.push_back(*p);
      }
      auto pl = parse_placement(placement);
      if (!pl.is_ok()) return fail(pl.status().message());
      co.placement = *pl;
      co.affinity_tokens = affinity_tokens;
      co.heartbeat = std::chrono::milliseconds(hb_ms);
      co.heartbeat_misses = hb_misses;
      co.claim_timeout = std::chrono::milliseconds(claim_timeout_ms);
      co.request_timeout_ms = request_timeout_ms;
      co.max_in_flight = max_queue + max_running;
      co.max_attempts = max_attempts;
      auto cs = ClusterService::create(cfg, tokenizer, co);
      if (!cs.is_ok()) return fail(cs.status().message());
      cluster_service = cs->get();
      service = std::move(cs).value();
      std::printf("CLUSTER %s\n", cluster_service->endpoint().c_str());
      std::fflush(stdout);
    }
    ApiHandlers api(*service, tokenizer, cfg,
                    {.served_model = served_name, .api_key = api_key, .default_max_tokens = default_max_tokens});
    auto handler = [&api, cluster_service](const HttpRequest& rq) {
      HttpResponse r = api.handle(rq);
      // Cluster mode: node and failure metrics follow the router's own.
      if (cluster_service && rq.method == "GET" && r.status == 200 && rq.target.rfind("/metrics", 0) == 0)
        r.body += cluster_service->prometheus_text();
      return r;
    };
    auto server = HttpServer::start({.host = host, .port = static_cast<uint16_t>(port), .max_body_bytes = max_body},
                                    handler);
    if (!server.is_ok()) return fail(server.status().to_string());
    std::printf("listening on http://%s:%u\n", host.c_str(), static_cast<unsigned>((*server)->port()));
    std::printf("serving model '%s' from %s\n", served_name.c_str(), model_dir.c_str());
    std::fflush(stdout);

    int sig = 0;
    sigwait(&sigs, &sig);
    std::fprintf(stderr, "k3-router: signal %d, shutting down\n", sig);
    service->shutdown();      // in-flight requests end with an error event
    (*server)->stop(std::chrono::milliseconds(3000));
    return 0;
  } catch (const std::exception& e) {
    return fail(e.what());
  }
}
