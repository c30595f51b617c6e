// Learns BPE merges from a corpus, deterministically (used to build the tiny test tokenizer).
#pragma once
#include <string>
#include <string_view>
#include <vector>

namespace k3 {

// Starts from the 256 single bytes and repeatedly merges the most frequent adjacent pair inside
// the Kimi pre-tokenizer's pieces (ties: the pair with the smaller (left id, right id) wins).
// Returns the new tokens' bytes in merge order, at most `max_new_tokens` of them; a merge whose
// bytes already exist as a token is applied but adds nothing. Same input, same output.
std::vector<std::string> learn_bpe_merges(std::string_view corpus, int max_new_tokens);

}  // namespace k3
