// Starts k3-cluster on a spec file and waits for its ENDPOINT line, collecting the children's pids from
// its STARTED lines (k3-cluster's status port from its STATUS line, the router's control endpoint from its
// CONTROL line). The ProcessGuard stops the launcher (and with it every child) when it goes away.
#pragma once
#include <catch2/catch.hpp>

#include <chrono>
#include <cstdint>
#include <fstream>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "tests/transfer/process_guard.h"

namespace k3::test {

// The rest of the line after `prefix`, from the first line `p` prints that starts with it; fails the test
// when `p` exits first or two minutes pass.
inline std::string wait_line(ProcessGuard& p, const std::string& prefix) {
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(120);
  for (;;) {
    REQUIRE(std::chrono::steady_clock::now() < until);
    auto line = p.read_line(std::chrono::milliseconds(500));
    if (!line) {
      REQUIRE(p.running());
      continue;
    }
    if (line->rfind(prefix, 0) == 0) return line->substr(prefix.size());
  }
}

// The vocabulary size of a model directory (its config.json), for drawing prompts the model accepts.
inline int model_vocab(const std::string& model_dir) {
  std::ifstream in(model_dir + "/config.json");
  return nlohmann::json::parse(in).at("vocab_size").get<int>();
}

// `len` token ids drawn uniformly from [0, vocab).
inline std::vector<int32_t> random_tokens(std::mt19937& rng, int vocab, int len) {
  std::vector<int32_t> v(len);
  for (auto& t : v) t = std::uniform_int_distribution<int32_t>(0, vocab - 1)(rng);
  return v;
}

struct LaunchedCluster {
  std::unique_ptr<ProcessGuard> proc;
  std::map<std::string, pid_t> pids;  // by node name ("router", "decode/d", "prefill/p/0", ...)
  int port = 0;
  int status_port = 0;  // k3-cluster's own GET /status, /metrics
  std::string control;                // the router's ZeroMQ control endpoint
};

// stderr_path: non-empty sends the stderr of k3-cluster and of every child (they share it) to that file.
inline LaunchedCluster launch_cluster(const std::string& spec_path,
                                      std::chrono::seconds startup = std::chrono::seconds(300),
                                      const std::vector<std::string>& extra_args = {},
                                      const std::string& stderr_path = "") {
  LaunchedCluster c;
  std::vector<std::string> args{"--spec", spec_path};
  args.insert(args.end(), extra_args.begin(), extra_args.end());
  const std::string exe = std::string(K3_BIN_DIR) + "/k3-cluster";
  if (stderr_path.empty()) {
    c.proc = std::make_unique<ProcessGuard>(exe, args);
  } else {
    // exec keeps the pid the guard kills; the path is a test's temp file (no quote in it).
    args.insert(args.begin(), {"-c", "exec \"$0\" \"$@\" 2>'" + stderr_path + "'", exe});
    c.proc = std::make_unique<ProcessGuard>("/bin/sh", args);
  }
  const auto deadline = std::chrono::steady_clock::now() + startup;
  while (c.port == 0) {
    REQUIRE(std::chrono::steady_clock::now() < deadline);
    auto line = c.proc->read_line(std::chrono::milliseconds(1000));
    if (!line) {
      REQUIRE(c.proc->running());
      continue;
    }
    if (line->rfind("STARTED ", 0) == 0) {
      const auto sp = line->find(' ', 8);
      c.pids[line->substr(8, sp - 8)] = std::stoi(line->substr(line->rfind(' ') + 1));
    }
    if (line->rfind("STATUS http://127.0.0.1:", 0) == 0) c.status_port = std::stoi(line->substr(24));
    if (line->rfind("CONTROL ", 0) == 0) c.control = line->substr(8);
    if (line->rfind("ENDPOINT http://127.0.0.1:", 0) == 0) c.port = std::stoi(line->substr(26));
  }
  return c;
}

}  // namespace k3::test
