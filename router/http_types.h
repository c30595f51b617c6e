// Plain request/response structs between the HTTP server (the only Beast code) and the handlers,
// so every handler is testable without sockets.
#pragma once
#include <functional>
#include <map>
#include <string>
#include <utility>
#include <vector>

namespace k3::router {

struct HttpRequest {
  std::string method;                         // "GET", "POST", ...
  std::string target;                         // path plus optional "?query"
  std::map<std::string, std::string> headers; // keys lower-case
  std::string body;
  // Set by the server: true once the client has closed its side (lets a long non-streamed request
  // be cancelled). May be empty (tests without sockets).
  std::function<bool()> client_gone;

  std::string header(const std::string& lower_name) const {
    auto it = headers.find(lower_name);
    return it == headers.end() ? std::string() : it->second;
  }
};

// Produces the next framed piece of a Server-Sent Events body into `chunk`; returns false when the
// stream is over (chunk is then ignored). The server destroys the generator when the client goes away,
// which cancels the request behind it.
using SseGenerator = std::function<bool(std::string& chunk)>;

struct HttpResponse {
  int status = 200;
  std::string content_type = "application/json";
  std::string body;
  std::vector<std::pair<std::string, std::string>> headers;  // extra headers (e.g. Allow)
  SseGenerator sse;                                          // set: the body is this event stream
};

// The server's one entry into the API: every request, every response.
using HttpHandler = std::function<HttpResponse(const HttpRequest&)>;

}  // namespace k3::router
