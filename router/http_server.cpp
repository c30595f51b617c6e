// The one translation unit that includes Boost.Beast (it compiles slowly).
//
// Threads: `io_threads` run the io_context; each connection is a Session whose socket and timer live
// on their own strand, so a session's steps never run concurrently. Handlers (and SSE generator steps)
// run on the HandlerRunner's pool and post their result back to the session's strand. While a pool
// task holds a session's request or generator, the strand leaves both alone (`in_pool_`).
#include "router/http_server.h"

#include <poll.h>
#include <sys/socket.h>

#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/strand.hpp>
#include <boost/asio/write.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>

#include <algorithm>
#include <array>
#include <atomic>
#include <cstdio>
#include <optional>
#include <thread>

#include "router/api_error.h"
#include "router/connection_table.h"
#include "router/handler_runner.h"

namespace k3::router {
namespace net = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
using tcp = net::ip::tcp;

namespace {

std::string lower(std::string s) {
  for (char& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return s;
}

// Beast's own HTTP parse errors (not end of stream or a cut-off message) deserve a 400.
bool is_malformed(const beast::error_code& ec) {
  return ec.category() == http::make_error_code(http::error::bad_method).category() && ec != http::error::end_of_stream &&
         ec != http::error::partial_message;
}

template <class Body>
void set_head(http::response<Body>& res, const HttpResponse& r, unsigned version, bool keep_alive) {
  res.version(version);
  res.result(static_cast<http::status>(r.status));
  res.set(http::field::server, "k3-router");
  res.set(http::field::content_type, r.content_type);
  for (const auto& [k, v] : r.headers) res.set(k, v);
  res.keep_alive(keep_alive);
}

auto make_message(const HttpResponse& r, unsigned version, bool keep_alive, bool head) {
  auto res = std::make_shared<http::response<http::string_body>>();
  set_head(*res, r, version, keep_alive);
  res->body() = r.body;
  res->prepare_payload();
  if (head) res->body().clear();  // Content-Length stays that of the GET body
  return res;
}

constexpr int kMaxRefusalDrains = 64;  // refused connections allowed to linger while their answer is read
}  // namespace

struct HttpServer::Impl {
  Impl(const HttpServerOptions& o, HttpHandler handler)
      : opts(o),
        metrics(o.metrics ? o.metrics : std::make_shared<ConnectionMetrics>()),
        table({.max_total = o.max_connections, .max_per_client = o.max_connections_per_client}, *metrics),
        handlers(std::move(handler), o.inline_paths, o.handler_threads),
        ioc(std::max(1, o.io_threads)),
        acceptor(net::make_strand(ioc)),
        accept_retry(acceptor.get_executor()) {}

  HttpServerOptions opts;
  std::shared_ptr<ConnectionMetrics> metrics;
  ConnectionTable table;  // outlives the io_context: sessions it destroys remove themselves here
  HandlerRunner handlers;
  std::atomic<bool> stopping{false};
  std::atomic<int> refusal_drains{0};
  net::io_context ioc;  // after everything a session touches, so sessions it destroys find them alive
  std::optional<net::executor_work_guard<net::io_context::executor_type>> work;
  tcp::acceptor acceptor;
  net::steady_timer accept_retry;
  std::vector<std::thread> io_threads;
  bool fd_limit_logged = false;  // acceptor strand only
  uint16_t port = 0;

  void do_accept();
  void on_accepted(tcp::socket sock);
  void on_accept_error(const beast::error_code& ec);
  void run_io();
};

class Session final : public EvictableConnection, public std::enable_shared_from_this<Session> {
 public:
  Session(HttpServer::Impl& srv, tcp::socket sock) : srv_(srv), sock_(std::move(sock)), timer_(sock_.get_executor()) {}
  ~Session() override {
    if (id_) srv_.table.remove(id_);
    if (draining_refusal_) --srv_.refusal_drains;
  }

  void begin(ConnectionTable::Id id) {
    id_ = id;
    on_strand([](Session& s) { s.wait_request(/*fresh=*/true); });
  }
  void refuse_admission(int status, std::string message) {
    on_strand([status, message = std::move(message)](Session& s) {
      s.draining_refusal_ = s.srv_.refusal_drains.fetch_add(1) < kMaxRefusalDrains;
      if (!s.draining_refusal_) --s.srv_.refusal_drains;
      s.refuse(status, message, s.draining_refusal_, "too_many_connections");
    });
  }
  // The table chose this connection to make room: close it now unless a request is being answered,
  // else after that response.
  void evict(CloseReason) override { on_strand([](Session& s) { s.close_when_idle(); }); }
  void stop_idle() { on_strand([](Session& s) { s.close_when_idle(); }); }
  void force_close() { on_strand([](Session& s) { s.close(); }); }

