// The binary frame every control-plane message travels in (docs/STYLE.md habit 8: drawn here, decoded strictly).
//
//   byte 0        4        6      7      8                 12
//        +--------+--------+------+------+-----------------+--------------------------+
//        | magic  |version | type |flags | payload length  | payload (length bytes)   |
//        | "K3WF" |  u16   |  u8  |  u8  |      u32        | fields of the message    |
//        +--------+--------+------+------+-----------------+--------------------------+
//
// All integers little-endian. magic = 0x4B 0x33 0x57 0x46 ("K3WF"). version = kWireVersion.
// type = MsgType (1..kMaxMsgType). flags: no flag is defined yet; every bit is reserved and must be 0.
// Payload fields in declaration order (messages.h):
//   u8/u16/u32/u64/i32  fixed width;  bool = u8 0|1;  f32 = IEEE-754 bits as u32;
//   enum                = u8, range-checked;
//   string / bytes      = u32 count + count bytes;
//   vector<T>           = u32 count + count elements;
//   struct              = its fields in order.
// A frame is exactly 12 + length bytes: short input, a length that disagrees with the input size, bytes
// left over after the payload's last field, an unknown version/type/flag bit or an out-of-range enum is
// an error Status naming the message and field. Decoding never reads past the input and never allocates
// more than the input could describe (counts are checked against the bytes that remain).
#pragma once
#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "common/core/status.h"
#include "common/protocol/messages.h"

namespace k3::protocol {

inline constexpr uint32_t kWireMagic = 0x4657334Bu;  // bytes "K3WF" read as u32 LE
inline constexpr uint16_t kWireVersion = 8;        // 2: HEARTBEAT carries the decode room; 3: trace id, logprobs; 4: output_format;
                                                   // 5: output_format "tool_calls:<spec>", region worker address, prefill prefix-cache report in HEARTBEAT;
                                                   // 6: n choices (SamplingParams.n, COMPUTE_DONE's other first tokens, TOKENS.choice), prompts_prefilled;
                                                   // 7: COMPUTE_DONE.streaming (addresses at a stage's first chunk);
                                                   // 8: the prefill stage's unified cache region in its prefix-cache report
inline constexpr size_t kFrameHeaderBytes = 12;
inline constexpr uint8_t kKnownFlags = 0;            // mask of defined flag bits (none yet)

struct FrameHeader {
  uint32_t magic = kWireMagic;
  uint16_t version = kWireVersion;
  MsgType type = MsgType::Heartbeat;
  uint8_t flags = 0;
  uint32_t payload_length = 0;
};

// Encodes one message into a complete frame.
std::vector<uint8_t> encode(const Message& m);

// Decodes one complete frame. On error returns a Status naming the cause; nothing else is touched.
Result<Message> decode(std::span<const uint8_t> frame);

// Header only (for routing / logging before a full decode). Same checks as decode() for the header.
Result<FrameHeader> decode_header(std::span<const uint8_t> frame);

}  // namespace k3::protocol
