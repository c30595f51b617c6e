#include "decode_node/group_command.h"

#include <cstring>
#include <string>

#include "common/protocol/frame.h"

namespace k3::decode {
namespace {

constexpr uint32_t kSizeTag = 0x6b3001, kCommandTag = 0x6b3002, kLogitsTag = 0x6b3003, kRegionRequestTag = 0x6b3004,
                   kRegionSizeTag = 0x6b3005, kRegionTag = 0x6b3006, kRoomTag = 0x6b3007, kLivenessSizeTag = 0x6b3008,
                   kLivenessTag = 0x6b3009;
constexpr uint64_t kMaxEndpointBytes = 512;

struct Writer {
  std::vector<std::byte> out;
  template <class T>
  void put(const T& v) {
    const auto* p = reinterpret_cast<const std::byte*>(&v);
    out.insert(out.end(), p, p + sizeof(T));
  }
  void bytes(const std::vector<uint8_t>& b) {
    put<uint64_t>(b.size());
    const auto* p = reinterpret_cast<const std::byte*>(b.data());
    out.insert(out.end(), p, p + b.size());
  }
};

struct Reader {
  std::span<const std::byte> in;
  size_t at = 0;
  const char* message = "group command";  // what is read, for the errors
  template <class T>
  Status get(T& v, const char* what) {
    if (in.size() - at < sizeof(T)) return invalid_argument(std::string(message) + " truncated at " + what);
    std::memcpy(&v, in.data() + at, sizeof(T));
    at += sizeof(T);
    return Status::ok();
  }
  Status count(uint64_t& n, size_t min_item, const char* what) {
    K3_TRY(get(n, what));
    if (min_item > 0 && n > (in.size() - at) / min_item)
      return invalid_argument(std::string(message) + ": " + what + " count " + std::to_string(n) + " exceeds the message");
    return Status::ok();
  }
};

// A message of any size over the group's Comm: its size (under size_tag), then its bytes (under tag).
Status send_sized(Comm& comm, int peer, std::span<const std::byte> bytes, uint32_t size_tag, uint32_t tag) {
  const uint64_t size = bytes.size();
  K3_TRY(comm.send(peer, std::as_bytes(std::span(&size, 1)), size_tag));
  return comm.send(peer, bytes, tag);
}

// `what` names the message in the error when it would be longer than `max_bytes`.
Result<std::vector<std::byte>> recv_sized(Comm& comm, int peer, uint64_t max_bytes, uint32_t size_tag, uint32_t tag,
                                          const char* what) {
  uint64_t size = 0;
  K3_TRY(comm.recv(peer, std::as_writable_bytes(std::span(&size, 1)), size_tag));
  if (size > max_bytes) return invalid_argument(std::string(what) + " of " + std::to_string(size) + " bytes");
  std::vector<std::byte> bytes(size);
  K3_TRY(comm.recv(peer, bytes, tag));
  return bytes;
}

}  // namespace

std::vector<std::byte> encode_group_command(const GroupCommand& c) {
  Writer w;
  w.put<uint8_t>(c.stop);
  w.put<uint8_t>(c.step);
  w.put<uint64_t>(c.drops.size());
  for (uint64_t id : c.drops) w.put(id);
  w.put<uint64_t>(c.admits.size());
  for (const auto& a : c.admits) {
    w.put(a.id);
    w.put(a.position);
    w.bytes(a.image);
    w.put<uint8_t>(a.from_region);
    w.put(a.slot);
    w.put<uint64_t>(a.page_ids.size());
    for (uint32_t p : a.page_ids) w.put(p);
  }
  w.put<uint64_t>(c.feeds.size());
  for (const auto& f : c.feeds) {
    w.put(f.id);
    w.put(f.token);
  }
  return std::move(w.out);
}

Result<GroupCommand> decode_group_command(std::span<const std::byte> bytes) {
  Reader r{bytes};
  GroupCommand c;
  uint8_t stop = 0, step = 0;
  K3_TRY(r.get(stop, "stop"));
  K3_TRY(r.get(step, "step"));
  c.stop = stop != 0;
  c.step = step != 0;
  uint64_t n = 0;
  K3_TRY(r.count(n, sizeof(uint64_t), "drops"));
  c.drops.resize(n);
  for (auto& id : c.drops) K3_TRY(r.get(id, "drops"));
  K3_TRY(r.count(n, 3 * sizeof(uint64_t), "admits"));
  c.admits.resize(n);
  for (auto& a : c.admits) {
    K3_TRY(r.get(a.id, "admit id"));
    K3_TRY(r.get(a.position, "admit position"));
    uint64_t len = 0;
    K3_TRY(r.count(len, 1, "admit image"));
    a.image.resize(len);
    std::memcpy(a.image.data(), bytes.data() + r.at, len);
    r.at += len;
    uint8_t from_region = 0;
    K3_TRY(r.get(from_region, "admit from_region"));
    a.from_region = from_region != 0;
    K3_TRY(r.get(a.slot, "admit slot"));
    K3_TRY(r.count(len, sizeof(uint32_t), "admit page ids"));
    a.page_ids.resize(len);
    for (auto& p : a.page_ids) K3_TRY(r.get(p, "admit page id"));
  }
  K3_TRY(r.count(n, sizeof(uint64_t) + sizeof(int32_t), "feeds"));
  c.feeds.resize(n);
  for (auto& f : c.feeds) {
    K3_TRY(r.get(f.id, "feed id"));
    K3_TRY(r.get(f.token, "feed token"));
  }
  if (r.at != bytes.size()) return invalid_argument("group command: " + std::to_string(bytes.size() - r.at) + " trailing bytes");
  return c;
}

Status send_group_command(Comm& comm, int peer, const GroupCommand& c) {
  return send_sized(comm, peer, encode_group_command(c), kSizeTag, kCommandTag);
}

Result<GroupCommand> recv_group_command(Comm& comm, int leader) {
  K3_ASSIGN_OR_RETURN(const std::vector<std::byte> payload,
                      recv_sized(comm, leader, uint64_t{1} << 34, kSizeTag, kCommandTag, "group command"));
  return decode_group_command(payload);
}

Status send_region_request(Comm& comm, int peer, const GroupRegionRequest& r) {
  return comm.send(peer, std::as_bytes(std::span(&r, 1)), kRegionRequestTag);
}

Result<GroupRegionRequest> recv_region_request(Comm& comm, int leader) {
  GroupRegionRequest r;
  K3_TRY(comm.recv(leader, std::as_writable_bytes(std::span(&r, 1)), kRegionRequestTag));
  if (r.page_size == 0 || r.num_pages == 0 || r.num_slots == 0)
    return invalid_argument("group region request: page_size, num_pages and num_slots must be positive");
  return r;
}

// The region travels as a REGISTER carrying it alone: the control plane's codec, checked on decode.
Status send_region_offer(Comm& comm, int leader, const protocol::MemoryRegion& region) {
  protocol::Register reg{.role = protocol::Role::Decode};
  reg.regions.push_back(region);
  const std::vector<uint8_t> frame = protocol::encode(reg);
  return send_sized(comm, leader, std::as_bytes(std::span(frame)), kRegionSizeTag, kRegionTag);
}

Result<protocol::MemoryRegion> recv_region_offer(Comm& comm, int peer) {
  K3_ASSIGN_OR_RETURN(const std::vector<std::byte> frame,
                      recv_sized(comm, peer, uint64_t{1} << 20, kRegionSizeTag, kRegionTag, "group region offer"));
  K3_ASSIGN_OR_RETURN(protocol::Message m,
                      protocol::decode({reinterpret_cast<const uint8_t*>(frame.data()), frame.size()}));
  const auto* reg = std::get_if<protocol::Register>(&m);
  if (!reg || reg->regions.size() != 1)
    return invalid_argument("group region offer of rank " + std::to_string(peer) + " is not one region");
  return reg->regions[0];
}

// Interval in ms, then the endpoint's bytes.
Status send_group_liveness(Comm& comm, int peer, const GroupLiveness& l) {
  if (l.endpoint.empty() || l.endpoint.size() > kMaxEndpointBytes || l.interval.count() <= 0)
    return invalid_argument("group liveness: endpoint of " + std::to_string(l.endpoint.size()) + " bytes, interval " +
                            std::to_string(l.interval.count()) + " ms");
  Writer w;
  w.put(static_cast<uint32_t>(l.interval.count()));
  w.bytes(std::vector<uint8_t>(l.endpoint.begin(), l.endpoint.end()));
  return send_sized(comm, peer, w.out, kLivenessSizeTag, kLivenessTag);
}

Result<GroupLiveness> recv_group_liveness(Comm& comm, int leader) {
  K3_ASSIGN_OR_RETURN(const std::vector<std::byte> bytes,
                      recv_sized(comm, leader, sizeof(uint32_t) + sizeof(uint64_t) + kMaxEndpointBytes,
                                 kLivenessSizeTag, kLivenessTag, "group liveness message"));
  Reader r{.in = bytes, .message = "group liveness message"};
  uint32_t interval_ms = 0;
  uint64_t endpoint_bytes = 0;
  K3_TRY(r.get(interval_ms, "interval"));
  K3_TRY(r.count(endpoint_bytes, 1, "endpoint"));
  if (interval_ms == 0 || endpoint_bytes == 0 || r.at + endpoint_bytes != bytes.size())
    return invalid_argument("group liveness message: interval " + std::to_string(interval_ms) + " ms, endpoint of " +
                            std::to_string(endpoint_bytes) + " bytes in " + std::to_string(bytes.size()));
  GroupLiveness l;
  l.interval = std::chrono::milliseconds(interval_ms);
  l.endpoint.assign(reinterpret_cast<const char*>(bytes.data()) + r.at, endpoint_bytes);
  return l;
}

Status send_group_room(Comm& comm, int leader, const GroupRoom& r) {
  return comm.send(leader, std::as_bytes(std::span(&r, 1)), kRoomTag);
}

Result<GroupRoom> recv_group_room(Comm& comm, int peer) {
  GroupRoom r;
  K3_TRY(comm.recv(peer, std::as_writable_bytes(std::span(&r, 1)), kRoomTag));
  if (r.page_size == 0 || r.free_pages > r.cache_pages || r.free_seqs > r.seqs)
    return invalid_argument("group rank " + std::to_string(peer) + " reported more free than it has");
  return r;
}

Status send_group_logits(Comm& comm, int leader, std::span<const float> logits) {
  return comm.send(leader, std::as_bytes(logits), kLogitsTag);
}

Status recv_group_logits(Comm& comm, int peer, std::span<float> logits) {
  return comm.recv(peer, std::as_writable_bytes(logits), kLogitsTag);
}

}  // namespace k3::decode
