// Helper process for the control-plane tests: a ControlServer or ControlClient that echoes every
// DATA payload back to its sender. Prints "READY <endpoint> <incarnation-hex>" once up and
// "DOWN <peer> <reason>" whenever it declares a peer dead.
//   k3-test-peer-control server <endpoint> <name> <interval_ms> <misses>
//   k3-test-peer-control client <endpoint> <name> <interval_ms> <misses>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "transfer/zmq_channel.h"

using namespace k3::transfer;

int main(int argc, char** argv) {
  if (argc != 6) {
    std::fprintf(stderr, "usage: %s server|client <endpoint> <name> <interval_ms> <misses>\n", argv[0]);
    return 2;
  }
  const std::string mode = argv[1];
  ControlOptions opt;
  opt.name = argv[3];
  opt.heartbeat.interval = std::chrono::milliseconds(std::atoi(argv[4]));
  opt.heartbeat.misses = std::atoi(argv[5]);
  zmq::context_t ctx;
  std::unique_ptr<ControlServer> server;
  std::unique_ptr<ControlClient> client;
  ControlSocket* sock = nullptr;
  std::string endpoint = argv[2];
  if (mode == "server") {
    auto s = ControlServer::bind(ctx, endpoint, opt);
    if (!s.is_ok()) {
      std::fprintf(stderr, "%s\n", s.status().to_string().c_str());
      return 1;
    }
    server = std::move(s).value();
    endpoint = server->endpoint();
    sock = server.get();
  } else {
    auto c = ControlClient::connect(ctx, endpoint, opt);
    if (!c.is_ok()) {
      std::fprintf(stderr, "%s\n", c.status().to_string().c_str());
      return 1;
    }
    client = std::move(c).value();
    sock = client.get();
  }
  std::printf("READY %s %016llx\n", endpoint.c_str(), static_cast<unsigned long long>(sock->incarnation()));
  std::fflush(stdout);
  for (;;) {
    auto events = sock->poll(std::chrono::milliseconds(1000));
    if (!events.is_ok()) return 1;
    for (auto& e : *events) {
      if (e.kind == ControlEventKind::PeerDown) {
        std::printf("DOWN %s %s\n", e.peer.c_str(), peer_down_reason_name(e.reason));
        std::fflush(stdout);
      }
      if (e.kind != ControlEventKind::Message) continue;
      if (e.payload.size() == 4 && std::string(e.payload.begin(), e.payload.end()) == "QUIT") return 0;
      k3::Status s = server ? server->send(e.peer, e.payload) : client->send(e.payload);
      if (!s.is_ok()) std::fprintf(stderr, "echo: %s\n", s.to_string().c_str());
    }
  }
}
