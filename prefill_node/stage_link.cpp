#include "prefill_node/stage_link.h"

#include <spdlog/spdlog.h>

#include <cstring>

namespace k3::prefill {

namespace {

constexpr uint32_t kMagic = 0x4341334b;  // "K3AC"
constexpr uint32_t kVersion = 3;   // 2: the prefix-cache sync; 3: the epoch
constexpr size_t kHeaderBytes = 4 + 4 + 8 + 8 + 4 + 4 + 4 + 4 + 4 + 4 + 4 + 4;
constexpr uint32_t kRecomputeMagic = 0x4352334b;  // "K3RC"
constexpr uint32_t kRecomputeVersion = 1;
constexpr size_t kRecomputeBytes = 4 + 4 + 8 + 4;

template <class T>
void put(std::vector<uint8_t>& out, T v) {
  const size_t at = out.size();
  out.resize(at + sizeof(T));
  std::memcpy(out.data() + at, &v, sizeof(T));
}

template <class T>
T get(std::span<const uint8_t> in, size_t& at) {
  T v;
  std::memcpy(&v, in.data() + at, sizeof(T));
  at += sizeof(T);
  return v;
}

void put_rows(std::vector<uint8_t>& out, const Tensor& t) {
  Tensor f = t.to_f32();
  const size_t at = out.size();
  out.resize(at + f.nbytes());
  std::memcpy(out.data() + at, f.data(), f.nbytes());
}

}  // namespace

std::vector<uint8_t> encode_chunk(const ActivationChunk& c) {
  const int64_t rows = c.act.rows();
  const int64_t width = rows > 0 ? c.act.partial.dim(1) : 0;
  std::vector<uint8_t> out;
  out.reserve(kHeaderBytes + (1 + c.act.bank.size()) * rows * width * sizeof(float));
  put<uint32_t>(out, kMagic);
  put<uint32_t>(out, kVersion);
  put<uint64_t>(out, c.request_id);
  put<uint64_t>(out, c.chunk_start);
  put<uint32_t>(out, c.prompt_len);
  put<uint32_t>(out, static_cast<uint32_t>(rows));
  put<uint32_t>(out, static_cast<uint32_t>(width));
  put<uint32_t>(out, static_cast<uint32_t>(c.act.bank.size()));
  put<uint32_t>(out, c.cache.evictions_before);
  put<uint32_t>(out, static_cast<uint32_t>(c.cache.prompt.size()));
  put<uint32_t>(out, static_cast<uint32_t>(c.cache.plan.size()));
  put<uint32_t>(out, c.epoch);
  put_rows(out, c.act.partial);
  for (const Tensor& b : c.act.bank) put_rows(out, b);
  for (int32_t t : c.cache.prompt) put<int32_t>(out, t);
  for (uint64_t p : c.cache.plan) put<uint64_t>(out, p);
  return out;
}

Result<ActivationChunk> decode_chunk(std::span<const uint8_t> bytes) {
  if (bytes.size() < kHeaderBytes)
    return invalid_argument("activation frame: " + std::to_string(bytes.size()) + " bytes is shorter than its header");
  size_t at = 0;
  if (get<uint32_t>(bytes, at) != kMagic) return invalid_argument("activation frame: bad magic");
  const uint32_t version = get<uint32_t>(bytes, at);
  if (version != kVersion) return invalid_argument("activation frame: unsupported version " + std::to_string(version));
  ActivationChunk c;
  c.request_id = get<uint64_t>(bytes, at);
  c.chunk_start = get<uint64_t>(bytes, at);
  c.prompt_len = get<uint32_t>(bytes, at);
  const uint32_t rows = get<uint32_t>(bytes, at);
  const uint32_t width = get<uint32_t>(bytes, at);
  const uint32_t banks = get<uint32_t>(bytes, at);
  c.cache.evictions_before = get<uint32_t>(bytes, at);
  const uint32_t prompt_count = get<uint32_t>(bytes, at);
  const uint32_t plan_count = get<uint32_t>(bytes, at);
  c.epoch = get<uint32_t>(bytes, at);
  if (rows == 0 || width == 0) return invalid_argument("activation frame: rows and width must be > 0");
  if (prompt_count != 0 && prompt_count != c.prompt_len)
    return invalid_argument("activation frame: prompt_count " + std::to_string(prompt_count) + " is neither 0 nor prompt_len " +
                            std::to_string(c.prompt_len));
  if (plan_count > c.prompt_len) return invalid_argument("activation frame: plan_count " + std::to_string(plan_count) + " exceeds prompt_len");
  if (c.chunk_start + rows > c.prompt_len)
    return invalid_argument("activation frame: rows " + std::to_string(c.chunk_start) + "+" + std::to_string(rows) +
                            " exceed prompt_len " + std::to_string(c.prompt_len));
  const uint64_t tensor_bytes = uint64_t{rows} * width * sizeof(float);
  const uint64_t sync_bytes = uint64_t{prompt_count} * sizeof(int32_t) + uint64_t{plan_count} * sizeof(uint64_t);
  if (banks > 4096 || bytes.size() != kHeaderBytes + (uint64_t{banks} + 1) * tensor_bytes + sync_bytes)
    return invalid_argument("activation frame: " + std::to_string(bytes.size()) + " bytes do not match rows " +
                            std::to_string(rows) + " width " + std::to_string(width) + " banks " + std::to_string(banks) +
                            " prompt " + std::to_string(prompt_count) + " plan " + std::to_string(plan_count));
  auto take = [&] {
    std::vector<float> v(size_t{rows} * width);
    std::memcpy(v.data(), bytes.data() + at, tensor_bytes);
    at += tensor_bytes;
    return Tensor::from_f32({rows, width}, v);
  };
  c.act.partial = take();
  for (uint32_t b = 0; b < banks; ++b) c.act.bank.push_back(take());
  for (uint32_t i = 0; i < prompt_count; ++i) c.cache.prompt.push_back(get<int32_t>(bytes, at));
  for (uint32_t i = 0; i < plan_count; ++i) {
    const uint64_t p = get<uint64_t>(bytes, at);
    if (p <= c.chunk_start || p > c.prompt_len)
      return invalid_argument("activation frame: checkpoint position " + std::to_string(p) + " is outside (" +
                              std::to_string(c.chunk_start) + ", " + std::to_string(c.prompt_len) + "]");
    c.cache.plan.push_back(p);
  }
  return c;
}

std::vector<uint8_t> encode_recompute(const RecomputeRequest& r) {
  std::vector<uint8_t> out;
  put<uint32_t>(out, kRecomputeMagic);
  put<uint32_t>(out, kRecomputeVersion);
  put<uint64_t>(out, r.request_id);
  put<uint32_t>(out, r.epoch);
  return out;
}

Result<RecomputeRequest> decode_recompute(std::span<const uint8_t> bytes) {
  if (bytes.size() != kRecomputeBytes)
    return invalid_argument("recompute frame: " + std::to_string(bytes.size()) + " bytes, expected " +
                            std::to_string(kRecomputeBytes));
  size_t at = 0;
  if (get<uint32_t>(bytes, at) != kRecomputeMagic) return invalid_argument("recompute frame: bad magic");
  if (const uint32_t v = get<uint32_t>(bytes, at); v != kRecomputeVersion)
    return invalid_argument("recompute frame: unsupported version " + std::to_string(v));
  RecomputeRequest r;
  r.request_id = get<uint64_t>(bytes, at);
  r.epoch = get<uint32_t>(bytes, at);
  if (r.epoch == 0) return invalid_argument("recompute frame: epoch must be > 0 (epoch 0 is the first computation)");
  return r;
}

Result<std::unique_ptr<StageSender>> StageSender::connect(zmq::context_t& ctx, const std::string& endpoint,
                                                          const std::optional<transfer::ControlKeys>& keys,
                                                          const std::string& next_stage) {
  try {
    zmq::socket_t s(ctx, zmq::socket_type::dealer);
    s.set(zmq::sockopt::linger, 2000);  // a stage shutting down still delivers chunks it queued
    if (keys) {
      Status st = transfer::apply_curve_client(s.handle(), *keys, next_stage);
      if (!st.is_ok()) return Status(st.code(), "--next-endpoint " + endpoint + ": " + st.message());
    }
    s.connect(endpoint);
    return std::unique_ptr<StageSender>(new StageSender(std::move(s)));
  } catch (const zmq::error_t& e) {
    return invalid_argument("--next-endpoint " + endpoint + ": " + e.what());
  }
}

Status StageSender::send(const ActivationChunk& c) {
  std::vector<uint8_t> bytes = encode_chunk(c);
  try {
    sock_.send(zmq::buffer(bytes), zmq::send_flags::none);
  } catch (const zmq::error_t& e) {
    return Status(Code::Unavailable, std::string("sending activations: ") + e.what());
  }
  return Status::ok();
}

Result<std::optional<std::vector<uint8_t>>> StageSender::try_receive_back() {
  zmq::message_t msg;
  try {
    if (!sock_.recv(msg, zmq::recv_flags::dontwait)) return std::optional<std::vector<uint8_t>>();
  } catch (const zmq::error_t& e) {
    return Status(Code::Unavailable, std::string("receiving from the next stage: ") + e.what());
  }
  const auto* p = static_cast<const uint8_t*>(msg.data());
  return std::optional<std::vector<uint8_t>>(std::vector<uint8_t>(p, p + msg.size()));
}

Result<std::unique_ptr<StageReceiver>> StageReceiver::bind(zmq::context_t& ctx, const std::string& endpoint,
                                                           const std::optional<transfer::ControlKeys>& keys,
                                                           const std::string& prev_stage) {
  try {
    zmq::socket_t s(ctx, zmq::socket_type::router);
    s.set(zmq::sockopt::linger, 0);
    std::unique_ptr<transfer::ZapHandler> zap;
    if (keys) {
      K3_TRY(transfer::apply_curve_server(s.handle(), *keys));
      K3_ASSIGN_OR_RETURN(zap, transfer::ZapHandler::start(ctx, keys->cluster));
    }
    s.bind(endpoint);
    std::string ep = s.get(zmq::sockopt::last_endpoint);
    std::unique_ptr<StageReceiver> r(new StageReceiver(std::move(s), std::move(ep)));
    r->zap_ = std::move(zap);
    r->prev_stage_ = keys ? prev_stage : "";
    return r;
  } catch (const zmq::error_t& e) {
    return invalid_argument("--listen " + endpoint + ": " + e.what());
  }
}

Result<std::optional<std::vector<uint8_t>>> StageReceiver::try_receive() {
  zmq::message_t id, msg;
  for (;;) {
    try {
      // A ROUTER frame: the connection's routing id, then the DEALER's one part.
      if (!sock_.recv(id, zmq::recv_flags::dontwait)) return std::optional<std::vector<uint8_t>>();
      (void)sock_.recv(msg, zmq::recv_flags::none);
      while (msg.more()) (void)sock_.recv(msg, zmq::recv_flags::none);   // not ours: keep the last part
    } catch (const zmq::error_t& e) {
      return Status(Code::Unavailable, std::string("receiving activations: ") + e.what());
    }
    if (prev_stage_.empty()) break;
    const char* uid = zmq_msg_gets(msg.handle(), "User-Id");
    if (uid && prev_stage_ == uid) break;
    ++rejected_;
    spdlog::warn("prefill: activations from '{}' dropped: only {} may send them", uid ? uid : "?", prev_stage_);
  }
  const auto* rid = static_cast<const uint8_t*>(id.data());
  peer_.assign(rid, rid + id.size());
  const auto* p = static_cast<const uint8_t*>(msg.data());
  return std::optional<std::vector<uint8_t>>(std::vector<uint8_t>(p, p + msg.size()));
}

Status StageReceiver::send_back(std::span<const uint8_t> bytes) {
  if (peer_.empty()) return Status(Code::Unavailable, "no frame from the previous stage yet: nowhere to send back");
  try {
    sock_.send(zmq::buffer(peer_), zmq::send_flags::sndmore);
    sock_.send(zmq::buffer(bytes.data(), bytes.size()), zmq::send_flags::none);
  } catch (const zmq::error_t& e) {
    return Status(Code::Unavailable, std::string("sending to the previous stage: ") + e.what());
  }
  return Status::ok();
}

}  // namespace k3::prefill
