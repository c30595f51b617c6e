#include "router/openai_format.h"

namespace k3::router {

using json = nlohmann::json;

std::string dump_json(const json& j) { return j.dump(-1, ' ', false, json::error_handler_t::replace); }
std::string sse_data(const json& j) { return "data: " + dump_json(j) + "\n\n"; }

json usage_json(int64_t prompt_tokens, int64_t completion_tokens) {
  return {{"prompt_tokens", prompt_tokens},
          {"completion_tokens", completion_tokens},
          {"total_tokens", prompt_tokens + completion_tokens}};
}

static std::string token_text(const Tokenizer& tok, int32_t id) {
  auto s = tok.decode(std::span<const int32_t>(&id, 1));
  return s.is_ok() ? *s : std::string();
}

static json token_bytes(const Tokenizer& tok, int32_t id) {
  json b = json::array();
  auto s = tok.decode_bytes(std::span<const int32_t>(&id, 1));
  if (s.is_ok())
    for (unsigned char c : *s) b.push_back(static_cast<int>(c));
  return b;
}

json logprobs_json(Endpoint endpoint, const std::vector<TokenLogprob>& lps, const Tokenizer& tok, int64_t text_offset) {
  if (endpoint == Endpoint::Chat) {
    json content = json::array();
    for (const TokenLogprob& lp : lps) {
      json top = json::array();
      for (auto [id, l] : lp.top)
        top.push_back({{"token", token_text(tok, id)}, {"logprob", l}, {"bytes", token_bytes(tok, id)}});
      content.push_back({{"token", token_text(tok, lp.id)},
                         {"logprob", lp.logprob},
                         {"bytes", token_bytes(tok, lp.id)},
                         {"top_logprobs", top}});
    }
    return {{"content", content}};
  }
  json tokens = json::array(), token_lps = json::array(), tops = json::array(), offsets = json::array();
  int64_t off = text_offset;
  for (const TokenLogprob& lp : lps) {
    const std::string t = token_text(tok, lp.id);
    tokens.push_back(t);
    token_lps.push_back(lp.logprob);
    json top = json::object();
    for (auto [id, l] : lp.top) top[token_text(tok, id)] = l;
    tops.push_back(top);
    offsets.push_back(off);
    off += static_cast<int64_t>(t.size());
  }
  return {{"tokens", tokens}, {"token_logprobs", token_lps}, {"top_logprobs", tops}, {"text_offset", offsets}};
}

static json choice_json(const CompletionRequest& rq, const ChoiceText& choice, const Tokenizer& tok) {
  json c = {{"index", choice.index}, {"finish_reason", choice.finish_reason}};
  json lp = rq.logprobs >= 0 ? logprobs_json(rq.endpoint, choice.logprobs, tok, 0) : json(nullptr);
  if (rq.endpoint == Endpoint::Chat) {
    c["message"] = {{"role", "assistant"}, {"content", choice.text}};
    if (!choice.tool_calls.empty()) {
      json calls = json::array();
      for (const ChatToolCall& tc : choice.tool_calls)
        calls.push_back({{"id", tc.id}, {"type", "function"}, {"function", {{"name", tc.name}, {"arguments", tc.arguments}}}});
      c["message"]["tool_calls"] = calls;
      if (choice.text.empty()) c["message"]["content"] = nullptr;
    }
  } else {
    c["text"] = choice.text;
  }
  c["logprobs"] = lp;
  if (rq.return_token_ids) c["token_ids"] = choice.token_ids;
  return c;
}

json completion_object(const CompletionRequest& rq, const ResponseIds& ids, const std::vector<ChoiceText>& choices,
                       const std::vector<int32_t>& prompt, int64_t completion_tokens, const Tokenizer& tok) {
  json cs = json::array();
  for (const ChoiceText& c : choices) cs.push_back(choice_json(rq, c, tok));
  json j = {{"id", ids.id},
            {"object", rq.endpoint == Endpoint::Chat ? "chat.completion" : "text_completion"},
            {"created", ids.created},
            {"model", ids.model},
            {"choices", cs},
            {"usage", usage_json(static_cast<int64_t>(prompt.size()), completion_tokens)}};
  if (rq.return_token_ids) j["prompt_token_ids"] = prompt;
  return j;
}

json chunk_object(const CompletionRequest& rq, const ResponseIds& ids, const ChoiceText& piece,
                  const std::string& finish_reason, bool role, const Tokenizer& tok) {
  json c = {{"index", piece.index}};
  if (rq.endpoint == Endpoint::Chat) {
    json delta = json::object();
    if (role) delta["role"] = "assistant";
    if (role || !piece.text.empty()) delta["content"] = piece.text;
    if (!piece.tool_call_deltas.empty()) {
      // A call's first delta names it; the ones after carry pieces of its arguments.
      json calls = json::array();
      for (const ToolCallDelta& d : piece.tool_call_deltas) {
        json call = {{"index", d.index}};
        if (!d.id.empty()) call["id"] = d.id, call["type"] = "function";
        call["function"] = d.name.empty() ? json{{"arguments", d.arguments}}
                                          : json{{"name", d.name}, {"arguments", d.arguments}};
        calls.push_back(call);
      }
      delta["tool_calls"] = calls;
    }
    c["delta"] = delta;
  } else {
    c["text"] = piece.text;
  }
  c["logprobs"] = rq.logprobs >= 0 && !piece.logprobs.empty() ? logprobs_json(rq.endpoint, piece.logprobs, tok, piece.text_offset)
                                                              : json(nullptr);
  c["finish_reason"] = finish_reason.empty() ? json(nullptr) : json(finish_reason);
  if (rq.return_token_ids) c["token_ids"] = piece.token_ids;
  json j = {{"id", ids.id},
            {"object", rq.endpoint == Endpoint::Chat ? "chat.completion.chunk" : "text_completion"},
            {"created", ids.created},
            {"model", ids.model},
            {"choices", json::array({c})}};
  if (rq.include_usage) j["usage"] = nullptr;
  return j;
}

json usage_chunk(const CompletionRequest& rq, const ResponseIds& ids, int64_t prompt_tokens, int64_t completion_tokens) {
  return {{"id", ids.id},
          {"object", rq.endpoint == Endpoint::Chat ? "chat.completion.chunk" : "text_completion"},
          {"created", ids.created},
          {"model", ids.model},
          {"choices", json::array()},
          {"usage", usage_json(prompt_tokens, completion_tokens)}};
}

}  // namespace k3::router
