#include "transfer/zmq_envelope.h"

namespace k3::transfer {

namespace {
void put_le(std::vector<uint8_t>& out, uint64_t v, int bytes) {
  for (int i = 0; i < bytes; ++i) out.push_back(static_cast<uint8_t>(v >> (8 * i)));
}
uint64_t get_le(std::span<const uint8_t> in, size_t off, int bytes) {
  uint64_t v = 0;
  for (int i = 0; i < bytes; ++i) v |= uint64_t{in[off + i]} << (8 * i);
  return v;
}
}  // namespace

std::vector<uint8_t> encode_envelope(const Envelope& e) {
  std::vector<uint8_t> out;
  out.reserve(kEnvelopeHeaderBytes + e.name.size());
  put_le(out, kEnvelopeMagic, 4);
  put_le(out, kEnvelopeVersion, 1);
  put_le(out, static_cast<uint8_t>(e.kind), 1);
  put_le(out, 0, 2);
  put_le(out, e.incarnation, 8);
  put_le(out, e.name.size(), 2);
  out.insert(out.end(), e.name.begin(), e.name.end());
  return out;
}

Result<Envelope> decode_envelope(std::span<const uint8_t> in) {
  if (in.size() < kEnvelopeHeaderBytes)
    return invalid_argument("envelope: " + std::to_string(in.size()) + " bytes, shorter than the 18-byte header");
  if (get_le(in, 0, 4) != kEnvelopeMagic) return invalid_argument("envelope.magic is not \"K3CP\"");
  if (in[4] != kEnvelopeVersion) return invalid_argument("envelope.version " + std::to_string(in[4]) + " is unknown");
  const uint8_t kind = in[5];
  if (kind < 1 || kind > 3) return invalid_argument("envelope.kind " + std::to_string(kind) + " is unknown");
  if (get_le(in, 6, 2) != 0) return invalid_argument("envelope.reserved must be 0");
  const size_t name_len = get_le(in, 16, 2);
  if (name_len == 0 || name_len > kMaxNameBytes)
    return invalid_argument("envelope.namelen " + std::to_string(name_len) + " is outside 1..256");
  if (in.size() != kEnvelopeHeaderBytes + name_len)
    return invalid_argument("envelope: size " + std::to_string(in.size()) + " disagrees with namelen " +
                            std::to_string(name_len));
  Envelope e;
  e.kind = static_cast<EnvelopeKind>(kind);
  e.incarnation = get_le(in, 8, 8);
  e.name.assign(reinterpret_cast<const char*>(in.data() + kEnvelopeHeaderBytes), name_len);
  return e;
}

}  // namespace k3::transfer
