#include "common/tokenizer/tiny_tokenizer.h"

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string_view>

#include "common/tokenizer/base64.h"
#include "common/tokenizer/bpe_train.h"
#include "common/tokenizer/kimi_chat_template.h"
#include "common/tokenizer/tiny_tokenizer_corpus.h"

namespace k3 {
namespace {

// The Kimi special tokens in the order of their real ids (163584 + k), placed right after the
// tiny regular vocabulary.
constexpr std::string_view kSpecials[] = {
    "[BOS]",
    "[EOS]",
    "<|im_end|>",
    "<|im_user|>",
    "<|im_assistant|>",
    "<|start_header_id|>",
    "<|end_header_id|>",
    "[EOT]",
    "<|im_system|>",
    "<|tool_calls_section_begin|>",
    "<|tool_calls_section_end|>",
    "<|tool_call_begin|>",
    "<|tool_call_argument_begin|>",
    "<|tool_call_end|>",
    "<|im_middle|>",
    "[UNK]",
    "[PAD]",
};
constexpr int kNumSpecials = int(std::size(kSpecials));
constexpr int kVocabSize = 512;  // 256 bytes + learned merges + specials

Status write_text(const std::filesystem::path& path, const std::string& text) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  if (!out) return io_error("cannot create " + path.string());
  out << text;
  out.close();
  if (!out) return io_error("cannot write " + path.string());
  return Status::ok();
}

}  // namespace

Result<int> write_tiny_tokenizer(const std::string& dir) {
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) return io_error("cannot create directory " + dir + ": " + ec.message());

  const std::vector<std::string> merges = learn_bpe_merges(tiny_tokenizer_corpus(), kVocabSize - 256 - kNumSpecials);
  std::string model;
  int id = 0;
  for (; id < 256; ++id) model += base64::encode(std::string(1, char(id))) + " " + std::to_string(id) + "\n";
  for (const std::string& bytes : merges) model += base64::encode(bytes) + " " + std::to_string(id++) + "\n";

  nlohmann::json added = nlohmann::json::object();
  for (std::string_view special : kSpecials) {
    added[std::to_string(id++)] = {{"content", std::string(special)}, {"lstrip", false}, {"normalized", false},
                                   {"rstrip", false},  {"single_word", false}, {"special", true}};
  }
  const nlohmann::json config = {
      {"added_tokens_decoder", added}, {"bos_token", "[BOS]"},  {"eos_token", "[EOS]"},
      {"pad_token", "[PAD]"},          {"unk_token", "[UNK]"},  {"tokenizer_class", "TikTokenTokenizer"},
      {"model_max_length", 1048576},
      // The family's turn format as a Jinja template, so a generated model is served through the
      // template engine exactly as a downloaded checkpoint is.
      {"chat_template", std::string(kimi_chat_template_jinja())},
  };
  const std::filesystem::path root(dir);
  K3_TRY(write_text(root / "tiktoken.model", model));
  K3_TRY(write_text(root / "tokenizer_config.json", config.dump(2) + "\n"));
  return id;
}

}  // namespace k3
