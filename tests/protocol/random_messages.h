// Random message contents for the protocol tests, written field by field by hand (not through the
// codec's field lists), so a field the codec forgot shows up as a round-trip mismatch.
#pragma once
#include <random>

#include "common/protocol/messages.h"

namespace k3::protocol::testing {

class RandomMessages {
 public:
  explicit RandomMessages(uint64_t seed) : rng_(seed) {}

  uint64_t u64() { return std::uniform_int_distribution<uint64_t>()(rng_); }
  uint32_t u32() { return uint32_t(u64()); }
  int32_t i32() { return int32_t(u32()); }
  bool coin() { return u64() & 1; }
  float f32() { return std::uniform_real_distribution<float>(-10.f, 10.f)(rng_); }
  size_t count(size_t max) { return std::uniform_int_distribution<size_t>(0, max)(rng_); }
  template <class E> E pick(uint8_t max) { return static_cast<E>(count(max)); }
  std::string str() {
    std::string s(count(12), ' ');
    for (char& c : s) c = char(u32());  // any byte, including NUL
    return s;
  }
  std::vector<uint8_t> bytes() {
    std::vector<uint8_t> b(count(40));
    for (auto& x : b) x = uint8_t(u32());
    return b;
  }
  std::vector<uint32_t> u32s() {
    std::vector<uint32_t> v(count(9));
    for (auto& x : v) x = u32();
    return v;
  }
  std::vector<int32_t> i32s() {
    std::vector<int32_t> v(count(30));
    for (auto& x : v) x = i32();
    return v;
  }

  std::vector<TokenLogprobs> logprobs(size_t max) {
    std::vector<TokenLogprobs> v(count(max));
    for (auto& x : v) {
      x.logprob = f32();
      x.top.resize(count(5));
      for (auto& t : x.top) t = {.id = i32(), .logprob = f32()};
    }
    return v;
  }

  ParallelLayout layout() { return {.dp_size = u32(), .dcp_size = u32(), .pp_partition = u32s()}; }
  CompatInfo compat() {
    return {.model_hash = u64(), .kv_dtype = pick<DType>(5), .state_dtype = pick<DType>(5), .page_size = u32(),
            .layout = layout()};
  }
  Register reg() {
    Register m{.role = pick<Role>(kMaxRole), .instance_id = str(), .rank = u32(), .stage = u32(),
               .compat = compat(), .compat_hash = u64(), .layer_ids = u32s(), .regions = {},
               .worker_address = bytes(), .control_endpoint = str()};
    for (size_t i = count(4); i > 0; --i)
      m.regions.push_back({.region_id = u32(), .base = u64(), .length = u64(), .packed_rkey = bytes(), .worker_address = bytes()});
    return m;
  }
  RegisterAck ack() { return {.ok = coin(), .reason = str()}; }
  Heartbeat heartbeat() {
    return {.role = pick<Role>(kMaxRole), .instance_id = str(), .rank = u32(), .stage = u32(), .seq = u64(),
            .free_bytes = u64(), .num_running = u32(),
            .room = {.pool_page_size = u32(), .pool_pages = u32(), .pool_free_pages = u32(), .pool_slots = u32(),
                     .pool_free_slots = u32(), .cache_page_size = u32(), .cache_pages = u32(),
                     .cache_free_pages = u32(), .cache_seqs = u32(), .cache_free_seqs = u32(), .paused = u32(),
                     .preemptions = u64()}};
  }
  Claim claim() {
    return {.request_id = u64(), .prompt_len = u32(), .decode_ranks = u32s(), .prefill_instance = str(),
            .num_prefill_stages = u32(), .timeout_ms = u64(), .sampling = sampling(), .trace_id = str()};
  }
  SamplingParams sampling() {
    return {.temperature = f32(), .top_p = f32(), .top_k = i32(), .seed = u64(), .max_tokens = u32(),
            .stop_token_ids = i32s(), .logprobs = i32(), .output_format = str(), .n = u32()};
  }
  Prefill prefill() {
    return {.request_id = u64(), .token_ids = i32s(), .sampling = sampling(),
            .decode_instance = str(), .decode_ranks = u32s(), .timeout_ms = u64(), .trace_id = str()};
  }
  ComputeDone compute_done() {
    return {.request_id = u64(), .stage = u32(), .prompt_len = u32(), .has_first_token = coin(),
            .first_token = i32(), .first_logprobs = logprobs(1), .choice_first_tokens = i32s()};
  }
  Addrs addrs() {
    Addrs m{.request_id = u64()};
    for (size_t i = count(20); i > 0; --i)
      m.entries.push_back({.layer_id = u32(), .kind = pick<EntryKind>(kMaxEntryKind), .dest_rank = u32(),
                           .remote_addr = u64(), .length = u64(), .region_id = u32()});
    for (size_t i = count(4); i > 0; --i) m.page_tables.push_back({.rank = u32(), .page_size = u32(), .page_ids = u32s()});
    return m;
  }
  TransferDone transfer_done() { return {.request_id = u64(), .stage = u32(), .bytes = u64()}; }
  Tokens tokens() {
    return {.request_id = u64(), .token_ids = i32s(), .finish = pick<FinishReason>(kMaxFinishReason),
            .logprobs = logprobs(3), .choice = u32()};
  }
  Abort abort() {
    return {.request_id = u64(), .reason = pick<AbortReason>(kMaxAbortReason), .origin_role = pick<Role>(kMaxRole),
            .origin_instance = str(), .origin_stage = u32()};
  }
  AbortAck abort_ack() { return {.request_id = u64(), .stage = u32()}; }
  Failed failed() { return {.request_id = u64(), .cause = pick<AbortReason>(kMaxAbortReason), .detail = str()}; }
  ClaimAck claim_ack() { return {.request_id = u64(), .ok = coin(), .reason = str()}; }

  // A random message of the given type.
  Message of(MsgType t) {
    switch (t) {
      case MsgType::Register: return reg();
      case MsgType::RegisterAck: return ack();
      case MsgType::Heartbeat: return heartbeat();
      case MsgType::Claim: return claim();
      case MsgType::Prefill: return prefill();
      case MsgType::ComputeDone: return compute_done();
      case MsgType::Addrs: return addrs();
      case MsgType::TransferDone: return transfer_done();
      case MsgType::Tokens: return tokens();
      case MsgType::Abort: return abort();
      case MsgType::AbortAck: return abort_ack();
      case MsgType::Failed: return failed();
      case MsgType::ClaimAck: return claim_ack();
    }
    return ack();
  }

  std::mt19937_64& rng() { return rng_; }

 private:
  std::mt19937_64 rng_;
};

}  // namespace k3::protocol::testing
