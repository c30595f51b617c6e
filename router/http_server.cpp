// The one translation unit that includes Boost.Beast (it compiles slowly).
#include "router/http_server.h"

#include <poll.h>
#include <sys/socket.h>

#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/write.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>

#include <atomic>
#include <list>
#include <mutex>
#include <thread>

#include "router/api_error.h"

namespace k3::router {

namespace net = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
using tcp = net::ip::tcp;

namespace {

// Runs one async operation to completion on the connection's own io_context, so deadlines
// (tcp_stream::expires_after) apply while the calling code stays sequential.
template <class Initiate>
beast::error_code run_op(net::io_context& ioc, Initiate&& initiate) {
  beast::error_code out = net::error::would_block;
  initiate([&out](beast::error_code ec, std::size_t) { out = ec; });
  ioc.restart();
  ioc.run();
  return out;
}

std::string lower(std::string s) {
  for (char& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return s;
}

}  // namespace

struct Connection {
  net::io_context ioc{1};
  beast::tcp_stream stream{ioc};
  std::thread thread;
  std::atomic<bool> finished{false};
  std::atomic<bool> busy{false};   // between reading a request header and finishing its response
  std::mutex close_mu;   // guards the socket's close against a concurrent shutdown from stop()
  bool closed = false;

  // Wakes any blocked operation (thread-safe: shutdown(2) on a still-open descriptor).
  void interrupt() {
    std::lock_guard lk(close_mu);
    if (!closed) ::shutdown(stream.socket().native_handle(), SHUT_RDWR);
  }
  void close() {
    std::lock_guard lk(close_mu);
    beast::error_code ec;
    stream.socket().shutdown(tcp::socket::shutdown_both, ec);
    stream.socket().close(ec);
    closed = true;
  }
};

struct HttpServer::Impl {
  HttpServerOptions opts;
  HttpHandler handler;
  net::io_context accept_ioc{1};
  tcp::acceptor acceptor{accept_ioc};
  std::thread accept_thread;
  std::atomic<bool> stopping{false};
  mutable std::mutex conns_mu;
  std::list<std::shared_ptr<Connection>> conns;
  uint16_t port = 0;

