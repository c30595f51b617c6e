#include "router/completion_request.h"

#include <nlohmann/json.hpp>

#include <charconv>
#include <cmath>
#include <random>

#include "common/tokenizer/chat_format.h"
#include "common/tokenizer/tokenizer.h"
#include "router/api_error.h"
#include "router/json_body.h"
#include "router/response_format.h"
#include "router/tool_request.h"

namespace k3::router {
namespace {

using json = nlohmann::json;

const char* type_name(const json& v) {
  if (v.is_null()) return "null";
  if (v.is_boolean()) return "a boolean";
  if (v.is_number_integer() || v.is_number_unsigned()) return "an integer";
  if (v.is_number()) return "a number";
  if (v.is_string()) return "a string";
  if (v.is_array()) return "an array";
  return "an object";
}

// A present, non-null member (null counts as absent, as in OpenAI's API).
const json* member(const json& obj, const char* name) {
  auto it = obj.find(name);
  if (it == obj.end() || it->is_null()) return nullptr;
  return &*it;
}

std::optional<int64_t> get_int(const json& obj, const char* name, int64_t lo, int64_t hi) {
  const json* v = member(obj, name);
  if (!v) return std::nullopt;
  if (!v->is_number_integer())  // true for unsigned too
    throw bad_param(name, std::string(name) + " must be an integer, got " + type_name(*v));
  if (v->is_number_unsigned() && v->get<uint64_t>() > static_cast<uint64_t>(INT64_MAX))
    throw bad_param(name, std::string(name) + " must be at most " + std::to_string(hi));
  const int64_t x = v->get<int64_t>();
  if (x < lo || x > hi)
    throw bad_param(name, std::string(name) + " must be in [" + std::to_string(lo) + ", " + std::to_string(hi) +
                              "], got " + std::to_string(x));
  return x;
}

std::optional<double> get_number(const json& obj, const char* name, double lo, double hi) {
  const json* v = member(obj, name);
  if (!v) return std::nullopt;
  if (!v->is_number()) throw bad_param(name, std::string(name) + " must be a number, got " + type_name(*v));
  const double x = v->get<double>();
  if (!(x >= lo && x <= hi))
    throw bad_param(name, std::string(name) + " must be in [" + std::to_string(lo) + ", " + std::to_string(hi) + "]");
  return x;
}

std::optional<bool> get_bool(const json& obj, const char* name) {
  const json* v = member(obj, name);
  if (!v) return std::nullopt;
  if (!v->is_boolean()) throw bad_param(name, std::string(name) + " must be a boolean, got " + type_name(*v));
  return v->get<bool>();
}

std::optional<std::string> get_string(const json& obj, const char* name) {
  const json* v = member(obj, name);
  if (!v) return std::nullopt;
  if (!v->is_string()) throw bad_param(name, std::string(name) + " must be a string, got " + type_name(*v));
  return v->get<std::string>();
}

std::string message_content(const json& m, const std::string& where) {
  auto it = m.find("content");
  if (it == m.end() || it->is_null()) return "";
  if (it->is_string()) return it->get<std::string>();
  if (!it->is_array()) throw bad_param(where + ".content", where + ".content must be a string or an array of parts");
  std::string text;
  for (size_t k = 0; k < it->size(); ++k) {
    const json& part = (*it)[k];
    const std::string pw = where + ".content[" + std::to_string(k) + "]";
    if (!part.is_object()) throw bad_param(pw, pw + " must be an object");
    auto type = get_string(part, "type");
    if (!type || *type != "text") throw bad_param(pw + ".type", pw + ".type must be \"text\" (only text parts are supported)");
    auto t = part.find("text");
    if (t == part.end() || !t->is_string()) throw bad_param(pw + ".text", pw + ".text must be a string");
    text += t->get<std::string>();
  }
  return text;
}

// An assistant message's tool_calls: [{id, type: "function", function: {name, arguments: JSON text}}].
std::vector<ChatToolCall> parse_tool_calls(const json& m, const std::string& where) {
  const json* v = member(m, "tool_calls");
  if (!v) return {};
  if (!v->is_array()) throw bad_param(where + ".tool_calls", where + ".tool_calls must be an array");
  std::vector<ChatToolCall> calls;
  for (size_t k = 0; k < v->size(); ++k) {
    const json& c = (*v)[k];
    const std::string cw = where + ".tool_calls[" + std::to_string(k) + "]";
    if (!c.is_object()) throw bad_param(cw, cw + " must be an object");
    auto id = get_string(c, "id");
    if (!id || id->empty()) throw bad_param(cw + ".id", cw + ".id must be a non-empty string");
    if (auto type = get_string(c, "type"); type && *type != "function")
      throw bad_param(cw + ".type", cw + ".type must be \"function\"");
    const json* fn = member(c, "function");
    if (!fn || !fn->is_object()) throw bad_param(cw + ".function", cw + ".function must be an object");
    auto name = get_string(*fn, "name");
    if (!name || name->empty()) throw bad_param(cw + ".function.name", cw + ".function.name must be a non-empty string");
    auto args = get_string(*fn, "arguments");
    if (!args) throw bad_param(cw + ".function.arguments", cw + ".function.arguments must be a string of JSON");
    if (json::parse(*args, nullptr, /*allow_exceptions=*/false).is_discarded())
      throw bad_param(cw + ".function.arguments", cw + ".function.arguments is not valid JSON");
    calls.push_back({.id = *id, .name = *name, .arguments = *args});
  }
  return calls;
}

std::vector<ChatMessage> parse_messages(const json& body) {
  const json* v = member(body, "messages");
  if (!v) throw bad_param("messages", "messages is required");
  if (!v->is_array()) throw bad_param("messages", std::string("messages must be an array, got ") + type_name(*v));
  if (v->empty()) throw bad_param("messages", "messages must contain at least one message");
  std::vector<ChatMessage> out;
  for (size_t i = 0; i < v->size(); ++i) {
    const json& m = (*v)[i];
    const std::string where = "messages[" + std::to_string(i) + "]";
    if (!m.is_object()) throw bad_param(where, where + " must be an object");
    auto role = get_string(m, "role");
    if (!role) throw bad_param(where + ".role", where + ".role is required");
    if (*role == "developer") *role = "system";  // OpenAI's newer name for the system role
    if (*role != "system" && *role != "user" && *role != "assistant" && *role != "tool")
      throw bad_param(where + ".role", where + ".role must be one of system, developer, user, assistant, tool");
    ChatMessage cm{.role = *role, .content = message_content(m, where), .name = get_string(m, "name").value_or("")};
    if (cm.role == "assistant") cm.tool_calls = parse_tool_calls(m, where);
    if (cm.role == "tool") {
      auto id = get_string(m, "tool_call_id");
      if (!id || id->empty()) throw bad_param(where + ".tool_call_id", where + ".tool_call_id is required for role tool");
      cm.tool_call_id = *id;
    }
    out.push_back(std::move(cm));
  }
  return out;
}

void parse_prompt(const json& body, CompletionRequest& rq, const ModelLimits& limits) {
  const json* v = member(body, "prompt");
  if (!v) throw bad_param("prompt", "prompt is required");
  if (v->is_string()) {
    rq.prompt_text = v->get<std::string>();
    return;
  }
  if (!v->is_array() || v->empty())
    throw bad_param("prompt", "prompt must be a string, an array of token ids or an array of one string");
  if ((*v)[0].is_string()) {
    if (v->size() != 1) throw bad_param("prompt", "only one prompt per request is supported (got " + std::to_string(v->size()) + ")");
    rq.prompt_text = (*v)[0].get<std::string>();
    return;
  }
  for (size_t i = 0; i < v->size(); ++i) {
    const json& t = (*v)[i];
    if (!t.is_number_integer() && !t.is_number_unsigned())
      throw bad_param("prompt", "prompt[" + std::to_string(i) + "] must be a token id (integer)");
    const int64_t id = t.is_number_unsigned() ? static_cast<int64_t>(std::min<uint64_t>(t.get<uint64_t>(), INT64_MAX)) : t.get<int64_t>();
    if (id < 0 || id >= limits.vocab)
      throw bad_param("prompt", "prompt[" + std::to_string(i) + "] = " + std::to_string(id) + " is not a token id in [0, " +
                                    std::to_string(limits.vocab) + ")");
    rq.prompt_ids.push_back(static_cast<int32_t>(id));
  }
}

void parse_stop(const json& body, CompletionRequest& rq) {
  const json* v = member(body, "stop");
  if (!v) return;
  if (v->is_string()) {
    rq.stop.push_back(v->get<std::string>());
  } else if (v->is_array()) {
    if (v->size() > 4) throw bad_param("stop", "stop accepts at most 4 sequences");
    for (const json& s : *v) {
      if (!s.is_string()) throw bad_param("stop", "stop must be a string or an array of strings");
      rq.stop.push_back(s.get<std::string>());
    }
  } else {
    throw bad_param("stop", std::string("stop must be a string or an array of strings, got ") + type_name(*v));
  }
  for (const std::string& s : rq.stop)
    if (s.empty()) throw bad_param("stop", "stop sequences must not be empty");
}

// Features this server does not implement are refused by name: ignoring them would hand an agent
// plain text where it asked for a tool call or a JSON document, and it would take the wrong path.
void reject_unsupported_features(const json& body, Endpoint endpoint) {
  if (endpoint == Endpoint::Completions) {
    if (const json* sfx = member(body, "suffix"); sfx && !(sfx->is_string() && sfx->get<std::string>().empty()))
      throw ApiError(400, "suffix is not supported (inserting text needs a fill-in-the-middle prompt format)", "suffix",
                     "unsupported_value");
    return;
  }
  if (const json* f = member(body, "functions"); f && !(f->is_array() && f->empty()))
    throw ApiError(400, "functions (deprecated) are not supported: give them as tools", "functions", "unsupported_value");
  if (member(body, "function_call"))
    throw ApiError(400, "function_call (deprecated) is not supported: use tool_choice", "function_call",
                   "unsupported_value");
}

}  // namespace

bool json_depth_ok(const std::string& body, int max_depth) {
  int depth = 0;
  bool in_string = false, escaped = false;
  for (char c : body) {
    if (in_string) {
      if (escaped) escaped = false;
      else if (c == '\\') escaped = true;
      else if (c == '"') in_string = false;
      continue;
    }
    if (c == '"') in_string = true;
    else if (c == '[' || c == '{') {
      if (++depth > max_depth) return false;
    } else if (c == ']' || c == '}') --depth;
  }
  return true;
}

CompletionRequest parse_completion_request(const std::string& text, Endpoint endpoint, const ModelLimits& limits) {
  json body = parse_json_body(text, kMaxJsonDepth);
  if (!body.is_object()) throw ApiError(400, "request body must be a JSON object", "", "invalid_json");

  CompletionRequest rq;
  rq.endpoint = endpoint;
  auto model = get_string(body, "model");
  if (!model) throw bad_param("model", "model is required");
  rq.model = *model;
  if (rq.model != limits.served_model)
    throw ApiError(404, "The model '" + rq.model + "' does not exist (served: '" + limits.served_model + "')", "model",
                   "model_not_found");

  if (endpoint == Endpoint::Chat) rq.messages = parse_messages(body);
  else parse_prompt(body, rq, limits);

  // max_tokens beyond the context can never be honoured; the exact prompt-dependent check comes later.
  // max_completion_tokens is the current name and wins over the deprecated max_tokens.
  rq.max_tokens = get_int(body, "max_tokens", 1, limits.context);
  if (auto mct = get_int(body, "max_completion_tokens", 1, limits.context)) {
    rq.max_tokens = mct;
    rq.max_tokens_field = "max_completion_tokens";
  }
  rq.temperature = static_cast<float>(get_number(body, "temperature", 0.0, 2.0).value_or(1.0));
  rq.top_p = static_cast<float>(get_number(body, "top_p", 0.0, 1.0).value_or(1.0));
  if (rq.top_p <= 0.f) throw bad_param("top_p", "top_p must be in (0, 1]");
  rq.top_k = static_cast<int>(get_int(body, "top_k", -1, limits.vocab).value_or(0));
  if (rq.top_k < 0) rq.top_k = 0;
  if (auto seed = get_int(body, "seed", INT64_MIN, INT64_MAX)) rq.seed = static_cast<uint64_t>(*seed);
  parse_stop(body, rq);
  if (const json* ids = member(body, "stop_token_ids")) {
    if (!ids->is_array()) throw bad_param("stop_token_ids", "stop_token_ids must be an array of token ids");
    for (const json& t : *ids) {
      if (!t.is_number_integer() || t.get<int64_t>() < 0 || t.get<int64_t>() >= limits.vocab)
        throw bad_param("stop_token_ids", "stop_token_ids must hold token ids in [0, " + std::to_string(limits.vocab) + ")");
      rq.stop_token_ids.push_back(t.get<int32_t>());
    }
  }
  rq.ignore_eos = get_bool(body, "ignore_eos").value_or(false);
  rq.n = static_cast<int>(get_int(body, "n", 1, kMaxChoices).value_or(1));
  if (auto b = get_int(body, "best_of", INT64_MIN, INT64_MAX); b && *b != 1)
    throw ApiError(400, "best_of must be 1", "best_of", "unsupported_value");
  if (get_bool(body, "echo").value_or(false)) throw ApiError(400, "echo is not supported", "echo", "unsupported_value");
  rq.presence_penalty = static_cast<float>(get_number(body, "presence_penalty", -2.0, 2.0).value_or(0.0));
  rq.frequency_penalty = static_cast<float>(get_number(body, "frequency_penalty", -2.0, 2.0).value_or(0.0));
  if (const json* bias = member(body, "logit_bias"); bias && !bias->is_null()) {
    // {"<token id>": bias}: keys are token ids written as decimal strings, as OpenAI's are.
    if (!bias->is_object()) throw bad_param("logit_bias", "logit_bias must be an object of token id -> bias");
    if (bias->size() > kMaxLogitBias)
      throw bad_param("logit_bias", "logit_bias holds at most " + std::to_string(kMaxLogitBias) + " tokens");
    for (const auto& [key, value] : bias->items()) {
      int64_t id = -1;
      const auto [end, ec] = std::from_chars(key.data(), key.data() + key.size(), id);
      if (ec != std::errc() || end != key.data() + key.size() || id < 0 || id >= limits.vocab)
        throw bad_param("logit_bias", "logit_bias key '" + key + "' is not a token id in [0, " +
                                          std::to_string(limits.vocab) + ")");
      if (!value.is_number() || std::fabs(value.get<double>()) > 100.0)
        throw bad_param("logit_bias", "logit_bias[\"" + key + "\"] must be a number in [-100, 100]");
      rq.logit_bias.push_back({.token = static_cast<int32_t>(id), .bias = static_cast<float>(value.get<double>())});
    }
  }
  (void)get_string(body, "user");  // accepted and ignored, but it must be a string
  reject_unsupported_features(body, endpoint);
  if (endpoint == Endpoint::Chat) {
    ResponseFormat rf = parse_response_format(body, text);
    int calls_so_far = 0;
    for (const ChatMessage& m : rq.messages) calls_so_far += static_cast<int>(m.tool_calls.size());
    ToolRequest tools = parse_tool_request(body, text, calls_so_far);
    rq.tools_json = std::move(tools.tools_json);
    rq.tool_calls_possible = tools.calls_possible;
    // One grammar per output: a JSON document, or content with tool calls. With tool_choice "none"
    // the tools are only declared and response_format rules the output.
    if (rf.format.constrained() && tools.calls_possible)
      throw bad_param("response_format", "response_format cannot be combined with tools unless tool_choice is \"none\"");
    if (rf.format.constrained() || !tools.format.constrained()) {
      rq.output_format = std::move(rf.format);
      rq.grammar = std::move(rf.grammar);
    } else {
      rq.output_format = std::move(tools.format);
      rq.grammar = std::move(tools.grammar);
    }
  }

  if (endpoint == Endpoint::Chat) {
    const bool want = get_bool(body, "logprobs").value_or(false);
    const auto top = get_int(body, "top_logprobs", 0, 20);
    if (top && !want) throw bad_param("top_logprobs", "top_logprobs requires logprobs: true");
    if (want) rq.logprobs = static_cast<int>(top.value_or(0));
  } else {
    if (auto lp = get_int(body, "logprobs", 0, 5)) rq.logprobs = static_cast<int>(*lp);
  }

  rq.stream = get_bool(body, "stream").value_or(false);
  if (const json* so = member(body, "stream_options")) {
    if (!so->is_object()) throw bad_param("stream_options", "stream_options must be an object");
    if (!rq.stream) throw bad_param("stream_options", "stream_options is only allowed when stream is true");
    rq.include_usage = get_bool(*so, "include_usage").value_or(false);
  }
  rq.return_token_ids = get_bool(body, "return_token_ids").value_or(false);
  return rq;
}

std::vector<int32_t> prompt_tokens(const CompletionRequest& rq, const Tokenizer& tok) {
  if (rq.endpoint == Endpoint::Chat) {
    // The model's own chat template when its tokenizer_config.json has one (tokenizer.h).
    auto rendered = tok.chat_format().render(rq.messages, /*add_generation_prompt=*/true, rq.tools_json);
    if (!rendered.is_ok()) throw bad_param("messages", rendered.status().message());
    return tok.encode(*rendered, /*allow_special=*/true);
  }
  if (rq.prompt_text) return tok.encode(*rq.prompt_text, /*allow_special=*/false);
  return rq.prompt_ids;
}

GenerationParams generation_params(const CompletionRequest& rq, std::vector<int32_t> prompt, const ModelLimits& limits,
                                   const std::vector<int32_t>& eos_ids) {
  const char* prompt_param = rq.endpoint == Endpoint::Chat ? "messages" : "prompt";
  if (prompt.empty()) throw bad_param(prompt_param, std::string(prompt_param) + " is empty");
  const int64_t n = static_cast<int64_t>(prompt.size());
  if (n >= limits.context)
    throw ApiError(400, "This model's maximum context length is " + std::to_string(limits.context) +
                            " tokens, but the prompt has " + std::to_string(n) + " tokens",
                   prompt_param, "context_length_exceeded");
  int64_t max_tokens = rq.max_tokens.value_or(std::min<int64_t>(limits.default_max_tokens, limits.context - n));
  if (n + max_tokens > limits.context)
    throw ApiError(400, "This model's maximum context length is " + std::to_string(limits.context) + " tokens; the prompt has " +
                            std::to_string(n) + " tokens and " + rq.max_tokens_field + " is " + std::to_string(max_tokens) +
                            ", so at most " + std::to_string(limits.context - n) + " tokens can be generated",
                   rq.max_tokens_field, "context_length_exceeded");
  GenerationParams p;
  p.prompt = std::move(prompt);
  p.max_tokens = static_cast<int>(max_tokens);
  p.n = rq.n;
  uint64_t seed = 0;
  if (rq.seed) seed = *rq.seed;
  else seed = (static_cast<uint64_t>(std::random_device{}()) << 32) ^ std::random_device{}();
  p.sampling = {.temperature = rq.temperature, .top_k = rq.top_k, .top_p = rq.top_p, .seed = seed,
                .presence_penalty = rq.presence_penalty, .frequency_penalty = rq.frequency_penalty};
  p.logit_bias = rq.logit_bias;
  p.stop_ids = rq.stop_token_ids;
  if (!rq.ignore_eos) p.stop_ids.insert(p.stop_ids.end(), eos_ids.begin(), eos_ids.end());
  // Stop strings end content, never a tool call's arguments: with tools the router applies them to
  // the content itself (router/tool_call_output.h).
  if (!rq.tool_calls_possible) p.stop_strings = rq.stop;
  p.logprobs = rq.logprobs;
  p.output_format = rq.output_format;
  p.grammar = rq.grammar;
  return p;
}

}  // namespace k3::router
