// k3-router: the OpenAI-compatible HTTP server. For now it generates with the monolithic engine in
// this process (LocalEngineService); the cluster service (prefill/decode nodes) plugs in later.
#include <CLI/CLI.hpp>

#include <csignal>
#include <cstdio>
#include <filesystem>
#include <iostream>

#include "router/api_handlers.h"
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
  app.add_option("--model", model_dir, "model directory (config.json, model.safetensors, tiktoken.model)")->required();
  app.add_option("--served-model-name", served_name, "model id clients send (default: the model dir's name)");
  app.add_option("--host", host, "address to bind (default 127.0.0.1)");
  app.add_option("--port", port, "TCP port; 0 picks a free one (printed on stdout)")->check(CLI::Range(0, 65535));
  app.add_option("--api-key", api_key, "require 'Authorization: Bearer <key>' on /v1/*");
  app.add_option("--max-queue", max_queue, "waiting requests before 429")->check(CLI::Range(0, 1 << 20));
  app.add_option("--max-running", max_running, "requests decoded together (engine sequence slots)")->check(CLI::Range(1, 4096));
  app.add_option("--threads", threads, "CPU threads for the engine (0 = all cores)")->check(CLI::NonNegativeNumber);
  app.add_option("--prefill-chunk", prefill_chunk, "prompt tokens per prefill forward (0 = whole prompt)")->check(CLI::NonNegativeNumber);
  app.add_option("--max-body-bytes", max_body, "largest accepted request body (413 beyond)")->check(CLI::Range(size_t{1}, size_t{1} << 30));
  app.add_option("--default-max-tokens", default_max_tokens, "max_tokens when a request gives none")->check(CLI::Range(1, 1 << 20));
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
    auto service = LocalEngineService::open(model_dir, {.max_running = max_running, .max_queue = max_queue,
                                                        .prefill_chunk = prefill_chunk, .threads = threads});
    if (!service.is_ok()) return fail(service.status().to_string());
    ApiHandlers api(**service, (*service)->tokenizer(), (*service)->config(),
                    {.served_model = served_name, .api_key = api_key, .default_max_tokens = default_max_tokens});
    auto server = HttpServer::start({.host = host, .port = static_cast<uint16_t>(port), .max_body_bytes = max_body},
                                    [&api](const HttpRequest& rq) { return api.handle(rq); });
    if (!server.is_ok()) return fail(server.status().to_string());
    std::printf("listening on http://%s:%u\n", host.c_str(), static_cast<unsigned>((*server)->port()));
    std::printf("serving model '%s' from %s\n", served_name.c_str(), model_dir.c_str());
    std::fflush(stdout);

    int sig = 0;
    sigwait(&sigs, &sig);
    std::fprintf(stderr, "k3-router: signal %d, shutting down\n", sig);
    (*service)->shutdown();      // in-flight requests end with an error event
    (*server)->stop(std::chrono::milliseconds(3000));
    return 0;
  } catch (const std::exception& e) {
    return fail(e.what());
  }
}
