#include "router/api_handlers.h"

#include <atomic>
#include <ctime>
#include <random>

#include "router/api_error.h"
#include "router/json_body.h"
#include "router/request_id.h"
#include "router/openai_format.h"
#include "router/request_stream.h"
#include "router/tool_call_output.h"

namespace k3::router {
namespace {

using Clock = std::chrono::steady_clock;
using json = nlohmann::json;

double seconds_since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

std::string new_id(const char* prefix) {
  static std::atomic<uint64_t> counter{0};  // uniqueness only; not state anything depends on
  thread_local std::mt19937_64 rng{std::random_device{}()};
  char buf[64];
  std::snprintf(buf, sizeof buf, "%s-%016llx%04llx", prefix, static_cast<unsigned long long>(rng()),
                static_cast<unsigned long long>(counter.fetch_add(1) & 0xffff));
  return buf;
}

HttpResponse json_response(int status, const json& j) {
  HttpResponse r;
  r.status = status;
  r.body = dump_json(j);
  return r;
}

// Latency bookkeeping shared by the streamed and the non-streamed path.
struct Timing {
  Clock::time_point start = Clock::now(), last;
  bool any = false;
  void token(RouterMetrics& m) {
    const auto now = Clock::now();
    if (!any) m.ttft().observe(std::chrono::duration<double>(now - start).count());
    else m.itl().observe(std::chrono::duration<double>(now - last).count());
    any = true;
    last = now;
  }
};

// With tools, the event's token ids are taken apart again into content and tool calls (the event's
// text would show a call's name and arguments as content). Stops at a stop string in the content.
void split_tool_output(ToolCallOutput& out, const std::vector<int32_t>& ids, bool finished, ChoiceText& piece) {
  piece.text.clear();
  auto add = [&piece](ToolCallOutput::Piece&& p) {
    piece.text += p.content;
    for (ToolCallDelta& d : p.calls) {
      if (!piece.tool_call_deltas.empty() && piece.tool_call_deltas.back().index == d.index)
        piece.tool_call_deltas.back().arguments += d.arguments;
      else
        piece.tool_call_deltas.push_back(std::move(d));
    }
  };
  for (int32_t id : ids) {
    auto p = out.push(id);
    if (!p.is_ok()) throw api_error_from_status(p.status());
    add(std::move(p).value());
    if (out.stopped()) break;
  }
  if (finished || out.stopped()) add(out.finish());
}

// A generation that ended on a stop id after whole tool calls ends for the client with "tool_calls".
std::string tool_finish_reason(const ToolCallOutput& out, const std::string& reason) {
  return reason == "stop" && out.calls_finished() > 0 && !out.stopped() ? "tool_calls" : reason;
}

// One choice's output as its events arrive (the streamed and the collected path share it).
struct ChoiceState {
  std::unique_ptr<ToolCallOutput> tools;  // the output may hold tool calls
  int64_t text_offset = 0, tokens_seen = 0, completion_tokens = 0;
  bool ended = false;
  std::string reason;                     // set when it ended
};

// Takes one Tokens/Finished event of choice `c` apart into `piece`; true when it ends the choice (a
// Finished event, or with tools a stop string in the content: the rest of that choice is dropped).
// Throws ApiError when the tool-call output does not parse.
bool absorb(ChoiceState& c, GenerationEvent& ev, ChoiceText& piece) {
  piece = ChoiceText{.text = std::move(ev.text), .token_ids = std::move(ev.token_ids),
                     .logprobs = std::move(ev.logprobs), .text_offset = c.text_offset, .index = ev.choice};
  bool finished = ev.kind == GenerationEvent::Kind::Finished;
  c.tokens_seen += static_cast<int64_t>(piece.token_ids.size());
  std::string reason = ev.finish_reason;
  int64_t completion_tokens = ev.completion_tokens;
  if (c.tools) {
    split_tool_output(*c.tools, piece.token_ids, finished, piece);
    if (c.tools->stopped() && !finished) {
      finished = true;
      reason = "stop";
      completion_tokens = c.tokens_seen;
    }
  }
  c.text_offset += static_cast<int64_t>(piece.text.size());
  if (!finished) return false;
  c.ended = true;
  c.reason = c.tools ? tool_finish_reason(*c.tools, reason) : reason;
  c.completion_tokens = completion_tokens;
  return true;
}

// The state behind one SSE response; the generator lambda owns it.
struct StreamState {
  std::unique_ptr<RequestStream> stream;
  CompletionRequest rq;
  ResponseIds ids;
  RouterMetrics* metrics = nullptr;
  const Tokenizer* tok = nullptr;
  std::chrono::milliseconds keepalive{2000};
  Timing timing;
  int64_t prompt_tokens = 0;
  enum class Phase { Role, Tokens, Usage, Done, Over } phase = Phase::Tokens;
  int roles_sent = 0;                 // chat: one role chunk per choice
  std::vector<ChoiceState> choices;   // n
  int open = 0;                       // choices not ended
  int64_t completion_tokens = 0;      // all choices'
  std::string outcome;  // set when generation ended

