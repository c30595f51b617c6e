#include "bench/completion_client.h"

#include <nlohmann/json.hpp>

#include <exception>
#include <stdexcept>

#include "tests/router/http_client.h"

namespace k3::bench {
namespace {

using Clock = std::chrono::steady_clock;
using json = nlohmann::json;

// The deadline passed with the response unfinished.
struct TimedOut : std::runtime_error {
  using std::runtime_error::runtime_error;
};

double seconds_between(Clock::time_point a, Clock::time_point b) { return std::chrono::duration<double>(b - a).count(); }

std::chrono::milliseconds left_until(Clock::time_point deadline) {
  return std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
}

std::string request_body(const CompletionRequestSpec& spec) {
  json j = {{"model", spec.model},          {"prompt", spec.prompt_ids}, {"max_tokens", spec.max_tokens},
            {"ignore_eos", true},           {"temperature", 0},         {"return_token_ids", true},
            {"stream", spec.stream}};
  if (spec.stream) j["stream_options"] = {{"include_usage", true}};
  return j.dump();
}

// Incremental reader of a streamed HTTP response: status line + headers, then a chunked (or plain)
// body handed out as it arrives, so token arrival times are taken when the bytes land.
class StreamedBody {
 public:
  // Feeds raw bytes; returns the body bytes that became complete.
  std::string feed(const std::string& bytes) {
    raw_ += bytes;
    if (!head_done_) {
      const size_t end = raw_.find("\r\n\r\n");
      if (end == std::string::npos) return "";
      const std::string head = raw_.substr(0, end + 2);
      raw_.erase(0, end + 4);
      head_done_ = true;
      const size_t sp = head.find(' ');
      status_ = sp == std::string::npos ? 0 : std::atoi(head.c_str() + sp + 1);
      std::string lower = head;
      for (char& c : lower) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
      chunked_ = lower.find("transfer-encoding: chunked") != std::string::npos;
      const size_t cl = lower.find("content-length:");
      if (cl != std::string::npos) content_length_ = std::atol(lower.c_str() + cl + 15);
    }
    if (!chunked_) {
      delivered_ += static_cast<long>(raw_.size());
      if (content_length_ >= 0 && delivered_ >= content_length_) finished_ = true;
      return std::exchange(raw_, std::string());
    }
    std::string out;
    for (;;) {
      const size_t eol = raw_.find("\r\n");
      if (eol == std::string::npos) break;
      const size_t n = std::stoul(raw_.substr(0, eol), nullptr, 16);
      if (n == 0) {
        finished_ = true;
        break;
      }
      if (raw_.size() < eol + 2 + n + 2) break;
      out += raw_.substr(eol + 2, n);
      raw_.erase(0, eol + 2 + n + 2);
    }
    return out;
  }
  bool head_done() const { return head_done_; }
  int status() const { return status_; }
  bool finished() const { return finished_; }

 private:
  std::string raw_;
  bool head_done_ = false, chunked_ = false, finished_ = false;
  int status_ = 0;
  long content_length_ = -1, delivered_ = 0;  // for a plain (non-chunked) body, e.g. an error reply
};

void run_streaming(test::HttpConnection& conn, Clock::time_point sent, Clock::time_point deadline, int disconnect_after,
                   CompletionTiming& t) {
  StreamedBody body;
  std::string events;  // SSE text not yet split into events
  Clock::time_point last{};
  bool done = false;
  std::string error_body;
  while (!done) {
    if (disconnect_after >= 0 && t.output_tokens >= disconnect_after) {
      conn.close();  // the client goes away mid-stream; the router must cancel the request
      t.disconnected = true;
      return;
    }
    const auto left = left_until(deadline);
    if (left.count() <= 0) throw TimedOut("timed out after " + std::to_string(t.output_tokens) + " tokens");
    const std::string bytes = conn.read_some(left);
    if (bytes.empty()) {
      if (left_until(deadline).count() <= 0) continue;  // the timeout above reports it
      throw std::runtime_error("connection closed after " + std::to_string(t.output_tokens) + " tokens");
    }
    const auto now = Clock::now();
    events += body.feed(bytes);
    if (body.head_done() && body.status() != 200) {
      error_body += events;
      events.clear();
      if (body.finished() || error_body.size() > 4096) throw std::runtime_error("HTTP " + std::to_string(body.status()) + ": " + error_body);
      continue;
    }
    size_t end;
    while ((end = events.find("\n\n")) != std::string::npos) {
      const std::string ev = events.substr(0, end);
      events.erase(0, end + 2);
      if (ev.rfind("data: ", 0) != 0) continue;  // comments / keep-alives
      const std::string data = ev.substr(6);
      if (data == "[DONE]") {
        done = true;
        break;
      }
      const json j = json::parse(data);
      if (j.contains("error")) throw std::runtime_error("error event: " + j["error"].dump());
      if (!j.contains("choices") || j["choices"].empty()) continue;  // the usage chunk
      const auto& ids = j["choices"][0].value("token_ids", json::array());
      if (ids.empty()) continue;
      if (t.output_tokens == 0) t.ttft_s = seconds_between(sent, now);
      else t.itl_s.push_back(seconds_between(last, now));
      last = now;
      t.output_tokens += static_cast<int>(ids.size());
    }
    if (body.finished() && !done) throw std::runtime_error("stream ended without [DONE]");
  }
}

void run_whole(test::HttpConnection& conn, Clock::time_point deadline, CompletionTiming& t) {
  const auto left = left_until(deadline);
  if (left.count() <= 0) throw TimedOut("timed out before the reply");
  const test::HttpReply r = conn.read_reply(left);
  if (r.status != 200) throw std::runtime_error("HTTP " + std::to_string(r.status) + ": " + r.body.substr(0, 4096));
  const json j = json::parse(r.body);
  t.output_tokens = static_cast<int>(j.at("choices").at(0).at("token_ids").size());
}

}  // namespace

CompletionTiming run_completion(const CompletionRequestSpec& spec, Clock::time_point deadline) {
  CompletionTiming t;
  try {
    test::HttpConnection conn(spec.port);
    const auto sent = Clock::now();
    conn.send_request("POST", "/v1/completions", request_body(spec),
                      spec.api_key.empty() ? "" : "Authorization: Bearer " + spec.api_key + "\r\n");
    if (spec.stream) run_streaming(conn, sent, deadline, spec.disconnect_after_tokens, t);
    else run_whole(conn, deadline, t);
    t.e2e_s = seconds_between(sent, Clock::now());
    if (t.disconnected) {
      t.ok = true;
      return t;
    }
    if (t.output_tokens != spec.max_tokens)
      throw std::runtime_error("got " + std::to_string(t.output_tokens) + " tokens, asked for exactly " + std::to_string(spec.max_tokens));
    t.ok = true;
  } catch (const TimedOut& e) {
    t.ok = false;
    t.timed_out = true;
    t.error = e.what();
  } catch (const std::exception& e) {
    t.ok = false;
    t.error = e.what();
  }
  return t;
}

}  // namespace k3::bench
