// Stage-to-stage activations of the prefill pipeline: stage s sends every computed chunk (the running
// partial sum P and the AttnRes bank rows, F32) to stage s+1. One ZeroMQ DEALER (stage s, connects) /
// ROUTER (stage s+1, binds) pair per link keeps chunks of a request in order (one connection, FIFO), and
// stage s computes chunk c+1 while stage s+1 computes chunk c, which is what overlaps the pipeline. The
// same connection carries the rare messages backwards: a stage whose prefix cache lacks the state stage
// 0 resumed a request from asks for the request to be computed again (RecomputeRequest), relayed stage
// by stage to stage 0.
//
// With control keys the link runs CURVE like the control plane (docs/SECURITY.md): the receiver accepts
// only the previous stage's key (ZapHandler + the "User-Id" of each frame), the sender only the next
// stage's key, so no other process can read activations (prompt-derived) or inject them, forwards or
// backwards.
//
// Frame (little-endian, host order): magic u32 "K3AC", version u32 (3), request_id u64, chunk_start u64,
// prompt_len u32, rows u32, width u32, bank_count u32, evictions_before u32, prompt_count u32,
// plan_count u32, epoch u32, then P [rows, width] F32, then each bank entry [rows, width] F32, then
// prompt_count token ids i32, then plan_count checkpoint positions u64 (the prefix-cache sync, see
// ChunkCacheSync).
// Backward frame: magic u32 "K3RC", version u32 (1), request_id u64, epoch u32.
#pragma once
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include <zmq.hpp>

#include "common/core/status.h"
#include "engine/model.h"
#include "transfer/control_keys.h"
#include "transfer/zap_handler.h"

namespace k3::prefill {

// What stage 0's prefix cache did, so that every later stage's replica makes the same moves in the same
// order (docs/PREFIX_CACHE.md, "On a prefill pipeline"). The first chunk of a request starts where stage
// 0's hit resumes (chunk_start) and carries the prompt and the checkpoint positions stage 0 planned.
struct ChunkCacheSync {
  uint32_t evictions_before = 0;   // entries stage 0 evicted under page pressure before computing this chunk
  std::vector<int32_t> prompt;     // first chunk with the cache on: the whole prompt; else empty
  std::vector<uint64_t> plan;      // first chunk: the checkpoint positions stage 0 planned
  bool operator==(const ChunkCacheSync&) const = default;
};

struct ActivationChunk {
  uint64_t request_id = 0;
  // Which computation of the request this chunk belongs to: 0 the first; each recompute that a later
  // stage asked for (RecomputeRequest) starts from token 0 with the next epoch, and a stage drops the
  // chunks of an older epoch.
  uint32_t epoch = 0;
  uint64_t chunk_start = 0;   // position of the chunk's first token in the prompt
  uint32_t prompt_len = 0;    // tokens of the whole prompt (the receiver knows when it has them all)
  Activations act;            // host F32 tensors, rows = tokens of the chunk
  ChunkCacheSync cache;
};

std::vector<uint8_t> encode_chunk(const ActivationChunk& c);
// Strict: wrong magic/version, sizes that disagree with the byte count, or rows beyond the prompt fail.
Result<ActivationChunk> decode_chunk(std::span<const uint8_t> bytes);

// Backwards, from the stage that lacks cached state to stage 0: compute request_id again from its first
// token, as `epoch`, with a prefix-cache miss.
struct RecomputeRequest {
  uint64_t request_id = 0;
  uint32_t epoch = 0;
  bool operator==(const RecomputeRequest&) const = default;
};

std::vector<uint8_t> encode_recompute(const RecomputeRequest& r);
// Strict: wrong magic/version/size or epoch 0 fail.
Result<RecomputeRequest> decode_recompute(std::span<const uint8_t> bytes);

// The sending end (stage s): connects to the next stage's bound endpoint.
class StageSender {
 public:
  // keys: CURVE with the next stage's key pinned (its control name `next_stage`); nullopt = plaintext.
  static Result<std::unique_ptr<StageSender>> connect(zmq::context_t& ctx, const std::string& endpoint,
                                                      const std::optional<transfer::ControlKeys>& keys = std::nullopt,
                                                      const std::string& next_stage = "");
  Status send(const ActivationChunk& c);
  // Next frame the next stage sent back, or nullopt when none is waiting.
  Result<std::optional<std::vector<uint8_t>>> try_receive_back();

 private:
  explicit StageSender(zmq::socket_t s) : sock_(std::move(s)) {}
  zmq::socket_t sock_;
};

// The receiving end (stage s+1): binds (a "*" port is picked by the OS) and reads without blocking.
class StageReceiver {
 public:
  // keys: CURVE, frames accepted only from `prev_stage` (a control name); nullopt = plaintext.
  static Result<std::unique_ptr<StageReceiver>> bind(zmq::context_t& ctx, const std::string& endpoint,
                                                     const std::optional<transfer::ControlKeys>& keys = std::nullopt,
                                                     const std::string& prev_stage = "");
  const std::string& endpoint() const { return endpoint_; }
  // Next received frame, or nullopt when none is waiting (frames from another key are dropped).
  Result<std::optional<std::vector<uint8_t>>> try_receive();
  uint64_t rejected() const { return rejected_; }
  // Sends `bytes` back to the previous stage (the peer of the last accepted frame). Unavailable before
  // any frame was accepted.
  Status send_back(std::span<const uint8_t> bytes);

 private:
  StageReceiver(zmq::socket_t s, std::string ep) : sock_(std::move(s)), endpoint_(std::move(ep)) {}
  std::unique_ptr<transfer::ZapHandler> zap_;  // with keys (declared first: outlives sock_)
  zmq::socket_t sock_;
  std::string endpoint_;
  std::string prev_stage_;  // with keys: the only accepted sender
  std::vector<uint8_t> peer_;  // ROUTER routing id of the last accepted frame's connection
  uint64_t rejected_ = 0;
};

}  // namespace k3::prefill
