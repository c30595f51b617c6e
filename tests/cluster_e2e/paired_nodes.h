// The nodes of a one-stage cluster started as separate processes, without k3-cluster: a cluster-mode
// k3-router pairing prefill instance "p" (one stage) with decode instance "d", one k3-decode rank 0 and
// one k3-prefill stage, each with its control-plane keys. Tests that need a node's own flags (heartbeat
// timing, cache sizes, a rank group) or its log lines start the nodes this way rather than from a spec.
// Every node started here is stopped when the PairedNodes goes away, the last started first, as a
// test's own guards declared in start order would be.
#pragma once
#include <catch2/catch.hpp>

#include <chrono>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "tests/cluster_e2e/cluster_launch.h"
#include "tests/router/http_client.h"
#include "tests/support/control_keys.h"
#include "tests/transfer/process_guard.h"

namespace k3::test {

class PairedNodes {
 public:
  // node_flags go on the router's, decode's and prefill's command lines (e.g. the heartbeat period and
  // misses), ahead of each start call's own flags.
  PairedNodes(std::string model_dir, std::vector<std::string> node_flags)
      : model_(std::move(model_dir)), node_flags_(std::move(node_flags)) {}
  ~PairedNodes() {
    while (!nodes_.empty()) nodes_.pop_back();
  }
  PairedNodes(const PairedNodes&) = delete;
  PairedNodes& operator=(const PairedNodes&) = delete;

  // build/bin/`tool` with `args` and the control-plane keys of `node` ("router", "decode/d",
  // "prefill/p/0"); none of the node flags (for a process such as a rank group's member).
  ProcessGuard& start(const std::string& tool, std::vector<std::string> args, const std::string& node) {
    for (auto& f : keys_.flags(node)) args.push_back(std::move(f));
    nodes_.push_back(std::make_unique<ProcessGuard>(std::string(K3_BIN_DIR) + "/" + tool, args));
    return *nodes_.back();
  }

  // k3-router in cluster mode, HTTP on a free port, serving the model as "k3-tiny"; returns once it
  // printed its control endpoint and its HTTP port.
  ProcessGuard& start_router(const std::vector<std::string>& extra = {}) {
    ProcessGuard& router = start("k3-router",
                                 with_flags({"--model", model_, "--port", "0", "--served-model-name", "k3-tiny",
                                             "--cluster-endpoint", "tcp://127.0.0.1:*", "--pair", "p:1:d:0"},
                                            extra),
                                 "router");
    control_ = wait_line(router, "CLUSTER ");
    const std::string listening = wait_line(router, "listening on http://");
    port_ = std::stoi(listening.substr(listening.rfind(':') + 1));
    return router;
  }

  // k3-decode rank 0 of instance "d" on the router's control endpoint, one compute thread (the nodes share
  // the test machine's cores). It does not wait: the caller reads the READY line (a rank group's leader
  // prints GROUP first, and READY only once its members joined).
  ProcessGuard& start_decode(const std::vector<std::string>& extra = {}) {
    return start("k3-decode",
                 with_flags({"--model", model_, "--router-endpoint", control_, "--instance", "d", "--rank", "0",
                             "--threads", "1"},
                            extra),
                 "decode/d");
  }

  // k3-prefill stage 0 of 1 of instance "p", one compute thread, sending to decode "d" at
  // `decode_endpoint` (its READY line).
  ProcessGuard& start_prefill(const std::string& decode_endpoint, const std::vector<std::string>& extra = {}) {
    return start("k3-prefill",
                 with_flags({"--model", model_, "--stage", "0", "--stages", "1", "--instance", "p",
                             "--decode-instance", "d", "--decode-endpoint", decode_endpoint,
                             "--router-endpoint", control_, "--threads", "1"},
                            extra),
                 "prefill/p/0");
  }

  // Returns once the router answers /health with 200: every node registered, decode told its capacity.
  void wait_healthy(std::chrono::seconds within = std::chrono::seconds(60)) const {
    for (auto t0 = std::chrono::steady_clock::now();; std::this_thread::sleep_for(std::chrono::milliseconds(100))) {
      REQUIRE(std::chrono::steady_clock::now() - t0 < within);
      HttpConnection h(port_);
      h.send_request("GET", "/health");
      if (h.read_reply(std::chrono::seconds(10)).status == 200) return;
    }
  }

  int port() const { return port_; }                         // the router's HTTP port
  const std::string& control() const { return control_; }    // the router's control endpoint

 private:
  std::vector<std::string> with_flags(std::vector<std::string> args, const std::vector<std::string>& extra) const {
    args.insert(args.end(), node_flags_.begin(), node_flags_.end());
    args.insert(args.end(), extra.begin(), extra.end());
    return args;
  }

  std::string model_;
  std::vector<std::string> node_flags_;
  TestControlKeys keys_{{"router", "decode/d", "prefill/p/0"}};
  std::vector<std::unique_ptr<ProcessGuard>> nodes_;  // in start order
  std::string control_;
  int port_ = 0;
};

}  // namespace k3::test
