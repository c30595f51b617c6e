// The built-in training text for the tiny tokenizer: English prose, chat turns, C++ and Python
// code and a little Chinese, so the learned merges cover what the tiny-model tests feed it.
#pragma once
#include <string_view>

namespace k3 {

std::string_view tiny_tokenizer_corpus();

}  // namespace k3
