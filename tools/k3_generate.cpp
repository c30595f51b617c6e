// k3-generate: the monolithic engine from the command line (whole model, one process, no transfer).
#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <optional>
#include <fstream>
#include <iostream>
#include <sstream>

#include "common/core/parse.h"
#include "common/config/config.h"
#include "engine/engine.h"
#include "engine/teacher_forced.h"
#include "common/model/weights.h"
#include "common/tokenizer/chat_format.h"
#include "common/tokenizer/tokenizer.h"
#include "common/io/load_progress.h"
#include "kernels/backend_flags.h"

using namespace k3;

namespace {

Result<std::string> read_file(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  if (!f) return io_error("cannot read " + path);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

int fail(const Status& s) {
  std::fprintf(stderr, "k3-generate: %s\n", s.to_string().c_str());
  return 1;
}

// Teacher-forced logits of every prompt position to `path` (F32, [tokens, vocab]).
int write_logits(const std::string& model, const ModelConfig& cfg, const BackendChoice& bc,
                 const std::vector<std::vector<int32_t>>& prompts, const std::string& path) {
  auto weights = load_weights(model, cfg);
  if (!weights.is_ok()) return fail(weights.status());
  LoadProgress load("k3-generate: weights");
  weights->set_upload_observer(load.observer());
  auto backend = make_backend(bc);
  if (!backend.is_ok()) return fail(backend.status());
  const auto t0 = std::chrono::steady_clock::now();
  auto logits = teacher_forced_logits(**backend, cfg, *weights, prompts);
  if (!logits.is_ok()) return fail(logits.status());
  std::ofstream f(path, std::ios::binary);
  f.write(static_cast<const char*>(logits->data()), static_cast<std::streamsize>(logits->nbytes()));
  if (!f) return fail(io_error("cannot write " + path));
  std::fprintf(stderr, "k3-generate: wrote %s: logits [%lld, %lld] of %zu prompts in %.1f s (upload included)\n",
               path.c_str(), static_cast<long long>(logits->dim(0)), static_cast<long long>(logits->dim(1)),
               prompts.size(), std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"k3-generate: run the K3 model monolithically (the reference engine) and print the generated tokens.\n"
               "Exactly one of --prompt, --prompt-ids, --messages is required."};
  std::string model_dir, prompt, prompt_ids, messages_file, logits_out, prompts_file;
  int max_tokens = 16, top_k = 0, chunk = 0, top_n = 5;
  float temperature = 0.f, top_p = 1.f, presence_penalty = 0.f, frequency_penalty = 0.f;
  uint64_t seed = 0;
  bool json = false, raw = false, ignore_eos = false;
  app.add_option("--model", model_dir, "model directory (config.json, model.safetensors, tiktoken.model), or "
                 "synthetic:PRESET[:SEED] for generated bf16 weights drawn where they are loaded (no files, no "
                 "tokenizer: give --prompt-ids)")->required();
  auto* o_prompt = app.add_option("--prompt", prompt, "prompt text (rendered through the chat template unless --raw)");
  auto* o_ids = app.add_option("--prompt-ids", prompt_ids, "prompt as comma-separated token ids, e.g. 1,2,3");
  auto* o_msgs = app.add_option("--messages", messages_file, "JSON file with an OpenAI-style messages array");
  o_prompt->excludes(o_ids)->excludes(o_msgs);
  o_ids->excludes(o_msgs);
  app.add_flag("--raw", raw, "tokenize --prompt as-is, without the chat template");
  app.add_option("--max-tokens", max_tokens, "tokens to generate (>= 1)")->check(CLI::Range(1, 1 << 20));
  app.add_option("--temperature", temperature, "0 = greedy (default)")->check(CLI::Range(0.f, 100.f));
  app.add_option("--presence-penalty", presence_penalty,
                 "subtracted from the logit of every token already generated (OpenAI's; default 0)")
      ->check(CLI::Range(-2.f, 2.f));
  std::string logit_bias_text;
  app.add_option("--logit-bias", logit_bias_text,
                 "added to tokens' logits before each draw (OpenAI's logit_bias): ID:BIAS,ID:BIAS,... with biases in "
                 "[-100, 100]");
  app.add_option("--frequency-penalty", frequency_penalty,
                 "times how often each token was generated, subtracted from its logit (OpenAI's; default 0)")
      ->check(CLI::Range(-2.f, 2.f));
  app.add_option("--top-k", top_k, "keep the k most likely tokens (0 = off)")->check(CLI::NonNegativeNumber);
  app.add_option("--top-p", top_p, "nucleus sampling mass (1 = off)")->check(CLI::Range(0.f, 1.f));
  app.add_option("--seed", seed, "sampling seed (draws depend only on seed, step and logits)");
  BackendFlags backend_flags;
  add_backend_flags(app, backend_flags);
  app.add_option("--prefill-chunk", chunk, "prefill chunk size in tokens (0 = whole prompt)")->check(CLI::NonNegativeNumber);
  app.add_option("--top-logits", top_n, "top logits recorded per step in --json output")->check(CLI::Range(0, 100));
  app.add_flag("--ignore-eos", ignore_eos, "do not stop at the tokenizer's end-of-sequence tokens");
  app.add_option("--logits-out", logits_out, "teacher-forced: write the F32 logits of every prompt position "
                 "([tokens, vocab], row-major, prompts end to end) to this file and exit without generating");
  app.add_option("--prompts-file", prompts_file, "with --logits-out: a JSON array of token-id arrays, run as one batch");
  app.add_flag("--json", json, "print one JSON object: tokens, text, per-step top logits, tokens/s");
  CLI11_PARSE(app, argc, argv);
  std::vector<ops::LogitBias> logit_bias;
  for (size_t at = 0; at < logit_bias_text.size();) {
    const size_t comma = std::min(logit_bias_text.find(',', at), logit_bias_text.size());
    const std::string item = logit_bias_text.substr(at, comma - at);
    int id = -1;
    float bias = 0.f;
    char tail = 0;
    if (std::sscanf(item.c_str(), "%d:%f%c", &id, &bias, &tail) != 2 || id < 0 || !(std::fabs(bias) <= 100.f))
      return fail(invalid_argument("--logit-bias: '" + item + "' is not ID:BIAS with a token id >= 0 and a bias in [-100, 100]"));
    logit_bias.push_back({.token = id, .bias = bias});
    at = comma + 1;
  }
  auto resolved = backend_flags.resolve();
  if (!resolved.is_ok()) return fail(resolved.status());
  const BackendChoice bc = *resolved;
  if (!prompts_file.empty()) {
    if (logits_out.empty()) return fail(invalid_argument("--prompts-file needs --logits-out"));
    if (!prompt.empty() || !prompt_ids.empty() || !messages_file.empty())
      return fail(invalid_argument("--prompts-file replaces --prompt, --prompt-ids and --messages"));
  } else if (prompt.empty() && prompt_ids.empty() && messages_file.empty()) {
    return fail(invalid_argument("one of --prompt, --prompt-ids, --messages is required"));
  }

  try {
    auto cfg = load_model_config_of(model_dir);
    if (!cfg.is_ok()) return fail(cfg.status());
    if (!logits_out.empty()) {
      std::vector<std::vector<int32_t>> prompts;
      if (!prompts_file.empty()) {
        auto body = read_file(prompts_file);
        if (!body.is_ok()) return fail(body.status());
        const auto j = nlohmann::json::parse(*body, nullptr, false);
        if (j.is_discarded() || !j.is_array()) return fail(invalid_argument("--prompts-file: expected a JSON array of token-id arrays"));
        for (const auto& p : j) {
          if (!p.is_array()) return fail(invalid_argument("--prompts-file: every prompt must be an array of token ids"));
          prompts.emplace_back();
          for (const auto& id : p) {
            if (!id.is_number_integer()) return fail(invalid_argument("--prompts-file: token ids must be integers"));
            prompts.back().push_back(id.get<int32_t>());
          }
        }
      } else {
        if (prompt_ids.empty()) return fail(invalid_argument("--logits-out needs --prompt-ids or --prompts-file"));
        auto r = parse_token_ids(prompt_ids, "--prompt-ids", false);
        if (!r.is_ok()) return fail(r.status());
        prompts.push_back(*r);
      }
      return write_logits(model_dir, *cfg, bc, prompts, logits_out);
    }
    const bool synthetic = is_synthetic_model(model_dir);
    if (synthetic && prompt_ids.empty()) return fail(invalid_argument("a synthetic model has no tokenizer: give --prompt-ids"));
    std::optional<Tokenizer> tok;
    if (!synthetic) {
      auto t = Tokenizer::load(model_dir);
      if (!t.is_ok()) return fail(t.status());
      tok.emplace(std::move(*t));
    }

    std::vector<int32_t> ids;
    if (!prompt_ids.empty()) {
      auto r = parse_token_ids(prompt_ids, "--prompt-ids", false);
      if (!r.is_ok()) return fail(r.status());
      ids = *r;
    } else {
      std::string text = prompt;
      bool special = false;
      if (!messages_file.empty() || !raw) {
        std::vector<ChatMessage> msgs;
        if (!messages_file.empty()) {
          auto body = read_file(messages_file);
          if (!body.is_ok()) return fail(body.status());
          auto parsed = parse_chat_messages(*body);
          if (!parsed.is_ok()) return fail(parsed.status());
          msgs = *parsed;
        } else {
          msgs = {{.role = "user", .content = prompt, .name = ""}};
        }
        auto rendered = tok->chat_format().render(msgs, /*add_generation_prompt=*/true, {});
        if (!rendered.is_ok()) return fail(rendered.status());
        text = *rendered;
        special = true;
      }
      ids = tok->encode(text, special);
    }
    for (int32_t id : ids)
      if (id >= cfg->vocab_size) return fail(invalid_argument("prompt token id " + std::to_string(id) + " >= vocab_size " + std::to_string(cfg->vocab_size)));

    auto weights = load_weights(model_dir, *cfg);
    if (!weights.is_ok()) return fail(weights.status());
    LoadProgress load("k3-generate: weights");
    weights->set_upload_observer(load.observer());
    auto backend = make_backend(bc);
    if (!backend.is_ok()) return fail(backend.status());
    if ((*backend)->chunk_invariant() && chunk % 64 != 0)
      std::fprintf(stderr, "k3-generate: --prefill-chunk %d is not a multiple of 64: with batch-invariant kernels the "
                           "tokens then equal a whole-prompt prefill's (and the cluster's) only to rounding\n", chunk);
    EngineOptions eo;
    eo.prefill_chunk = chunk;
    eo.top_logits = top_n;
    eo.cache.max_seqs = 1;
    eo.cache.page_size = 16;
    eo.cache.num_pages = static_cast<int>((ids.size() + max_tokens) / eo.cache.page_size + 2);
    auto engine = Engine::create(**backend, *cfg, *weights, eo);
    if (!engine.is_ok()) return fail(engine.status());
    load.finish();

    GenerateRequest rq;
    rq.prompt = ids;
    rq.max_tokens = max_tokens;
    rq.sampling = {.temperature = temperature, .top_k = top_k, .top_p = top_p, .seed = seed,
                   .presence_penalty = presence_penalty, .frequency_penalty = frequency_penalty};
    rq.sampling.logit_bias = logit_bias;  // owned here until the engine is done
    if (!ignore_eos) rq.stop_ids = tok ? tok->eos_ids() : std::vector<int32_t>(cfg->eos_token_ids.begin(), cfg->eos_token_ids.end());
    auto results = (*engine)->generate(std::span<const GenerateRequest>(&rq, 1));
    if (!results.is_ok()) return fail(results.status());
    const GenerateResult& r = results->at(0);
    Result<std::string> text = std::string();
    if (tok) text = tok->decode(r.tokens);
    if (!text.is_ok()) return fail(text.status());
    const double prefill_tps = r.prefill_seconds > 0 ? r.prompt_tokens / r.prefill_seconds : 0;
    const double decode_steps = r.tokens.size() > 1 ? static_cast<double>(r.tokens.size() - 1) : 0;
    const double decode_tps = r.decode_seconds > 0 ? decode_steps / r.decode_seconds : 0;
    if (json) {
      nlohmann::json j;
      j["prompt_tokens"] = ids;
      j["tokens"] = r.tokens;
      j["text"] = *text;
      j["finish_reason"] = r.finish_reason;
      nlohmann::json steps = nlohmann::json::array();
      for (const auto& step : r.top) {
        nlohmann::json s = nlohmann::json::array();
        for (auto [id, logit] : step) s.push_back({{"id", id}, {"logit", logit}});
        steps.push_back(s);
      }
      j["top_logits"] = steps;
      j["prefill_tokens_per_s"] = prefill_tps;
      j["decode_tokens_per_s"] = decode_tps;
      j["prefill_seconds"] = r.prefill_seconds;
      j["decode_seconds"] = r.decode_seconds;
      std::cout << j.dump() << "\n";
    } else {
      std::cout << "tokens:";
      for (int32_t t : r.tokens) std::cout << ' ' << t;
      std::cout << "\ntext: " << *text << "\n";
      std::fprintf(stderr, "prompt %lld tokens, prefill %.1f tok/s, decode %.1f tok/s, finish %s\n",
                   static_cast<long long>(r.prompt_tokens), prefill_tps, decode_tps, r.finish_reason.c_str());
    }
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "k3-generate: %s\n", e.what());
    return 1;
  }
}
