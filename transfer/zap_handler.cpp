#include "transfer/zap_handler.h"

#include <spdlog/spdlog.h>
#include <zmq_addon.hpp>

#include <cstdio>

namespace k3::transfer {

namespace {
constexpr const char* kZapEndpoint = "inproc://zeromq.zap.01";
}

ZapHandler::ZapHandler(zmq::context_t& ctx, std::shared_ptr<const PublicKeys> allowed)
    : allowed_(std::move(allowed)), rep_(ctx, zmq::socket_type::rep), stop_rx_(ctx, zmq::socket_type::pair),
      stop_tx_(ctx, zmq::socket_type::pair) {}

Result<std::unique_ptr<ZapHandler>> ZapHandler::start(zmq::context_t& ctx, std::shared_ptr<const PublicKeys> allowed) {
  if (!allowed || allowed->by_name().empty()) return invalid_argument("ZAP handler: the allow-list is empty");
  std::unique_ptr<ZapHandler> h(new ZapHandler(ctx, std::move(allowed)));
  char stop_ep[64];
  std::snprintf(stop_ep, sizeof stop_ep, "inproc://k3-zap-stop-%p", static_cast<void*>(h.get()));
  try {
    h->rep_.set(zmq::sockopt::linger, 0);
    h->stop_rx_.set(zmq::sockopt::linger, 0);
    h->stop_tx_.set(zmq::sockopt::linger, 0);
    h->rep_.bind(kZapEndpoint);
    h->stop_rx_.bind(stop_ep);
    h->stop_tx_.connect(stop_ep);
  } catch (const zmq::error_t& e) {
    const bool taken = e.num() == EADDRINUSE;
    return Status(Code::Internal, std::string("ZAP handler: bind ") + kZapEndpoint + ": " + e.what() +
                                      (taken ? " (this ZeroMQ context already has a CURVE server; one per context)" : ""));
  }
  // The sockets are handed to the thread here (thread start is a full memory barrier) and used only
  // there until the destructor joins it.
  h->thread_ = std::thread([p = h.get()] { p->run(); });
  return h;
}

ZapHandler::~ZapHandler() {
  if (thread_.joinable()) {
    try {
      stop_tx_.send(zmq::str_buffer("stop"), zmq::send_flags::none);
    } catch (const zmq::error_t& e) {
      spdlog::error("ZAP handler: stop signal failed: {}", e.what());
    }
    thread_.join();
  }
}

void ZapHandler::run() {
  zmq::pollitem_t items[] = {{rep_.handle(), 0, ZMQ_POLLIN, 0}, {stop_rx_.handle(), 0, ZMQ_POLLIN, 0}};
  for (;;) {
    try {
      zmq::poll(items, 2, std::chrono::milliseconds(-1));
    } catch (const zmq::error_t& e) {
      if (e.num() == EINTR) continue;
      spdlog::error("ZAP handler: poll failed: {}", e.what());
      return;
    }
    if (items[1].revents & ZMQ_POLLIN) return;
    if (!(items[0].revents & ZMQ_POLLIN)) continue;
    std::vector<zmq::message_t> request;
    try {
      if (!zmq::recv_multipart(rep_, std::back_inserter(request), zmq::recv_flags::dontwait)) continue;
      answer(request);
    } catch (const zmq::error_t& e) {
      spdlog::error("ZAP handler: {}", e.what());
    }
  }
}

// Request: version, request id, domain, address, routing id, mechanism, credentials...
// Reply:   version, request id, status code, status text, user id, metadata.
void ZapHandler::answer(std::vector<zmq::message_t>& rq) {
  auto reply = [&](const std::string& code, const std::string& text, const std::string& user) {
    std::vector<zmq::message_t> out;
    out.emplace_back(std::string("1.0"));
    out.emplace_back(rq.size() > 1 ? rq[1].to_string() : std::string());
    out.emplace_back(code);
    out.emplace_back(text);
    out.emplace_back(user);
    out.emplace_back(std::string());
    zmq::send_multipart(rep_, out);
  };
  if (rq.size() < 6 || rq[0].to_string() != "1.0") return reply("500", "malformed ZAP request", "");
  const std::string address = rq[3].to_string(), mechanism = rq[5].to_string();
  if (mechanism != "CURVE" || rq.size() != 7 || rq[6].size() != kCurveKeyBytes) {
    ++refused_;
    spdlog::debug("control: refused a {} handshake from {}: only CURVE with a known key is accepted", mechanism, address);
    return reply("400", "CURVE required", "");
  }
  const std::string key = raw_to_z85(rq[6].to_string());
  if (auto name = allowed_->name_of(key)) return reply("200", "OK", *name);
  ++refused_;
  // Logged at warn once per key (a refused client retries every reconnect interval); the memory of
  // logged keys is bounded so that a flood of fresh keys cannot grow it.
  constexpr size_t kMaxWarned = 1024;
  if (warned_.size() < kMaxWarned && warned_.insert(key).second) spdlog::warn("control: refused a CURVE client with unknown key {} from {}", key, address);
  reply("400", "unknown key", "");
}

}  // namespace k3::transfer
