#include "deploy/http_probe.h"

#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cstdlib>

namespace k3::deploy {

namespace {

struct Fd {
  int fd = -1;
  ~Fd() {
    if (fd >= 0) ::close(fd);
  }
};

// True once the head and a Content-Length body are in.
bool complete(const std::string& data) {
  const auto head_end = data.find("\r\n\r\n");
  if (head_end == std::string::npos) return false;
  std::string head = data.substr(0, head_end);
  for (char& c : head) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  const auto cl = head.find("content-length:");
  if (cl == std::string::npos) return false;
  const size_t len = std::strtoul(head.c_str() + cl + 15, nullptr, 10);
  return data.size() >= head_end + 4 + len;
}

}  // namespace

Result<ProbeReply> http_get(const std::string& host, int port, const std::string& path, std::chrono::milliseconds timeout) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  auto left_ms = [&] {
    return static_cast<int>(std::max<int64_t>(
        0, std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now()).count()));
  };
  Fd s{::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0)};
  if (s.fd < 0) return Status(Code::Unavailable, "socket failed");
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(static_cast<uint16_t>(port));
  if (::inet_pton(AF_INET, host == "localhost" ? "127.0.0.1" : host.c_str(), &a.sin_addr) != 1) {
    // A name (a Kubernetes Service, a Slurm node): its first IPv4 address.
    addrinfo hints{}, *found = nullptr;
    hints.ai_family = AF_INET;
    hints.ai_socktype = SOCK_STREAM;
    if (::getaddrinfo(host.c_str(), nullptr, &hints, &found) != 0 || !found)
      return Status(Code::Unavailable, "host '" + host + "' is neither an IPv4 address nor a name that resolves");
    a.sin_addr = reinterpret_cast<sockaddr_in*>(found->ai_addr)->sin_addr;
    ::freeaddrinfo(found);
  }
  if (::connect(s.fd, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0)
    return Status(Code::Unavailable, "connect to " + host + ":" + std::to_string(port) + " refused");
  const std::string rq = "GET " + path + " HTTP/1.0\r\nHost: " + host + "\r\nConnection: close\r\n\r\n";
  if (::send(s.fd, rq.data(), rq.size(), MSG_NOSIGNAL) != static_cast<ssize_t>(rq.size()))
    return Status(Code::Unavailable, "send failed");
  std::string data;
  for (;;) {
    pollfd p{.fd = s.fd, .events = POLLIN, .revents = 0};
    const int ms = left_ms();
    if (ms == 0 || ::poll(&p, 1, ms) <= 0) return Status(Code::Unavailable, "no reply from " + host + ":" + std::to_string(port));
    char buf[4096];
    const ssize_t n = ::recv(s.fd, buf, sizeof buf, 0);
    if (n < 0) return Status(Code::Unavailable, "recv failed");
    if (n == 0) break;
    data.append(buf, static_cast<size_t>(n));
    if (complete(data)) break;  // a server that keeps the connection open anyway
  }
  const auto sp = data.find(' ');
  const auto head_end = data.find("\r\n\r\n");
  if (sp == std::string::npos || head_end == std::string::npos || data.size() < sp + 4)
    return Status(Code::Unavailable, "malformed HTTP reply");
  ProbeReply r;
  r.status = std::atoi(data.substr(sp + 1, 3).c_str());
  r.body = data.substr(head_end + 4);
  return r;
}

}  // namespace k3::deploy
