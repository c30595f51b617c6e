// A real k3-tiny model for the router tests: the generated tiny tokenizer in a temp dir, random F32
// weights in memory, served by a real LocalEngineService behind real ApiHandlers.
#pragma once
#include <unistd.h>

#include <filesystem>
#include <memory>
#include <string>

#include <fstream>

#include "common/io/safetensors_writer.h"
#include "common/config/config.h"
#include "common/model/weights.h"
#include "common/tokenizer/tiny_tokenizer.h"
#include "common/tokenizer/tokenizer.h"
#include "router/api_handlers.h"
#include "router/local_engine_service.h"

namespace k3::test {

struct TempDir {
  std::string path;
  TempDir() {
    char tmpl[] = "/tmp/k3-router-test-XXXXXX";
    path = ::mkdtemp(tmpl);
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path, ec);
  }
};

// A model dir as k3-router reads it (config.json, model.safetensors, tokenizer files): k3-tiny with
// random F32 weights and a short context so context-limit cases are cheap.
inline void write_tiny_model(const std::string& dir, int64_t context = 256) {
  ModelConfig cfg = preset_config("k3-tiny").value();
  cfg.vocab_size = write_tiny_tokenizer(dir).value();
  cfg.max_position_embeddings = context;
  std::ofstream(dir + "/config.json") << model_config_to_json(cfg);
  WeightStore w = random_weights(cfg, 7, DType::F32);
  std::vector<std::pair<std::string, Tensor>> tensors(w.all().begin(), w.all().end());
  Status st = write_safetensors(dir + "/model.safetensors", tensors);
  if (!st.is_ok()) throw Error(st);
}

struct TinyServer {
  TempDir dir;
  ModelConfig cfg;
  std::shared_ptr<const Tokenizer> tok;
  std::unique_ptr<router::LocalEngineService> service;
  std::unique_ptr<router::ApiHandlers> api;

  explicit TinyServer(router::LocalEngineOptions opts = {}, std::string api_key = "", int64_t context = 256) {
    const int vocab = write_tiny_tokenizer(dir.path).value();
    tok = std::make_shared<const Tokenizer>(Tokenizer::load(dir.path).value());
    cfg = preset_config("k3-tiny").value();
    cfg.vocab_size = vocab;
    cfg.max_position_embeddings = context;  // small by default, so context-limit cases are cheap to provoke
    if (opts.backend.threads == 0) opts.backend.threads = 2;
    service = router::LocalEngineService::create(cfg, random_weights(cfg, 7, DType::F32), tok, opts).value();
    api = std::make_unique<router::ApiHandlers>(
        *service, tok, cfg,
        router::ApiOptions{.served_model = "k3-tiny", .api_key = api_key, .default_max_tokens = 8,
                           .sse_keepalive = std::chrono::milliseconds(200)});
  }

  router::HttpResponse post(const std::string& path, const std::string& body) {
    return api->handle({.method = "POST", .target = path, .headers = {{"content-type", "application/json"}}, .body = body});
  }
  router::HttpResponse get(const std::string& path) { return api->handle({.method = "GET", .target = path}); }
};

// Drains an SSE generator into its frames.
inline std::string drain_sse(router::HttpResponse& r) {
  std::string all, chunk;
  while (r.sse(chunk)) all += chunk;
  return all;
}

}  // namespace k3::test
