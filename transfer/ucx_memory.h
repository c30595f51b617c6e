// Registered memory and remote keys.
// A pool is registered once (ucp_mem_map of the whole range) and its packed rkey is published to
// the peers that will write into it; a writer unpacks that rkey against its endpoint once and reuses
// it for every put. Registration stays alive until the UcxMemory is destroyed, which the owner does
// only after every write that could target it has been flushed (deferred release on decode).
#pragma once
#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "transfer/ucx_context.h"

namespace k3::transfer {

class UcxMemory {
 public:
  // Registers [base, base + length); the memory stays owned by the caller.
  static Result<std::unique_ptr<UcxMemory>> map(std::shared_ptr<UcxContext> ctx, void* base, size_t length,
                                                MemoryType type = MemoryType::Host);
  // Allocates and registers `length` host bytes through UCX (ucp_mem_map with UCP_MEM_MAP_ALLOCATE).
  // Prefer this for pools peers write into: on one host UCX then places the pool in a shared-memory
  // segment that peers map and write with memcpy (one-sided, ~perftest bandwidth), whereas user
  // memory is reachable only through slower paths (cma / emulated RMA, see docs/PERF.md).
  // The memory is owned by the UcxMemory and freed with it.
  static Result<std::unique_ptr<UcxMemory>> allocate(std::shared_ptr<UcxContext> ctx, size_t length);
  ~UcxMemory();
  UcxMemory(const UcxMemory&) = delete;
  UcxMemory& operator=(const UcxMemory&) = delete;

  ucp_mem_h get() const { return memh_; }
  uint8_t* base() const { return base_; }
  size_t length() const { return length_; }
  MemoryType type() const { return type_; }
  bool contains(const void* p, size_t n) const {
    auto* b = static_cast<const uint8_t*>(p);
    return b >= base_ && n <= length_ && b - base_ <= static_cast<std::ptrdiff_t>(length_ - n);
  }
  // The packed remote key peers need to write here (opaque bytes; travels in registration/ADDRS).
  Result<std::vector<uint8_t>> packed_rkey() const;

 private:
  UcxMemory(std::shared_ptr<UcxContext> ctx, ucp_mem_h m, uint8_t* b, size_t n, MemoryType t)
      : ctx_(std::move(ctx)), memh_(m), base_(b), length_(n), type_(t) {}
  std::shared_ptr<UcxContext> ctx_;
  ucp_mem_h memh_;
  uint8_t* base_;
  size_t length_;
  MemoryType type_;
};

// A packed rkey unpacked for one endpoint. Holds the endpoint so the rkey is destroyed first.
class RemoteKey {
 public:
  // remote_base/remote_length describe the registered range on the peer, for bounds checks.
  static Result<std::unique_ptr<RemoteKey>> unpack(std::shared_ptr<UcxEndpoint> ep, std::span<const uint8_t> packed,
                                                   uint64_t remote_base, uint64_t remote_length);
  ~RemoteKey();
  RemoteKey(const RemoteKey&) = delete;
  RemoteKey& operator=(const RemoteKey&) = delete;

  ucp_rkey_h get() const { return rkey_; }
  const std::shared_ptr<UcxEndpoint>& endpoint() const { return ep_; }
  uint64_t remote_base() const { return base_; }
  uint64_t remote_length() const { return length_; }
  bool contains(uint64_t addr, uint64_t n) const {
    return addr >= base_ && n <= length_ && addr - base_ <= length_ - n;
  }

 private:
  RemoteKey(std::shared_ptr<UcxEndpoint> ep, ucp_rkey_h k, uint64_t b, uint64_t n)
      : ep_(std::move(ep)), rkey_(k), base_(b), length_(n) {}
  std::shared_ptr<UcxEndpoint> ep_;
  ucp_rkey_h rkey_;
  uint64_t base_;
  uint64_t length_;
};

}  // namespace k3::transfer
