// One timed /v1/completions request for `k3-bench serve`: sends a prompt of token ids with max_tokens +
// ignore_eos (so the output length is exact) and return_token_ids (so tokens are counted by id, not by
// text pieces), and records when each token-carrying SSE chunk arrived.
#pragma once
#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

namespace k3::bench {

struct CompletionRequestSpec {
  int port = 0;  // on 127.0.0.1
  std::string model;
  std::vector<int32_t> prompt_ids;
  int max_tokens = 1;
  bool stream = true;
  std::string api_key;              // sent as 'Authorization: Bearer <key>' when not empty
  int disconnect_after_tokens = -1; // streaming: >= 0 closes the connection once this many tokens arrived
};

struct CompletionTiming {
  bool ok = false;
  std::string error;     // why it failed (HTTP status + body, an error event, a timeout, a short output)
  int output_tokens = 0;  // generated ids received
  double ttft_s = 0;      // request sent → first token-carrying chunk (streaming only)
  double e2e_s = 0;       // request sent → response complete
  std::vector<double> itl_s;  // gaps between consecutive token-carrying chunks (streaming only)
  bool disconnected = false;  // closed by us as asked (disconnect_after_tokens); counts as ok
  bool timed_out = false;     // the deadline passed with the response unfinished (a hung request)
};

// Runs one request, giving up at `deadline`. Never throws: every failure lands in .error.
CompletionTiming run_completion(const CompletionRequestSpec& spec, std::chrono::steady_clock::time_point deadline);

}  // namespace k3::bench
