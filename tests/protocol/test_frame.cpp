// Wire frames: round trips of every message with random contents, one test per rejection class per
// message, and truncated / corrupted / random input that must be rejected or re-encode identically.
#include <catch2/catch.hpp>

#include "common/protocol/frame.h"
#include "tests/protocol/random_messages.h"

using namespace k3;
using namespace k3::protocol;
using k3::protocol::testing::RandomMessages;

namespace {

std::vector<MsgType> all_types() {
  std::vector<MsgType> t;
  for (uint8_t i = 1; i <= kMaxMsgType; ++i) t.push_back(static_cast<MsgType>(i));
  return t;
}

void set_u32(std::vector<uint8_t>& f, size_t at, uint32_t v) {
  for (int i = 0; i < 4; ++i) f[at + i] = uint8_t(v >> (8 * i));
}

// Re-frames `payload` as a message of type `t` with a correct header.
std::vector<uint8_t> frame_of(MsgType t, const std::vector<uint8_t>& payload) {
  std::vector<uint8_t> f = encode(RegisterAck{});
  f.resize(kFrameHeaderBytes);
  f[6] = uint8_t(t);
  set_u32(f, 8, uint32_t(payload.size()));
  f.insert(f.end(), payload.begin(), payload.end());
  return f;
}

std::vector<uint8_t> payload_of(const std::vector<uint8_t>& frame) {
  return {frame.begin() + kFrameHeaderBytes, frame.end()};
}

void require_rejected(const std::vector<uint8_t>& f, const std::string& needle) {
  auto r = decode(f);
  REQUIRE_FALSE(r.is_ok());
  CHECK(r.status().code() == Code::InvalidArgument);
  INFO(r.status().message());
  CHECK(r.status().message().find(needle) != std::string::npos);
}

}  // namespace

TEST_CASE("frame header is the drawn layout", "[frame]") {
  const auto f = encode(TransferDone{.request_id = 7, .stage = 2, .bytes = 99});
  REQUIRE(f.size() == kFrameHeaderBytes + 8 + 4 + 8);
  CHECK(std::string(f.begin(), f.begin() + 4) == "K3WF");
  CHECK(f[4] == kWireVersion);
  CHECK(f[5] == 0);
  CHECK(f[6] == uint8_t(MsgType::TransferDone));
  CHECK(f[7] == 0);
  CHECK(f[8] == 20);
  CHECK(f[12] == 7);             // request_id, little-endian
  CHECK(f[20] == 2);             // stage
  CHECK(f[24] == 99);            // bytes
}

TEST_CASE("every message round-trips with random contents", "[frame]") {
  const MsgType t = GENERATE(from_range(all_types()));
  RandomMessages rnd(1000 + uint8_t(t));
  for (int trial = 0; trial < 200; ++trial) {
    const Message m = rnd.of(t);
    const auto bytes = encode(m);
    auto back = decode(bytes);
    REQUIRE(back.is_ok());
    CHECK(type_of(back.value()) == t);
    CHECK(back.value() == m);
    auto h = decode_header(bytes);
    REQUIRE(h.is_ok());
    CHECK(h->payload_length == bytes.size() - kFrameHeaderBytes);
  }
}