 private:
  enum class Phase { Idle, Header, Body, Handler, Write, Draining, Closed };
  struct SseWrite {
    http::response<http::empty_body> res;
    std::optional<http::response_serializer<http::empty_body>> sr;
    SseGenerator gen;
    std::string chunk;
    bool close_delimited = false;  // HTTP/1.0 has no chunked coding: the body ends when the connection does
  };

  template <class F>
  void on_strand(F&& f) {
    net::post(sock_.get_executor(), [self = shared_from_this(), f = std::forward<F>(f)]() mutable { f(*self); });
  }
  bool closed() const { return phase_ == Phase::Closed; }
  // The completion of a write with a deadline: ends the deadline, closes on error, else next(*this).
  template <class F>
  auto then(F next) {
    return [self = shared_from_this(), next](beast::error_code ec, std::size_t) {
      if (self->closed()) return;
      self->disarm();
      if (ec) return self->close();  // (SSE) the client left: dropping the generator cancels the request
      next(*self);
    };
  }

  // A deadline for the phase being entered; `why` is counted when it closes the connection.
  void arm(std::chrono::milliseconds d, std::optional<CloseReason> why) {
    timer_.expires_after(d);
    timer_.async_wait([self = shared_from_this(), gen = ++timer_gen_, why](beast::error_code ec) {
      if (ec || gen != self->timer_gen_ || self->closed()) return;
      if (why) self->srv_.metrics->count_closed(*why);
      self->close();
    });
  }
  void disarm() { ++timer_gen_; timer_.cancel(); }

  // Shuts both directions (wakes a pool handler polling client_gone) and closes the descriptor unless
  // a pool task may still poll it; then the strand closes it when the task reports back.
  void close() {
    if (closed()) return;
    phase_ = Phase::Closed;
    disarm();
    beast::error_code ec;
    sock_.shutdown(tcp::socket::shutdown_both, ec);
    if (!in_pool_) sock_.close(ec);
    release_generator();
  }
  void close_when_idle() {
    if (phase_ == Phase::Handler || phase_ == Phase::Write) no_keep_alive_ = true;
    else close();  // still receiving its request (or draining a refusal): nothing is lost
  }
  // The SseWrite itself stays until the last write completed (its chunk may be in flight).
  void release_generator() {
    if (!sse_ || in_pool_ || !sse_->gen) return;
    srv_.handlers.release(std::move(sse_->gen));
    sse_->gen = nullptr;
  }

  void wait_request(bool fresh) {
    if (closed()) return;  // evicted before it began
    sse_.reset();
    phase_ = Phase::Idle;
    if (no_keep_alive_ || srv_.stopping) return close();
    // A new connection's deadline runs from accept to the end of its header; a keep-alive one waits
    // idle_timeout for a first byte, then gets header_timeout.
    if (fresh) arm(srv_.opts.header_timeout, CloseReason::HeaderTimeout);
    else arm(srv_.opts.idle_timeout, CloseReason::IdleTimeout);
    if (buf_.size() > 0) return read_header(fresh);  // pipelined
    buf_.shrink_to_fit();                             // an idle connection holds no buffer
    sock_.async_wait(tcp::socket::wait_read, [self = shared_from_this(), fresh](beast::error_code ec) {
      if (self->closed()) return;
      if (ec) return self->close();
      self->read_header(fresh);
    });
  }

  void read_header(bool fresh) {
    phase_ = Phase::Header;
    if (!fresh) arm(srv_.opts.header_timeout, CloseReason::HeaderTimeout);
    parser_.emplace();
    parser_->header_limit(static_cast<std::uint32_t>(srv_.opts.max_header_bytes));
    parser_->body_limit(srv_.opts.max_body_bytes);
    http::async_read_header(sock_, buf_, *parser_, [self = shared_from_this()](beast::error_code ec, std::size_t) {
      self->on_header(ec);
    });
  }

