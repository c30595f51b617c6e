#include "common/tokenizer/tokenizer.h"

#include <algorithm>
#include <array>
#include <charconv>
#include <fstream>
#include <limits>
#include <map>
#include <nlohmann/json.hpp>
#include <sstream>
#include <unordered_map>

#include "common/tokenizer/base64.h"
#include "common/tokenizer/bpe.h"
#include "common/tokenizer/chat_format.h"
#include "common/tokenizer/pretokenize.h"
#include "common/tokenizer/tokenizer_config.h"

namespace k3 {

struct Tokenizer::Impl {
  TokenTable table;                                   // the mergeable (BPE) tokens
  std::unordered_map<std::string, int32_t> special_by_text;
  std::map<int32_t, std::string> special_by_id;
  // Special texts grouped by first byte, longest first, so the scan tests few candidates.
  std::array<std::vector<std::pair<std::string, int32_t>>, 256> specials_by_first_byte;
  int32_t vocab_size = 0;
  std::optional<int32_t> bos;
  std::vector<int32_t> eos;
  ChatFormat chat;  // the config's chat_template, or the built-in renderer

  void encode_ordinary(std::string_view text, std::vector<int32_t>& out, BpeScratch& scratch) const {
    for (std::string_view piece : kimi_pretokenize(text)) bpe_encode(table, piece, out, scratch);
  }
};

namespace {

Result<std::string> read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return not_found("cannot open " + path);
  std::ostringstream ss;
  ss << in.rdbuf();
  if (in.bad()) return io_error("cannot read " + path);
  return ss.str();
}

// Parses "<base64 bytes> <rank>" lines; the rank is the token id.
Status load_ranks(const std::string& path, TokenTable& table, int32_t& max_rank) {
  K3_ASSIGN_OR_RETURN(const std::string text, read_file(path));
  std::vector<bool> seen;
  size_t line_no = 0;
  for (size_t pos = 0; pos < text.size();) {
    size_t eol = text.find('\n', pos);
    if (eol == std::string::npos) eol = text.size();
    std::string_view line(text.data() + pos, eol - pos);
    pos = eol + 1;
    ++line_no;
    if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
    if (line.empty()) continue;
    const auto where = [&] { return path + ":" + std::to_string(line_no) + ": "; };
    const size_t space = line.find(' ');
    if (space == std::string_view::npos) return invalid_argument(where() + "expected \"<base64> <rank>\"");
    const std::string_view b64 = line.substr(0, space), rank_text = line.substr(space + 1);
    const std::optional<std::string> bytes = base64::decode(b64);
    if (!bytes || bytes->empty()) return invalid_argument(where() + "bad base64 token \"" + std::string(b64) + "\"");
    int64_t rank = -1;
    const auto [end, ec] = std::from_chars(rank_text.data(), rank_text.data() + rank_text.size(), rank);
    if (ec != std::errc() || end != rank_text.data() + rank_text.size() || rank < 0 ||
        rank >= std::numeric_limits<int32_t>::max()) {
      return invalid_argument(where() + "bad rank \"" + std::string(rank_text) + "\"");
    }
    if (size_t(rank) >= seen.size()) seen.resize(size_t(rank) + 1);
    if (seen[rank]) return invalid_argument(where() + "duplicate rank " + std::to_string(rank));
    seen[rank] = true;
    if (!table.insert(*bytes, int32_t(rank))) {
      return invalid_argument(where() + "duplicate token bytes (base64 " + std::string(b64) + ")");
    }
    max_rank = std::max(max_rank, int32_t(rank));
  }
  if (table.size() == 0) return invalid_argument(path + ": no tokens");
  for (int b = 0; b < 256; ++b) {
    if (!table.find(std::string(1, char(b)))) {
      return invalid_argument(path + ": no token for the single byte " + std::to_string(b) +
                              " (byte-level BPE needs all 256)");
    }
  }
  return Status::ok();
}

// Every added token is special here, as in Kimi's tokenization_kimi.py (which hands them all to
// tiktoken as special tokens).
Status load_specials(const std::string& path, Tokenizer::Impl& impl, int32_t& max_id) {
  K3_ASSIGN_OR_RETURN(const std::string text, read_file(path));
  nlohmann::json config = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (config.is_discarded()) return invalid_argument(path + ": not valid JSON");
  if (!config.is_object()) return invalid_argument(path + ": expected a JSON object");
  const auto added = config.find("added_tokens_decoder");
  if (added == config.end()) return invalid_argument(path + ": missing \"added_tokens_decoder\"");
  if (!added->is_object()) return invalid_argument(path + ": \"added_tokens_decoder\" must be an object");
  for (const auto& [key, entry] : added->items()) {
    const std::string field = path + ": added_tokens_decoder[\"" + key + "\"]";
    int64_t id = -1;
    const auto [end, ec] = std::from_chars(key.data(), key.data() + key.size(), id);
    if (ec != std::errc() || end != key.data() + key.size() || id < 0 ||
        id >= std::numeric_limits<int32_t>::max()) {
      return invalid_argument(field + ": the key must be a token id");
    }
    if (!entry.is_object() || !entry.contains("content") || !entry["content"].is_string()) {
      return invalid_argument(field + ".content must be a string");
    }
    std::string content = entry["content"].get<std::string>();
    if (content.empty()) return invalid_argument(field + ".content is empty");
    if (impl.table.bytes_of(int32_t(id))) {
      return invalid_argument(field + ": id " + std::to_string(id) + " is also a tiktoken.model rank");
    }
    if (!impl.special_by_text.emplace(content, int32_t(id)).second) {
      return invalid_argument(field + ": \"" + content + "\" is listed twice");
    }
    impl.special_by_id.emplace(int32_t(id), content);
    max_id = std::max(max_id, int32_t(id));
  }
  const auto id_of = [&](const std::string& t) -> std::optional<int32_t> {
    const auto it = impl.special_by_text.find(t);
    return it == impl.special_by_text.end() ? std::nullopt : std::optional<int32_t>(it->second);
  };
  K3_ASSIGN_OR_RETURN(impl.chat, ChatFormat::from_tokenizer_config(config, path));
  impl.bos = id_of(config_token_text(config, "bos_token").value_or("[BOS]"));
  if (!impl.bos) impl.bos = id_of("[BOS]");
  for (const std::optional<std::string>& t :
       {std::optional<std::string>("[EOS]"), std::optional<std::string>("<|im_end|>"),
        config_token_text(config, "eos_token")}) {
    if (!t) continue;
    const std::optional<int32_t> id = id_of(*t);
    if (id && std::find(impl.eos.begin(), impl.eos.end(), *id) == impl.eos.end()) impl.eos.push_back(*id);
  }
  return Status::ok();
}

// Ids between the last rank and the last listed special that the config leaves out become
// "<|reserved_token_{id}|>", as Kimi's tokenization_kimi.py names them, so every id below the
// vocabulary size decodes.
void add_reserved_specials(Tokenizer::Impl& impl, int32_t max_rank, int32_t max_id) {
  for (int32_t id = max_rank + 1; id <= max_id; ++id) {
    if (impl.special_by_id.count(id)) continue;
    std::string text = "<|reserved_token_" + std::to_string(id) + "|>";
    if (!impl.special_by_text.emplace(text, id).second) continue;  // a listed token already has the name
    impl.special_by_id.emplace(id, std::move(text));
  }
}

void index_specials_for_matching(Tokenizer::Impl& impl) {
  for (const auto& [content, id] : impl.special_by_text) {
    impl.specials_by_first_byte[static_cast<uint8_t>(content[0])].emplace_back(content, id);
  }
  for (auto& bucket : impl.specials_by_first_byte) {
    std::sort(bucket.begin(), bucket.end(), [](const auto& a, const auto& b) {
      return a.first.size() != b.first.size() ? a.first.size() > b.first.size() : a.first < b.first;
    });
  }
}

}  // namespace

