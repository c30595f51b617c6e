// Frame encoder/decoder (layout drawn in frame.h). Both directions walk the same field lists
// (message_fields.h); the decoder fills a fresh message and hands it out only when every check passed.
#include "common/protocol/frame.h"

#include <bit>
#include <cstdio>
#include <string>
#include <type_traits>

#include "common/protocol/message_fields.h"

namespace k3::protocol {
namespace {

template <class T> struct is_vector : std::false_type {};
template <class T> struct is_vector<std::vector<T>> : std::true_type {};

template <class T>
constexpr bool is_scalar_v = std::is_integral_v<T> || std::is_floating_point_v<T> || std::is_enum_v<T>;

// Smallest number of wire bytes one T can take: bounds vector counts before any allocation.
template <class T> constexpr size_t min_wire_bytes() {
  if constexpr (std::is_same_v<T, bool> || std::is_enum_v<T>) return 1;
  else if constexpr (is_scalar_v<T>) return sizeof(T);
  else if constexpr (std::is_same_v<T, std::string> || is_vector<T>::value) return 4;
  else return 1;
}

class Writer {
 public:
  explicit Writer(std::vector<uint8_t>& out) : out_(out) {}

  template <class T> void operator()(const char*, const T& v) { put(v); }

  void put_u(uint64_t v, size_t bytes) {
    for (size_t i = 0; i < bytes; ++i) out_.push_back(uint8_t(v >> (8 * i)));
  }
  template <class T> void put(const T& v) {
    if constexpr (std::is_same_v<T, bool>) put_u(v ? 1 : 0, 1);
    else if constexpr (std::is_enum_v<T>) put_u(static_cast<uint8_t>(v), 1);
    else if constexpr (std::is_same_v<T, float>) put_u(std::bit_cast<uint32_t>(v), 4);
    else if constexpr (std::is_integral_v<T>) put_u(static_cast<std::make_unsigned_t<T>>(v), sizeof(T));
    else if constexpr (std::is_same_v<T, std::string>) {
      put_u(v.size(), 4);
      out_.insert(out_.end(), v.begin(), v.end());
    } else if constexpr (is_vector<T>::value) {
      put_u(v.size(), 4);
      for (const auto& e : v) put(e);
    } else {
      fields::visit(*this, v);
    }
  }

 private:
  std::vector<uint8_t>& out_;
};

// Reads fields; the first failure is kept (with the field path) and every later read does nothing.
class Reader {
 public:
  Reader(std::span<const uint8_t> in, const char* msg) : in_(in), msg_(msg) {}

  template <class T> void operator()(const char* name, T& v) {
    if (!ok()) return;
    path_.push_back(name);
    get(v);
    path_.pop_back();
  }

  bool ok() const { return error_.empty(); }
  size_t remaining() const { return in_.size() - pos_; }
  const std::string& error() const { return error_; }

  template <class T> void get(T& v) {
    if constexpr (std::is_same_v<T, bool>) {
      uint64_t b = 0;
      if (!get_u(b, 1)) return;
      if (b > 1) return fail("bool value " + std::to_string(b) + " is not 0 or 1");
      v = b == 1;
    } else if constexpr (std::is_enum_v<T>) {
      uint64_t b = 0;
      if (!get_u(b, 1)) return;
      if (b > fields::enum_max<T>())
        return fail("enum value " + std::to_string(b) + " out of range (max " +
                    std::to_string(fields::enum_max<T>()) + ")");
      v = static_cast<T>(b);
    } else if constexpr (std::is_same_v<T, float>) {
      uint64_t b = 0;
      if (get_u(b, 4)) v = std::bit_cast<float>(uint32_t(b));
    } else if constexpr (std::is_integral_v<T>) {
      uint64_t b = 0;
      if (get_u(b, sizeof(T))) v = static_cast<T>(static_cast<std::make_unsigned_t<T>>(b));
    } else if constexpr (std::is_same_v<T, std::string>) {
      uint64_t n = 0;
      if (!get_count(n, 1)) return;
      v.assign(reinterpret_cast<const char*>(in_.data() + pos_), n);
      pos_ += n;
    } else if constexpr (is_vector<T>::value) {
      using E = typename T::value_type;
      uint64_t n = 0;
      if (!get_count(n, min_wire_bytes<E>())) return;
      v.clear();
      v.reserve(n);
      for (uint64_t i = 0; i < n && ok(); ++i) {
        E e{};
        get(e);
        v.push_back(std::move(e));
      }
    } else {
      fields::visit(*this, v);
    }
  }

  void fail(const std::string& why) {
    if (!ok()) return;
    std::string p;
    for (const char* s : path_) p += (p.empty() ? "" : ".") + std::string(s);
    error_ = std::string(msg_) + (p.empty() ? "" : "." + p) + ": " + why;
  }

