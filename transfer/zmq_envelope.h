// The control-plane envelope: the first ZeroMQ frame of every control message says who sent it
// (logical name + incarnation) and what it is; a DATA envelope is followed by exactly one payload
// frame carrying a protocol message (common/protocol/frame.h).
//
//   byte 0        4     5      6          8                16       18
//        +--------+-----+------+----------+----------------+--------+--------------+
//        | magic  | ver | kind | reserved |  incarnation   | namelen| name bytes   |
//        | "K3CP" | u8  |  u8  | u16 = 0  |      u64       |  u16   | (namelen)    |
//        +--------+-----+------+----------+----------------+--------+--------------+
//
// Little-endian. kind: 1 HEARTBEAT, 2 DATA, 3 BYE (graceful close). The incarnation is a random
// 64-bit id drawn when the process's channel starts: the same name with a new incarnation means the
// peer restarted, and everything held for the old one is dead. Decoding is strict: wrong magic,
// version, kind, a reserved bit, a name length that disagrees with the frame size, an empty name or
// more than kMaxNameBytes is an error naming the field.
#pragma once
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "common/core/status.h"

namespace k3::transfer {

inline constexpr uint32_t kEnvelopeMagic = 0x5043334Bu;  // bytes "K3CP" read as u32 LE
inline constexpr uint8_t kEnvelopeVersion = 1;
inline constexpr size_t kEnvelopeHeaderBytes = 18;
inline constexpr size_t kMaxNameBytes = 256;

enum class EnvelopeKind : uint8_t { Heartbeat = 1, Data = 2, Bye = 3 };

struct Envelope {
  EnvelopeKind kind = EnvelopeKind::Heartbeat;
  uint64_t incarnation = 0;
  std::string name;
  bool operator==(const Envelope&) const = default;
};

std::vector<uint8_t> encode_envelope(const Envelope& e);
Result<Envelope> decode_envelope(std::span<const uint8_t> bytes);

}  // namespace k3::transfer
