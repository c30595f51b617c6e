// Hashes of a prompt's whole blocks, chained (block i's hash covers blocks 0..i): the names a prefix
// cache reports for what it holds and a router matches prompts against (KV-aware placement). Defined
// once here so the cache and the router agree bit for bit.
#pragma once
#include <cstdint>
#include <span>
#include <vector>

namespace k3 {

// One hash per whole block of `block_tokens` tokens (a trailing partial block has none).
inline std::vector<uint64_t> prefix_block_hashes(std::span<const int32_t> tokens, int block_tokens) {
  std::vector<uint64_t> out;
  if (block_tokens <= 0) return out;
  uint64_t h = 1469598103934665603ull;   // FNV-1a over the ids' bytes, carried from block to block
  const size_t blocks = tokens.size() / static_cast<size_t>(block_tokens);
  for (size_t b = 0; b < blocks; ++b) {
    for (size_t i = b * block_tokens; i < (b + 1) * block_tokens; ++i) {
      const uint32_t t = static_cast<uint32_t>(tokens[i]);
      for (int k = 0; k < 4; ++k) {
        h ^= (t >> (8 * k)) & 0xff;
        h *= 1099511628211ull;
      }
    }
    out.push_back(h);
  }
  return out;
}

}  // namespace k3
