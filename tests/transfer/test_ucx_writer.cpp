// UCX data plane in one process: a writer worker puts into memory registered by a target worker
// (driven by its own thread, as a decode rank's progress loop would be).
#include <catch2/catch.hpp>

#include <poll.h>

#include <atomic>
#include <mutex>
#include <cstring>
#include <random>
#include <thread>

#include "tests/transfer/progressed_worker.h"
#include "transfer/async_writes.h"
#include "transfer/ucx_writer.h"

using namespace k3::transfer;
using namespace std::chrono_literals;

namespace {

// A target rank: its own context/worker served by a thread that sleeps on progress, and a registered pool.
using Target = k3::test::RegisteredTarget;

struct Source {
  std::shared_ptr<UcxContext> ctx = UcxContext::create().value();
  std::shared_ptr<UcxWorker> worker = UcxWorker::create(ctx).value();
  // An endpoint to `t` and the remote key of its whole pool (the key keeps the endpoint).
  std::unique_ptr<RemoteKey> key_to(const Target& t) const {
    auto ep = worker->connect(t.worker->address()).value();
    return RemoteKey::unpack(ep, t.mem->packed_rkey().value(), t.base(), t.pool.size()).value();
  }
};

// Random disjoint runs covering part of the destination; source bytes are a pure function of the
// source offset so a misplaced byte is caught.
std::vector<RemoteWrite> random_runs(std::mt19937& rng, const std::vector<uint8_t>& src, uint64_t dst_base,
                                     size_t dst_bytes, size_t max_run) {
  std::vector<RemoteWrite> out;
  size_t dst = 0;
  std::uniform_int_distribution<size_t> gap(0, 64), len(1, max_run);
  while (true) {
    dst += gap(rng);
    size_t n = len(rng);
    if (dst + n > dst_bytes) break;
    size_t s = std::uniform_int_distribution<size_t>(0, src.size() - n)(rng);
    out.push_back({src.data() + s, dst_base + dst, n});
    dst += n;
  }
  return out;
}

void check_runs(const std::vector<RemoteWrite>& runs, const std::vector<uint8_t>& pool, uint64_t base) {
  std::vector<bool> written(pool.size(), false);
  for (const auto& w : runs) {
    const size_t off = w.remote_addr - base;
    REQUIRE(std::memcmp(pool.data() + off, w.src, w.length) == 0);
    for (size_t i = 0; i < w.length; ++i) written[off + i] = true;
  }
  for (size_t i = 0; i < pool.size(); ++i)
    if (!written[i]) REQUIRE(pool[i] == 0xEE);  // nothing outside the runs was touched
}

std::vector<uint8_t> pattern(size_t n, uint32_t seed) {
  std::vector<uint8_t> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = static_cast<uint8_t>((i * 2654435761u + seed) >> 7);
  return v;
}

}  // namespace

TEST_CASE("direct puts land every run and touch nothing else", "[ucx]") {
  Target target(1 << 20);
  Source source;
  auto rkey_bytes = target.mem->packed_rkey().value();
  auto ep = source.worker->connect(target.worker->address()).value();
  auto rkey = RemoteKey::unpack(ep, rkey_bytes, target.base(), target.pool.size()).value();
  auto writer = UcxWriter::create(source.worker, std::make_shared<HostSourceReader>()).value();
  REQUIRE_FALSE(writer->staging());
  std::mt19937 rng(7);
  auto src = pattern(256 << 10, 1);
  auto runs = random_runs(rng, src, target.base(), target.pool.size(), 8192);
  REQUIRE(runs.size() > 50);
  REQUIRE(writer->write(*rkey, runs).is_ok());
  check_runs(runs, target.pool, target.base());
  CHECK(writer->stats().puts == runs.size());
}