Tokenizer::Tokenizer() : impl_(std::make_unique<Impl>()) {}
Tokenizer::~Tokenizer() = default;
Tokenizer::Tokenizer(Tokenizer&&) noexcept = default;
Tokenizer& Tokenizer::operator=(Tokenizer&&) noexcept = default;

Result<Tokenizer> Tokenizer::load(const std::string& model_dir) {
  Tokenizer tok;
  int32_t max_rank = -1;
  K3_TRY(load_ranks(model_dir + "/tiktoken.model", tok.impl_->table, max_rank));
  int32_t max_id = max_rank;
  K3_TRY(load_specials(model_dir + "/tokenizer_config.json", *tok.impl_, max_id));
  add_reserved_specials(*tok.impl_, max_rank, max_id);
  index_specials_for_matching(*tok.impl_);
  tok.impl_->vocab_size = max_id + 1;
  return tok;
}

const ChatFormat& Tokenizer::chat_format() const { return impl_->chat; }

std::vector<int32_t> Tokenizer::encode(std::string_view text, bool allow_special) const {
  std::vector<int32_t> out;
  out.reserve(text.size() / 3 + 4);
  BpeScratch scratch;
  if (!allow_special || impl_->special_by_text.empty()) {
    impl_->encode_ordinary(text, out, scratch);
    return out;
  }
  size_t plain_start = 0;
  for (size_t i = 0; i < text.size();) {
    const auto& bucket = impl_->specials_by_first_byte[static_cast<uint8_t>(text[i])];
    const std::pair<std::string, int32_t>* hit = nullptr;
    for (const auto& special : bucket) {
      if (text.substr(i).starts_with(special.first)) {
        hit = &special;
        break;
      }
    }
    if (!hit) {
      ++i;
      continue;
    }
    impl_->encode_ordinary(text.substr(plain_start, i - plain_start), out, scratch);
    out.push_back(hit->second);
    i += hit->first.size();
    plain_start = i;
  }
  impl_->encode_ordinary(text.substr(plain_start), out, scratch);
  return out;
}