TEST_CASE("header rejections, for every message type", "[frame][reject]") {
  const MsgType t = GENERATE(from_range(all_types()));
  RandomMessages rnd(77 + uint8_t(t));
  const auto good = encode(rnd.of(t));
  REQUIRE(decode(good).is_ok());

  SECTION("bad magic") {
    auto f = good;
    f[0] ^= 0x20;
    require_rejected(f, "magic");
  }
  SECTION("unknown version") {
    auto f = good;
    f[4] = kWireVersion + 1;
    require_rejected(f, "version");
  }
  SECTION("unknown flag bits") {
    for (int bit = 0; bit < 8; ++bit) {
      auto f = good;
      f[7] = uint8_t(1u << bit);
      require_rejected(f, "flag");
    }
  }
  SECTION("shorter than the header") {
    require_rejected(std::vector<uint8_t>(good.begin(), good.begin() + 11), "header");
  }
  SECTION("payload shorter than its length field") {
    auto f = good;
    set_u32(f, 8, uint32_t(good.size() - kFrameHeaderBytes + 1));
    require_rejected(f, "truncated");
  }
  SECTION("bytes after the payload") {
    auto f = good;
    f.push_back(0);
    require_rejected(f, "trailing");
  }
  SECTION("payload trailing bytes after the last field") {
    auto p = payload_of(good);
    p.push_back(0xAB);
    require_rejected(frame_of(t, p), "trailing bytes after the last field");
  }
  SECTION("payload cut short (length field consistent)") {
    auto p = payload_of(good);
    if (!p.empty()) {
      p.pop_back();
      require_rejected(frame_of(t, p), msg_type_name(t));
    }
  }
}

TEST_CASE("unknown message types are rejected", "[frame][reject]") {
  auto f = encode(AbortAck{.request_id = 1, .stage = 0});
  for (int t : {0, int(kMaxMsgType) + 1, 200, 255}) {
    f[6] = uint8_t(t);
    require_rejected(f, "unknown message type");
  }
}