TEST_CASE("staging path (host memory through the bounce buffer) equals the direct path", "[ucx]") {
  Target target(1 << 20);
  Source source;
  auto rkey = source.key_to(target);
  WriterOptions opt;
  opt.force_staging = true;
  opt.staging_slot_bytes = 4096;  // runs span several slots, slots are reused many times
  opt.staging_slots = 2;
  auto writer = UcxWriter::create(source.worker, std::make_shared<HostSourceReader>(), opt).value();
  REQUIRE(writer->staging());
  std::mt19937 rng(11);
  auto src = pattern(512 << 10, 2);
  auto runs = random_runs(rng, src, target.base(), target.pool.size(), 20000);
  REQUIRE(writer->write(*rkey, runs).is_ok());
  check_runs(runs, target.pool, target.base());
  size_t bytes = 0;
  for (auto& r : runs) bytes += r.length;
  CHECK(writer->stats().bytes == bytes);
  CHECK(writer->stats().puts > runs.size());  // long runs were split at slot size
}

TEST_CASE("puts from a registered source (its memory handle) equal the unregistered path", "[ucx]") {
  Target target(1 << 20);
  Source source;
  auto ep = source.worker->connect(target.worker->address()).value();
  auto rkey = RemoteKey::unpack(ep, target.mem->packed_rkey().value(), target.base(), target.pool.size()).value();
  auto writer = UcxWriter::create(source.worker, std::make_shared<HostSourceReader>()).value();
  auto src = pattern(256 << 10, 3);
  auto src_mem = UcxMemory::map(source.ctx, src.data(), src.size()).value();
  std::mt19937 rng(13);
  auto runs = random_runs(rng, src, target.base(), target.pool.size(), 16384);
  REQUIRE(runs.size() > 20);
  REQUIRE(writer->write(*rkey, runs, {}, src_mem.get()).is_ok());
  check_runs(runs, target.pool, target.base());
  CHECK(writer->stats().puts == runs.size());

  // A run whose source lies outside the given registration is refused by index, before any put.
  std::vector<uint8_t> elsewhere(64, 9);
  const uint64_t puts = writer->stats().puts;
  std::vector<RemoteWrite> bad = {{src.data(), target.base(), 64}, {elsewhere.data(), target.base() + 64, 64}};
  auto s = writer->write(*rkey, bad, {}, src_mem.get());
  REQUIRE(s.code() == k3::Code::OutOfRange);
  CHECK(s.message().find("writes[1] source") != std::string::npos);
  CHECK(writer->stats().puts == puts);
}

TEST_CASE("write lists in flight: each wait() returns once its runs landed; unwaited ones are safe", "[ucx]") {
  // Four lists into disjoint quarters of the pool, all posted before any is waited for, then waited in
  // order: each one's runs are in place when its wait returns (its flush follows every put before it).
  const bool staging = GENERATE(false, true);   // staged: post() does the whole write
  const int poll_us = GENERATE(0, 2000);         // waits that progress without sleeping first
  Target target(1 << 20);
  Source source;
  auto rkey = source.key_to(target);
  WriterOptions opt;
  opt.force_staging = staging;
  opt.staging_slot_bytes = 8192;
  opt.busy_poll = std::chrono::microseconds(poll_us);
  auto writer = UcxWriter::create(source.worker, std::make_shared<HostSourceReader>(), opt).value();
  std::mt19937 rng(19);
  auto src = pattern(256 << 10, 3);
  const size_t quarter = target.pool.size() / 4;
  std::vector<std::vector<RemoteWrite>> lists;
  std::vector<std::unique_ptr<UcxWriter::InFlight>> flying;
  for (int q = 0; q < 4; ++q) {
    lists.push_back(random_runs(rng, src, target.base() + q * quarter, quarter, 16384));
    REQUIRE(!lists.back().empty());
    flying.push_back(writer->post(*rkey, lists.back()).value());
  }
  for (int q = 0; q < 4; ++q) {
    INFO("list " << q << (staging ? ", staged" : "") << ", busy poll " << poll_us << " us");
    REQUIRE(writer->wait(*flying[q]).is_ok());
    CHECK(flying[q]->done());
    for (const auto& w : lists[q]) REQUIRE(std::memcmp(target.pool.data() + (w.remote_addr - target.base()), w.src, w.length) == 0);
    CHECK(writer->wait(*flying[q]).is_ok());   // waiting again returns the same result
  }
  std::vector<RemoteWrite> all;
  for (const auto& l : lists) all.insert(all.end(), l.begin(), l.end());
  check_runs(all, target.pool, target.base());   // nothing outside the runs was touched

  // Posted and dropped without a wait (a shutting-down writer): nothing dangles, the writer still works.
  { auto dropped = writer->post(*rkey, lists[0]).value(); }
  REQUIRE(writer->write(*rkey, lists[1]).is_ok());
  // A bad list is refused at post(), before any put.
  const std::vector<RemoteWrite> outside{{src.data(), target.base() + target.pool.size(), 8}};
  CHECK(writer->post(*rkey, outside).status().code() == k3::Code::OutOfRange);
}

