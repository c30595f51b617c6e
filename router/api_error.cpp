#include "router/api_error.h"

#include <nlohmann/json.hpp>

namespace k3::router {

ApiError::ApiError(int status, std::string message, std::string param, std::string code)
    : std::runtime_error(std::move(message)), status_(status), param_(std::move(param)), code_(std::move(code)) {}

std::string ApiError::type() const {
  switch (status_) {
    case 401: return "authentication_error";
    case 404: return "invalid_request_error";
    case 429: return "rate_limit_error";
    case 503: return "service_unavailable";
    default: return status_ >= 500 ? "server_error" : "invalid_request_error";
  }
}

std::string error_body(int status, const std::string& message, const std::string& type, const std::string& param,
                       const std::string& code) {
  nlohmann::json e = {{"message", message},
                      {"type", type},
                      {"param", param.empty() ? nlohmann::json(nullptr) : nlohmann::json(param)},
                      {"code", code.empty() ? nlohmann::json(nullptr) : nlohmann::json(code)}};
  // Messages may quote client bytes: replace invalid UTF-8 instead of throwing.
  return nlohmann::json{{"error", e}}.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

HttpResponse error_response(const ApiError& e) {
  HttpResponse r;
  r.status = e.status();
  r.body = error_body(e.status(), e.what(), e.type(), e.param(), e.code());
  if (e.status() == 401) r.headers.emplace_back("WWW-Authenticate", "Bearer");
  return r;
}

ApiError api_error_from_status(const Status& s) {
  switch (s.code()) {
    case Code::ResourceExhausted: return ApiError(429, s.message(), "", "queue_full");
    case Code::Unavailable: return ApiError(503, s.message(), "", "service_unavailable");
    case Code::DeadlineExceeded: return ApiError(504, s.message(), "", "deadline_exceeded");
    case Code::InvalidArgument:
    case Code::OutOfRange: return ApiError(400, s.message(), "", "invalid_value");
    default: return ApiError(500, s.message(), "", "internal_error");
  }
}

}  // namespace k3::router
