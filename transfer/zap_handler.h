// The ZAP handler (ZeroMQ authentication protocol, RFC 27) of one ZeroMQ context: answers the CURVE
// handshakes of the context's server sockets. A client is accepted only when its public key is in the
// allow-list; the reply's user id is the name that key belongs to, so every message from that
// connection carries the name as its "User-Id" property (ControlSocket compares it with the name the
// envelope claims). Refusals are counted and logged with the key and the peer address.
//
// Owns its REP socket (bound at inproc://zeromq.zap.01, one per context) and a thread that answers
// requests; the destructor stops the thread through an inproc pair and closes both sockets. Must be
// destroyed before its context.
#pragma once
#include <atomic>
#include <cstdint>
#include <memory>
#include <set>
#include <string>
#include <thread>
#include <zmq.hpp>

#include "common/core/status.h"
#include "transfer/curve_keys.h"

namespace k3::transfer {

class ZapHandler {
 public:
  static Result<std::unique_ptr<ZapHandler>> start(zmq::context_t& ctx, std::shared_ptr<const PublicKeys> allowed);
  ~ZapHandler();
  ZapHandler(const ZapHandler&) = delete;
  ZapHandler& operator=(const ZapHandler&) = delete;

  // Handshakes refused because the client's key is not in the allow-list (or not CURVE at all).
  uint64_t refused() const { return refused_.load(); }

 private:
  ZapHandler(zmq::context_t& ctx, std::shared_ptr<const PublicKeys> allowed);
  void run();
  void answer(std::vector<zmq::message_t>& request);

  std::shared_ptr<const PublicKeys> allowed_;
  zmq::socket_t rep_;
  zmq::socket_t stop_rx_;
  zmq::socket_t stop_tx_;
  std::atomic<uint64_t> refused_{0};
  std::set<std::string> warned_;  // unknown keys already logged (handler thread only; at most 1024)
  std::thread thread_;
};

}  // namespace k3::transfer
