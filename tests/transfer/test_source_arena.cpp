// A prefill stage's source arena with real UCX: images carved from one registered host range, written
// into a peer's registered memory by the writer with the arena's memory handle (byte-identical to the
// image), their extents returned when the last holder lets go (also when that is after the arena's owner
// dropped it), and a full arena saying so (nullopt, counted) instead of failing the request.
#include <catch2/catch.hpp>

#include <cstring>
#include <vector>

#include "common/protocol/metrics.h"
#include "tests/transfer/progressed_worker.h"
#include "transfer/source_arena.h"
#include "transfer/ucx_writer.h"

using namespace k3::transfer;

using Target = k3::test::RegisteredTarget;

TEST_CASE("source arena: images carved from one registration, put with its handle, extents returned",
          "[transfer][arena]") {
  k3::protocol::MetricsRegistry metrics;
  auto ctx = UcxContext::create().value();
  auto worker = UcxWorker::create(ctx).value();
  auto arena = SourceArena::create(ctx, MemoryType::Host, 1 << 20, &metrics).value();
  REQUIRE(arena->registration() != nullptr);
  CHECK(metrics.gauge_value("k3_transfer_source_arena_free_bytes") == 1 << 20);

  auto a = arena->take(300 * 1024).value();
  auto b = arena->take(500 * 1024).value();
  CHECK(a->registration() == arena->registration());
  CHECK(arena->registration()->contains(a->data(), a->size()));
  CHECK(arena->registration()->contains(b->data(), b->size()));
  CHECK((a->data() + a->size() <= b->data() || b->data() + b->size() <= a->data()));
  CHECK(metrics.gauge_value("k3_transfer_source_arena_free_bytes") == (1 << 20) - 800 * 1024);

  // Full: no extent of 300 KiB is left; the caller makes its own image.
  CHECK_FALSE(arena->take(300 * 1024).has_value());
  CHECK(metrics.counter_value("k3_transfer_source_arena_overflow_total") == 1);

  // Put b's bytes into a peer with the arena's memory handle.
  for (size_t i = 0; i < b->size(); ++i) b->data()[i] = static_cast<uint8_t>(i * 131 + 7);
  Target target(1 << 20);
  auto ep = worker->connect(target.worker->address()).value();
  auto rkey = RemoteKey::unpack(ep, target.mem->packed_rkey().value(), target.base(), target.pool.size()).value();
  auto writer = UcxWriter::create(worker, std::make_shared<HostSourceReader>()).value();
  const std::vector<RemoteWrite> runs{{b->data(), target.base() + 4096, 200 * 1024},
                                      {b->data() + 200 * 1024, target.base() + 600 * 1024, 300 * 1024}};
  REQUIRE(writer->write(*rkey, runs, {}, b->registration()).is_ok());
  // write() returned after the flush: the bytes are in the peer's memory.
  CHECK(std::memcmp(target.pool.data() + 4096, b->data(), 200 * 1024) == 0);
  CHECK(std::memcmp(target.pool.data() + 600 * 1024, b->data() + 200 * 1024, 300 * 1024) == 0);
  CHECK(target.pool[4095] == 0xEE);

  // Extents come back with their images; an image may outlive the arena's owner.
  a.reset();
  CHECK(arena->free_bytes() == (1 << 20) - 500 * 1024);
  CHECK(arena->take(300 * 1024).has_value());   // a's room again (the temporary goes at once)
  std::weak_ptr<SourceArena> weak = arena;
  arena.reset();
  CHECK_FALSE(weak.expired());                  // b holds it
  rkey.reset();
  ep.reset();
  b.reset();
  CHECK(weak.expired());
  CHECK(metrics.gauge_value("k3_transfer_source_arena_free_bytes") == 1 << 20);
}

TEST_CASE("source arena: bad sizes and device memory without a CUDA build are clear errors", "[transfer][arena]") {
  auto ctx = UcxContext::create().value();
  auto tiny = SourceArena::create(ctx, MemoryType::Host, 100, nullptr);
  REQUIRE_FALSE(tiny.is_ok());
  CHECK_THAT(tiny.status().message(), Catch::Contains("100 bytes"));
  CHECK_FALSE(SourceArena::create(nullptr, MemoryType::Host, 1 << 20, nullptr).is_ok());
#ifndef K3_TRANSFER_HAVE_CUDA
  auto dev = SourceArena::create(ctx, MemoryType::Cuda, 1 << 20, nullptr);
  REQUIRE_FALSE(dev.is_ok());
  CHECK_THAT(dev.status().message(), Catch::Contains("CUDA build"));
#endif
}
