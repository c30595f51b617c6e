// Errors as the OpenAI API reports them: an HTTP status plus
//   {"error": {"message": ..., "type": ..., "param": ... | null, "code": ... | null}}
// Validation code throws ApiError; the one wrapper in ApiHandlers turns it into a response.
#pragma once
#include <stdexcept>
#include <string>

#include "common/core/status.h"
#include "router/http_types.h"

namespace k3::router {

class ApiError : public std::runtime_error {
 public:
  ApiError(int status, std::string message, std::string param = "", std::string code = "");
  int status() const { return status_; }
  const std::string& param() const { return param_; }
  const std::string& code() const { return code_; }
  std::string type() const;  // from the status: invalid_request_error, authentication_error, ...

 private:
  int status_;
  std::string param_, code_;
};

// 400 naming the parameter.
inline ApiError bad_param(const std::string& param, const std::string& message) {
  return ApiError(400, message, param, "invalid_value");
}

// The JSON error body and a full response carrying it.
std::string error_body(int status, const std::string& message, const std::string& type, const std::string& param,
                       const std::string& code);
HttpResponse error_response(const ApiError& e);
// A service Status as the client sees it: ResourceExhausted 429, Unavailable 503, InvalidArgument 400, else 500.
ApiError api_error_from_status(const Status& s);

}  // namespace k3::router
