// The authenticated control plane of a real k3-cluster (router + prefill + decode processes, keys
// written by the launcher): local processes that connect to the router's control endpoint under the
// prefill stage's name - with an unknown key, with no key at all, and with another node's valid key -
// are refused and counted in /metrics, receive no PREFILL (no prompt byte), and the real stage keeps
// serving. Then the bind check: every TCP socket the nodes listen on is on 127.0.0.1 (the configured
// interface), and the data-plane/control ports do not answer on the host's other addresses.
#include <catch2/catch.hpp>

#include <arpa/inet.h>
#include <dirent.h>
#include <ifaddrs.h>
#include <netinet/in.h>
#include <nlohmann/json.hpp>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <fstream>
#include <set>
#include <sstream>

#include "common/protocol/frame.h"
#include "tests/cluster_e2e/cluster_launch.h"
#include "tests/router/http_client.h"
#include "tests/router/router_fixture.h"
#include "tests/support/scratch_dir.h"
#include "transfer/control_keys.h"
#include "transfer/zmq_channel.h"

using namespace std::chrono_literals;
using nlohmann::json;
using k3::test::HttpConnection;
namespace transfer = k3::transfer;

namespace {

long metric(const std::string& body, const std::string& series) {
  const auto at = body.find(series + " ");
  return at == std::string::npos ? -1 : std::atol(body.c_str() + at + series.size() + 1);
}
std::string rejected(const std::string& kind) {
  return "k3_cluster_control_rejected_total{kind=\"" + kind + "\",message=\"\"}";
}

// TCP sockets in LISTEN state owned by `pid`: (address, port) pairs, IPv4 only (/proc/<pid>/net/tcp).
std::set<std::pair<std::string, int>> listening(pid_t pid) {
  std::set<std::string> inodes;
  const std::string fd_dir = "/proc/" + std::to_string(pid) + "/fd";
  if (DIR* d = ::opendir(fd_dir.c_str())) {
    while (dirent* e = ::readdir(d)) {
      char target[256];
      const ssize_t n = ::readlink((fd_dir + "/" + e->d_name).c_str(), target, sizeof target - 1);
      if (n <= 0) continue;
      target[n] = 0;
      std::string t(target);
      if (t.rfind("socket:[", 0) == 0) inodes.insert(t.substr(8, t.size() - 9));
    }
    ::closedir(d);
  }
  std::set<std::pair<std::string, int>> out;
  std::ifstream f("/proc/" + std::to_string(pid) + "/net/tcp");
  std::string line;
  std::getline(f, line);  // header
  while (std::getline(f, line)) {
    std::istringstream in(line);
    std::string slot, local, remote, state, queues, timer, retr, uid, timeout, inode;
    in >> slot >> local >> remote >> state >> queues >> timer >> retr >> uid >> timeout >> inode;
    if (state != "0A" || !inodes.count(inode)) continue;
    in_addr a{};
    a.s_addr = static_cast<in_addr_t>(std::stoul(local.substr(0, 8), nullptr, 16));
    out.insert({inet_ntoa(a), std::stoi(local.substr(9), nullptr, 16)});
  }
  return out;
}

// The host's IPv4 addresses other than loopback.
std::vector<std::string> other_addresses() {
  std::vector<std::string> out;
  ifaddrs* all = nullptr;
  if (getifaddrs(&all) != 0) return out;
  for (ifaddrs* i = all; i; i = i->ifa_next)
    if (i->ifa_addr && i->ifa_addr->sa_family == AF_INET) {
      const auto* a = reinterpret_cast<const sockaddr_in*>(i->ifa_addr);
      if ((ntohl(a->sin_addr.s_addr) >> 24) != 127) out.push_back(inet_ntoa(a->sin_addr));
    }
  freeifaddrs(all);
  return out;
}

bool tcp_connects(const std::string& addr, int port) {
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in sa{};
  sa.sin_family = AF_INET;
  sa.sin_port = htons(static_cast<uint16_t>(port));
  inet_pton(AF_INET, addr.c_str(), &sa.sin_addr);
  const bool ok = ::connect(fd, reinterpret_cast<sockaddr*>(&sa), sizeof sa) == 0;
  ::close(fd);
  return ok;
}

}  // namespace