  void on_read_error(const beast::error_code& ec) {
    if (ec == http::error::header_limit) refuse(431, "request header fields too large", true);
    else if (ec == http::error::body_limit)  // a declared Content-Length or a chunked body over the limit
      refuse(413, "request body exceeds the limit of " + std::to_string(srv_.opts.max_body_bytes) + " bytes", true);
    else if (is_malformed(ec)) refuse(400, "malformed HTTP request: " + ec.message(), true);
    else close();  // end of stream, reset, or closed by a deadline
  }

  void on_header(beast::error_code ec) {
    if (closed()) return;
    disarm();
    if (ec) return on_read_error(ec);
    phase_ = Phase::Body;
    const auto declared = parser_->content_length();
    if (declared && *declared > srv_.opts.max_body_bytes)
      return refuse(413, "request body of " + std::to_string(*declared) + " bytes exceeds the limit of " +
                             std::to_string(srv_.opts.max_body_bytes) + " bytes", true);
    if (lower(std::string(parser_->get()[http::field::expect])) == "100-continue") {
      static const char kContinue[] = "HTTP/1.1 100 Continue\r\n\r\n";
      arm(srv_.opts.write_timeout, CloseReason::WriteTimeout);
      return net::async_write(sock_, net::buffer(kContinue, sizeof kContinue - 1), then([](Session& s) { s.read_body(); }));
    }
    read_body();
  }

  void read_body() {
    arm(srv_.opts.body_timeout, CloseReason::BodyTimeout);
    http::async_read(sock_, buf_, *parser_, [self = shared_from_this()](beast::error_code ec, std::size_t) {
      if (self->closed()) return;
      self->disarm();
      if (ec) return self->on_read_error(ec);
      self->on_request();
    });
  }

  void on_request() {
    auto& req = parser_->get();
    HttpRequest hr;
    hr.method = std::string(req.method_string());
    hr.target = std::string(req.target());
    for (const auto& f : req) hr.headers[lower(std::string(f.name_string()))] = std::string(f.value());
    hr.body = std::move(req.body());
    const int fd = sock_.native_handle();
    hr.client_gone = [fd] {
      // Peer closed or reset (or we shut the socket down): POLLRDHUP/POLLHUP/POLLERR, without
      // consuming any pipelined bytes. The descriptor stays open while a pool task may call this.
      pollfd p{fd, POLLRDHUP, 0};
      return ::poll(&p, 1, 0) > 0 && (p.revents & (POLLRDHUP | POLLHUP | POLLERR)) != 0;
    };
    version_ = req.version();
    keep_ = req.keep_alive() && !no_keep_alive_ && !srv_.stopping;
    head_ = req.method() == http::verb::head;
    parser_.reset();
    phase_ = Phase::Handler;
    srv_.table.set_busy(id_);
    if (srv_.handlers.runs_inline(hr.target)) return respond(srv_.handlers.call(hr));
    in_pool_ = true;
    const bool queued = srv_.handlers.call_on_pool(std::move(hr), [self = shared_from_this()](HttpResponse r) {
      net::post(self->sock_.get_executor(), [self, r = std::move(r)]() mutable { self->from_pool(std::move(r)); });
    });
    if (!queued) from_pool(error_response(ApiError(503, "the server is shutting down", "", "service_unavailable")));
  }

  // A pool task reported back; false when the connection was closed meanwhile (its descriptor, kept
  // open for the task, is closed now).
  bool back_from_pool() {
    in_pool_ = false;
    beast::error_code ec;
    if (closed()) sock_.close(ec);
    return !closed();
  }
  void from_pool(HttpResponse r) {
    if (back_from_pool()) respond(std::move(r));
    else srv_.handlers.release(std::move(r.sse));
  }

  void respond(HttpResponse r) {
    phase_ = Phase::Write;
    if (r.sse) return start_sse(std::move(r));
    auto msg = make_message(r, version_, keep_, head_);
    idle_from_last_write();
    arm(srv_.opts.write_timeout, CloseReason::WriteTimeout);
    http::async_write(sock_, *msg, [self = shared_from_this(), msg](beast::error_code ec, std::size_t) { self->on_written(ec); });
  }

  // Idle (evictable, the newest) from the start of a kept-alive response's last write: a client that
  // read the response knows it counts as idle. An eviction during the write closes after it.
  void idle_from_last_write() {
    if (keep_) srv_.table.set_idle(id_);
  }

