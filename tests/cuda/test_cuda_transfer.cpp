// The data plane with device memory: puts from CUDA memory into CUDA (or host) memory registered by
// another UCX worker, through the CUDA-aware UCX (cuda_copy / cuda_ipc), and through pinned staging
// (CudaSourceReader). Each result is compared byte for byte with the same runs applied on the host
// (the slow reference). Prints SKIPPED where no GPU is visible.
#include <catch2/catch.hpp>

#include <atomic>
#include <cstring>
#include <random>
#include <thread>

#include "tests/transfer/progressed_worker.h"
#include "transfer/cuda/cuda_memory.h"

using namespace k3::transfer;
using namespace std::chrono_literals;

namespace {

#define K3_CUDA_DEVICE_OR_SKIP()                                  \
  if (auto n = cuda_device_count(); !n.is_ok()) {                 \
    WARN("SKIPPED: " << n.status().to_string());                  \
    return;                                                       \
  }

// A target rank: its own context/worker and a thread sleeping on progress, as a decode rank's loop.
using Target = k3::test::ProgressedWorker;

struct Run { size_t src_off, dst_off, n; };

std::vector<Run> random_runs(std::mt19937& rng, size_t src_bytes, size_t dst_bytes, size_t max_run) {
  std::vector<Run> out;
  std::uniform_int_distribution<size_t> gap(0, 4096), len(1, max_run);
  for (size_t dst = 0;;) {
    dst += gap(rng);
    const size_t n = len(rng);
    if (dst + n > dst_bytes) break;
    out.push_back({std::uniform_int_distribution<size_t>(0, src_bytes - n)(rng), dst, n});
    dst += n;
  }
  return out;
}

std::vector<uint8_t> pattern(size_t n, uint32_t seed) {
  std::vector<uint8_t> v(n);
  std::mt19937 rng(seed);
  for (auto& b : v) b = static_cast<uint8_t>(rng());
  return v;
}

// Writes `runs` from a device source (or, with host_source, unregistered host memory, as a prefill stage
// that exports its cache into host bytes puts it) into the target's registration and compares the image.
void check_against_host(bool cuda_destination, bool force_staging, bool source_memh = false, bool host_source = false) {
  constexpr size_t kSrc = 4 << 20, kDst = 8 << 20;
  // The writer's CUDA context exists before its UCX context, as in every process that moves device memory.
  REQUIRE(cuda_make_current(0).is_ok());
  Target target;
  auto sctx = UcxContext::create().value();
  // What makes UCX CUDA-aware: the wheel's cuda transports loaded into this context.
  REQUIRE(sctx->supports(MemoryType::Cuda));
  auto sworker = UcxWorker::create(sctx).value();

  const auto host_src = pattern(kSrc, 5);
  auto src = CudaBuffer::create(kSrc).value();
  REQUIRE(src->upload(host_src.data(), kSrc).is_ok());
  auto src_mem = UcxMemory::map(sctx, src->data(), kSrc, MemoryType::Cuda).value();

  std::unique_ptr<CudaBuffer> dst_dev;
  std::vector<uint8_t> dst_host;
  std::unique_ptr<UcxMemory> dst_mem;
  if (cuda_destination) {
    dst_dev = CudaBuffer::create(kDst).value();
    REQUIRE(dst_dev->fill(0xEE).is_ok());
    dst_mem = UcxMemory::map(target.ctx, dst_dev->data(), kDst, MemoryType::Cuda).value();
  } else {
    dst_host.assign(kDst, 0xEE);
    dst_mem = UcxMemory::map(target.ctx, dst_host.data(), kDst).value();
  }
  const uint64_t base = reinterpret_cast<uint64_t>(dst_mem->base());
  auto ep = sworker->connect(target.worker->address(), /*peer_error_handling=*/false).value();
  auto rkey = RemoteKey::unpack(ep, dst_mem->packed_rkey().value(), base, kDst).value();
  WriterOptions wo;
  wo.force_staging = force_staging;
  wo.staging_slot_bytes = 64 << 10;  // several slots per long run: exercises slot reuse
  std::shared_ptr<const SourceReader> reader = std::make_shared<CudaSourceReader>();
  if (host_source) reader = std::make_shared<HostSourceReader>();
  auto writer = UcxWriter::create(sworker, reader, wo).value();
  const uint8_t* source = host_source ? host_src.data() : static_cast<const uint8_t*>(src->data());

  std::mt19937 rng(cuda_destination * 2 + force_staging);
  const auto runs = random_runs(rng, kSrc, kDst, 300 << 10);
  REQUIRE(runs.size() > 10);
  std::vector<RemoteWrite> writes;
  std::vector<uint8_t> expected(kDst, 0xEE);
  for (const Run& r : runs) {
    writes.push_back({source + r.src_off, base + r.dst_off, r.n});
    std::memcpy(expected.data() + r.dst_off, host_src.data() + r.src_off, r.n);
  }
  REQUIRE(writer->write(*rkey, writes, {}, source_memh ? src_mem.get() : nullptr).is_ok());
  std::vector<uint8_t> got(kDst);
  if (cuda_destination) REQUIRE(dst_dev->download(got.data(), kDst).is_ok());
  else got = dst_host;
  size_t first_bad = kDst;
  for (size_t i = 0; i < kDst && first_bad == kDst; ++i)
    if (got[i] != expected[i]) first_bad = i;
  INFO("first differing byte at " << first_bad);
  CHECK(first_bad == kDst);
  size_t total = 0;
  for (const Run& r : runs) total += r.n;
  CHECK(writer->stats().bytes == total);
}

}  // namespace

TEST_CASE("puts from CUDA memory into CUDA memory equal the host reference", "[cuda][transfer]") {
  K3_CUDA_DEVICE_OR_SKIP();
  check_against_host(/*cuda_destination=*/true, /*force_staging=*/false);
}

TEST_CASE("puts from a registered CUDA source (its memory handle) into CUDA memory equal the host reference",
          "[cuda][transfer]") {
  K3_CUDA_DEVICE_OR_SKIP();
  check_against_host(/*cuda_destination=*/true, /*force_staging=*/false, /*source_memh=*/true);
}

TEST_CASE("puts from CUDA memory into host memory equal the host reference", "[cuda][transfer]") {
  K3_CUDA_DEVICE_OR_SKIP();
  check_against_host(/*cuda_destination=*/false, /*force_staging=*/false);
}

TEST_CASE("puts from host memory into CUDA memory equal the host reference", "[cuda][transfer]") {
  K3_CUDA_DEVICE_OR_SKIP();
  check_against_host(/*cuda_destination=*/true, /*force_staging=*/false, /*source_memh=*/false, /*host_source=*/true);
}

TEST_CASE("CUDA source through pinned staging (CudaSourceReader) equals the host reference", "[cuda][transfer]") {
  K3_CUDA_DEVICE_OR_SKIP();
  check_against_host(/*cuda_destination=*/true, /*force_staging=*/true);
}

TEST_CASE("CudaBuffer rejects bad input", "[cuda][transfer]") {
  CHECK(CudaBuffer::create(0).status().code() == k3::Code::InvalidArgument);
  K3_CUDA_DEVICE_OR_SKIP();
  CHECK(cuda_make_current(-1).code() == k3::Code::InvalidArgument);
  auto b = CudaBuffer::create(16).value();
  uint8_t host[32] = {};
  CHECK(b->upload(host, 32).code() == k3::Code::OutOfRange);
  CHECK(b->download(host, 8, 12).code() == k3::Code::OutOfRange);
}