// Per message with an enum / bool / count field: put a bad value at that field's payload offset.
TEST_CASE("field-level rejections name the message and field", "[frame][reject]") {
  SECTION("REGISTER role out of range") {
    auto p = payload_of(encode(Register{}));
    p[0] = kMaxRole + 1;
    require_rejected(frame_of(MsgType::Register, p), "REGISTER.role: enum value 3 out of range");
  }
  SECTION("REGISTER kv dtype out of range") {
    Register m;
    m.instance_id = "ab";
    auto p = payload_of(encode(m));
    p[1 + 4 + 2 + 4 + 4 + 8] = 6;  // role, instance_id, rank, stage, model_hash, then kv_dtype
    require_rejected(frame_of(MsgType::Register, p), "REGISTER.compat.kv_dtype");
  }
  SECTION("REGISTER region count larger than the bytes left") {
    Register m;
    auto p = payload_of(encode(m));
    // regions count sits after role(1) id(4) rank(4) stage(4) compat(8+1+1+4+4+4+4) hash(8) layers(4)
    const size_t at = 1 + 4 + 4 + 4 + (8 + 1 + 1 + 4 + 4 + 4 + 4) + 8 + 4;
    set_u32(p, at, 0x40000000u);
    require_rejected(frame_of(MsgType::Register, p), "REGISTER.regions: count");
  }
  SECTION("REGISTER_ACK bool not 0/1") {
    auto p = payload_of(encode(RegisterAck{.ok = true, .reason = ""}));
    p[0] = 2;
    require_rejected(frame_of(MsgType::RegisterAck, p), "REGISTER_ACK.ok: bool value 2");
  }
  SECTION("HEARTBEAT role out of range") {
    auto p = payload_of(encode(Heartbeat{}));
    p[0] = 0xFF;
    require_rejected(frame_of(MsgType::Heartbeat, p), "HEARTBEAT.role");
  }
  SECTION("HEARTBEAT without its decode room (an older peer's layout)") {
    auto p = payload_of(encode(Heartbeat{.role = Role::Decode, .room = {.pool_page_size = 16, .paused = 3}}));
    p.resize(p.size() - 92 - 8);   // the prefix-cache report (empty: 92 bytes) and the room's last field
    require_rejected(frame_of(MsgType::Heartbeat, p), "HEARTBEAT.room.preemptions: truncated");
    p.resize(p.size() - 44);
    require_rejected(frame_of(MsgType::Heartbeat, p), "HEARTBEAT.room.pool_page_size: truncated");
  }
  SECTION("HEARTBEAT without its prefix-cache report (an older peer's layout)") {
    auto p = payload_of(encode(Heartbeat{.role = Role::Prefill, .prefix = {.block_tokens = 64, .block_hashes = {1, 2}}}));
    p.resize(p.size() - 8);
    require_rejected(frame_of(MsgType::Heartbeat, p), "HEARTBEAT.prefix.region_slot_moves: truncated");
    p.resize(p.size() - 4);
    require_rejected(frame_of(MsgType::Heartbeat, p), "HEARTBEAT.prefix.region_free_extents: truncated");
    p.resize(p.size() - 8);
    require_rejected(frame_of(MsgType::Heartbeat, p), "HEARTBEAT.prefix.region_free_bytes: truncated");
    p.resize(p.size() - 8);
    require_rejected(frame_of(MsgType::Heartbeat, p), "HEARTBEAT.prefix.prompts_prefilled: truncated");
    p.resize(p.size() - 4);
    require_rejected(frame_of(MsgType::Heartbeat, p), "HEARTBEAT.prefix.pool_free_slots: truncated");
    p.resize(p.size() - 60);
    require_rejected(frame_of(MsgType::Heartbeat, p), "HEARTBEAT.prefix.block_hashes");
  }
  SECTION("CLAIM decode_ranks count larger than the bytes left") {
    auto p = payload_of(encode(Claim{.request_id = 1, .decode_ranks = {0, 1}}));
    set_u32(p, 12, 1000);
    require_rejected(frame_of(MsgType::Claim, p), "CLAIM.decode_ranks: count 1000");
  }
  SECTION("PREFILL token count larger than the bytes left") {
    auto p = payload_of(encode(Prefill{.request_id = 1, .token_ids = {1, 2, 3}}));
    set_u32(p, 8, 0xFFFFFFFFu);
    require_rejected(frame_of(MsgType::Prefill, p), "PREFILL.token_ids: count");
  }
  SECTION("COMPUTE_DONE has_first_token not 0/1") {
    auto p = payload_of(encode(ComputeDone{}));
    p[16] = 7;
    require_rejected(frame_of(MsgType::ComputeDone, p), "COMPUTE_DONE.has_first_token");
  }
  SECTION("ADDRS entry kind out of range") {
    auto p = payload_of(encode(Addrs{.request_id = 1, .entries = {AddrEntry{}}, .page_tables = {}}));
    p[8 + 4 + 4] = kMaxEntryKind + 1;
    require_rejected(frame_of(MsgType::Addrs, p), "ADDRS.entries.kind");
  }
  SECTION("ADDRS page ids count larger than the bytes left") {
    auto p = payload_of(encode(Addrs{.request_id = 1, .entries = {}, .page_tables = {PageTable{.page_ids = {5}}}}));
    set_u32(p, 8 + 4 + 4 + 4 + 4, 2);
    require_rejected(frame_of(MsgType::Addrs, p), "ADDRS.page_tables.page_ids: count 2");
  }
  SECTION("TRANSFER_DONE short") {
    auto p = payload_of(encode(TransferDone{}));
    p.resize(19);
    require_rejected(frame_of(MsgType::TransferDone, p), "TRANSFER_DONE.bytes: truncated");
  }
  SECTION("TOKENS finish out of range") {
    auto p = payload_of(encode(Tokens{}));
    p[p.size() - 9] = kMaxFinishReason + 1;  // finish, then the logprobs count (u32) and the choice (u32)
    require_rejected(frame_of(MsgType::Tokens, p), "TOKENS.finish");
  }
  SECTION("ABORT reason and origin out of range") {
    auto p = payload_of(encode(Abort{}));
    auto q = p;
    p[8] = kMaxAbortReason + 1;
    require_rejected(frame_of(MsgType::Abort, p), "ABORT.reason");
    q[9] = kMaxRole + 1;
    require_rejected(frame_of(MsgType::Abort, q), "ABORT.origin_role");
  }
  SECTION("ABORT_ACK short") {
    auto p = payload_of(encode(AbortAck{}));
    p.resize(8);
    require_rejected(frame_of(MsgType::AbortAck, p), "ABORT_ACK.stage: truncated");
  }
  SECTION("FAILED cause out of range, detail count too large") {
    auto p = payload_of(encode(Failed{.request_id = 1, .cause = AbortReason::Internal, .detail = "x"}));
    auto q = p;
    p[8] = 0x80;
    require_rejected(frame_of(MsgType::Failed, p), "FAILED.cause");
    set_u32(q, 9, 2);
    require_rejected(frame_of(MsgType::Failed, q), "FAILED.detail: count 2");
  }
}

