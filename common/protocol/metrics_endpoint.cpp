#include "common/protocol/metrics_endpoint.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>

namespace k3::protocol {
namespace {

constexpr size_t kMaxHeader = 8 << 10;
constexpr auto kRequestTimeout = std::chrono::seconds(5);

Status errno_status(const std::string& what) { return io_error(what + ": " + std::strerror(errno)); }

// Waits until `fd` is ready for `events` or `deadline` passes (false then).
bool wait_fd(int fd, short events, std::chrono::steady_clock::time_point deadline) {
  for (;;) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
    if (left.count() <= 0) return false;
    pollfd p{fd, events, 0};
    const int rc = ::poll(&p, 1, static_cast<int>(left.count()));
    if (rc > 0) return true;
    if (rc < 0 && errno != EINTR) return false;
  }
}

std::string response(int code, const char* reason, const std::string& type, const std::string& body) {
  return "HTTP/1.1 " + std::to_string(code) + " " + reason + "\r\nContent-Type: " + type +
         "\r\nContent-Length: " + std::to_string(body.size()) + "\r\nConnection: close\r\n\r\n" + body;
}

}  // namespace

Result<ListenAddress> parse_listen_address(const std::string& text, const std::string& what) {
  const auto colon = text.rfind(':');
  if (colon == std::string::npos || colon == 0 || colon + 1 == text.size())
    return invalid_argument(what + " '" + text + "': expected HOST:PORT (e.g. 0.0.0.0:9400)");
  ListenAddress a{.host = text.substr(0, colon)};
  in_addr probe{};
  if (::inet_pton(AF_INET, a.host.c_str(), &probe) != 1)
    return invalid_argument(what + " '" + text + "': '" + a.host + "' is not an IPv4 address");
  const std::string port = text.substr(colon + 1);
  if (port.size() > 5 || port.find_first_not_of("0123456789") != std::string::npos || std::stoul(port) > 65535)
    return invalid_argument(what + " '" + text + "': the port must be 0..65535");
  a.port = static_cast<uint16_t>(std::stoul(port));
  return a;
}

Result<std::unique_ptr<MetricsEndpoint>> MetricsEndpoint::start(const ListenAddress& at, const MetricsRegistry& registry) {
  const std::string where = at.host + ":" + std::to_string(at.port);
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
  if (fd < 0) return errno_status("metrics endpoint " + where + ": socket");
  const int one = 1;
  (void)::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  sockaddr_in sa{};
  sa.sin_family = AF_INET;
  sa.sin_port = htons(at.port);
  if (::inet_pton(AF_INET, at.host.c_str(), &sa.sin_addr) != 1) {
    ::close(fd);
    return invalid_argument("metrics endpoint " + where + ": '" + at.host + "' is not an IPv4 address");
  }
  if (::bind(fd, reinterpret_cast<sockaddr*>(&sa), sizeof sa) != 0 || ::listen(fd, 16) != 0) {
    Status s = errno_status("metrics endpoint " + where + ": bind/listen");
    ::close(fd);
    return s;
  }
  socklen_t len = sizeof sa;
  (void)::getsockname(fd, reinterpret_cast<sockaddr*>(&sa), &len);
  const int wake = ::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
  if (wake < 0) {
    Status s = errno_status("metrics endpoint " + where + ": eventfd");
    ::close(fd);
    return s;
  }
  std::unique_ptr<MetricsEndpoint> e(new MetricsEndpoint(fd, wake, at.host, ntohs(sa.sin_port), registry));
  e->thread_ = std::thread([p = e.get()] { p->loop(); });
  return e;
}

MetricsEndpoint::~MetricsEndpoint() {
  const uint64_t one = 1;
  (void)!::write(wake_fd_, &one, sizeof one);
  if (thread_.joinable()) thread_.join();
  ::close(listen_fd_);
  ::close(wake_fd_);
}

std::string MetricsEndpoint::url() const { return "http://" + host_ + ":" + std::to_string(port_) + "/metrics"; }

void MetricsEndpoint::loop() {
  for (;;) {
    pollfd p[2] = {{wake_fd_, POLLIN, 0}, {listen_fd_, POLLIN, 0}};
    if (::poll(p, 2, -1) < 0 && errno != EINTR) return;
    if (p[0].revents) return;
    if (!(p[1].revents & POLLIN)) continue;
    const int c = ::accept4(listen_fd_, nullptr, nullptr, SOCK_CLOEXEC | SOCK_NONBLOCK);
    if (c < 0) continue;   // the client went away meanwhile, or no descriptor left: try the next one
    serve_one(c);
    ::close(c);
  }
}

void MetricsEndpoint::serve_one(int fd) const {
  const auto deadline = std::chrono::steady_clock::now() + kRequestTimeout;
  std::string req;
  char buf[2048];
  while (req.find("\r\n\r\n") == std::string::npos) {
    if (req.size() > kMaxHeader || !wait_fd(fd, POLLIN, deadline)) return;   // dropped without an answer
    const ssize_t n = ::recv(fd, buf, sizeof buf, 0);
    if (n <= 0) {
      if (n < 0 && (errno == EAGAIN || errno == EINTR)) continue;
      return;
    }
    req.append(buf, static_cast<size_t>(n));
  }
  const std::string line = req.substr(0, req.find("\r\n"));
  const auto sp1 = line.find(' '), sp2 = line.find(' ', sp1 + 1);
  const std::string method = line.substr(0, sp1);
  std::string path = sp1 == std::string::npos ? "" : line.substr(sp1 + 1, sp2 == std::string::npos ? std::string::npos : sp2 - sp1 - 1);
  path = path.substr(0, path.find('?'));
  std::string out;
  if (method != "GET") out = response(405, "Method Not Allowed", "text/plain", "GET /metrics or /health\n");
  else if (path == "/metrics") out = response(200, "OK", "text/plain; version=0.0.4", registry_.prometheus_text());
  else if (path == "/health") out = response(200, "OK", "text/plain", "ok\n");
  else out = response(404, "Not Found", "text/plain", "GET /metrics or /health\n");
  for (size_t sent = 0; sent < out.size();) {
    if (!wait_fd(fd, POLLOUT, deadline)) return;
    const ssize_t n = ::send(fd, out.data() + sent, out.size() - sent, MSG_NOSIGNAL);
    if (n < 0) {
      if (errno == EAGAIN || errno == EINTR) continue;
      return;
    }
    sent += static_cast<size_t>(n);
  }
}

}  // namespace k3::protocol