  void on_written(const beast::error_code& ec) {
    if (closed()) return;
    disarm();
    if (ec || !keep_) return close();
    wait_request(/*fresh=*/false);
  }

  void start_sse(HttpResponse r) {
    sse_ = std::make_unique<SseWrite>();
    sse_->close_delimited = version_ < 11;
    keep_ = keep_ && !sse_->close_delimited;
    set_head(sse_->res, r, version_, keep_);
    sse_->res.chunked(!sse_->close_delimited);
    sse_->gen = std::move(r.sse);
    sse_->sr.emplace(sse_->res);
    arm(srv_.opts.write_timeout, CloseReason::WriteTimeout);
    http::async_write_header(sock_, *sse_->sr, then([](Session& s) { s.sse_step(); }));
  }

  // One generator call on the pool (it may wait up to the keep-alive interval for a token).
  void sse_step() {
    in_pool_ = true;
    const bool queued = srv_.handlers.submit([self = shared_from_this()] {
      SseWrite& s = *self->sse_;  // the strand leaves sse_ alone while in_pool_
      bool more = false;
      try {
        more = s.gen(s.chunk);
      } catch (...) {
        more = false;  // the generator is the handler's; a throw ends the stream
      }
      net::post(self->sock_.get_executor(), [self, more] { self->on_sse_chunk(more); });
    });
    if (!queued) {
      in_pool_ = false;
      close();
    }
  }

  void on_sse_chunk(bool more) {
    if (!back_from_pool()) return release_generator();
    arm(srv_.opts.write_timeout, CloseReason::WriteTimeout);
    if (!more) {
      release_generator();
      if (sse_->close_delimited) return close();
      idle_from_last_write();
      return net::async_write(sock_, http::make_chunk_last(),
                              [self = shared_from_this()](beast::error_code ec, std::size_t) { self->on_written(ec); });
    }
    if (sse_->close_delimited) return net::async_write(sock_, net::buffer(sse_->chunk), then([](Session& s) { s.sse_step(); }));
    net::async_write(sock_, http::make_chunk(net::buffer(sse_->chunk)), then([](Session& s) { s.sse_step(); }));
  }

  // Answers an error and closes. drain: first read and discard what the client is still sending
  // (bounded in bytes and time, never buffered), so closing does not reset the connection before
  // the client has read the answer.
  void refuse(int status, const std::string& message, bool drain, const std::string& code = "") {
    keep_ = false;
    phase_ = Phase::Write;
    const ApiError e(status, message, "", status == 413 ? "request_too_large" : code);
    auto msg = make_message(error_response(e), 11, false, false);
    arm(srv_.opts.write_timeout, CloseReason::WriteTimeout);
    http::async_write(sock_, *msg, then([msg, drain](Session& s) {
      if (!drain) return s.close();
      beast::error_code ec;
      s.sock_.shutdown(tcp::socket::shutdown_send, ec);
      s.phase_ = Phase::Draining;
      s.arm(std::chrono::seconds(2), std::nullopt);
      s.drain_buf_ = std::make_unique<std::array<char, 16384>>();
      s.drain(0);
    }));
  }
  void drain(size_t total) {
    sock_.async_read_some(net::buffer(*drain_buf_), [self = shared_from_this(), total](beast::error_code ec, std::size_t n) {
      if (self->closed()) return;
      if (ec || total + n > (64u << 20)) return self->close();
      self->drain(total + n);
    });
  }