TEST_CASE("k3-cluster: control-plane impostors get no prompt and change nothing; nodes listen on loopback only",
          "[cluster_e2e][auth]") {
  k3::test::TempDir dir;
  k3::testing::ScratchDir run("cluster_run");
  const std::string model = dir.path + "/model";
  std::filesystem::create_directories(model);
  k3::test::write_tiny_model(model, 256);
  const json spec = {{"model", model},
                     {"router", {{"host", "127.0.0.1"}, {"port", 0}, {"served_model_name", "k3-tiny"}}},
                     {"prefill", json::array({{{"id", "p"}, {"stages", 1}, {"chunk_size", 8}}})},
                     {"decode", json::array({{{"id", "d"}, {"ranks", 1}}})},
                     {"threads", 1},
                     {"timeouts", {{"heartbeat_ms", 200}, {"heartbeat_misses", 10}, {"startup_s", 240}}}};
  std::ofstream(dir.path + "/spec.json") << spec.dump(2);
  k3::test::LaunchedCluster cluster =
      k3::test::launch_cluster(dir.path + "/spec.json", std::chrono::seconds(300), {"--run-dir", run.str()});
  REQUIRE_FALSE(cluster.control.empty());
  const std::string keys_dir = run.str() + "/keys";
  auto metrics = [&] {
    HttpConnection m(cluster.port);
    m.send_request("GET", "/metrics");
    return m.read_reply().body;
  };

  // Three impostors under the stage's name "prefill/p/0".
  zmq::context_t ctx;
  auto impostor = [&](std::optional<transfer::ControlKeys> keys) {
    transfer::ControlOptions o;
    o.name = "prefill/p/0";
    o.heartbeat = {200ms, 10};
    o.keys = std::move(keys);
    o.server_name = "router";
    return transfer::ControlClient::connect(ctx, cluster.control, o).value();
  };
  auto cluster_keys = [&](const std::string& keypair) {
    return transfer::ControlKeys::load(keys_dir + "/" + keypair, keys_dir + "/public_keys").value();
  };
  transfer::ControlKeys unknown = cluster_keys("prefill_p_0.key");
  unknown.self = transfer::generate_keypair("prefill/p/0").value();  // the right name, a key nobody listed
  transfer::ControlKeys borrowed = cluster_keys("decode_d.key");
  borrowed.self.name = "prefill/p/0";  // decode's valid key, claiming the stage's name
  std::vector<std::unique_ptr<transfer::ControlClient>> impostors;
  impostors.push_back(impostor(unknown));
  impostors.push_back(impostor(std::nullopt));
  impostors.push_back(impostor(borrowed));
  std::vector<transfer::ControlEvent> got;
  auto pump = [&](std::chrono::milliseconds wait) {
    std::vector<transfer::ControlSocket*> socks;
    for (auto& i : impostors) socks.push_back(i.get());
    auto ev = transfer::ControlSocket::poll_all(socks, wait);
    REQUIRE(ev.is_ok());
    for (auto& per : *ev)
      for (auto& e : per) got.push_back(std::move(e));
  };
  const auto deadline = std::chrono::steady_clock::now() + 30s;
  std::string body;
  for (;;) {
    pump(200ms);
    body = metrics();
    if (metric(body, rejected("unknown_key")) >= 1 && metric(body, rejected("handshake_failed")) >= 1 &&
        metric(body, rejected("name_mismatch")) >= 1)
      break;
    INFO(body);
    REQUIRE(std::chrono::steady_clock::now() < deadline);
  }

  // Requests go through while the impostors stay connected; the real stage computes them.
  for (int i = 0; i < 2; ++i) {
    HttpConnection c(cluster.port);
    c.send_request("POST", "/v1/completions",
                   json({{"model", "k3-tiny"}, {"prompt", {5, 17, 99, 3 + i}}, {"max_tokens", 4}, {"temperature", 0},
                         {"ignore_eos", true}, {"return_token_ids", true}})
                       .dump());
    const auto r = c.read_reply(120s);
    INFO(r.body);
    REQUIRE(r.status == 200);
    CHECK(json::parse(r.body).at("choices").at(0).at("token_ids").size() == 4);
  }
  for (int i = 0; i < 5; ++i) pump(100ms);
  for (const auto& e : got) {
    INFO("an impostor got event kind " << int(e.kind) << " from " << e.peer);
    CHECK(e.kind != transfer::ControlEventKind::Message);  // no PREFILL, no CLAIM, no ABORT, nothing
  }
  for (auto& i : impostors) CHECK_FALSE(i->server_alive());
  body = metrics();
  INFO(body);
  CHECK(metric(body, "k3_cluster_node_up{node=\"prefill/p/0\"}") == 1);
  CHECK(metric(body, "k3_cluster_node_failures_total{node=\"prefill/p/0\"}") == 0);
  CHECK(metric(body, "k3_cluster_node_failures_total{node=\"decode/d\"}") == 0);

  // Bind check: the nodes and the router listen on the configured loopback interface only.
  const auto others = other_addresses();
  for (const auto& [name, pid] : cluster.pids) {
    const auto socks = listening(pid);
    if (name != "router") CHECK_FALSE(socks.empty());  // decode: control + UCX tcp; prefill: UCX tcp
    for (const auto& [addr, port] : socks) {
      INFO(name << " listens on " << addr << ":" << port);
      CHECK(addr == "127.0.0.1");
      CHECK(tcp_connects("127.0.0.1", port));
      for (const auto& other : others) {
        INFO("reachable on " << other << "?");
        CHECK_FALSE(tcp_connects(other, port));
      }
    }
  }
  ::kill(cluster.proc->pid(), SIGTERM);
  CHECK(cluster.proc->wait_exit(20s) == 0);
}