Result<std::string> Tokenizer::decode_bytes(std::span<const int32_t> ids) const {
  std::string out;
  for (size_t k = 0; k < ids.size(); ++k) {
    const int32_t id = ids[k];
    if (id < 0 || id >= impl_->vocab_size) {
      return Status(Code::OutOfRange, "ids[" + std::to_string(k) + "] = " + std::to_string(id) +
                                          " is outside the vocabulary [0, " +
                                          std::to_string(impl_->vocab_size) + ")");
    }
    if (const std::optional<std::string_view> bytes = impl_->table.bytes_of(id)) {
      out.append(*bytes);
    } else if (const auto it = impl_->special_by_id.find(id); it != impl_->special_by_id.end()) {
      out.append(it->second);
    } else {
      return Status(Code::OutOfRange, "ids[" + std::to_string(k) + "] = " + std::to_string(id) +
                                          " is not assigned to any token");
    }
  }
  return out;
}

Result<std::string> Tokenizer::decode(std::span<const int32_t> ids) const {
  K3_ASSIGN_OR_RETURN(std::string bytes, decode_bytes(ids));
  return sanitize_utf8(bytes);
}

int Tokenizer::vocab_size() const { return impl_->vocab_size; }
bool Tokenizer::assigns(int32_t id) const {
  return id >= 0 && id < impl_->vocab_size && (impl_->table.bytes_of(id) || impl_->special_by_id.count(id) != 0);
}

std::optional<int32_t> Tokenizer::special_id(std::string_view text) const {
  const auto it = impl_->special_by_text.find(std::string(text));
  if (it == impl_->special_by_text.end()) return std::nullopt;
  return it->second;
}

bool Tokenizer::is_special(int32_t id) const { return impl_->special_by_id.count(id) != 0; }

std::vector<int32_t> Tokenizer::eos_ids() const { return impl_->eos; }

std::optional<int32_t> Tokenizer::bos_id() const { return impl_->bos; }

}  // namespace k3
