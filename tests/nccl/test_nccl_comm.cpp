// The NCCL Comm as a group of one on GPU 0: every collective on device buffers gives the Comm
// interface's result (a group of one: copies, and the sums of one contribution), and bad calls are refused
// by name. More ranks need one GPU each (NCCL refuses two ranks on one device); the same calls then run
// the NCCL transfers. One GPU can still show the join deadline: rank 0 of a group of two whose rank 1
// never comes. Prints SKIPPED where no GPU is visible.
#include <catch2/catch.hpp>

#include <cuda_runtime.h>

#include <chrono>
#include <cstdio>
#include <numeric>
#include <vector>

#include "transfer/nccl/comm_nccl.h"

using namespace k3;
using namespace k3::transfer;

namespace {

bool have_gpu(std::string& why) {
  int n = 0;
  const cudaError_t e = cudaGetDeviceCount(&n);
  if (e != cudaSuccess) why = std::string("no CUDA device: ") + cudaGetErrorString(e);
  else if (n == 0) why = "no CUDA device";
  return e == cudaSuccess && n > 0;
}

template <class T>
struct DeviceBuffer {  // RAII device memory for the test
  T* p = nullptr;
  size_t n = 0;
  explicit DeviceBuffer(size_t count) : n(count) { REQUIRE(cudaMalloc(&p, std::max<size_t>(1, n) * sizeof(T)) == cudaSuccess); }
  explicit DeviceBuffer(const std::vector<T>& v) : DeviceBuffer(v.size()) {
    REQUIRE(cudaMemcpy(p, v.data(), n * sizeof(T), cudaMemcpyHostToDevice) == cudaSuccess);
  }
  ~DeviceBuffer() { cudaFree(p); }
  std::vector<T> host() const {
    std::vector<T> v(n);
    REQUIRE(cudaMemcpy(v.data(), p, n * sizeof(T), cudaMemcpyDeviceToHost) == cudaSuccess);
    return v;
  }
  std::span<T> span() { return {p, n}; }
  std::span<std::byte> bytes() { return std::as_writable_bytes(span()); }
};

}  // namespace

TEST_CASE("NCCL Comm: a group of one on one GPU", "[nccl]") {
  std::string why;
  if (!have_gpu(why)) {
    WARN("SKIPPED: " << why);
    return;
  }
  auto id = NcclComm::new_unique_id();
  REQUIRE(id.is_ok());
  auto made = NcclComm::create(0, 1, *id, 0);
  INFO(made.status().to_string());
  REQUIRE(made.is_ok());
  NcclComm& c = **made;
  CHECK(c.rank() == 0);
  CHECK(c.size() == 1);

  std::vector<float> x(1000);
  for (size_t i = 0; i < x.size(); ++i) x[i] = std::ldexp(float(i % 17) - 8.f, int(i % 11) - 5);
  DeviceBuffer<float> a(x);
  REQUIRE(c.all_reduce_sum(a.span()).is_ok());
  CHECK(a.host() == x);  // one contribution: the sum is itself, bit for bit

  DeviceBuffer<float> rs_out(x.size());
  REQUIRE(c.reduce_scatter_sum(DeviceBuffer<float>(x).span(), rs_out.span()).is_ok());
  CHECK(rs_out.host() == x);

  std::vector<std::byte> bytes(37);
  for (size_t i = 0; i < bytes.size(); ++i) bytes[i] = std::byte(i * 7 + 3);
  DeviceBuffer<std::byte> src(bytes), gathered(bytes.size()), swapped(bytes.size());
  REQUIRE(c.all_gather(src.bytes(), gathered.bytes()).is_ok());
  CHECK(gathered.host() == bytes);
  REQUIRE(c.all_to_all(src.bytes(), swapped.bytes()).is_ok());
  CHECK(swapped.host() == bytes);
  const std::vector<size_t> counts{bytes.size()};
  DeviceBuffer<std::byte> v_out(bytes.size());
  REQUIRE(c.all_to_allv(src.bytes(), counts, v_out.bytes(), counts).is_ok());
  CHECK(v_out.host() == bytes);
  REQUIRE(c.barrier().is_ok());

  // Refused by name.
  CHECK(c.send(0, src.bytes()).to_string().find("bad peer 0") != std::string::npos);
  CHECK(c.recv(0, src.bytes(), 3).to_string().find("NCCL has no tags") != std::string::npos);
  DeviceBuffer<std::byte> short_out(bytes.size() - 1);
  CHECK(c.all_gather(src.bytes(), short_out.bytes()).to_string().find("expected size x 37") != std::string::npos);
  CHECK(NcclComm::create(0, 1, *id, 4096).status().to_string().find("device 4096 outside") != std::string::npos);
}

TEST_CASE("NCCL Comm: a group whose other rank never joins fails at the join deadline and keeps no memory",
          "[nccl]") {
  std::string why;
  if (!have_gpu(why)) {
    WARN("SKIPPED: " << why);
    return;
  }
  REQUIRE(cudaSetDevice(0) == cudaSuccess);
  REQUIRE(cudaFree(nullptr) == cudaSuccess);  // the context exists before the first measure
  size_t free_before = 0, free_after = 0, total = 0;
  REQUIRE(cudaMemGetInfo(&free_before, &total) == cudaSuccess);
  auto id = NcclComm::new_unique_id();
  REQUIRE(id.is_ok());
  const auto t0 = std::chrono::steady_clock::now();
  auto made = NcclComm::create(0, 2, *id, 0, std::chrono::milliseconds(2000));
  const double waited = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  REQUIRE(cudaMemGetInfo(&free_after, &total) == cudaSuccess);
  const double kept_mib = (double(free_before) - double(free_after)) / (1 << 20);
  std::printf("NCCL-JOIN rank 0 of 2 alone: failed after %.2f s (%s), device memory kept %.1f MiB\n", waited,
              made.status().to_string().c_str(), kept_mib);
  REQUIRE_FALSE(made.is_ok());
  CHECK(made.status().code() == Code::DeadlineExceeded);
  CHECK(made.status().message().find("rank 0 of 2") != std::string::npos);
  CHECK(made.status().message().find("did not form within 2000 ms") != std::string::npos);
  CHECK(waited >= 2.0);
  CHECK(waited < 10.0);
  // The abort gave back what the half-made communicator allocated (NCCL may keep a little per process).
  CHECK(kept_mib < 64.0);

  // The process can still form a group afterwards.
  auto id1 = NcclComm::new_unique_id();
  REQUIRE(id1.is_ok());
  auto one = NcclComm::create(0, 1, *id1, 0, std::chrono::milliseconds(30000));
  INFO(one.status().to_string());
  REQUIRE(one.is_ok());
  CHECK((*one)->barrier().is_ok());
}