TEST_CASE("a worker's wait polls for at most its busy-poll span and still honours the timeout", "[ucx]") {
  auto ctx = UcxContext::create().value();
  auto worker = UcxWorker::create(ctx).value();
  // Never done: the wait ends at its timeout even when the busy-poll span is longer.
  const auto t0 = std::chrono::steady_clock::now();
  auto s = worker->wait_until([] { return false; }, std::chrono::milliseconds(30), std::chrono::microseconds(200000));
  const auto waited = std::chrono::steady_clock::now() - t0;
  CHECK(s.code() == k3::Code::DeadlineExceeded);
  CHECK(waited >= std::chrono::milliseconds(30));
  CHECK(waited < std::chrono::milliseconds(1000));
  // Done after a few checks: returns ok from inside the busy-poll span.
  int calls = 0;
  CHECK(worker->wait_until([&] { return ++calls >= 5; }, std::chrono::milliseconds(1000), std::chrono::microseconds(5000))
            .is_ok());
  CHECK(calls == 5);
}

TEST_CASE("writes outside the registration are refused before any put", "[ucx]") {
  Target target(4096);
  Source source;
  auto ep = source.worker->connect(target.worker->address()).value();
  auto rkey = RemoteKey::unpack(ep, target.mem->packed_rkey().value(), target.base(), target.pool.size()).value();
  auto writer = UcxWriter::create(source.worker, std::make_shared<HostSourceReader>()).value();
  std::vector<uint8_t> src(64, 1);
  std::vector<RemoteWrite> bad = {{src.data(), target.base(), 64}, {src.data(), target.base() + 4090, 64}};
  auto s = writer->write(*rkey, bad);
  REQUIRE(s.code() == k3::Code::OutOfRange);
  CHECK(s.message().find("writes[1]") != std::string::npos);
  CHECK(writer->stats().puts == 0);
  for (auto b : target.pool) REQUIRE(b == 0xEE);
  std::vector<RemoteWrite> empty_run = {{src.data(), target.base(), 0}};
  CHECK(writer->write(*rkey, empty_run).code() == k3::Code::InvalidArgument);
}

TEST_CASE("cancel stops posting: later runs are never written", "[ucx]") {
  Target target(1 << 16);
  Source source;
  auto ep = source.worker->connect(target.worker->address()).value();
  auto rkey = RemoteKey::unpack(ep, target.mem->packed_rkey().value(), target.base(), target.pool.size()).value();
  auto writer = UcxWriter::create(source.worker, std::make_shared<HostSourceReader>()).value();
  std::vector<uint8_t> src(1024, 0x11);
  std::vector<RemoteWrite> runs;
  for (int i = 0; i < 32; ++i) runs.push_back({src.data(), target.base() + i * 1024u, 1024});
  int checks = 0;
  auto s = writer->write(*rkey, runs, [&] { return ++checks > 10; });
  REQUIRE(s.code() == k3::Code::Aborted);
  CHECK(writer->stats().puts == 10);
  for (size_t i = 0; i < target.pool.size(); ++i) REQUIRE(target.pool[i] == (i < 10 * 1024 ? 0x11 : 0xEE));
}