 private:
  bool get_u(uint64_t& v, size_t bytes) {
    if (remaining() < bytes) {
      fail("truncated: need " + std::to_string(bytes) + " bytes, " + std::to_string(remaining()) + " left");
      return false;
    }
    v = 0;
    for (size_t i = 0; i < bytes; ++i) v |= uint64_t(in_[pos_ + i]) << (8 * i);
    pos_ += bytes;
    return true;
  }
  // A count of elements that each take at least `min_bytes`: must fit in what is left.
  bool get_count(uint64_t& n, size_t min_bytes) {
    if (!get_u(n, 4)) return false;
    if (n * min_bytes > remaining()) {
      fail("count " + std::to_string(n) + " exceeds the " + std::to_string(remaining()) + " bytes left");
      return false;
    }
    return true;
  }

  std::span<const uint8_t> in_;
  size_t pos_ = 0;
  const char* msg_;
  std::vector<const char*> path_;
  std::string error_;
};

uint32_t read_u32(const uint8_t* p) { return p[0] | p[1] << 8 | p[2] << 16 | uint32_t(p[3]) << 24; }

template <size_t I = 0>
Result<Message> decode_payload(MsgType type, std::span<const uint8_t> payload) {
  if constexpr (I == std::variant_size_v<Message>) {
    return invalid_argument("frame: unknown message type " + std::to_string(int(type)));
  } else {
    if (static_cast<size_t>(type) != I + 1) return decode_payload<I + 1>(type, payload);
    std::variant_alternative_t<I, Message> m{};
    Reader r(payload, msg_type_name(type));
    r.get(m);
    if (r.ok() && r.remaining() != 0)
      r.fail(std::to_string(r.remaining()) + " trailing bytes after the last field");
    if (!r.ok()) return invalid_argument(r.error());
    return Message(std::move(m));
  }
}

}  // namespace

std::vector<uint8_t> encode(const Message& m) {
  std::vector<uint8_t> out;
  Writer w(out);
  w.put_u(kWireMagic, 4);
  w.put_u(kWireVersion, 2);
  w.put_u(static_cast<uint8_t>(type_of(m)), 1);
  w.put_u(0, 1);  // flags
  w.put_u(0, 4);  // payload length, patched below
  std::visit([&](const auto& msg) { w.put(msg); }, m);
  const uint64_t len = out.size() - kFrameHeaderBytes;
  K3_CHECK(len <= UINT32_MAX, "message payload over 4 GiB");
  for (int i = 0; i < 4; ++i) out[8 + i] = uint8_t(len >> (8 * i));
  return out;
}

Result<FrameHeader> decode_header(std::span<const uint8_t> frame) {
  if (frame.size() < kFrameHeaderBytes)
    return invalid_argument("frame: " + std::to_string(frame.size()) + " bytes is shorter than the " +
                            std::to_string(kFrameHeaderBytes) + "-byte header");
  FrameHeader h;
  h.magic = read_u32(frame.data());
  if (h.magic != kWireMagic) return invalid_argument("frame: bad magic (not a K3WF frame)");
  h.version = uint16_t(frame[4] | frame[5] << 8);
  if (h.version != kWireVersion)
    return invalid_argument("frame: unsupported version " + std::to_string(h.version) + " (this build speaks " +
                            std::to_string(kWireVersion) + ")");
  const uint8_t type = frame[6];
  if (type == 0 || type > kMaxMsgType)
    return invalid_argument("frame: unknown message type " + std::to_string(type));
  h.type = static_cast<MsgType>(type);
  h.flags = frame[7];
  if (h.flags & ~kKnownFlags)
    return invalid_argument(std::string("frame: ") + msg_type_name(h.type) + ": unknown flag bits 0x" +
                            [](uint8_t f) { char b[8]; std::snprintf(b, sizeof b, "%02x", f); return std::string(b); }(h.flags));
  h.payload_length = read_u32(frame.data() + 8);
  const uint64_t have = frame.size() - kFrameHeaderBytes;
  if (have < h.payload_length)
    return invalid_argument(std::string("frame: ") + msg_type_name(h.type) + ": truncated: payload length " +
                            std::to_string(h.payload_length) + ", " + std::to_string(have) + " bytes present");
  if (have > h.payload_length)
    return invalid_argument(std::string("frame: ") + msg_type_name(h.type) + ": " +
                            std::to_string(have - h.payload_length) + " trailing bytes after the payload");
  return h;
}

Result<Message> decode(std::span<const uint8_t> frame) {
  K3_ASSIGN_OR_RETURN(FrameHeader h, decode_header(frame));
  return decode_payload(h.type, frame.subspan(kFrameHeaderBytes));
}

}  // namespace k3::protocol
