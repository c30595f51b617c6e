// k3-router: the OpenAI-compatible HTTP server. Two generation back ends behind the same API:
//  - local mode (default): the monolithic engine in this process (LocalEngineService);
//  - cluster mode (--cluster-endpoint): prefill/decode nodes over the ZeroMQ control plane
//    (ClusterService); the nodes get the bound endpoint (printed as "CLUSTER <endpoint>") as their
//    --router-endpoint, and --pair names which prefill instance may feed which decode rank (any to any
//    when every combination is listed).
#include <CLI/CLI.hpp>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <csignal>
#include <cstdio>
#include <filesystem>
#include <iostream>

#include "common/io/load_progress.h"
#include "kernels/backend_flags.h"
#include "router/api_handlers.h"
#include "router/cluster_service.h"
#include "router/http_server.h"
#include "router/local_engine_service.h"
#include "router/open_file_limit.h"
#include "transfer/advertise_endpoint.h"
#include "transfer/control_keys.h"

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
  int port = 8000, max_queue = 64, max_running = 8, prefill_chunk = 256, default_max_tokens = 256;
  size_t max_body = 4 << 20;
  std::string cluster_endpoint, placement = "round-robin";
  std::vector<std::string> pair_texts;
  int hb_ms = 200, hb_misses = 3, claim_timeout_ms = 5000, affinity_tokens = 16, max_attempts = 2;
  int queued_timeout_ms = 300000, prefill_timeout_ms = 300000, decode_stall_ms = 60000, generation_reserve = 32;
  uint64_t request_timeout_ms = 0;
  bool metrics_require_key = false;
  HttpServerOptions http;
  int header_timeout_ms = 10000, body_timeout_ms = 30000, idle_timeout_ms = 60000, write_timeout_ms = 30000;
  std::string control_key, control_public_keys;
  bool insecure_control = false;
  std::string log_level = "info";
  app.add_option("--model", model_dir, "model directory (config.json, model.safetensors, tiktoken.model)")->required();
  app.add_option("--served-model-name", served_name, "model id clients send (default: the model dir's name)");
  app.add_option("--host", host, "address to bind (default 127.0.0.1)");
  app.add_option("--port", port, "TCP port; 0 picks a free one (printed on stdout)")->check(CLI::Range(0, 65535));
  app.add_option("--api-key", api_key, "require 'Authorization: Bearer <key>' on /v1/* (default: $K3_API_KEY)")
      ->envname("K3_API_KEY");
  app.add_flag("--metrics-require-key", metrics_require_key, "/metrics wants the API key too (/health stays open)");
  app.add_option("--max-connections", http.max_connections,
                 "open HTTP connections in all; beyond: the oldest idle one is closed, or 503 when none is idle (default 10000)")
      ->check(CLI::Range(1, 1 << 22));
  app.add_option("--max-connections-per-client", http.max_connections_per_client,
                 "open connections per source address, 0 = no limit; beyond: that client's oldest idle one is closed, "
                 "or 429 when none is idle (default 1024)")
      ->check(CLI::Range(0, 1 << 22));
  app.add_option("--header-timeout-ms", header_timeout_ms, "accept (or a keep-alive request's first byte) to the end of its header (default 10000)")
      ->check(CLI::Range(1, 1 << 30));
  app.add_option("--body-timeout-ms", body_timeout_ms, "end of header to the end of the body (default 30000)")->check(CLI::Range(1, 1 << 30));
  app.add_option("--idle-timeout-ms", idle_timeout_ms, "keep-alive wait for the next request (default 60000)")->check(CLI::Range(1, 1 << 30));
  app.add_option("--write-timeout-ms", write_timeout_ms, "one response write, e.g. one SSE chunk (default 30000)")->check(CLI::Range(1, 1 << 30));
  app.add_option("--http-threads", http.io_threads, "HTTP I/O threads (default 2)")->check(CLI::Range(1, 256));
  app.add_option("--handler-threads", http.handler_threads,
                 "most requests handled at once; more wait in order (default: 128, at least --max-queue + --max-running + 32)")
      ->check(CLI::Range(1, 1 << 16));
  app.add_option("--max-queue", max_queue, "waiting requests before 429")->check(CLI::Range(0, 1 << 20));
  app.add_option("--max-running", max_running, "requests decoded together (engine sequence slots)")->check(CLI::Range(1, 4096));
  BackendFlags backend_flags;  // the local engine's (unused with --cluster)
  add_backend_flags(app, backend_flags);
  app.add_option("--prefill-chunk", prefill_chunk, "prompt tokens per prefill forward (0 = whole prompt)")->check(CLI::NonNegativeNumber);
  int prefix_slots = 0, prefix_block = 256, prefix_every = 1;
  double prefix_budget_mb = 0;
  app.add_option("--prefix-cache-slots", prefix_slots,
                 "local engine: KDA checkpoint slots of the prefix cache (0 = cache off, the default)")
      ->check(CLI::NonNegativeNumber);
  app.add_option("--prefix-block", prefix_block,
                 "prefix cache: checkpoint alignment in tokens, a multiple of 64 and of the page size (default 256)")
      ->check(CLI::PositiveNumber);
  app.add_option("--prefix-checkpoint-every", prefix_every, "prefix cache: blocks between checkpoints (default 1)")
      ->check(CLI::PositiveNumber);
  double cache_region_mib = 0;
  app.add_option("--cache-region-mib", cache_region_mib,
                 "local engine: MiB of the unified cache region that KDA slots and MLA pages share (0 = room for every "
                 "slot and page at once; less lets the boundary follow demand)")
      ->check(CLI::NonNegativeNumber);
  app.add_option("--prefix-budget-mb", prefix_budget_mb, "prefix cache: memory budget in MiB (0 = the pools bound it)")
      ->check(CLI::NonNegativeNumber);
  app.add_option("--max-body-bytes", max_body, "largest accepted request body (413 beyond)")->check(CLI::Range(size_t{1}, size_t{1} << 30));
  app.add_option("--log-level", log_level, "spdlog level: trace, debug, info (default: a line per request), warn, error")
      ->check(CLI::IsMember({"trace", "debug", "info", "warn", "error", "critical", "off"}));
  app.add_option("--default-max-tokens", default_max_tokens, "max_tokens when a request gives none")->check(CLI::Range(1, 1 << 20));
  auto* cluster = app.add_option_group("cluster", "cluster mode: generate on k3-prefill / k3-decode nodes");
  std::string advertise_host;
  cluster->add_option("--advertise-host", advertise_host,
                      "host (address or name) nodes reach the control endpoint at, printed in CLUSTER with the bound port "
                      "(default: the bound host; required when --cluster-endpoint is tcp://0.0.0.0:...)");
  cluster->add_option("--cluster-endpoint", cluster_endpoint,
                      "bind this ZeroMQ control endpoint (e.g. tcp://127.0.0.1:5600, port * = pick one; printed as "
                      "'CLUSTER <endpoint>') and serve through the nodes that connect to it; without it the engine "
                      "runs in this process");
  cluster->add_option("--pair", pair_texts,
                      "PREFILL:STAGES:DECODE:RANK[:DCP], repeatable: prefill instance PREFILL (stages 0..STAGES-1, "
                      "control names prefill/PREFILL/<s>) feeds decode instance DECODE (decode/DECODE) serving rank RANK "
                      "(a DCP group: ranks RANK..RANK+DCP-1, each request written to all of them). A prefill instance may be "
                      "paired with several decode instances and the reverse: the placement policy picks the prefill "
                      "instance, then the least-loaded decode instance it is paired with serves the request");
  cluster->add_option("--placement", placement, "round-robin (default), least-loaded or prefix-affinity");
  cluster->add_option("--affinity-tokens", affinity_tokens, "prefix-affinity: leading prompt tokens hashed (default 16)")
      ->check(CLI::PositiveNumber);
  cluster->add_option("--heartbeat-ms", hb_ms, "control heartbeat interval; nodes must use the same or less (default 200)")
      ->check(CLI::PositiveNumber);
  cluster->add_option("--heartbeat-misses", hb_misses, "missed heartbeats before a node is dead (default 3)")
      ->check(CLI::PositiveNumber);
  cluster->add_option("--claim-timeout-ms", claim_timeout_ms, "CLAIM -> decode's CLAIM_ACK wait (default 5000)")
      ->check(CLI::PositiveNumber);
  cluster->add_option("--queued-timeout-ms", queued_timeout_ms,
                      "deadline of a request waiting in the admission queue (default 300000)")->check(CLI::PositiveNumber);
  cluster->add_option("--prefill-timeout-ms", prefill_timeout_ms,
                      "deadline from PREFILL to the first token: prefill compute and KV transfer (default 300000)")
      ->check(CLI::PositiveNumber);
  cluster->add_option("--decode-stall-ms", decode_stall_ms,
                      "deadline of a decoding request without a new token (default 60000)")->check(CLI::PositiveNumber);
  cluster->add_option("--generation-reserve", generation_reserve,
                      "decode cache tokens reserved per request beyond its prompt when admitting it (default 32)")
      ->check(CLI::NonNegativeNumber);
  cluster->add_option("--request-timeout-ms", request_timeout_ms, "protocol wait budget sent to the nodes (0 = theirs)");
  cluster->add_option("--max-attempts", max_attempts, "placements per request; retries only before any token (default 2)")
      ->check(CLI::PositiveNumber);
  cluster->add_option("--control-key", control_key, transfer::kControlKeyHelp);
  cluster->add_option("--control-public-keys", control_public_keys, transfer::kControlPublicKeysHelp);
  cluster->add_flag("--insecure-control-plane", insecure_control, transfer::kInsecureControlHelp);
  CLI11_PARSE(app, argc, argv);
  spdlog::set_level(spdlog::level::from_str(log_level));

  // Signals are taken by sigwait below; block them before any thread starts so none receives them.
  sigset_t sigs;
  sigemptyset(&sigs);
  sigaddset(&sigs, SIGINT);
  sigaddset(&sigs, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &sigs, nullptr);
  std::signal(SIGPIPE, SIG_IGN);
  // Each accepted generation holds a handler thread while it waits for tokens: never fewer threads
  // than generations the service may accept, or streams would wait for a thread.
  if (app.count("--handler-threads") == 0) http.handler_threads = std::max(http.handler_threads, max_queue + max_running + 32);
  if (metrics_require_key && api_key.empty()) return fail("--metrics-require-key needs --api-key (or K3_API_KEY)");
  // Each connection is a descriptor; leave room for the engine, the control plane and the log files.
  const uint64_t wanted_fds = static_cast<uint64_t>(http.max_connections) + 256;
  const std::string fd_note = describe_open_file_limit(raise_open_file_limit(wanted_fds), wanted_fds);
  if (!fd_note.empty()) std::fprintf(stderr, "k3-router: %s\n", fd_note.c_str());

  try {
    if (served_name.empty()) served_name = std::filesystem::path(model_dir).lexically_normal().filename().string();
    if (served_name.empty()) served_name = std::filesystem::path(model_dir).lexically_normal().parent_path().filename().string();
    std::unique_ptr<GenerationService> service;
    ClusterService* cluster_service = nullptr;
    std::shared_ptr<const Tokenizer> tokenizer;
    ModelConfig cfg;
    if (cluster_endpoint.empty()) {
      auto backend = backend_flags.resolve();
      if (!backend.is_ok()) return fail(backend.status().to_string());
      LoadProgress load("k3-router: weights");
      auto local = LocalEngineService::open(model_dir, {.max_running = max_running, .max_queue = max_queue,
                                                        .prefill_chunk = prefill_chunk, .backend = *backend,
                                                        .on_upload = load.observer(),
                                                        .prefix_checkpoint_slots = prefix_slots,
                                                        .prefix_block_tokens = prefix_block,
                                                        .prefix_checkpoint_every = prefix_every,
                                                        .prefix_budget_bytes = static_cast<uint64_t>(prefix_budget_mb * (1 << 20)),
                                                        .cache_region_bytes = static_cast<uint64_t>(cache_region_mib * (1 << 20))});
      if (!local.is_ok()) return fail(local.status().to_string());
      load.finish();
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
      co.deadlines = {.queued = std::chrono::milliseconds(queued_timeout_ms),
                      .claimed = std::chrono::milliseconds(claim_timeout_ms),
                      .prefilling = std::chrono::milliseconds(prefill_timeout_ms),
                      .decoding = std::chrono::milliseconds(decode_stall_ms)};
      co.generation_reserve = generation_reserve;
      co.request_timeout_ms = request_timeout_ms;
      co.max_queue = std::max(1, max_queue);
      co.max_attempts = max_attempts;
      auto keys = transfer::control_keys_from_flags(control_key, control_public_keys, insecure_control);
      if (!keys.is_ok()) return fail(keys.status().message());
      co.control_keys = *keys;
      auto cs = ClusterService::create(cfg, tokenizer, co);
      if (!cs.is_ok()) return fail(cs.status().message());
      cluster_service = cs->get();
      service = std::move(cs).value();
      auto advertised = transfer::advertised_endpoint(cluster_service->endpoint(), advertise_host);
      if (!advertised.is_ok()) return fail(advertised.status().message());
      std::printf("CLUSTER %s\n", advertised->c_str());
      std::fflush(stdout);
    }
    ApiHandlers api(*service, tokenizer, cfg,
                    {.served_model = served_name, .api_key = api_key, .metrics_require_key = metrics_require_key,
                     .default_max_tokens = default_max_tokens});
    auto connections = std::make_shared<ConnectionMetrics>();
    auto handler = [&api, cluster_service, connections](const HttpRequest& rq) {
      HttpResponse r = api.handle(rq);
      // The HTTP server's connection counters, then (cluster mode) node and failure metrics.
      if (rq.method == "GET" && r.status == 200 && rq.target.rfind("/metrics", 0) == 0) {
        r.body += connections->prometheus_text();
        if (cluster_service) r.body += cluster_service->prometheus_text();
      }
      return r;
    };
    http.host = host;
    http.port = static_cast<uint16_t>(port);
    http.max_body_bytes = max_body;
    http.header_timeout = std::chrono::milliseconds(header_timeout_ms);
    http.body_timeout = std::chrono::milliseconds(body_timeout_ms);
    http.idle_timeout = std::chrono::milliseconds(idle_timeout_ms);
    http.write_timeout = std::chrono::milliseconds(write_timeout_ms);
    http.metrics = connections;
    auto server = HttpServer::start(http, handler);
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