TEST_CASE("every truncation of every message is rejected without a crash", "[frame][fuzz]") {
  const MsgType t = GENERATE(from_range(all_types()));
  RandomMessages rnd(5 + uint8_t(t));
  for (int trial = 0; trial < 20; ++trial) {
    const auto good = encode(rnd.of(t));
    for (size_t n = 0; n < good.size(); ++n) {
      CHECK_FALSE(decode(std::span(good.data(), n)).is_ok());
      // Also with a header that agrees with the cut payload: the field decoder must catch it.
      if (n >= kFrameHeaderBytes && n < good.size()) {
        auto p = std::vector<uint8_t>(good.begin() + kFrameHeaderBytes, good.begin() + n);
        CHECK_FALSE(decode(frame_of(t, p)).is_ok());
      }
    }
  }
}

TEST_CASE("corrupted and random frames never crash; accepted ones re-encode identically", "[frame][fuzz]") {
  RandomMessages rnd(42);
  auto& rng = rnd.rng();
  int accepted = 0, rejected = 0;
  for (int trial = 0; trial < 20000; ++trial) {
    std::vector<uint8_t> f;
    if (trial % 2 == 0) {
      // Flip 1..4 random payload bytes of a valid frame.
      f = encode(rnd.of(static_cast<MsgType>(1 + rng() % kMaxMsgType)));
      for (int k = 1 + int(rng() % 4); k > 0; --k) {
        if (f.size() == kFrameHeaderBytes) break;
        f[kFrameHeaderBytes + rng() % (f.size() - kFrameHeaderBytes)] = uint8_t(rng());
      }
    } else {
      // Random payload bytes behind a valid header of a random type.
      std::vector<uint8_t> p(rng() % 64);
      for (auto& b : p) b = uint8_t(rng() % 4 == 0 ? rng() : rng() % 3);  // small values parse further
      f = frame_of(static_cast<MsgType>(1 + rng() % kMaxMsgType), p);
    }
    auto r = decode(f);
    if (r.is_ok()) {
      ++accepted;
      CHECK(encode(r.value()) == f);  // the encoding is canonical
    } else {
      ++rejected;
      CHECK(r.status().code() == Code::InvalidArgument);
      CHECK_FALSE(r.status().message().empty());
    }
  }
  CHECK(accepted > 0);
  CHECK(rejected > 0);
}

TEST_CASE("names of every enum value", "[frame]") {
  for (uint8_t i = 1; i <= kMaxMsgType; ++i) CHECK(std::string(msg_type_name(MsgType(i))) != "?");
  for (uint8_t i = 0; i <= kMaxAbortReason; ++i) CHECK(std::string(abort_reason_name(AbortReason(i))) != "?");
  for (uint8_t i = 0; i <= kMaxEntryKind; ++i) CHECK(std::string(entry_kind_name(EntryKind(i))) != "?");
  for (uint8_t i = 0; i <= kMaxRole; ++i) CHECK(std::string(role_name(Role(i))) != "?");
  for (uint8_t i = 0; i <= kMaxFinishReason; ++i) CHECK(std::string(finish_reason_name(FinishReason(i))) != "?");
}
