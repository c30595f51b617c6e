// One request id through every process of a real k3-cluster (router, prefill PP2, decode DP1, logging at
// info; --verbose relays every child's log lines, prefixed with its name, into one file): a client's X-Request-Id comes back in the response and names the request in the
// router's, both prefill stages' and the decode rank's log lines; a request without the header gets a
// generated id that is traced the same way; a malformed header is refused by name. With --log-dir every
// node also writes its own log file, and `k3-cluster logs --log-dir DIR ID` prints the request's whole
// path from them (router, both stages, decode) in time order.
#include <catch2/catch.hpp>

#include <nlohmann/json.hpp>

#include <algorithm>
#include <fstream>
#include <sstream>
#include <thread>

#include "tests/cluster_e2e/cluster_launch.h"
#include "tests/router/http_client.h"
#include "tests/support/run_command.h"

using namespace std::chrono_literals;
using nlohmann::json;
using k3::test::HttpConnection;

namespace {

std::vector<std::string> lines_with(const std::string& path, const std::string& needle) {
  std::ifstream f(path);
  std::vector<std::string> out;
  for (std::string line; std::getline(f, line);)
    if (line.find(needle) != std::string::npos) out.push_back(line);
  return out;
}

// The log lines of each process about `id`, waiting a moment for the last ones to be written.
std::map<std::string, int> trace(const std::string& log, const std::string& id) {
  std::map<std::string, int> by;
  for (int i = 0; i < 100; ++i) {
    by.clear();
    for (const std::string& l : lines_with(log, id)) {
      for (const char* who : {"router: request ", "prefill stage 0: request ", "prefill stage 1: request ", "decode rank 0: request "})
        if (l.find(std::string(who) + id) != std::string::npos) ++by[who];
    }
    if (by.size() == 4 && by["router: request "] >= 2 && by["decode rank 0: request "] >= 2) break;
    std::this_thread::sleep_for(100ms);
  }
  return by;
}

}  // namespace

TEST_CASE("k3-cluster: one request id through router, prefill and decode logs", "[cluster_e2e]") {
  k3::test::TempDir dir("trace");
  const json spec = {{"model", dir.path() + "/model"},
                     {"router", {{"host", "127.0.0.1"}, {"port", 0}, {"served_model_name", "k3-tiny"}}},
                     {"prefill", json::array({{{"id", "p"}, {"stages", 2}, {"chunk_size", 8}}})},
                     {"decode", json::array({{{"id", "d"}, {"ranks", 1}}})},
                     {"threads", 1}};
  std::ofstream(dir.path() + "/spec.json") << spec.dump(2);
  const std::string log = dir.path() + "/cluster.log", log_dir = dir.path() + "/logs";
  k3::test::LaunchedCluster cluster = k3::test::launch_cluster(
      dir.path() + "/spec.json", std::chrono::seconds(300), {"--log-level", "info", "--verbose", "--log-dir", log_dir}, log);

  const std::string body = R"({"model":"k3-tiny","messages":[{"role":"user","content":"trace me"}],"max_tokens":4})";
  // The client's own id, streamed.
  {
    HttpConnection c(cluster.port);
    const std::string sbody = body.substr(0, body.size() - 1) + R"(,"stream":true})";
    c.send_request("POST", "/v1/chat/completions", sbody, "X-Request-Id: client-7f3a.trace/42\r\n");
    auto r = c.read_reply(120000ms);
    INFO(r.body);
    REQUIRE(r.status == 200);
    CHECK(r.headers["x-request-id"] == "client-7f3a.trace/42");
    CHECK(r.body.find("data: [DONE]") != std::string::npos);
  }
  auto by = trace(log, "client-7f3a.trace/42");
  for (const std::string& l : lines_with(log, "client-7f3a.trace/42")) std::printf("%s\n", l.c_str());
  INFO("log:\n" << k3::test::run_command("cat " + log).out);
  CHECK(by["router: request "] >= 2);          // placed, finished
  CHECK(by["prefill stage 0: request "] >= 2);  // accepted, computed
  CHECK(by["prefill stage 1: request "] >= 2);
  CHECK(by["decode rank 0: request "] >= 2);    // decoding, finished

  // The same path from the nodes' own log files, through `k3-cluster logs`: every node, in time order.
  {
    const std::string cmd = std::string(K3_BIN_DIR) + "/k3-cluster logs --log-dir '" + log_dir + "' 'client-7f3a.trace/42'";
    const auto out = k3::test::run_command(cmd);
    INFO(cmd << "\n" << out.out);
    REQUIRE(out.exit_code == 0);
    std::istringstream in(out.out);
    std::vector<std::string> nodes, stamps;
    std::string line_buf;
    for (std::string line; std::getline(in, line);) {
      std::istringstream words(line);
      std::string node;
      words >> node;
      nodes.push_back(node);
      const auto at = line.find('[');
      stamps.push_back(at == std::string::npos ? "" : line.substr(at, 25));
    }
    for (const char* node : {"router", "prefill_p_0", "prefill_p_1", "decode_d"})
      CHECK(std::count(nodes.begin(), nodes.end(), node) >= 2);
    CHECK(std::is_sorted(stamps.begin(), stamps.end()));
    // The router placed it first, and finished it after every node's work on it (lines of one millisecond
    // may tie). The decode rank's own "finished" line may come a moment after the router's: it is written
    // once the last tokens have left, and the router may log them first.
    std::string placed, finished, last_work;
    for (std::istringstream again(out.out); std::getline(again, line_buf);) {
      const auto at = line_buf.find('[');
      if (at == std::string::npos) continue;
      const bool finish_line = line_buf.find(" finished") != std::string::npos;
      if (!finish_line) last_work = std::max(last_work, line_buf.substr(at, 25));
      if (line_buf.rfind("router", 0) != 0) continue;
      if (line_buf.find(" placed on ") != std::string::npos && placed.empty()) placed = line_buf.substr(at, 25);
      if (finish_line) finished = line_buf.substr(at, 25);
    }
    CHECK(placed == stamps.front());
    CHECK(!finished.empty());
    CHECK(finished >= last_work);
    // An id that only starts like it names nothing; a missing directory is an error naming the flag.
    CHECK(k3::test::run_command(std::string(K3_BIN_DIR) + "/k3-cluster logs --log-dir '" + log_dir + "' client-7f3a").exit_code != 0);
    const auto missing = k3::test::run_command(std::string(K3_BIN_DIR) + "/k3-cluster logs --log-dir /nonexistent/x y 2>&1");
    CHECK(missing.exit_code != 0);
    CHECK(missing.out.find("--log-dir") != std::string::npos);
  }

  // No header: the router makes one, returns it and traces it the same way.
  HttpConnection c(cluster.port);
  c.send_request("POST", "/v1/chat/completions", body);
  auto r = c.read_reply(120000ms);
  REQUIRE(r.status == 200);
  const std::string made = r.headers["x-request-id"];
  CHECK(made.rfind("req-", 0) == 0);
  CHECK(made.size() == 36);
  by = trace(log, made);
  CHECK(by.size() == 4);

  // A header that cannot go into a log line is refused by name, and the answer still carries an id.
  c.send_request("POST", "/v1/chat/completions", body, "X-Request-Id: " + std::string(200, 'a') + "\r\n");
  auto bad = c.read_reply(60000ms);
  CHECK(bad.status == 400);
  CHECK(json::parse(bad.body)["error"]["param"] == "X-Request-Id");
  CHECK(bad.headers["x-request-id"].rfind("req-", 0) == 0);
}
