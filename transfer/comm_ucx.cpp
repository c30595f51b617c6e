#include "transfer/comm_ucx.h"

#include <cstring>
#include <string>

#include "transfer/zmq_channel.h"

namespace k3::transfer {

namespace {

constexpr uint64_t kCollectiveBit = uint64_t{1} << 63;
constexpr uint32_t kMaxUserTag = (1u << 24) - 1;

uint64_t make_tag(bool collective, uint32_t tag24, int src) {
  return (collective ? kCollectiveBit : 0) | (uint64_t{tag24 & kMaxUserTag} << 32) | static_cast<uint32_t>(src);
}

// --- bootstrap frames (rank addresses), strictly decoded --------------------------------------
constexpr uint32_t kHelloMagic = 0x48423B4Bu, kTableMagic = 0x54423B4Bu, kAckMagic = 0x41423B4Bu;

void put_u32(std::vector<uint8_t>& out, uint32_t v) {
  for (int i = 0; i < 4; ++i) out.push_back(static_cast<uint8_t>(v >> (8 * i)));
}
struct Reader {
  std::span<const uint8_t> in;
  size_t pos = 0;
  bool u32(uint32_t& v) {
    if (in.size() - pos < 4) return false;
    v = 0;
    for (int i = 0; i < 4; ++i) v |= uint32_t{in[pos + i]} << (8 * i);
    pos += 4;
    return true;
  }
  bool bytes(std::vector<uint8_t>& out, size_t n) {
    if (in.size() - pos < n) return false;
    out.assign(in.begin() + pos, in.begin() + pos + n);
    pos += n;
    return true;
  }
  bool done() const { return pos == in.size(); }
};

std::vector<uint8_t> encode_hello(int rank, int size, const std::vector<uint8_t>& addr) {
  std::vector<uint8_t> out;
  put_u32(out, kHelloMagic);
  put_u32(out, rank);
  put_u32(out, size);
  out.insert(out.end(), addr.begin(), addr.end());
  return out;
}

std::vector<uint8_t> encode_table(const std::vector<std::vector<uint8_t>>& addrs) {
  std::vector<uint8_t> out;
  put_u32(out, kTableMagic);
  put_u32(out, addrs.size());
  for (auto& a : addrs) {
    put_u32(out, a.size());
    out.insert(out.end(), a.begin(), a.end());
  }
  return out;
}

Result<std::vector<std::vector<uint8_t>>> decode_table(std::span<const uint8_t> in, int size) {
  Reader r{in};
  uint32_t magic = 0, n = 0;
  if (!r.u32(magic) || magic != kTableMagic) return invalid_argument("bootstrap table: bad magic");
  if (!r.u32(n) || n != static_cast<uint32_t>(size))
    return invalid_argument("bootstrap table: rank count " + std::to_string(n) + " != size " + std::to_string(size));
  std::vector<std::vector<uint8_t>> addrs(n);
  for (uint32_t i = 0; i < n; ++i) {
    uint32_t len = 0;
    if (!r.u32(len) || !r.bytes(addrs[i], len) || len == 0)
      return invalid_argument("bootstrap table: address of rank " + std::to_string(i) + " is truncated or empty");
  }
  if (!r.done()) return invalid_argument("bootstrap table: trailing bytes");
  return addrs;
}

Result<ControlEvent> next_message(EventQueue& q, const std::function<bool(const ControlEvent&)>& accept,
                                  std::chrono::milliseconds timeout, const std::string& what) {
  K3_ASSIGN_OR_RETURN(auto e, q.next([&](const ControlEvent& ev) { return ev.kind == ControlEventKind::Message && accept(ev); },
                                     timeout));
  if (!e) return Status(Code::DeadlineExceeded, "comm bootstrap: timed out waiting for " + what);
  return std::move(*e);
}

}  // namespace

Result<std::unique_ptr<UcxComm>> UcxComm::create(int rank, int size, const std::string& rank0_endpoint,
                                                 UcxCommOptions options,
                                                 const std::function<void(const std::string&)>& on_bound) {
  if (size < 1) return invalid_argument("UcxComm: size must be >= 1, got " + std::to_string(size));
  if (rank < 0 || rank >= size)
    return invalid_argument("UcxComm: rank " + std::to_string(rank) + " outside 0.." + std::to_string(size - 1));
  std::unique_ptr<UcxComm> c(new UcxComm(rank, size, options));
  K3_ASSIGN_OR_RETURN(c->ctx_, UcxContext::create(UCP_FEATURE_TAG));
  K3_ASSIGN_OR_RETURN(c->worker_, UcxWorker::create(c->ctx_));

  std::vector<std::vector<uint8_t>> table(size);
  table[rank] = c->worker_->address();
  zmq::context_t zctx;
  ControlOptions copt;
  copt.name = "comm/" + std::to_string(rank);
  copt.heartbeat = {std::chrono::milliseconds(200), 50};  // startup of many processes on few cores is slow
  if (rank == 0) {
    K3_ASSIGN_OR_RETURN(auto server, ControlServer::bind(zctx, rank0_endpoint, copt));
    EventQueue events(*server);
    if (on_bound) on_bound(server->endpoint());
    std::vector<std::string> names(size);
    for (int got = 1; got < size; ++got) {
      K3_ASSIGN_OR_RETURN(auto hello, next_message(events, [](const ControlEvent&) { return true; }, options.timeout, "hello"));
      Reader r{hello.payload};
      uint32_t magic = 0, rk = 0, sz = 0;
      if (!r.u32(magic) || magic != kHelloMagic || !r.u32(rk) || !r.u32(sz) || sz != static_cast<uint32_t>(size) ||
          rk == 0 || rk >= sz || !table[rk].empty() || !r.bytes(table[rk], hello.payload.size() - 12) ||
          table[rk].empty()) {
        return invalid_argument("comm bootstrap: bad hello from " + hello.peer + " (rank/size/address)");
      }
      names[rk] = hello.peer;
    }
    const auto t = encode_table(table);
    for (int r = 1; r < size; ++r) K3_TRY(server->send(names[r], t));
    for (int acked = 1; acked < size; ++acked) {
      K3_ASSIGN_OR_RETURN(auto ack, next_message(events, [](const ControlEvent& e) { return e.payload.size() == 8; },
                                                 options.timeout, "acks"));
      (void)ack;
    }
  } else {
    K3_ASSIGN_OR_RETURN(auto client, ControlClient::connect(zctx, rank0_endpoint, copt));
    EventQueue events(*client);
    K3_TRY(client->send(encode_hello(rank, size, table[rank])));
    K3_ASSIGN_OR_RETURN(auto reply, next_message(events, [](const ControlEvent&) { return true; }, options.timeout, "address table"));
    K3_ASSIGN_OR_RETURN(table, decode_table(reply.payload, size));
    std::vector<uint8_t> ack;
    put_u32(ack, kAckMagic);
    put_u32(ack, rank);
    K3_TRY(client->send(ack));
    // Let the ack leave before the socket closes (rank 0 waits for it).
    (void)client->poll(std::chrono::milliseconds(20));
  }
  c->eps_.resize(size);
  for (int p = 0; p < size; ++p) {
    if (p == rank) continue;
    K3_ASSIGN_OR_RETURN(c->eps_[p], c->worker_->connect(table[p]));
  }
  K3_TRY(c->barrier());  // every endpoint is usable before the first user collective
  return c;
}

UcxComm::~UcxComm() {
  // Endpoints close (flush) before the worker and context go.
  eps_.clear();
}

Status UcxComm::check_peer(int peer, const char* what) const {
  if (peer < 0 || peer >= size_ || peer == rank_)
    return invalid_argument(std::string(what) + ": peer " + std::to_string(peer) + " is not another rank of 0.." +
                            std::to_string(size_ - 1));
  return Status::ok();
}

Status UcxComm::send(int peer, std::span<const std::byte> data, uint32_t tag) {
  K3_TRY(check_peer(peer, "send"));
  if (tag > kMaxUserTag) return invalid_argument("send: tag " + std::to_string(tag) + " >= 2^24");
  auto* c = new UcxCompletion;
  ucp_request_param_t p = ucx_send_param(c);
  auto req = ucp_tag_send_nbx(eps_[peer]->get(), data.data(), data.size(), make_tag(false, tag, rank_), &p);
  return ucx_wait(*worker_, req, c, opt_.timeout, "send to rank " + std::to_string(peer), nullptr, while_waiting_);
}

Status UcxComm::recv(int peer, std::span<std::byte> data, uint32_t tag) {
  K3_TRY(check_peer(peer, "recv"));
  if (tag > kMaxUserTag) return invalid_argument("recv: tag " + std::to_string(tag) + " >= 2^24");
  auto* c = new UcxCompletion;
  ucp_request_param_t p = ucx_recv_param(c);
  auto req = ucp_tag_recv_nbx(worker_->get(), data.data(), data.size(), make_tag(false, tag, peer), ~uint64_t{0}, &p);
  size_t got = 0;
  K3_TRY(ucx_wait(*worker_, req, c, opt_.timeout, "recv from rank " + std::to_string(peer), &got, while_waiting_));
  if (req != nullptr && got != data.size())
    return invalid_argument("recv from rank " + std::to_string(peer) + ": got " + std::to_string(got) +
                            " bytes, expected " + std::to_string(data.size()));
  return Status::ok();
}

Status UcxComm::exchange(const std::vector<std::span<const std::byte>>& to,
                         const std::vector<std::span<std::byte>>& from) {
  const uint32_t seq = collective_seq_++ & kMaxUserTag;
  struct Posted {
    ucs_status_ptr_t req;
    UcxCompletion* c;
    size_t expect;
    bool is_recv;
    int peer;
  };
  std::vector<Posted> posted;
  Status first;
  auto post_failed = [&](ucs_status_ptr_t req, UcxCompletion* c) {
    if (UCS_PTR_IS_ERR(req)) {
      delete c;
      if (first.is_ok()) first = ucx_status(UCS_PTR_STATUS(req), "collective post");
      return true;
    }
    return false;
  };
  for (int p = 0; p < size_; ++p) {
    if (p == rank_ || from[p].empty()) continue;
    auto* c = new UcxCompletion;
    ucp_request_param_t prm = ucx_recv_param(c);
    auto req = ucp_tag_recv_nbx(worker_->get(), from[p].data(), from[p].size(), make_tag(true, seq, p), ~uint64_t{0}, &prm);
    if (!post_failed(req, c)) posted.push_back({req, c, from[p].size(), true, p});
  }
  if (!to[rank_].empty()) std::memcpy(from[rank_].data(), to[rank_].data(), to[rank_].size());
  for (int k = 1; k < size_; ++k) {
    const int p = (rank_ + k) % size_;  // staggered so rank 0 is not everyone's first target
    if (to[p].empty()) continue;
    auto* c = new UcxCompletion;
    ucp_request_param_t prm = ucx_send_param(c);
    auto req = ucp_tag_send_nbx(eps_[p]->get(), to[p].data(), to[p].size(), make_tag(true, seq, rank_), &prm);
    if (!post_failed(req, c)) posted.push_back({req, c, 0, false, p});
  }
  for (auto& x : posted) {
    size_t got = x.expect;
    Status s = ucx_wait(*worker_, x.req, x.c, opt_.timeout,
                        std::string(x.is_recv ? "collective recv from rank " : "collective send to rank ") +
                            std::to_string(x.peer),
                        &got, while_waiting_);
    if (s.is_ok() && x.is_recv && x.req != nullptr && got != x.expect)
      s = invalid_argument("collective recv from rank " + std::to_string(x.peer) + ": got " + std::to_string(got) +
                           " bytes, expected " + std::to_string(x.expect));
    if (first.is_ok() && !s.is_ok()) first = s;
  }
  return first;
}

namespace {
template <class T>
std::span<const std::byte> cbytes(std::span<const T> s) { return std::as_bytes(s); }
template <class T>
std::span<std::byte> wbytes(std::span<T> s) { return std::as_writable_bytes(s); }
}  // namespace

Status UcxComm::reduce_scatter_even(std::span<const float> in, std::span<float> out) {
  const size_t count = in.size();
  const Chunk mine = even_chunk(count, size_, rank_);
  if (out.size() != mine.count)
    return invalid_argument("reduce_scatter: out has " + std::to_string(out.size()) + " floats, chunk is " +
                            std::to_string(mine.count));
  std::vector<float> recv(static_cast<size_t>(size_) * mine.count);
  std::vector<std::span<const std::byte>> to(size_);
  std::vector<std::span<std::byte>> from(size_);
  for (int p = 0; p < size_; ++p) {
    const Chunk c = even_chunk(count, size_, p);
    to[p] = cbytes(in.subspan(c.offset, c.count));
    from[p] = wbytes(std::span<float>(recv).subspan(p * mine.count, mine.count));
  }
  K3_TRY(exchange(to, from));
  // Rank order, one element at a time: ((x0 + x1) + x2) ... exactly as a serial loop over ranks.
  for (size_t i = 0; i < mine.count; ++i) {
    float acc = recv[i];
    for (int p = 1; p < size_; ++p) acc += recv[p * mine.count + i];
    out[i] = acc;
  }
  return Status::ok();
}

Status UcxComm::all_reduce_sum(std::span<float> data) {
  const Chunk mine = even_chunk(data.size(), size_, rank_);
  std::vector<float> reduced(mine.count);
  K3_TRY(reduce_scatter_even(data, reduced));
  std::vector<std::span<const std::byte>> to(size_, cbytes(std::span<const float>(reduced)));
  std::vector<std::span<std::byte>> from(size_);
  for (int p = 0; p < size_; ++p) {
    const Chunk c = even_chunk(data.size(), size_, p);
    from[p] = wbytes(data.subspan(c.offset, c.count));
  }
  return exchange(to, from);
}

Status UcxComm::reduce_scatter_sum(std::span<const float> in, std::span<float> out) {
  if (in.size() != out.size() * size_)
    return invalid_argument("reduce_scatter_sum: in has " + std::to_string(in.size()) + " floats, expected size " +
                            std::to_string(size_) + " x out " + std::to_string(out.size()));
  return reduce_scatter_even(in, out);
}

Status UcxComm::all_gather(std::span<const std::byte> mine, std::span<std::byte> all) {
  if (all.size() != mine.size() * size_)
    return invalid_argument("all_gather: all has " + std::to_string(all.size()) + " bytes, expected size x " +
                            std::to_string(mine.size()));
  std::vector<std::span<const std::byte>> to(size_, mine);
  std::vector<std::span<std::byte>> from(size_);
  for (int p = 0; p < size_; ++p) from[p] = all.subspan(p * mine.size(), mine.size());
  return exchange(to, from);
}

Status UcxComm::all_to_all(std::span<const std::byte> in, std::span<std::byte> out) {
  if (in.size() != out.size() || in.size() % size_ != 0)
    return invalid_argument("all_to_all: in and out must be equal and divisible into " + std::to_string(size_) +
                            " blocks (in " + std::to_string(in.size()) + ", out " + std::to_string(out.size()) + ")");
  const size_t b = in.size() / size_;
  std::vector<std::span<const std::byte>> to(size_);
  std::vector<std::span<std::byte>> from(size_);
  for (int p = 0; p < size_; ++p) {
    to[p] = in.subspan(p * b, b);
    from[p] = out.subspan(p * b, b);
  }
  return exchange(to, from);
}

Status UcxComm::all_to_allv(std::span<const std::byte> in, std::span<const size_t> send_counts,
                            std::span<std::byte> out, std::span<const size_t> recv_counts) {
  if (send_counts.size() != static_cast<size_t>(size_) || recv_counts.size() != static_cast<size_t>(size_))
    return invalid_argument("all_to_allv: send_counts and recv_counts need " + std::to_string(size_) + " entries");
  size_t st = 0, rt = 0;
  for (int p = 0; p < size_; ++p) {
    st += send_counts[p];
    rt += recv_counts[p];
  }
  if (st != in.size()) return invalid_argument("all_to_allv: sum(send_counts) != in.size()");
  if (rt != out.size()) return invalid_argument("all_to_allv: sum(recv_counts) != out.size()");
  if (send_counts[rank_] != recv_counts[rank_]) return invalid_argument("all_to_allv: self send != self recv count");
  std::vector<std::span<const std::byte>> to(size_);
  std::vector<std::span<std::byte>> from(size_);
  size_t so = 0, ro = 0;
  for (int p = 0; p < size_; ++p) {
    to[p] = in.subspan(so, send_counts[p]);
    from[p] = out.subspan(ro, recv_counts[p]);
    so += send_counts[p];
    ro += recv_counts[p];
  }
  return exchange(to, from);
}

Status UcxComm::barrier() {
  std::byte mine{1};
  std::vector<std::byte> all(size_);
  return all_gather(std::span<const std::byte>(&mine, 1), all);
}

}  // namespace k3::transfer
