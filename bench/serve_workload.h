// The prompt sets of `k3-bench serve --workload`:
//   random         each prompt a fresh random length in --input-len (the default);
//   shared-prefix  one system prompt (--system-len tokens) and multi-turn chats on it: turn t of a chat
//                  resends the system prompt and the chat's earlier user turns, then a new user turn
//                  (--input-len); the answers are not resent (the bench does not read their token ids);
//   unique         the shared-prefix prompts' lengths, with every token fresh (nothing to reuse).
#pragma once
#include <cstdint>
#include <string>
#include <vector>

namespace k3::bench {

struct WorkloadOptions {
  std::string kind = "random";
  int requests = 8;
  int input_min = 16, input_max = 128;
  int system_len = 2048;
  int turns = 4;               // turns per chat (shared-prefix, unique)
  int token_id_max = 256;
  uint64_t seed = 0;
};

// Prompts in the order they are sent; throws std::invalid_argument naming a bad option.
std::vector<std::vector<int32_t>> make_workload(const WorkloadOptions& o);

}  // namespace k3::bench