TEST_CASE("production data-plane setup: UCX-allocated pool, writer without peer errors", "[ucx]") {
  // What the drivers use (docs/PERF.md): the pool is allocated by UCX, the writer's endpoint has no peer
  // error mode and its worker sleeps on its event fd; the result must be byte-identical.
  auto tctx = UcxContext::create().value();
  auto tworker = UcxWorker::create(tctx).value();
  auto pool = UcxMemory::allocate(tctx, 1 << 20).value();
  REQUIRE(pool->length() == (1u << 20));
  std::memset(pool->base(), 0xEE, pool->length());
  std::atomic<bool> stop{false};
  std::thread progress([&] {
    while (!stop.load()) (void)tworker->wait_until([&] { return stop.load(); }, 20ms);
  });
  auto sctx = UcxContext::create(UCP_FEATURE_RMA | UCP_FEATURE_TAG).value();
  auto sworker = UcxWorker::create(sctx).value();
  CHECK(sworker->event_fd() >= 0);
  auto ep = sworker->connect(tworker->address(), /*peer_error_handling=*/false).value();
  const uint64_t base = reinterpret_cast<uint64_t>(pool->base());
  auto rkey = RemoteKey::unpack(ep, pool->packed_rkey().value(), base, pool->length()).value();
  auto writer = UcxWriter::create(sworker, std::make_shared<HostSourceReader>()).value();
  std::mt19937 rng(3);
  auto src = pattern(256 << 10, 9);
  auto runs = random_runs(rng, src, base, pool->length(), 16384);
  REQUIRE(writer->write(*rkey, runs).is_ok());
  std::vector<uint8_t> image(pool->base(), pool->base() + pool->length());
  check_runs(runs, image, base);
  stop = true;
  progress.join();
}

TEST_CASE("AsyncWrites: jobs run on the writer thread, each reported once; a cancelled queued job writes nothing",
          "[ucx]") {
  Target target(1 << 20);
  Source source;
  source.worker = UcxWorker::create(source.ctx, /*serialized=*/true).value();
  std::mutex ucx;
  auto ep = source.worker->connect(target.worker->address()).value();
  std::shared_ptr<const RemoteKey> rkey =
      RemoteKey::unpack(ep, target.mem->packed_rkey().value(), target.base(), target.pool.size()).value();
  auto writer = UcxWriter::create(source.worker, std::make_shared<HostSourceReader>()).value();
  auto writes = AsyncWrites::create(*writer, ucx).value();
  auto src = std::make_shared<const std::vector<uint8_t>>(pattern(64 << 10, 3));
  const auto job = [&](uint64_t id, uint64_t dst_off) {
    return WriteJob{.request_id = id, .runs = {{rkey, {{src->data(), target.base() + dst_off, src->size()}}}}, .source = src};
  };
  const auto wait_done = [&](size_t n) {
    std::vector<WriteDone> done;
    for (auto deadline = std::chrono::steady_clock::now() + 30s; done.size() < n;) {
      REQUIRE(std::chrono::steady_clock::now() < deadline);
      pollfd p{.fd = writes->fd(), .events = POLLIN, .revents = 0};
      (void)::poll(&p, 1, 1000);   // sleeps until a job ends (the fd), no spinning
      for (auto& d : writes->take_done()) done.push_back(std::move(d));
    }
    return done;
  };
  {
    // The "control loop" holds the worker: posting and cancelling never wait for it.
    std::unique_lock hold(ucx);
    writes->post(job(1, 0));
    writes->post(job(2, 128 << 10));
    writes->cancel(2);
    CHECK(writes->take_done().empty());   // nothing could run yet
  }
  const auto done = wait_done(2);
  REQUIRE(done.size() == 2);
  CHECK(done[0].request_id == 1);
  CHECK(done[0].status.is_ok());
  CHECK(done[0].end_us >= done[0].begin_us);
  CHECK(done[1].request_id == 2);
  CHECK(done[1].status.code() == k3::Code::Aborted);
  CHECK(std::memcmp(target.pool.data(), src->data(), src->size()) == 0);
  for (size_t i = 128 << 10; i < (192 << 10); ++i) REQUIRE(target.pool[i] == 0xEE);   // job 2 wrote nothing
  writes->forget(2);
  writes->post(job(2, 256 << 10));   // the id is usable again once forgotten
  const auto again = wait_done(1);
  CHECK(again.at(0).status.is_ok());
  CHECK(std::memcmp(target.pool.data() + (256 << 10), src->data(), src->size()) == 0);
  CHECK(writes->take_done().empty());   // each job reported exactly once
}

