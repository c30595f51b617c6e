// Executes a write list: one-sided puts into a peer's registered memory, completed by a flush.
//
// Guarantees (docs/STYLE.md habit 10):
// - write() returns Ok only after an endpoint flush: every byte is in remote memory, so the caller
//   may send TRANSFER_DONE.
// - Cancel (should_stop returns true) and timeout: no new puts are posted; puts already posted may
//   still land; write() then waits for the posted ones (bounded by the timeout) before returning,
//   and the destination must stay registered until the peer learns the writer is done or dead.
// - Coalescing is the plan's job; each RemoteWrite is one contiguous run and becomes one put
//   (or several staging-sized puts).
//
// Memory-type seam: a SourceReader says where the source bytes live. When UCX can read that memory
// type directly the put is posted from it; otherwise chunks are copied into a registered host
// bounce buffer (pinned staging) and put from there, double-buffered so the copy of chunk i+1
// overlaps the put of chunk i.
#pragma once
#include <chrono>
#include <functional>
#include <memory>
#include <span>

#include "transfer/ucx_memory.h"

namespace k3::transfer {

// One contiguous run: `length` bytes from local `src` to `remote_addr` in the peer's registration.
struct RemoteWrite {
  const void* src = nullptr;
  uint64_t remote_addr = 0;
  size_t length = 0;
};

// Reads source bytes of one memory type into host memory (the CUDA reader: transfer/cuda/cuda_memory.h).
class SourceReader {
 public:
  virtual ~SourceReader() = default;
  virtual MemoryType type() const = 0;
  virtual Status copy_to_host(void* host_dst, const void* src, size_t n) const = 0;
};

class HostSourceReader final : public SourceReader {
 public:
  MemoryType type() const override { return MemoryType::Host; }
  Status copy_to_host(void* host_dst, const void* src, size_t n) const override;
};

struct WriterOptions {
  size_t staging_slot_bytes = size_t{4} << 20;  // one bounce buffer slot
  int staging_slots = 2;
  bool force_staging = false;                    // tests: exercise the staging path with host memory
  size_t max_outstanding_puts = 256;             // bounds UCX request memory for long write lists
  // Puts of a list tell UCX they are one batch whose throughput counts, not each one's latency
  // (UCP_OP_ATTR_FLAG_MULTI_SEND, as ucx_perftest's bandwidth tests do); off only to measure it.
  bool batch_hint = true;
  // wait(): progress without sleeping for up to this long before sleeping on the worker's event fd
  // (0: sleep at once, the default; many processes share a host's cores). For GPU hosts, where a
  // list's device copies complete within a few hundred microseconds and each fd wake-up costs tens.
  std::chrono::microseconds busy_poll{0};
  std::chrono::milliseconds timeout{30000};      // for the whole write() incl. flush
};

struct WriteStats {
  uint64_t bytes = 0;
  uint64_t puts = 0;
};

class UcxWriter {
 public:
  static Result<std::unique_ptr<UcxWriter>> create(std::shared_ptr<UcxWorker> worker,
                                                   std::shared_ptr<const SourceReader> reader,
                                                   WriterOptions options = {});
  ~UcxWriter();
  UcxWriter(const UcxWriter&) = delete;
  UcxWriter& operator=(const UcxWriter&) = delete;

  // Writes every run into `dest` (bounds-checked against its registered range), then flushes.
  // `source`, when given, is the registration every run's source bytes lie in (checked): the puts carry
  // its memory handle, so UCX takes the source's memory type and device from the registration and never
  // registers or looks the buffer up per put (the zero-copy protocols need a registered source; with
  // device memory that is what lets a put go over cuda_ipc). Without it UCX detects and registers each
  // source itself.
  Status write(const RemoteKey& dest, std::span<const RemoteWrite> writes,
               const std::function<bool()>& should_stop = {}, const UcxMemory* source = nullptr);

  // write() in two halves, so that several write lists can be in flight on one endpoint: post() checks
  // and posts every run and requests the endpoint flush without waiting for it; wait() waits for that
  // flush (so for every put posted before it) and returns what write() would have. Lists finish in the
  // order posted. The writer's timeout runs from post(). With the staging path (its bounce buffers are
  // shared) post() does the whole write and wait() only returns its result. A list dropped unwaited is
  // abandoned safely: UCX's callbacks free what they still reference.
  class InFlight;
  Result<std::unique_ptr<InFlight>> post(const RemoteKey& dest, std::span<const RemoteWrite> writes,
                                         const std::function<bool()>& should_stop = {},
                                         const UcxMemory* source = nullptr);
  Status wait(InFlight& list);
  bool staging() const { return staging_ != nullptr; }
  const WriteStats& stats() const { return stats_; }

 private:
  struct Batch;
  UcxWriter(std::shared_ptr<UcxWorker> w, std::shared_ptr<const SourceReader> r, WriterOptions o)
      : worker_(std::move(w)), reader_(std::move(r)), opt_(o) {}
  Status write_direct(const RemoteKey& dest, std::span<const RemoteWrite> writes, Batch& batch,
                      const std::function<bool()>& should_stop, std::chrono::steady_clock::time_point deadline,
                      const UcxMemory* source);
  Status write_staged(const RemoteKey& dest, std::span<const RemoteWrite> writes, Batch& batch,
                      const std::function<bool()>& should_stop, std::chrono::steady_clock::time_point deadline);
  // slot >= 0: from that staging slot; else from `source` (its memh) or unregistered memory (nullptr).
  Status post_put(const RemoteKey& dest, const void* src, size_t n, uint64_t remote, Batch& batch, int slot,
                  const UcxMemory* source = nullptr);

  // Frees `batch` now, or (puts still pending) leaves that to the last put callback.
  static void release(Batch* batch);

  std::shared_ptr<UcxWorker> worker_;
  std::shared_ptr<const SourceReader> reader_;
  WriterOptions opt_;
  std::vector<uint8_t> staging_buf_;
  std::unique_ptr<UcxMemory> staging_;
  WriteStats stats_;
};

// A posted write list (UcxWriter::post).
class UcxWriter::InFlight {
 public:
  ~InFlight();
  InFlight(const InFlight&) = delete;
  InFlight& operator=(const InFlight&) = delete;
  // Every put and the flush completed (or failed): wait() will not block.
  bool done() const;

 private:
  friend class UcxWriter;
  InFlight() = default;
  Batch* batch_ = nullptr;                              // null once released
  std::unique_ptr<UcxEndpoint::PendingFlush> flush_;    // null once waited
  Status result_;                                       // posting's error; once waited, the list's result
  std::chrono::steady_clock::time_point deadline_;
};

}  // namespace k3::transfer
