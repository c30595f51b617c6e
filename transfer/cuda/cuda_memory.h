// CUDA device memory on the data plane (CUDA builds only: K3_TRANSFER_HAVE_CUDA): a device
// allocation that a UcxMemory registers (decode pools, prefill sources, benches), and the source reader
// for bytes in device memory. With a CUDA-aware UCX (cuda_copy / cuda_ipc loaded) the writer puts
// straight from device memory and this reader is never asked to copy; without one it stages through
// pinned host memory (ucx_writer.h).
#pragma once
#include <cstddef>
#include <memory>

#include "transfer/ucx_writer.h"

namespace k3::transfer {

// Number of CUDA devices visible, or an error naming why none can be used (no driver, no device).
Result<int> cuda_device_count();

// Makes `device`'s primary context current on this thread and creates it now (cudaSetDevice + cudaFree(0)).
// A process that moves device memory over UCX calls this before it creates its UCX context, as
// ucx_perftest does: docs/PERF.md ("Device memory") records what the order changes.
Status cuda_make_current(int device);

// Synchronous copy of `n` host bytes to device address `dst` (any device allocation, e.g. an arena's extent).
Status cuda_upload(void* dst, const void* host, size_t n);
// `rows` rows of `row_bytes` at src, src + pitch, ... to dst back to back (device to device), enqueued on
// the legacy default stream (the engine's streams do not wait for it); cuda_copies_done waits for them.
Status cuda_gather_rows(void* dst, const void* src, size_t row_bytes, size_t pitch, size_t rows);
Status cuda_copies_done();

class CudaBuffer {
 public:
  // cudaMalloc of `bytes` on the current device.
  static Result<std::unique_ptr<CudaBuffer>> create(size_t bytes);
  ~CudaBuffer();
  CudaBuffer(const CudaBuffer&) = delete;
  CudaBuffer& operator=(const CudaBuffer&) = delete;

  void* data() const { return ptr_; }
  size_t bytes() const { return bytes_; }
  // Synchronous copies between host memory and [offset, offset + n) of the buffer.
  Status upload(const void* host, size_t n, size_t offset = 0);
  Status download(void* host, size_t n, size_t offset = 0) const;
  Status fill(int byte);

 private:
  CudaBuffer(void* p, size_t n) : ptr_(p), bytes_(n) {}
  void* ptr_;
  size_t bytes_;
};

class CudaSourceReader final : public SourceReader {
 public:
  MemoryType type() const override { return MemoryType::Cuda; }
  Status copy_to_host(void* host_dst, const void* src, size_t n) const override;
};

}  // namespace k3::transfer