  ~StreamState() {
    if (outcome.empty()) metrics->count_finish("cancelled");
  }

  bool next(std::string& chunk) {
    switch (phase) {
      case Phase::Role: {
        ChoiceText role{.index = roles_sent};
        if (++roles_sent == static_cast<int>(choices.size())) phase = Phase::Tokens;
        chunk = sse_data(chunk_object(rq, ids, role, "", /*role=*/true, *tok));
        return true;
      }
      case Phase::Tokens: return next_tokens(chunk);
      case Phase::Usage:
        phase = Phase::Done;
        chunk = sse_data(usage_chunk(rq, ids, prompt_tokens, completion_tokens));
        return true;
      case Phase::Done:
        phase = Phase::Over;
        chunk = kSseDone;
        return true;
      case Phase::Over: return false;
    }
    return false;
  }

  void error_chunk(const ApiError& e, std::string& chunk) {
    outcome = "error";
    metrics->count_finish(outcome);
    chunk = "data: " + error_body(e.status(), e.what(), e.type(), e.param(), e.code()) + "\n\n";
    phase = Phase::Done;
  }

  bool next_tokens(std::string& chunk) {
    for (;;) {
      auto ev = stream->next(keepalive);
      if (!ev) {
        chunk = ": keep-alive\n\n";  // an SSE comment; lets the server notice a client that left
        return true;
      }
      if (ev->kind == GenerationEvent::Kind::Failed) {
        error_chunk(api_error_from_status(ev->error), chunk);
        return true;
      }
      if (ev->choice < 0 || ev->choice >= static_cast<int>(choices.size())) {
        error_chunk(ApiError(500, "internal error: an event for choice " + std::to_string(ev->choice), "", "internal_error"), chunk);
        return true;
      }
      ChoiceState& c = choices[ev->choice];
      if (c.ended) continue;  // the rest of a choice a stop string in its content ended
      ChoiceText piece;
      bool finished;
      try {
        finished = absorb(c, *ev, piece);
      } catch (const ApiError& e) {
        error_chunk(e, chunk);
        return true;
      }
      if (finished) {
        metrics->count_finish(c.reason);
        completion_tokens += c.completion_tokens;
        if (--open == 0) {
          outcome = c.reason;
          stream.reset();  // over, or the generation a stop string ended is dropped here
          metrics->add_tokens(prompt_tokens, completion_tokens);
          metrics->e2e().observe(seconds_since(timing.start));
          phase = rq.include_usage ? Phase::Usage : Phase::Done;
        }
        chunk = sse_data(chunk_object(rq, ids, piece, c.reason, false, *tok));
        return true;
      }
      for (size_t i = 0; i < piece.token_ids.size(); ++i) timing.token(*metrics);
      // Text held back (stop-string prefix, partial UTF-8) yields no chunk unless ids/logprobs are asked for.
      if (piece.text.empty() && piece.tool_call_deltas.empty() && !(rq.return_token_ids || rq.logprobs >= 0)) continue;
      chunk = sse_data(chunk_object(rq, ids, piece, "", false, *tok));
      return true;
    }
  }
};

}  // namespace

ApiHandlers::ApiHandlers(GenerationService& service, std::shared_ptr<const Tokenizer> tokenizer, const ModelConfig& cfg,
                         ApiOptions opts)
    : service_(service), tokenizer_(std::move(tokenizer)), opts_(std::move(opts)) {
  limits_ = {.served_model = opts_.served_model, .context = cfg.max_position_embeddings, .vocab = cfg.vocab_size,
             .default_max_tokens = opts_.default_max_tokens};
  eos_ids_ = tokenizer_->eos_ids();
  for (int id : cfg.eos_token_ids)
    if (std::find(eos_ids_.begin(), eos_ids_.end(), id) == eos_ids_.end()) eos_ids_.push_back(id);
  created_ = static_cast<int64_t>(std::time(nullptr));
}

HttpResponse ApiHandlers::handle(const HttpRequest& rq) noexcept {
  std::string endpoint = "other";
  HttpResponse resp;
  std::string request_id;
  try {
    request_id = request_id_for(rq);
    resp = route(rq, endpoint, request_id);
  } catch (const ApiError& e) {
    resp = error_response(e);
  } catch (const std::exception& e) {
    resp = error_response(ApiError(500, std::string("internal error: ") + e.what(), "", "internal_error"));
  } catch (...) {
    resp = error_response(ApiError(500, "internal error", "", "internal_error"));
  }
  try {
    resp.headers.emplace_back("X-Request-Id", request_id.empty() ? new_request_id() : request_id);
    metrics_.count_request(endpoint, resp.status);
  } catch (...) {
  }
  return resp;
}

bool ApiHandlers::authorized(const HttpRequest& rq) const {
  if (opts_.api_key.empty()) return true;
  const std::string want = "Bearer " + opts_.api_key;
  const std::string got = rq.header("authorization");
  // Length-independent comparison: no early exit on the first differing byte.
  unsigned diff = got.size() != want.size();
  for (size_t i = 0; i < want.size(); ++i) diff |= static_cast<unsigned char>(want[i]) ^ static_cast<unsigned char>(i < got.size() ? got[i] : 0);
  return diff == 0;
}

HttpResponse ApiHandlers::route(const HttpRequest& rq, std::string& endpoint, const std::string& request_id) {
  const std::string path = rq.target.substr(0, rq.target.find('?'));
  struct Route {
    const char* path;
    const char* method;
    const char* label;
  };
  static constexpr Route kRoutes[] = {{"/v1/chat/completions", "POST", "chat"},
                                      {"/v1/completions", "POST", "completions"},
                                      {"/v1/models", "GET", "models"},
                                      {"/health", "GET", "health"},
                                      {"/metrics", "GET", "metrics"}};
  const Route* route = nullptr;
  for (const Route& r : kRoutes)
    if (path == r.path) route = &r;
  const bool model_by_id = path.rfind("/v1/models/", 0) == 0 && path.size() > 11;
  if (!route && !model_by_id) throw ApiError(404, "Unknown route: " + rq.method + " " + path, "", "not_found");
  endpoint = route ? route->label : "models";
  const char* method = route ? route->method : "GET";
  if (rq.method != method && !(std::string(method) == "GET" && rq.method == "HEAD")) {
    ApiError e(405, "Method " + rq.method + " is not allowed for " + path + " (use " + method + ")", "", "method_not_allowed");
    HttpResponse r = error_response(e);
    r.headers.emplace_back("Allow", method);
    return r;
  }
  if (endpoint == "health") {
    if (!service_.ready()) throw ApiError(503, "the generation service is not ready", "", "service_unavailable");
    return json_response(200, {{"status", "ok"}, {"model", opts_.served_model}});
  }
  if (endpoint == "metrics") {
    if (opts_.metrics_require_key && !authorized(rq))
      throw ApiError(401, "Incorrect or missing API key (send 'Authorization: Bearer <key>')", "", "invalid_api_key");
    HttpResponse r;
    r.content_type = "text/plain; version=0.0.4; charset=utf-8";
    r.body = metrics_.prometheus_text(service_.stats(), service_.ready());
    return r;
  }
  if (!authorized(rq)) throw ApiError(401, "Incorrect or missing API key (send 'Authorization: Bearer <key>')", "", "invalid_api_key");
  if (model_by_id) {
    if (path.substr(11) != opts_.served_model)
      throw ApiError(404, "The model '" + path.substr(11) + "' does not exist", "model", "model_not_found");
    return json_response(200, model_card());
  }
  if (endpoint == "models") return models();
  return completions(rq, endpoint == "chat" ? Endpoint::Chat : Endpoint::Completions, request_id);
}

nlohmann::json ApiHandlers::model_card() const {
  return {{"id", opts_.served_model},
          {"object", "model"},
          {"created", created_},
          {"owned_by", "k3serve"},
          {"max_model_len", limits_.context}};
}

HttpResponse ApiHandlers::models() const {
  return json_response(200, {{"object", "list"}, {"data", json::array({model_card()})}});
}

HttpResponse ApiHandlers::completions(const HttpRequest& http, Endpoint endpoint, const std::string& request_id) {
  const std::string ctype = http.header("content-type");
  if (!ctype.empty() && !is_json_media_type(ctype))
    throw ApiError(400, "Content-Type must be application/json, got '" + ctype + "'", "", "invalid_content_type");
  CompletionRequest rq = parse_completion_request(http.body, endpoint, limits_);
  std::vector<int32_t> prompt = prompt_tokens(rq, *tokenizer_);
  GenerationParams params = generation_params(rq, prompt, limits_, eos_ids_);
  params.trace_id = request_id;
  if (!service_.ready()) throw ApiError(503, "the generation service is not ready", "", "service_unavailable");

  auto state = std::make_shared<StreamState>();
  state->timing.start = Clock::now();
  auto stream = RequestStream::start(service_, std::move(params));
  if (!stream.is_ok()) {
    state->outcome = "rejected";  // never started: not a cancellation
    throw api_error_from_status(stream.status());
  }
  state->stream = std::move(stream).value();
  state->rq = rq;
  state->ids = {.id = new_id(endpoint == Endpoint::Chat ? "chatcmpl" : "cmpl"),
                .created = static_cast<int64_t>(std::time(nullptr)), .model = opts_.served_model};
  state->metrics = &metrics_;
  state->tok = tokenizer_.get();
  state->keepalive = opts_.sse_keepalive;
  state->prompt_tokens = static_cast<int64_t>(prompt.size());
  state->choices.resize(static_cast<size_t>(rq.n));
  state->open = rq.n;
  if (rq.tool_calls_possible)
    for (ChoiceState& c : state->choices) c.tools = std::make_unique<ToolCallOutput>(tokenizer_, rq.stop, eos_ids_);

  if (rq.stream) {
    state->phase = endpoint == Endpoint::Chat ? StreamState::Phase::Role : StreamState::Phase::Tokens;
    HttpResponse r;
    r.content_type = "text/event-stream";
    r.headers.emplace_back("Cache-Control", "no-cache");
    r.sse = [state](std::string& chunk) { return state->next(chunk); };
    return r;
  }

  // Not streamed: collect to the end (the RequestStream cancels if this thread unwinds, e.g. when
  // the client left: there is nobody to answer then).
  std::vector<ChoiceText> all(static_cast<size_t>(rq.n));
  for (int i = 0; i < rq.n; ++i) all[i].index = i;
  auto last_check = Clock::now();
  for (;;) {
    auto ev = state->stream->next(std::chrono::milliseconds(100));
    if (http.client_gone && Clock::now() - last_check >= std::chrono::milliseconds(100)) {
      last_check = Clock::now();
      if (http.client_gone()) throw ApiError(499, "client closed the connection", "", "client_closed");
    }
    if (!ev) continue;
    if (ev->kind == GenerationEvent::Kind::Failed) {
      state->outcome = "error";
      metrics_.count_finish("error");
      throw api_error_from_status(ev->error);
    }
    if (ev->choice < 0 || ev->choice >= rq.n)
      throw ApiError(500, "internal error: an event for choice " + std::to_string(ev->choice), "", "internal_error");
    ChoiceState& c = state->choices[ev->choice];
    if (c.ended) continue;
    for (size_t i = 0; i < ev->token_ids.size(); ++i) state->timing.token(metrics_);
    ChoiceText piece;
    const bool finished = absorb(c, *ev, piece);
    ChoiceText& whole = all[ev->choice];
    whole.text += piece.text;
    whole.token_ids.insert(whole.token_ids.end(), piece.token_ids.begin(), piece.token_ids.end());
    for (auto& lp : piece.logprobs) whole.logprobs.push_back(std::move(lp));
    if (!finished) continue;
    if (c.tools) whole.tool_calls = c.tools->calls();
    whole.finish_reason = c.reason;
    metrics_.count_finish(c.reason);
    state->completion_tokens += c.completion_tokens;
    if (--state->open > 0) continue;
    state->outcome = c.reason;
    metrics_.add_tokens(state->prompt_tokens, state->completion_tokens);
    metrics_.e2e().observe(seconds_since(state->timing.start));
    return json_response(200, completion_object(rq, state->ids, all, prompt, state->completion_tokens, *tokenizer_));
  }
}

}  // namespace k3::router
