// The table of malformed and hostile API requests shared by the handler test (no sockets) and the
// process test (over the wire): each with the status and the error "param" it must produce.
#pragma once
#include <string>
#include <vector>

namespace k3::test {

inline std::string chat(const std::string& extra) {
  return R"({"model":"k3-tiny","messages":[{"role":"user","content":"hi"}])" + (extra.empty() ? "" : "," + extra) + "}";
}
inline std::string completion(const std::string& extra) {
  return R"({"model":"k3-tiny")" + (extra.empty() ? "" : "," + extra) + "}";
}

struct BadCase {
  std::string what, method, path, body;
  int status;
  std::string param;
  std::string content_type = "application/json";
};

inline std::vector<BadCase> bad_cases() {
  const std::string C = "/v1/chat/completions", P = "/v1/completions";
  std::string ids300 = "[";
  for (int i = 0; i < 300; ++i) ids300 += (i ? "," : "") + std::to_string(i % 100);
  ids300 += "]";
  return {
      {"truncated JSON", "POST", C, "{", 400, ""},
      {"not JSON", "POST", C, "hello", 400, ""},
      {"empty body", "POST", C, "", 400, ""},
      {"array body", "POST", C, "[]", 400, ""},
      {"string body", "POST", C, "\"x\"", 400, ""},
      {"trailing garbage", "POST", C, chat("") + "}", 400, ""},
      {"missing model", "POST", C, R"({"messages":[{"role":"user","content":"hi"}]})", 400, "model"},
      {"model not a string", "POST", C, R"({"model":5,"messages":[{"role":"user","content":"hi"}]})", 400, "model"},
      {"unknown model", "POST", C, R"({"model":"gpt-4","messages":[{"role":"user","content":"hi"}]})", 404, "model"},
      {"messages missing", "POST", C, R"({"model":"k3-tiny"})", 400, "messages"},
      {"messages not array", "POST", C, R"({"model":"k3-tiny","messages":"hi"})", 400, "messages"},
      {"messages empty", "POST", C, R"({"model":"k3-tiny","messages":[]})", 400, "messages"},
      {"message not object", "POST", C, R"({"model":"k3-tiny","messages":[1]})", 400, "messages[0]"},
      {"role missing", "POST", C, R"({"model":"k3-tiny","messages":[{"content":"x"}]})", 400, "messages[0].role"},
      {"role unknown", "POST", C, R"({"model":"k3-tiny","messages":[{"role":"wizard","content":"x"}]})", 400, "messages[0].role"},
      {"content a number", "POST", C, R"({"model":"k3-tiny","messages":[{"role":"user","content":5}]})", 400, "messages[0].content"},
      {"image content part", "POST", C,
       R"({"model":"k3-tiny","messages":[{"role":"user","content":[{"type":"image_url","image_url":{"url":"x"}}]}]})", 400,
       "messages[0].content[0].type"},
      {"max_tokens negative", "POST", C, chat(R"("max_tokens":-1)"), 400, "max_tokens"},
      {"max_tokens zero", "POST", C, chat(R"("max_tokens":0)"), 400, "max_tokens"},
      {"max_tokens huge", "POST", C, chat(R"("max_tokens":1000000000000)"), 400, "max_tokens"},
      {"max_tokens beyond uint64", "POST", C, chat(R"("max_tokens":99999999999999999999999)"), 400, "max_tokens"},
      {"max_tokens float", "POST", C, chat(R"("max_tokens":1.5)"), 400, "max_tokens"},
      {"max_tokens string", "POST", C, chat(R"("max_tokens":"5")"), 400, "max_tokens"},
      {"max_completion_tokens negative", "POST", C, chat(R"("max_completion_tokens":-3)"), 400, "max_completion_tokens"},
      {"max_tokens past context", "POST", C, chat(R"("max_tokens":250)"), 400, "max_tokens"},
      {"max_completion_tokens past context (wins over max_tokens)", "POST", C,
       chat(R"("max_tokens":2,"max_completion_tokens":250)"), 400, "max_completion_tokens"},
      {"prompt over context", "POST", P, completion(R"("prompt":)" + ids300), 400, "prompt"},
      {"temperature string", "POST", C, chat(R"("temperature":"hot")"), 400, "temperature"},
      {"temperature too high", "POST", C, chat(R"("temperature":5)"), 400, "temperature"},
      {"top_p zero", "POST", C, chat(R"("top_p":0)"), 400, "top_p"},
      {"top_p above one", "POST", C, chat(R"("top_p":1.5)"), 400, "top_p"},
      {"top_k negative", "POST", C, chat(R"("top_k":-5)"), 400, "top_k"},
      {"n = 0", "POST", C, chat(R"("n":0)"), 400, "n"},
      {"n above the maximum 16", "POST", C, chat(R"("n":17)"), 400, "n"},
      {"n string", "POST", C, chat(R"("n":"1")"), 400, "n"},
      {"five stop strings", "POST", C, chat(R"("stop":["a","b","c","d","e"])"), 400, "stop"},
      {"stop a number", "POST", C, chat(R"("stop":7)"), 400, "stop"},
      {"stop empty string", "POST", C, chat(R"("stop":"")"), 400, "stop"},
      {"presence_penalty above 2", "POST", C, chat(R"("presence_penalty":2.5)"), 400, "presence_penalty"},
      {"frequency_penalty below -2", "POST", C, chat(R"("frequency_penalty":-3)"), 400, "frequency_penalty"},
      {"frequency_penalty a string", "POST", C, chat(R"("frequency_penalty":"1")"), 400, "frequency_penalty"},
      {"stream a string", "POST", C, chat(R"("stream":"yes")"), 400, "stream"},
      {"stream_options without stream", "POST", C, chat(R"("stream_options":{"include_usage":true})"), 400, "stream_options"},
      {"invalid UTF-8 in content", "POST", C, R"({"model":"k3-tiny","messages":[{"role":"user","content":"a)" "\xFF\xFE" R"("}]})", 400, ""},
      {"overlong UTF-8 in content", "POST", C, R"({"model":"k3-tiny","messages":[{"role":"user","content":")" "\xC0\xAF" R"("}]})", 400, ""},
      {"lone surrogate escape", "POST", C, R"({"model":"k3-tiny","messages":[{"role":"user","content":"\ud800"}]})", 400, ""},
      {"nesting bomb", "POST", C, std::string(100000, '['), 400, ""},
      {"NUL byte body", "POST", C, std::string("{\0}", 3), 400, ""},
      {"prompt missing", "POST", P, completion(""), 400, "prompt"},
      {"prompt a number", "POST", P, completion(R"("prompt":5)"), 400, "prompt"},
      {"prompt empty string", "POST", P, completion(R"("prompt":"")"), 400, "prompt"},
      {"prompt two strings", "POST", P, completion(R"("prompt":["a","b"])"), 400, "prompt"},
      {"prompt token out of range", "POST", P, completion(R"("prompt":[1,2,999999])"), 400, "prompt"},
      {"prompt negative token", "POST", P, completion(R"("prompt":[-1])"), 400, "prompt"},
      {"prompt mixed array", "POST", P, completion(R"("prompt":[1,"a"])"), 400, "prompt"},
      {"completions logprobs 10", "POST", P, completion(R"("prompt":"x","logprobs":10)"), 400, "logprobs"},
      {"chat top_logprobs without logprobs", "POST", C, chat(R"("top_logprobs":2)"), 400, "top_logprobs"},
      {"chat top_logprobs 21", "POST", C, chat(R"("logprobs":true,"top_logprobs":21)"), 400, "top_logprobs"},
      {"chat logprobs an int", "POST", C, chat(R"("logprobs":3)"), 400, "logprobs"},
      {"logit_bias a list", "POST", C, chat(R"("logit_bias":[5,10])"), 400, "logit_bias"},
      {"logit_bias key not a token id", "POST", C, chat(R"("logit_bias":{"five":10})"), 400, "logit_bias"},
      {"logit_bias key outside the vocabulary", "POST", C, chat(R"("logit_bias":{"99999999":10})"), 400, "logit_bias"},
      {"logit_bias key negative", "POST", C, chat(R"("logit_bias":{"-1":10})"), 400, "logit_bias"},
      {"logit_bias above 100", "POST", C, chat(R"("logit_bias":{"5":101})"), 400, "logit_bias"},
      {"logit_bias value a string", "POST", C, chat(R"("logit_bias":{"5":"10"})"), 400, "logit_bias"},
      {"seed a string", "POST", C, chat(R"("seed":"abc")"), 400, "seed"},
      {"user a number", "POST", C, chat(R"("user":5)"), 400, "user"},
      {"echo", "POST", P, completion(R"("prompt":"x","echo":true)"), 400, "echo"},
      {"best_of 3", "POST", P, completion(R"("prompt":"x","best_of":3)"), 400, "best_of"},
      {"text/plain body", "POST", C, chat(""), 400, "", "text/plain"},
      {"Text/Plain body (media types compare case-insensitively)", "POST", C, chat(""), 400, "", "Text/Plain; charset=UTF-8"},
      {"temperature 1e400 overflows a double", "POST", C, chat(R"("temperature":1e400)"), 400, "temperature"},
      {"-1e400 deep in messages", "POST", C, R"({"model":"k3-tiny","messages":[{"role":"user","content":-1e400}]})", 400,
       "messages[0].content"},
      {"1e400 in an array", "POST", C, chat(R"("stop_token_ids":[1,2,1e400])"), 400, "stop_token_ids[2]"},
      {"1e400 in an unknown field", "POST", C, chat(R"("x_vendor":{"a":[1e400]})"), 400, "x_vendor.a[0]"},
      {"both max-token fields, max_completion_tokens past context", "POST", C,
       chat(R"("max_tokens":5,"max_completion_tokens":300)"), 400, "max_completion_tokens"},
      {"suffix", "POST", P, completion(R"("prompt":"x","suffix":"y")"), 400, "suffix"},
      {"response_format bogus", "POST", C, chat(R"("response_format":{"type":"bogus"})"), 400, "response_format.type"},
      {"response_format a string", "POST", C, chat(R"("response_format":"json")"), 400, "response_format"},
      {"json_schema keyword outside the subset", "POST", C,
       chat(R"("response_format":{"type":"json_schema","json_schema":{"name":"x","schema":{"type":"object","properties":{"a":{"type":"string","format":"date"}}}}})"),
       400, "response_format.json_schema.schema.properties.a.format"},
      {"json_schema without a schema", "POST", C, chat(R"("response_format":{"type":"json_schema","json_schema":{"name":"x"}})"),
       400, "response_format.json_schema.schema"},
      {"tools: schema keyword outside the subset", "POST", C,
       chat(R"("tools":[{"type":"function","function":{"name":"f","parameters":{"properties":{"a":{"type":"string","pattern":"x"}}}}}])"),
       400, "tools[0].function.parameters.properties.a.pattern"},
      {"tools: parameters not an object schema", "POST", C,
       chat(R"("tools":[{"type":"function","function":{"name":"f","parameters":{"type":"array"}}}])"), 400,
       "tools[0].function.parameters.type"},
      {"tool_choice names an unknown function", "POST", C,
       chat(R"("tools":[{"type":"function","function":{"name":"f"}}],"tool_choice":{"type":"function","function":{"name":"g"}})"),
       400, "tool_choice.function.name"},
      {"tool_choice without tools", "POST", C, chat(R"("tool_choice":"required")"), 400, "tool_choice"},
      {"tools not an array", "POST", C, chat(R"("tools":{"type":"function"})"), 400, "tools"},
      {"tool message without tool_call_id", "POST", C,
       R"({"model":"k3-tiny","messages":[{"role":"user","content":"x"},{"role":"tool","content":"1"}]})", 400,
       "messages[1].tool_call_id"},
      {"GET on chat", "GET", C, "", 405, ""},
      {"POST on models", "POST", "/v1/models", "", 405, ""},
      {"DELETE on health", "DELETE", "/health", "", 405, ""},
      {"unknown route", "GET", "/v2/everything", "", 404, ""},
      {"unknown model by id", "GET", "/v1/models/nope", "", 404, "model"},
  };
}

}  // namespace k3::test
