#include "decode_node/group_command.h"

#include <cstring>
#include <string>

#include "common/protocol/frame.h"

namespace k3::decode {
namespace {

constexpr uint32_t kSizeTag = 0x6b3001, kCommandTag = 0x6b3002, kLogitsTag = 0x6b3003, kRegionRequestTag = 0x6b3004,
                   kRegionSizeTag = 0x6b3005, kRegionTag = 0x6b3006, kRoomTag = 0x6b3007, kLivenessTag = 0x6b3008;

// The liveness message: interval in ms, the endpoint's length, then the endpoint.
struct LivenessHead {
  uint32_t interval_ms = 0;
  uint32_t endpoint_bytes = 0;
};
constexpr uint32_t kMaxEndpointBytes = 512;

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
  template <class T>
  Status get(T& v, const char* what) {
    if (in.size() - at < sizeof(T)) return invalid_argument(std::string("group command truncated at ") + what);
    std::memcpy(&v, in.data() + at, sizeof(T));
    at += sizeof(T);
    return Status::ok();
  }
  Status count(uint64_t& n, size_t min_item, const char* what) {
    K3_TRY(get(n, what));
    if (min_item > 0 && n > (in.size() - at) / min_item)
      return invalid_argument(std::string("group command: ") + what + " count " + std::to_string(n) + " exceeds the message");
    return Status::ok();
  }
};

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
  const std::vector<std::byte> payload = encode_group_command(c);
  const uint64_t size = payload.size();
  K3_TRY(comm.send(peer, std::as_bytes(std::span(&size, 1)), kSizeTag));
  return comm.send(peer, payload, kCommandTag);
}

Result<GroupCommand> recv_group_command(Comm& comm, int leader) {
  uint64_t size = 0;
  K3_TRY(comm.recv(leader, std::as_writable_bytes(std::span(&size, 1)), kSizeTag));
  if (size > (uint64_t{1} << 34)) return invalid_argument("group command of " + std::to_string(size) + " bytes");
  std::vector<std::byte> payload(size);
  K3_TRY(comm.recv(leader, payload, kCommandTag));
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
  const uint64_t size = frame.size();
  K3_TRY(comm.send(leader, std::as_bytes(std::span(&size, 1)), kRegionSizeTag));
  return comm.send(leader, std::as_bytes(std::span(frame)), kRegionTag);
}

Result<protocol::MemoryRegion> recv_region_offer(Comm& comm, int peer) {
  uint64_t size = 0;
  K3_TRY(comm.recv(peer, std::as_writable_bytes(std::span(&size, 1)), kRegionSizeTag));
  if (size > (uint64_t{1} << 20)) return invalid_argument("group region offer of " + std::to_string(size) + " bytes");
  std::vector<uint8_t> frame(size);
  K3_TRY(comm.recv(peer, std::as_writable_bytes(std::span(frame)), kRegionTag));
  K3_ASSIGN_OR_RETURN(protocol::Message m, protocol::decode(frame));
  const auto* reg = std::get_if<protocol::Register>(&m);
  if (!reg || reg->regions.size() != 1)
    return invalid_argument("group region offer of rank " + std::to_string(peer) + " is not one region");
  return reg->regions[0];
}

Status send_group_liveness(Comm& comm, int peer, const GroupLiveness& l) {
  if (l.endpoint.empty() || l.endpoint.size() > kMaxEndpointBytes || l.interval.count() <= 0)
    return invalid_argument("group liveness: endpoint of " + std::to_string(l.endpoint.size()) + " bytes, interval " +
                            std::to_string(l.interval.count()) + " ms");
  std::vector<std::byte> bytes(sizeof(LivenessHead) + l.endpoint.size());
  const LivenessHead head{.interval_ms = static_cast<uint32_t>(l.interval.count()),
                          .endpoint_bytes = static_cast<uint32_t>(l.endpoint.size())};
  std::memcpy(bytes.data(), &head, sizeof(head));
  std::memcpy(bytes.data() + sizeof(head), l.endpoint.data(), l.endpoint.size());
  const uint64_t size = bytes.size();
  K3_TRY(comm.send(peer, std::as_bytes(std::span(&size, 1)), kLivenessTag));
  return comm.send(peer, std::span(bytes), kLivenessTag);
}

Result<GroupLiveness> recv_group_liveness(Comm& comm, int leader) {
  uint64_t size = 0;
  K3_TRY(comm.recv(leader, std::as_writable_bytes(std::span(&size, 1)), kLivenessTag));
  if (size <= sizeof(LivenessHead) || size > sizeof(LivenessHead) + kMaxEndpointBytes)
    return invalid_argument("group liveness message of " + std::to_string(size) + " bytes");
  std::vector<std::byte> bytes(size);
  K3_TRY(comm.recv(leader, std::span(bytes), kLivenessTag));
  LivenessHead head;
  std::memcpy(&head, bytes.data(), sizeof(head));
  if (head.interval_ms == 0 || sizeof(head) + head.endpoint_bytes != size)
    return invalid_argument("group liveness message: interval " + std::to_string(head.interval_ms) + " ms, endpoint of " +
                            std::to_string(head.endpoint_bytes) + " bytes in " + std::to_string(size));
  GroupLiveness l;
  l.interval = std::chrono::milliseconds(head.interval_ms);
  l.endpoint.assign(reinterpret_cast<const char*>(bytes.data()) + sizeof(head), head.endpoint_bytes);
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
