// A minimal HTTP/1.1 client over POSIX sockets for the process tests: one connection, requests
// written as raw bytes (so hostile framing can be sent), responses read with Content-Length or
// chunked bodies, keep-alive by reusing the connection.
#pragma once
#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <map>
#include <stdexcept>
#include <string>

namespace k3::test {

struct HttpReply {
  int status = 0;
  std::map<std::string, std::string> headers;  // lower-case keys
  std::string body;                            // de-chunked
};

class HttpConnection {
 public:
  explicit HttpConnection(int port) {
    fd_ = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_port = htons(static_cast<uint16_t>(port));
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (::connect(fd_, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0) throw std::runtime_error("connect failed");
  }
  ~HttpConnection() { close(); }
  HttpConnection(const HttpConnection&) = delete;
  HttpConnection& operator=(const HttpConnection&) = delete;

  void close() {
    if (fd_ >= 0) ::close(fd_);
    fd_ = -1;
  }
  // Sends everything it can; false when the peer stopped taking bytes.
  bool send_raw(const std::string& bytes) {
    size_t at = 0;
    while (at < bytes.size()) {
      const ssize_t n = ::send(fd_, bytes.data() + at, bytes.size() - at, MSG_NOSIGNAL);
      if (n <= 0) return false;
      at += static_cast<size_t>(n);
    }
    return true;
  }
  void send_request(const std::string& method, const std::string& path, const std::string& body = "",
                    const std::string& extra_headers = "") {
    std::string r = method + " " + path + " HTTP/1.1\r\nHost: 127.0.0.1\r\n" + extra_headers;
    if (!body.empty() || method == "POST") r += "Content-Type: application/json\r\nContent-Length: " + std::to_string(body.size()) + "\r\n";
    r += "\r\n" + body;
    send_raw(r);
  }
  // Reads one whole response (throws on timeout or a closed connection before it is complete).
  // head: the reply to a HEAD request (headers only, whatever Content-Length says).
  HttpReply read_reply(std::chrono::milliseconds timeout = std::chrono::milliseconds(60000), bool head_request = false) {
    deadline_ = std::chrono::steady_clock::now() + timeout;
    HttpReply r;
    std::string head = read_until("\r\n\r\n");
    const size_t sp = head.find(' ');
    r.status = std::stoi(head.substr(sp + 1, 3));
    size_t at = head.find("\r\n") + 2;
    while (at < head.size()) {
      const size_t eol = head.find("\r\n", at);
      const std::string line = head.substr(at, eol - at);
      at = eol + 2;
      const size_t colon = line.find(':');
      if (colon == std::string::npos) continue;
      std::string k = line.substr(0, colon), v = line.substr(colon + 1);
      for (char& c : k) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
      while (!v.empty() && v.front() == ' ') v.erase(0, 1);
      r.headers[k] = v;
    }
    if (head_request) return r;
    if (r.headers.count("content-length")) {
      r.body = read_exact(std::stoul(r.headers["content-length"]));
    } else if (r.headers["transfer-encoding"].find("chunked") != std::string::npos) {
      for (;;) {
        const std::string size_line = read_until("\r\n");
        const size_t n = std::stoul(size_line, nullptr, 16);
        if (n == 0) {
          read_until("\r\n");
          break;
        }
        r.body += read_exact(n);
        read_exact(2);
      }
    }
    return r;
  }
  // Reads whatever arrives within the timeout (for streams read piecemeal); "" on EOF/timeout.
  std::string read_some(std::chrono::milliseconds timeout) {
    if (!buf_.empty()) return std::exchange(buf_, std::string());
    pollfd p{fd_, POLLIN, 0};
    if (::poll(&p, 1, static_cast<int>(timeout.count())) <= 0) return "";
    char tmp[4096];
    const ssize_t n = ::recv(fd_, tmp, sizeof tmp, 0);
    return n > 0 ? std::string(tmp, static_cast<size_t>(n)) : "";
  }
  // True when the server closed the connection (EOF within the timeout).
  bool closed_by_peer(std::chrono::milliseconds timeout) {
    pollfd p{fd_, POLLIN, 0};
    if (::poll(&p, 1, static_cast<int>(timeout.count())) <= 0) return false;
    char tmp[1];
    return ::recv(fd_, tmp, 1, MSG_PEEK) <= 0;
  }

 private:
  void fill() {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline_ - std::chrono::steady_clock::now());
    pollfd p{fd_, POLLIN, 0};
    if (left.count() <= 0 || ::poll(&p, 1, static_cast<int>(left.count())) <= 0) throw std::runtime_error("read timeout");
    char tmp[65536];
    const ssize_t n = ::recv(fd_, tmp, sizeof tmp, 0);
    if (n <= 0) throw std::runtime_error("connection closed");
    buf_.append(tmp, static_cast<size_t>(n));
  }
  std::string read_until(const std::string& delim) {
    size_t pos;
    while ((pos = buf_.find(delim)) == std::string::npos) fill();
    std::string out = buf_.substr(0, pos + delim.size());
    buf_.erase(0, pos + delim.size());
    return out;
  }
  std::string read_exact(size_t n) {
    while (buf_.size() < n) fill();
    std::string out = buf_.substr(0, n);
    buf_.erase(0, n);
    return out;
  }

  int fd_ = -1;
  std::string buf_;
  std::chrono::steady_clock::time_point deadline_;
};

}  // namespace k3::test
