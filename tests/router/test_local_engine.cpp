// LocalEngineService against the monolithic engine's own generate(): the same tokens for concurrent
// greedy and seeded requests, stop strings, logprobs from the logits, cancellation freeing the
// sequence, and shutdown failing in-flight requests.
#include <catch2/catch.hpp>
#include <nlohmann/json.hpp>

#include <cmath>
#include <random>
#include <thread>

#include "router/request_stream.h"
#include "router_fixture.h"

using namespace k3;
using namespace k3::router;
using json = nlohmann::json;

namespace {

struct Collected {
  std::vector<int32_t> tokens;
  std::string text, finish;
  std::vector<TokenLogprob> logprobs;
  Status error;
};

Collected collect(RequestStream& rs) {
  Collected c;
  for (;;) {
    auto ev = rs.next(std::chrono::milliseconds(60000));
    REQUIRE(ev);
    c.tokens.insert(c.tokens.end(), ev->token_ids.begin(), ev->token_ids.end());
    c.text += ev->text;
    for (auto& lp : ev->logprobs) c.logprobs.push_back(lp);
    if (ev->kind == GenerationEvent::Kind::Finished) {
      c.finish = ev->finish_reason;
      return c;
    }
    if (ev->kind == GenerationEvent::Kind::Failed) {
      c.error = ev->error;
      return c;
    }
  }
}

// Waits until the service reports no running request (cancellation is processed between steps).
bool wait_idle(GenerationService& s, int max_running) {
  for (int i = 0; i < 500; ++i) {
    const ServiceStats st = s.stats();
    if (st.running == 0 && st.free_slots == max_running) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return false;
}

}  // namespace

TEST_CASE("concurrent requests give the reference engine's tokens (greedy and seeded, chunked prefill)") {
  const int chunk = 5;
  test::TinyServer s({.max_running = 3, .max_queue = 16, .prefill_chunk = chunk});
  std::mt19937 rng(3);
  std::vector<GenerateRequest> refs;
  for (int i = 0; i < 5; ++i) {
    GenerateRequest g;
    const int len = 1 + static_cast<int>(rng() % 17);  // 1 token up to several chunks, uneven
    for (int k = 0; k < len; ++k) g.prompt.push_back(static_cast<int32_t>(rng() % s.cfg.vocab_size));
    g.max_tokens = 3 + i;
    if (i % 2) g.sampling = {.temperature = 0.9f, .top_k = 20, .top_p = 0.9f, .seed = 100u + i};
    refs.push_back(g);
  }
  // Reference: the monolithic engine on its own, same weights and chunking.
  auto backend = make_cpu_backend({.threads = 2});
  WeightStore w = random_weights(s.cfg, 7, DType::F32);
  EngineOptions eo;
  eo.prefill_chunk = chunk;
  eo.cache.max_seqs = 8;
  eo.cache.num_pages = 256;
  auto engine = Engine::create(*backend, s.cfg, w, eo).value();
  auto expected = engine->generate(refs).value();

  // All five at once (more than max_running: some wait in the queue and join mid-flight).
  std::vector<std::unique_ptr<RequestStream>> streams;
  for (const GenerateRequest& g : refs) {
    GenerationParams p{.prompt = g.prompt, .max_tokens = g.max_tokens, .sampling = g.sampling};
    streams.push_back(RequestStream::start(*s.service, p).value());
  }
  for (size_t i = 0; i < refs.size(); ++i) {
    Collected c = collect(*streams[i]);
    INFO("request " << i);
    CHECK(c.error.is_ok());
    CHECK(c.tokens == expected[i].tokens);
    CHECK(c.finish == "length");
    auto text = s.tok->decode(c.tokens).value();
    CHECK(c.text == text);  // no stop strings, no specials: the text is the whole decode
  }
  CHECK(wait_idle(*s.service, 3));
}

TEST_CASE("stop strings end generation and are not returned, streamed or not") {
  test::TinyServer s;
  const std::string base = R"({"model":"k3-tiny","prompt":"Once upon","max_tokens":24,"temperature":0,"ignore_eos":true)";
  json full = json::parse(s.post("/v1/completions", base + "}").body);
  const std::string text = full["choices"][0]["text"];
  REQUIRE(text.size() >= 6);
  // Two whole characters from the middle (the text may hold multi-byte UTF-8).
  auto next_char = [&](size_t i) {
    ++i;
    while (i < text.size() && (static_cast<unsigned char>(text[i]) & 0xC0) == 0x80) ++i;
    return i;
  };
  const size_t from = next_char(next_char(0));
  const size_t to = next_char(next_char(from));
  REQUIRE(to <= text.size());
  const std::string stop = text.substr(from, to - from);
  const std::string expected = text.substr(0, text.find(stop));
  json cut = json::parse(s.post("/v1/completions", base + R"(,"stop":[)" + json(stop).dump() + "]}").body);
  CHECK(cut["choices"][0]["text"] == expected);
  CHECK(cut["choices"][0]["finish_reason"] == "stop");

  HttpResponse r = s.post("/v1/completions", base + R"(,"stream":true,"stop":)" + json(stop).dump() + "}");
  REQUIRE(r.sse);
  const std::string sse = test::drain_sse(r);
  std::string streamed;
  size_t at = 0;
  while ((at = sse.find("data: {", at)) != std::string::npos) {
    const size_t end = sse.find("\n\n", at);
    json c = json::parse(sse.substr(at + 6, end - at - 6));
    streamed += c["choices"][0]["text"].get<std::string>();
    at = end;
  }
  CHECK(streamed == expected);
}

TEST_CASE("logprobs are the log-softmax of the logits: greedy picks the top alternative") {
  test::TinyServer s;
  json j = json::parse(s.post("/v1/chat/completions",
                              R"({"model":"k3-tiny","messages":[{"role":"user","content":"hello"}],"max_tokens":4,
                                  "temperature":0,"ignore_eos":true,"logprobs":true,"top_logprobs":3})").body);
  const json& content = j["choices"][0]["logprobs"]["content"];
  REQUIRE(content.size() == 4);
  for (const json& t : content) {
    REQUIRE(t["top_logprobs"].size() == 3);
    CHECK(t["logprob"].get<double>() <= 0.0);
    CHECK(t["logprob"].get<double>() == Approx(t["top_logprobs"][0]["logprob"].get<double>()));
    CHECK(t["token"] == t["top_logprobs"][0]["token"]);
    double mass = 0;
    for (const json& a : t["top_logprobs"]) mass += std::exp(a["logprob"].get<double>());
    CHECK(mass <= 1.0 + 1e-5);
    CHECK(t["top_logprobs"][0]["logprob"].get<double>() >= t["top_logprobs"][1]["logprob"].get<double>());
  }
  json k = json::parse(s.post("/v1/completions", R"({"model":"k3-tiny","prompt":"hello","max_tokens":3,"temperature":0,
                                                    "ignore_eos":true,"logprobs":2})").body);
  const json& lp = k["choices"][0]["logprobs"];
  CHECK(lp["tokens"].size() == 3);
  CHECK(lp["token_logprobs"].size() == 3);
  CHECK(lp["top_logprobs"][0].size() <= 2);
  CHECK(lp["text_offset"][0] == 0);
}

TEST_CASE("dropping a stream mid-generation cancels it and frees the engine sequence") {
  // A long generation (seconds at k3-tiny speed) so it is surely still running when dropped.
  test::TinyServer s({.max_running = 2}, "", 4096);
  HttpResponse r = s.post("/v1/chat/completions", R"({"model":"k3-tiny","messages":[{"role":"user","content":"go"}],
      "max_tokens":4000,"temperature":0,"ignore_eos":true,"stream":true})");
  REQUIRE(r.sse);
  std::string chunk;
  int content_chunks = 0;
  while (content_chunks < 3 && r.sse(chunk)) content_chunks += chunk.find("\"content\"") != std::string::npos;
  CHECK(s.service->stats().running == 1);
  CHECK(s.service->stats().free_slots == 1);
  r = HttpResponse{};  // the server does this when the client goes away
  CHECK(wait_idle(*s.service, 2));
  CHECK(s.get("/metrics").body.find("k3_router_request_finish_total{outcome=\"cancelled\"} 1") != std::string::npos);
  // The engine still serves.
  CHECK(s.post("/v1/chat/completions", R"({"model":"k3-tiny","messages":[{"role":"user","content":"go"}],"max_tokens":2})").status == 200);
}

TEST_CASE("shutdown fails in-flight streams with an error event, then [DONE]; health turns 503") {
  test::TinyServer s({}, "", 4096);
  HttpResponse r = s.post("/v1/completions", R"({"model":"k3-tiny","prompt":"x","max_tokens":4000,"ignore_eos":true,"stream":true})");
  REQUIRE(r.sse);
  std::string chunk;
  REQUIRE(r.sse(chunk));
  s.service->shutdown();
  std::string rest;
  while (r.sse(chunk)) rest += chunk;
  CHECK(rest.find("data: {\"error\":") != std::string::npos);
  CHECK(rest.size() >= 14);
  CHECK(rest.substr(rest.size() - 14) == "data: [DONE]\n\n");
  CHECK(s.get("/health").status == 503);
  CHECK(s.post("/v1/completions", R"({"model":"k3-tiny","prompt":"x","max_tokens":2})").status == 503);
}
