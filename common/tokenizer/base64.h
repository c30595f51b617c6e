// Standard base64 (RFC 4648 alphabet, '=' padding), as used by tiktoken.model files.
#pragma once
#include <optional>
#include <string>
#include <string_view>

namespace k3::base64 {

std::string encode(std::string_view bytes);
// Strict: the length must be a multiple of 4 and '=' may only pad the end; nullopt otherwise.
std::optional<std::string> decode(std::string_view text);

}  // namespace k3::base64