  void accept_loop();
  void do_accept();
  void reap(bool all);
  void serve(Connection& c);
  bool write_response(Connection& c, const HttpResponse& r, unsigned version, bool keep_alive, bool head);
  bool write_sse(Connection& c, HttpResponse& r, unsigned version, bool keep_alive);
  void refuse(Connection& c, int status, const std::string& message, bool drain);
};

void HttpServer::Impl::reap(bool all) {
  std::list<std::shared_ptr<Connection>> done;
  {
    std::lock_guard lk(conns_mu);
    for (auto it = conns.begin(); it != conns.end();) {
      if (all || (*it)->finished) {
        done.push_back(*it);
        it = conns.erase(it);
      } else {
        ++it;
      }
    }
  }
  for (auto& c : done)
    if (c->thread.joinable()) c->thread.join();
}

void HttpServer::Impl::do_accept() {
  auto c = std::make_shared<Connection>();
  acceptor.async_accept(c->stream.socket(), [this, c](beast::error_code ec) {
    if (ec || stopping) return;  // closed by stop()
    reap(false);
    size_t live;
    {
      std::lock_guard lk(conns_mu);
      live = conns.size();
      conns.push_back(c);
    }
    const bool over = static_cast<int>(live) >= opts.max_connections;
    c->thread = std::thread([this, c, over] {
      if (over) refuse(*c, 503, "too many open connections", false);
      else serve(*c);
      c->close();
      c->finished = true;
    });
    do_accept();
  });
}

void HttpServer::Impl::accept_loop() {
  do_accept();
  accept_ioc.run();
}

bool HttpServer::Impl::write_response(Connection& c, const HttpResponse& r, unsigned version, bool keep_alive, bool head) {
  http::response<http::string_body> res{static_cast<http::status>(r.status), version};
  res.set(http::field::server, "k3-router");
  res.set(http::field::content_type, r.content_type);
  for (const auto& [k, v] : r.headers) res.set(k, v);
  res.keep_alive(keep_alive);
  res.body() = r.body;
  res.prepare_payload();
  if (head) res.body().clear();  // Content-Length stays that of the GET body
  c.stream.expires_after(opts.io_timeout);
  http::response_serializer<http::string_body> sr{res};
  return !run_op(c.ioc, [&](auto&& h) { http::async_write(c.stream, sr, h); });
}

bool HttpServer::Impl::write_sse(Connection& c, HttpResponse& r, unsigned version, bool keep_alive) {
  http::response<http::empty_body> res{static_cast<http::status>(r.status), version};
  res.set(http::field::server, "k3-router");
  res.set(http::field::content_type, r.content_type);
  for (const auto& [k, v] : r.headers) res.set(k, v);
  res.keep_alive(keep_alive);
  res.chunked(true);
  http::response_serializer<http::empty_body> sr{res};
  c.stream.expires_after(opts.io_timeout);
  if (run_op(c.ioc, [&](auto&& h) { http::async_write_header(c.stream, sr, h); })) return false;
  std::string chunk;
  for (;;) {
    bool more = false;
    try {
      more = r.sse(chunk);
    } catch (...) {
      more = false;  // the generator is the handler's; a throw ends the stream
    }
    if (!more) break;
    c.stream.expires_after(opts.io_timeout);
    if (run_op(c.ioc, [&](auto&& h) { net::async_write(c.stream, http::make_chunk(net::buffer(chunk)), h); }))
      return false;  // the client left: the caller drops the generator, which cancels the request
  }
  c.stream.expires_after(opts.io_timeout);
  return !run_op(c.ioc, [&](auto&& h) { net::async_write(c.stream, http::make_chunk_last(), h); });
}

// Sends an error and closes. drain: read and discard what the client is still sending (bounded in
// bytes and time, never buffered) so closing does not reset the connection before it reads the reply.
void HttpServer::Impl::refuse(Connection& c, int status, const std::string& message, bool drain) {
  const ApiError e(status, message, "", status == 413 ? "request_too_large" : "");
  HttpResponse r = error_response(e);
  write_response(c, r, 11, false, false);
  beast::error_code ec;
  c.stream.socket().shutdown(tcp::socket::shutdown_send, ec);
  if (!drain) return;
  char sink[1 << 16];
  size_t total = 0;
  c.stream.expires_after(std::chrono::seconds(2));
  while (total < (64u << 20)) {
    std::size_t n = 0;
    beast::error_code rec = net::error::would_block;
    c.stream.async_read_some(net::buffer(sink), [&](beast::error_code e2, std::size_t k) {
      rec = e2;
      n = k;
    });
    c.ioc.restart();
    c.ioc.run();
    if (rec) break;
    total += n;
  }
}

void HttpServer::Impl::serve(Connection& c) {
  beast::flat_buffer buf;
  while (!stopping) {
    http::request_parser<http::string_body> parser;
    parser.header_limit(static_cast<std::uint32_t>(opts.max_header_bytes));
    parser.body_limit(opts.max_body_bytes);
    c.stream.expires_after(opts.idle_timeout);
    beast::error_code ec = run_op(c.ioc, [&](auto&& h) { http::async_read_header(c.stream, buf, parser, h); });
    if (ec) {
      if (ec == http::error::header_limit) refuse(c, 431, "request header fields too large", false);
      else if (ec == http::error::body_limit)  // a declared Content-Length over the limit
        refuse(c, 413, "request body exceeds the limit of " + std::to_string(opts.max_body_bytes) + " bytes", true);
      else if (ec.category() == http::make_error_code(http::error::bad_method).category() && ec != http::error::end_of_stream &&
               ec != http::error::partial_message)
        refuse(c, 400, "malformed HTTP request: " + ec.message(), false);
      return;  // end of stream, timeout, reset or shutdown
    }
    c.busy = true;
    if (parser.content_length() && *parser.content_length() > opts.max_body_bytes) {
      refuse(c, 413, "request body of " + std::to_string(*parser.content_length()) + " bytes exceeds the limit of " +
                         std::to_string(opts.max_body_bytes) + " bytes", true);
      return;
    }
    if (lower(std::string(parser.get()[http::field::expect])) == "100-continue") {
      static const char kContinue[] = "HTTP/1.1 100 Continue\r\n\r\n";
      c.stream.expires_after(opts.io_timeout);
      if (run_op(c.ioc, [&](auto&& h) { net::async_write(c.stream, net::buffer(kContinue, sizeof kContinue - 1), h); })) return;
    }
    c.stream.expires_after(opts.io_timeout);
    ec = run_op(c.ioc, [&](auto&& h) { http::async_read(c.stream, buf, parser, h); });
    if (ec == http::error::body_limit) {
      refuse(c, 413, "request body exceeds the limit of " + std::to_string(opts.max_body_bytes) + " bytes", true);
      return;
    }
    if (ec) {
      if (ec.category() == http::make_error_code(http::error::bad_method).category() && ec != http::error::end_of_stream &&
          ec != http::error::partial_message)
        refuse(c, 400, "malformed HTTP request: " + ec.message(), false);
      return;
    }
    auto& req = parser.get();
    HttpRequest hr;
    hr.method = std::string(req.method_string());
    hr.target = std::string(req.target());
    for (const auto& f : req) hr.headers[lower(std::string(f.name_string()))] = std::string(f.value());
    hr.body = std::move(req.body());
    const int fd = c.stream.socket().native_handle();
    hr.client_gone = [fd] {
      // Peer closed or reset: POLLRDHUP/POLLHUP/POLLERR, without consuming any pipelined bytes.
      pollfd p{fd, POLLRDHUP, 0};
      return ::poll(&p, 1, 0) > 0 && (p.revents & (POLLRDHUP | POLLHUP | POLLERR)) != 0;
    };
    const bool keep = req.keep_alive() && !stopping;
    HttpResponse resp;
    try {
      resp = handler(hr);
    } catch (const std::exception& e) {
      resp = error_response(ApiError(500, std::string("internal error: ") + e.what()));
    }
    const bool ok = resp.sse ? write_sse(c, resp, req.version(), keep)
                             : write_response(c, resp, req.version(), keep, req.method() == http::verb::head);
    c.busy = false;
    if (!ok || !keep) return;
  }
}

HttpServer::HttpServer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

Result<std::unique_ptr<HttpServer>> HttpServer::start(const HttpServerOptions& opts, HttpHandler handler) {
  auto impl = std::make_unique<Impl>();
  impl->opts = opts;
  impl->handler = std::move(handler);
  beast::error_code ec;
  auto addr = net::ip::make_address(opts.host, ec);
  if (ec) return invalid_argument("--host: '" + opts.host + "' is not an IP address");
  tcp::endpoint ep{addr, opts.port};
  impl->acceptor.open(ep.protocol(), ec);
  if (!ec) impl->acceptor.set_option(net::socket_base::reuse_address(true), ec);
  if (!ec) impl->acceptor.bind(ep, ec);
  if (!ec) impl->acceptor.listen(net::socket_base::max_listen_connections, ec);
  if (ec) return Status(Code::Unavailable, "cannot listen on " + opts.host + ":" + std::to_string(opts.port) + ": " + ec.message());
  impl->port = impl->acceptor.local_endpoint().port();
  Impl* p = impl.get();
  impl->accept_thread = std::thread([p] { p->accept_loop(); });
  return std::unique_ptr<HttpServer>(new HttpServer(std::move(impl)));
}

HttpServer::~HttpServer() { stop(); }

uint16_t HttpServer::port() const { return impl_->port; }

int HttpServer::open_connections() const {
  std::lock_guard lk(impl_->conns_mu);
  int n = 0;
  for (const auto& c : impl_->conns) n += !c->finished;
  return n;
}

void HttpServer::stop(std::chrono::milliseconds grace) {
  if (impl_->stopping.exchange(true)) {
    if (impl_->accept_thread.joinable()) impl_->accept_thread.join();
    return;
  }
  net::post(impl_->accept_ioc, [p = impl_.get()] {
    beast::error_code ec;
    p->acceptor.close(ec);
  });
  if (impl_->accept_thread.joinable()) impl_->accept_thread.join();
  // Connections finish the response in hand (keep-alive is off now); idle ones are woken at once.
  {
    std::lock_guard lk(impl_->conns_mu);
    for (auto& c : impl_->conns)
      if (!c->busy) c->interrupt();
  }
  const auto deadline = std::chrono::steady_clock::now() + grace;
  for (;;) {
    {
      std::lock_guard lk(impl_->conns_mu);
      bool all_done = true;
      for (auto& c : impl_->conns) all_done &= c->finished.load();
      if (all_done || std::chrono::steady_clock::now() >= deadline) {
        for (auto& c : impl_->conns)
          if (!c->finished) c->interrupt();
        break;
      }
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  impl_->reap(true);
}

}  // namespace k3::router
