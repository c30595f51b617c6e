#include "router/text_stream.h"

#include <algorithm>

#include "common/tokenizer/tokenizer.h"

namespace k3::router {

TextStream::TextStream(DecodeBytes decode, std::vector<std::string> stop_strings, std::function<bool(int32_t)> hidden)
    : decode_(std::move(decode)), stops_(std::move(stop_strings)), hidden_(std::move(hidden)) {
  std::erase_if(stops_, [](const std::string& s) { return s.empty(); });
}

TextStream tokenizer_text_stream(std::shared_ptr<const Tokenizer> tok, std::vector<std::string> stop_strings,
                                 std::vector<int32_t> stop_ids) {
  return TextStream([tok](int32_t id) { return tok->decode_bytes(std::span<const int32_t>(&id, 1)); },
                    std::move(stop_strings), [tok, stop_ids = std::move(stop_ids)](int32_t id) {
                      return tok->is_special(id) || !tok->assigns(id) ||
                             std::find(stop_ids.begin(), stop_ids.end(), id) != stop_ids.end();
                    });
}

size_t held_stop_prefix(const std::string& text, const std::vector<std::string>& stops) {
  size_t best = 0;
  for (const std::string& stop : stops)
    for (size_t len = std::min(stop.size() - 1, text.size()); len > best; --len)
      if (text.compare(text.size() - len, len, stop, 0, len) == 0) {
        best = len;
        break;
      }
  return best;
}

size_t incomplete_utf8_tail(const std::string& s) {
  // Walk back over at most 3 continuation bytes to the lead byte and compare the length it announces.
  for (size_t back = 1; back <= std::min<size_t>(4, s.size()); ++back) {
    const auto c = static_cast<unsigned char>(s[s.size() - back]);
    if ((c & 0xC0) == 0x80) continue;  // continuation byte
    const size_t need = (c & 0xE0) == 0xC0 ? 2 : (c & 0xF0) == 0xE0 ? 3 : (c & 0xF8) == 0xF0 ? 4 : 1;
    return need > back ? back : 0;
  }
  return 0;
}

std::string TextStream::take(size_t end) {
  std::string out = sanitize_utf8(std::string_view(bytes_).substr(emitted_, end - emitted_));
  emitted_ = end;
  return out;
}

Result<std::string> TextStream::push(int32_t id) {
  if (stopped_) return std::string();
  if (hidden_ && hidden_(id)) return std::string();
  K3_ASSIGN_OR_RETURN(std::string piece, decode_(id));
  bytes_ += piece;
  // A stop string can only start at or after emitted_: every emitted byte was checked not to begin one.
  size_t first = std::string::npos;
  for (const std::string& stop : stops_) first = std::min(first, bytes_.find(stop, emitted_));
  if (first != std::string::npos) {
    stopped_ = true;
    return take(first);
  }
  const std::string pending = bytes_.substr(emitted_);
  const size_t hold = std::max(held_stop_prefix(pending, stops_), incomplete_utf8_tail(pending));
  return take(bytes_.size() - hold);
}

std::string TextStream::flush() {
  if (stopped_) return {};
  return take(bytes_.size());
}

}  // namespace k3::router
