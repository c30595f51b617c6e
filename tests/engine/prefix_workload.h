// The randomized prefix-cache workload of the token-exact tests (CPU: engine.test_prefix_exact, GPU:
// cuda.test_cuda_prefix_cache): shared system prompts of random lengths, branches, multi-turn chats that
// resend the previous answer, batches of several requests, greedy and seeded sampling, and evictions
// under a tight budget; the engine with the cache on must give the tokens of the engine with it off.
#pragma once
#include <catch2/catch.hpp>

#include "tests/engine/model_fixture.h"

namespace k3::test {

struct PrefixWorkload {
  std::mt19937 rng;
  int vocab;
  std::vector<std::vector<int32_t>> systems;      // shared prefixes
  std::vector<std::vector<int32_t>> chats;        // open conversations (prompt + answers so far)
  PrefixWorkload(uint32_t seed, int vocab_size) : rng(seed), vocab(vocab_size) {
    for (int i = 0; i < 5; ++i) {
      std::uniform_int_distribution<int> len(20, 330);
      systems.push_back(random_tokens(rng, len(rng), vocab));
    }
  }
  int pick(int n) { return std::uniform_int_distribution<int>(0, n - 1)(rng); }
  // A new prompt: a fresh chat on a shared prefix (a branch), the next turn of an open chat, or unique.
  std::pair<std::vector<int32_t>, int> next() {
    const int kind = pick(10);
    std::vector<int32_t> p;
    int chat = -1;
    if (kind < 5 || chats.empty()) {
      p = systems[pick(static_cast<int>(systems.size()))];
      // Branch mid-prefix sometimes: a prompt that shares only part of a system prompt.
      if (pick(4) == 0) p.resize(std::max<size_t>(1, p.size() * (1 + pick(3)) / 4));
    } else if (kind < 9) {
      chat = pick(static_cast<int>(chats.size()));
      p = chats[chat];
    }
    auto user = random_tokens(rng, 1 + pick(60), vocab);
    p.insert(p.end(), user.begin(), user.end());
    if (p.size() > 700) {   // keep prompts bounded: start the chat over
      p.resize(700);
      chat = -1;
    }
    return {p, chat};
  }
};

// Runs `total` requests of the workload through two engines on `backend`, cache off and on, and
// checks the same tokens, real reuse and evictions, and every byte back after a flush. `weights`:
// F32 on the CPU, BF16 on a GPU (its compute dtype). `cfg`: k3-tiny unless given (its vocabulary is
// replaced by the test's).
inline void run_prefix_workload(Backend& backend, DType weight_dtype, int total,
                                ModelConfig cfg = tiny_config("k3-tiny")) {
  cfg.vocab_size = tiny_config("k3-tiny").vocab_size;
  cfg.eos_token_ids.clear();
  WeightStore weights = random_weights(cfg, 21, weight_dtype);
  EngineOptions off = engine_options(/*chunk=*/128, /*max_seqs=*/4);
  off.cache.num_pages = 256;
  off.top_logits = 0;
  EngineOptions on = off;
  on.cache.checkpoint_slots = 8;
  on.prefix_cache.enabled = true;
  on.prefix_cache.block_tokens = 64;
  on.prefix_cache.checkpoint_every = 2;
  auto e_off = Engine::create(backend, cfg, weights, off).value();
  auto e_on = Engine::create(backend, cfg, weights, on).value();
  CachePools& pools = e_on->caches();
  PrefixCache& cache = *e_on->prefix_cache();
  // Tight: five checkpoints' and 60 pages' worth, far below the workload's prefixes.
  cache.set_budget_bytes(5 * pools.slot_bytes() + 60 * pools.page_bytes());
  auto free_bytes = [&] {
    return uint64_t(pools.free_slots()) * pools.slot_bytes() + uint64_t(pools.free_pages()) * pools.page_bytes();
  };
  const uint64_t start_bytes = free_bytes();

  PrefixWorkload w(7, cfg.vocab_size);
  int done = 0, mismatches = 0;
  uint64_t seed = 1;
  while (done < total) {
    const int batch = 1 + w.pick(3);
    std::vector<GenerateRequest> reqs;
    std::vector<int> chat_of;
    for (int i = 0; i < batch && done + i < total; ++i) {
      auto [prompt, chat] = w.next();
      GenerateRequest r;
      r.prompt = prompt;
      r.max_tokens = 1 + w.pick(6);
      if (w.pick(2)) r.sampling = {.temperature = 0.9f, .top_k = 20, .top_p = 0.9f, .seed = seed++};
      reqs.push_back(r);
      chat_of.push_back(chat);
    }
    auto a = e_off->generate(reqs).value();
    auto b = e_on->generate(reqs).value();
    for (size_t i = 0; i < reqs.size(); ++i) {
      if (a[i].tokens != b[i].tokens) ++mismatches;
      // The chat continues with this answer (or a new chat opens).
      std::vector<int32_t> next = reqs[i].prompt;
      next.insert(next.end(), a[i].tokens.begin(), a[i].tokens.end());
      if (chat_of[i] >= 0) w.chats[chat_of[i]] = next;
      else if (w.chats.size() < 12) w.chats.push_back(next);
      else w.chats[w.pick(12)] = next;
    }
    done += static_cast<int>(reqs.size());
  }
  const PrefixCacheStats& st = cache.stats();
  INFO("requests " << total << " lookup " << st.lookup_tokens << " hit " << st.hit_tokens << " stored "
                   << st.checkpoints_stored << " evicted " << st.checkpoints_evicted);
  REQUIRE(mismatches == 0);
  REQUIRE(st.hit_tokens > st.lookup_tokens / 10);    // the workload does reuse
  REQUIRE(st.checkpoints_evicted > 0);               // and the budget does bite
  REQUIRE(cache.tree().bytes() <= cache.options().budget_bytes);
  cache.flush();
  REQUIRE(free_bytes() == start_bytes);
}

}  // namespace k3::test
