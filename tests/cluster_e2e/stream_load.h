// Streamed completions against a k3-cluster for the admission and overload tests: one request with its
// outcome classified (finished with [DONE], ended by an error event, refused with a status, or hung: no
// end within the client's deadline), the router's /metrics read as numbers, and a spec writer for a
// default-shaped cluster (router, prefill PP2, decode DP1 on a generated k3-tiny).
#pragma once
#include <nlohmann/json.hpp>

#include <chrono>
#include <fstream>
#include <map>
#include <string>
#include <vector>

#include "tests/router/http_client.h"

namespace k3::test {

struct StreamOutcome {
  enum class Kind { Done, ErrorEvent, Refused, Hung } kind = Kind::Hung;
  int status = 0;
  std::string error;            // the error event's or refusal's body
  size_t tokens = 0;            // token ids received
  std::vector<int32_t> ids;     // ... and which
  std::chrono::duration<double> seconds{0};
};

inline const char* outcome_name(StreamOutcome::Kind k) {
  switch (k) {
    case StreamOutcome::Kind::Done: return "done";
    case StreamOutcome::Kind::ErrorEvent: return "error_event";
    case StreamOutcome::Kind::Refused: return "refused";
    case StreamOutcome::Kind::Hung: return "hung";
  }
  return "?";
}

// POSTs a streamed /v1/completions of `prompt` (token ids, greedy, EOS ignored) and reads the whole
// stream; a stream that has not ended after `deadline` counts as hung.
inline StreamOutcome stream_completion(int port, const std::vector<int32_t>& prompt, int max_tokens,
                                       std::chrono::milliseconds deadline) {
  const nlohmann::json body = {{"model", "k3-tiny"}, {"prompt", prompt}, {"max_tokens", max_tokens},
                               {"temperature", 0}, {"ignore_eos", true}, {"return_token_ids", true},
                               {"stream", true}};
  StreamOutcome out;
  const auto t0 = std::chrono::steady_clock::now();
  try {
    HttpConnection c(port);
    c.send_request("POST", "/v1/completions", body.dump());
    const HttpReply r = c.read_reply(deadline);
    out.status = r.status;
    if (r.status != 200) {
      out.kind = StreamOutcome::Kind::Refused;
      out.error = r.body;
    } else if (r.body.find("\"error\"") != std::string::npos) {
      out.kind = StreamOutcome::Kind::ErrorEvent;
      out.error = r.body.substr(r.body.find("\"error\""), 400);
    } else if (r.body.find("data: [DONE]") != std::string::npos) {
      out.kind = StreamOutcome::Kind::Done;
    }
    for (size_t at = r.body.find("\"token_ids\":["); at != std::string::npos; at = r.body.find("\"token_ids\":[", at + 1)) {
      const size_t end = r.body.find(']', at);
      for (const auto& id : nlohmann::json::parse(r.body.substr(at + 12, end - at - 11))) out.ids.push_back(id.get<int32_t>());
    }
    out.tokens = out.ids.size();
  } catch (const std::exception& e) {
    out.kind = StreamOutcome::Kind::Hung;  // read timeout (or the connection dropped without an end)
    out.error = e.what();
  }
  out.seconds = std::chrono::steady_clock::now() - t0;
  return out;
}

// The router's /metrics as "series -> value" (series with their labels, exactly as printed).
inline std::map<std::string, double> read_metrics(int port) {
  HttpConnection m(port);
  m.send_request("GET", "/metrics");
  const std::string body = m.read_reply(std::chrono::seconds(30)).body;
  std::map<std::string, double> out;
  size_t at = 0;
  while (at < body.size()) {
    size_t eol = body.find('\n', at);
    if (eol == std::string::npos) eol = body.size();
    const std::string line = body.substr(at, eol - at);
    at = eol + 1;
    if (line.empty() || line[0] == '#') continue;
    const size_t sp = line.rfind(' ');
    if (sp == std::string::npos) continue;
    out[line.substr(0, sp)] = std::atof(line.c_str() + sp + 1);
  }
  return out;
}
inline double metric_or(const std::map<std::string, double>& m, const std::string& series, double dflt = 0) {
  auto it = m.find(series);
  return it == m.end() ? dflt : it->second;
}
// Sum of every series of a metric family whose name and labels start with `prefix`.
inline double metric_sum(const std::map<std::string, double>& m, const std::string& prefix) {
  double s = 0;
  for (const auto& [k, v] : m)
    if (k.rfind(prefix, 0) == 0) s += v;
  return s;
}

// A spec shaped like deploy/cluster-default.json (prefill PP2, decode DP1: 8 slots, a 4096-token pool)
// on a k3-tiny generated into `dir` on first use, on a free port.
inline std::string write_default_spec(const std::string& dir, int prefill_chunk = 64) {
  const nlohmann::json spec = {
      {"model", dir + "/model"},
      {"generate", {{"preset", "k3-tiny"}, {"seed", 0}}},
      {"router", {{"host", "127.0.0.1"}, {"port", 0}, {"served_model_name", "k3-tiny"}}},
      {"prefill", nlohmann::json::array({{{"id", "p"}, {"stages", 2}, {"chunk_size", prefill_chunk}, {"max_requests", 8}}})},
      {"decode", nlohmann::json::array({{{"id", "d"}, {"ranks", 1}, {"max_requests", 8}}})},
      {"threads", 1},
      {"timeouts", {{"heartbeat_ms", 200}, {"heartbeat_misses", 10}, {"startup_s", 240}}}};
  const std::string path = dir + "/spec.json";
  std::ofstream(path) << spec.dump(2);
  return path;
}

}  // namespace k3::test
