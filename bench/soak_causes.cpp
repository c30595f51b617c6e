#include "bench/soak_causes.h"

#include <utility>

namespace k3::bench {

std::string error_cause(const std::string& e) {
  std::string kind = "other";
  if (e.rfind("HTTP ", 0) == 0) kind = "http_" + e.substr(5, e.find(':') == std::string::npos ? 3 : e.find(':') - 5);
  else if (e.rfind("error event", 0) == 0) kind = "stream_error";
  else if (e.rfind("connection closed", 0) == 0) kind = "connection_closed";
  else if (e.rfind("stream ended without", 0) == 0) kind = "no_done";
  else if (e.rfind("got ", 0) == 0) kind = "short_output";
  else if (e.rfind("connect failed", 0) == 0) kind = "connect_failed";
  // The router's messages quote the protocol's abort reason, e.g. "... failed the request (alloc_failed): ...".
  static const std::pair<const char*, const char*> kReasons[] = {
      {"alloc_failed", "alloc_failed"}, {"peer_dead", "peer_dead"},         {"transfer_failed", "transfer_failed"},
      {"plan_failed", "plan_failed"},   {"(rejected)", "rejected"},         {"refused the request", "rejected"},
      {"(deadline)", "deadline"},       {"(shutdown)", "shutdown"},         {"(internal)", "internal"},
      {"is down", "node_down"},         {"no prefill/decode pair", "no_pair"}, {"acknowledge the CLAIM", "claim_timeout"},
      {"queue_full", "queue_full"},     {"aborted the request", "decode_aborted"}};
  for (const auto& [needle, reason] : kReasons)
    if (e.find(needle) != std::string::npos) return kind + ":" + reason;
  return kind;
}

bool is_overload_cause(const std::string& cause) { return cause.rfind("http_429", 0) == 0; }

bool is_node_death_cause(const std::string& cause) {
  if (cause.find("alloc_failed") != std::string::npos || cause.find("internal") != std::string::npos) return false;
  if (cause.rfind("http_503", 0) == 0) return true;
  for (const char* c : {"stream_error:peer_dead", "stream_error:node_down", "stream_error:transfer_failed",
                        "stream_error:no_pair", "stream_error:claim_timeout"})
    if (cause == c) return true;
  return false;
}

}  // namespace k3::bench
