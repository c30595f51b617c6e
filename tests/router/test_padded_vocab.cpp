// A model whose vocabulary runs past its tokenizer's (padding rows; a generated test model such as
// k3-small has 163840 rows over a tokenizer of a few hundred tokens): ids the tokenizer does not assign
// can be sampled. They are the request's tokens (ids and logprobs) but add no text; before, the first
// such id failed the whole request with a 400 from the detokenizer.
#include <catch2/catch.hpp>

#include <nlohmann/json.hpp>

#include "tests/router/router_fixture.h"

using namespace k3;
using nlohmann::json;

TEST_CASE("ids past the tokenizer's vocabulary are generated tokens without text, not a failed request") {
  test::TempDir dir;
  const int tokenizer_vocab = write_tiny_tokenizer(dir.path).value();
  auto tok = std::make_shared<const Tokenizer>(Tokenizer::load(dir.path).value());
  ModelConfig cfg = preset_config("k3-tiny").value();
  cfg.vocab_size = tokenizer_vocab + 4096;  // 8 in 9 rows of the output have no token
  cfg.max_position_embeddings = 512;
  auto service = router::LocalEngineService::create(cfg, random_weights(cfg, 11, DType::F32), tok, {.backend = {.threads = 2}}).value();
  router::ApiHandlers api(*service, tok, cfg, router::ApiOptions{.served_model = "k3-tiny", .default_max_tokens = 8});
  CHECK_FALSE(tok->assigns(tokenizer_vocab));
  CHECK_FALSE(tok->assigns(-1));
  CHECK(tok->assigns(tokenizer_vocab - 1));
  {
    const json body = {{"model", "k3-tiny"}, {"prompt", "hello there"}, {"max_tokens", 12}, {"temperature", 1.0},
                       {"seed", 5},         {"logprobs", 5},           {"ignore_eos", true}, {"return_token_ids", true}};
    const router::HttpResponse r = api.handle({.method = "POST", .target = "/v1/completions",
                                               .headers = {{"content-type", "application/json"}}, .body = body.dump()});
    INFO(r.body);
    REQUIRE(r.status == 200);
    const json choice = json::parse(r.body)["choices"][0];
    const std::vector<int32_t> ids = choice["token_ids"].get<std::vector<int32_t>>();
    REQUIRE(ids.size() == 12);
    std::string want;
    int past = 0;
    for (int32_t id : ids) {
      CHECK(id < cfg.vocab_size);
      if (!tok->assigns(id)) {
        ++past;
        continue;
      }
      if (!tok->is_special(id)) want += tok->decode(std::span<const int32_t>(&id, 1)).value();
    }
    CHECK(past > 0);  // random weights over 9x the tokenizer's rows: most draws land past it
    CHECK(choice["text"] == want);
    CHECK(choice["logprobs"]["tokens"].size() == ids.size());
  }
}