  HttpServer::Impl& srv_;
  tcp::socket sock_;
  net::steady_timer timer_;
  uint64_t timer_gen_ = 0;  // a timer callback of an earlier phase finds a newer generation and does nothing
  ConnectionTable::Id id_ = 0;  // 0: refused, not in the table
  Phase phase_ = Phase::Idle;
  beast::flat_buffer buf_;
  std::optional<http::request_parser<http::string_body>> parser_;
  std::unique_ptr<SseWrite> sse_;
  std::unique_ptr<std::array<char, 16384>> drain_buf_;
  unsigned version_ = 11;
  bool keep_ = false, head_ = false;
  bool no_keep_alive_ = false;  // evicted or stopping while busy: close after this response
  bool in_pool_ = false;        // a pool task holds the request or the generator
  bool draining_refusal_ = false;
};

void HttpServer::Impl::do_accept() {
  acceptor.async_accept(net::make_strand(ioc), [this](beast::error_code ec, tcp::socket sock) {
    if (stopping || ec == net::error::operation_aborted) return;
    if (ec) return on_accept_error(ec);
    on_accepted(std::move(sock));
    do_accept();
  });
}

void HttpServer::Impl::on_accept_error(const beast::error_code& ec) {
  // Out of descriptors: the pending connection stays in the backlog; close the oldest idle connection
  // so it (a health check, say) gets in, and try again shortly instead of spinning.
  if (ec == net::error::no_descriptors || ec == std::errc::too_many_files_open_in_system) {
    if (!fd_limit_logged) {
      std::fprintf(stderr, "k3-router: out of file descriptors at %d open connections (%s); closing idle ones\n",
                   table.open(), ec.message().c_str());
      fd_limit_logged = true;
    }
    if (auto victim = table.take_oldest_idle()) victim->evict(CloseReason::FdLimit);
  }
  accept_retry.expires_after(std::chrono::milliseconds(50));
  accept_retry.async_wait([this](beast::error_code e) {
    if (!e && !stopping) do_accept();
  });
}

void HttpServer::Impl::run_io() {
  for (bool done = false; !done;) {
    try {
      ioc.run();
      done = true;
    } catch (const std::exception& e) {  // a step that throws (out of memory, say) loses its connection only
      std::fprintf(stderr, "k3-router: HTTP I/O: %s\n", e.what());
    }
  }
}

void HttpServer::Impl::on_accepted(tcp::socket sock) {
  metrics->count_accepted();
  beast::error_code ec;
  const auto peer = sock.remote_endpoint(ec);
  const std::string client = ec ? std::string() : peer.address().to_string();
  sock.set_option(tcp::no_delay(true), ec);  // SSE chunks are small and latency matters
  auto s = std::make_shared<Session>(*this, std::move(sock));
  auto a = table.admit(client, s);
  for (auto& v : a.victims) v->evict(a.victims_reason);
  switch (a.verdict) {
    case ConnectionTable::Verdict::Admit: return s->begin(a.id);
    case ConnectionTable::Verdict::RefusePerClient: return s->refuse_admission(429, "too many open connections from this client");
    case ConnectionTable::Verdict::RefuseGlobal: return s->refuse_admission(503, "too many open connections");
  }
}

HttpServer::HttpServer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Result<std::unique_ptr<HttpServer>> HttpServer::start(const HttpServerOptions& opts, HttpHandler handler) {
  if (opts.max_connections < 1) return invalid_argument("max_connections must be at least 1");
  if (opts.max_connections_per_client < 0) return invalid_argument("max_connections_per_client must be 0 (no limit) or more");
  auto impl = std::make_unique<Impl>(opts, std::move(handler));
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
  impl->work.emplace(impl->ioc.get_executor());
  Impl* p = impl.get();
  net::post(impl->acceptor.get_executor(), [p] { p->do_accept(); });
  for (int i = 0; i < std::max(1, opts.io_threads); ++i) impl->io_threads.emplace_back([p] { p->run_io(); });
  return std::unique_ptr<HttpServer>(new HttpServer(std::move(impl)));
}

HttpServer::~HttpServer() { stop(); }
uint16_t HttpServer::port() const { return impl_->port; }
int HttpServer::open_connections() const { return impl_->table.open(); }

void HttpServer::stop(std::chrono::milliseconds grace) {
  Impl& m = *impl_;
  if (m.stopping.exchange(true)) return;
  net::post(m.acceptor.get_executor(), [&m] {
    beast::error_code ec;
    m.acceptor.close(ec);
    m.accept_retry.cancel();
  });
  // Idle connections close at once; busy ones finish the response in hand (keep-alive is off now).
  for (auto& c : m.table.all()) std::static_pointer_cast<Session>(c)->stop_idle();
  if (!m.table.wait_empty(std::chrono::steady_clock::now() + grace))
    for (auto& c : m.table.all()) std::static_pointer_cast<Session>(c)->force_close();
  m.handlers.stop();  // what is queued runs to the end; generator steps end quickly once their sockets are shut
  m.table.wait_empty(std::chrono::steady_clock::now() + std::chrono::seconds(2));
  m.work.reset();
  m.ioc.stop();
  for (auto& t : m.io_threads) t.join();
  m.io_threads.clear();
}

}  // namespace k3::router
