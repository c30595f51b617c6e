#include "transfer/cuda/cuda_memory.h"

#include <cuda_runtime.h>

#include <string>

namespace k3::transfer {
namespace {
Status cuda_status(cudaError_t e, const std::string& what) {
  if (e == cudaSuccess) return Status::ok();
  return {Code::Internal, "CUDA " + what + ": " + cudaGetErrorString(e)};
}
}  // namespace

Result<int> cuda_device_count() {
  int n = 0;
  if (cudaError_t e = cudaGetDeviceCount(&n); e != cudaSuccess) {
    return Status{Code::Unavailable, std::string("no usable CUDA device: ") + cudaGetErrorString(e)};
  }
  if (n == 0) return Status{Code::Unavailable, "no CUDA device visible"};
  return n;
}

Status cuda_make_current(int device) {
  K3_ASSIGN_OR_RETURN(int n, cuda_device_count());
  if (device < 0 || device >= n)
    return invalid_argument("CUDA device " + std::to_string(device) + " out of range (have " + std::to_string(n) + ")");
  K3_TRY(cuda_status(cudaSetDevice(device), "cudaSetDevice(" + std::to_string(device) + ")"));
  return cuda_status(cudaFree(nullptr), "context creation (cudaFree(0))");
}

Result<std::unique_ptr<CudaBuffer>> CudaBuffer::create(size_t bytes) {
  if (bytes == 0) return invalid_argument("CudaBuffer::create: bytes is 0");
  void* p = nullptr;
  K3_TRY(cuda_status(cudaMalloc(&p, bytes), "cudaMalloc(" + std::to_string(bytes) + " bytes)"));
  return std::unique_ptr<CudaBuffer>(new CudaBuffer(p, bytes));
}

CudaBuffer::~CudaBuffer() { cudaFree(ptr_); }

Status cuda_upload(void* dst, const void* host, size_t n) {
  return cuda_status(cudaMemcpy(dst, host, n, cudaMemcpyHostToDevice), "upload");
}

Status cuda_gather_rows(void* dst, const void* src, size_t row_bytes, size_t pitch, size_t rows) {
  return cuda_status(cudaMemcpy2DAsync(dst, row_bytes, src, pitch, row_bytes, rows, cudaMemcpyDeviceToDevice, 0),
                     "row gather (cudaMemcpy2DAsync)");
}

Status cuda_copies_done() { return cuda_status(cudaStreamSynchronize(0), "row gathers (cudaStreamSynchronize)"); }

Status CudaBuffer::upload(const void* host, size_t n, size_t offset) {
  if (offset > bytes_ || n > bytes_ - offset) return {Code::OutOfRange, "CudaBuffer::upload past the end"};
  return cuda_upload(static_cast<char*>(ptr_) + offset, host, n);
}

Status CudaBuffer::download(void* host, size_t n, size_t offset) const {
  if (offset > bytes_ || n > bytes_ - offset) return {Code::OutOfRange, "CudaBuffer::download past the end"};
  return cuda_status(cudaMemcpy(host, static_cast<const char*>(ptr_) + offset, n, cudaMemcpyDeviceToHost), "download");
}

Status CudaBuffer::fill(int byte) { return cuda_status(cudaMemset(ptr_, byte, bytes_), "cudaMemset"); }

Status CudaSourceReader::copy_to_host(void* host_dst, const void* src, size_t n) const {
  return cuda_status(cudaMemcpy(host_dst, src, n, cudaMemcpyDeviceToHost), "source copy to staging");
}

}  // namespace k3::transfer
