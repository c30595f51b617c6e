// The OpenAI-compatible API as plain functions of HttpRequest -> HttpResponse (no sockets here).
// handle() is the one wrapper: ApiError becomes its status + OpenAI error JSON, any other exception
// a 500; nothing escapes. Streaming responses carry an SseGenerator that owns the RequestStream,
// so dropping the generator (client gone) cancels the generation.
#pragma once
#include <nlohmann/json.hpp>

#include <chrono>
#include <memory>
#include <string>

#include "common/config/config.h"
#include "common/tokenizer/tokenizer.h"
#include "router/completion_request.h"
#include "router/generation_service.h"
#include "router/http_types.h"
#include "router/router_metrics.h"

namespace k3::router {

struct ApiOptions {
  std::string served_model;                          // the id clients must send as "model"
  std::string api_key;                               // empty: no authentication
  bool metrics_require_key = false;                  // /metrics wants the key too (/health never does)
  int default_max_tokens = 256;                      // when a request gives none (capped by the context)
  std::chrono::milliseconds sse_keepalive{2000};     // idle SSE streams send a comment this often
};

class ApiHandlers {
 public:
  ApiHandlers(GenerationService& service, std::shared_ptr<const Tokenizer> tokenizer, const ModelConfig& cfg,
              ApiOptions opts);
  HttpResponse handle(const HttpRequest& rq) noexcept;
  RouterMetrics& metrics() { return metrics_; }
  const ModelLimits& limits() const { return limits_; }

 private:
  HttpResponse route(const HttpRequest& rq, std::string& endpoint, const std::string& request_id);
  HttpResponse completions(const HttpRequest& rq, Endpoint endpoint, const std::string& request_id);
  HttpResponse models() const;
  nlohmann::json model_card() const;
  bool authorized(const HttpRequest& rq) const;

  GenerationService& service_;
  std::shared_ptr<const Tokenizer> tokenizer_;
  ApiOptions opts_;
  ModelLimits limits_;
  std::vector<int32_t> eos_ids_;
  int64_t created_ = 0;
  RouterMetrics metrics_;
};

}  // namespace k3::router
