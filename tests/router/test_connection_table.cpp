// The HTTP server's admission rules without sockets: per-client and global limits, which idle
// connection is closed to make room, busy connections never closed, refusals and their counters;
// plus the handler pool's bound and the open-file limit helper.
#include <catch2/catch.hpp>

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <mutex>

#include "router/blocking_pool.h"
#include "router/connection_table.h"
#include "router/open_file_limit.h"

using namespace k3::router;

namespace {

struct FakeConnection : EvictableConnection {
  int evictions = 0;
  CloseReason last{};
  void evict(CloseReason why) override {
    ++evictions;
    last = why;
  }
};

struct Opened {
  std::shared_ptr<FakeConnection> conn = std::make_shared<FakeConnection>();
  ConnectionTable::Admission admission;
};

Opened open(ConnectionTable& t, const std::string& client) {
  Opened o;
  o.admission = t.admit(client, o.conn);
  for (auto& v : o.admission.victims) v->evict(o.admission.victims_reason);
  return o;
}

}  // namespace

TEST_CASE("per-client limit: the client's oldest idle connection makes room, else 429") {
  ConnectionMetrics m;
  ConnectionTable t({.max_total = 100, .max_per_client = 2}, m);
  Opened a = open(t, "10.0.0.1"), b = open(t, "10.0.0.1"), other = open(t, "10.0.0.2");
  REQUIRE(a.admission.verdict == ConnectionTable::Verdict::Admit);
  REQUIRE(t.open() == 3);
  Opened c = open(t, "10.0.0.1");  // a is the oldest idle of this client
  CHECK(c.admission.verdict == ConnectionTable::Verdict::Admit);
  CHECK(a.conn->evictions == 1);
  CHECK(a.conn->last == CloseReason::PerClientLimit);
  CHECK(b.conn->evictions == 0);
  CHECK(other.conn->evictions == 0);  // another client's connection is never taken
  CHECK(t.open() == 3);
  t.remove(a.admission.id);  // the evicted connection closing later changes nothing
  CHECK(t.open() == 3);
  // b and c busy: nothing of this client is idle, so the next one is refused.
  t.set_busy(b.admission.id);
  t.set_busy(c.admission.id);
  Opened d = open(t, "10.0.0.1");
  CHECK(d.admission.verdict == ConnectionTable::Verdict::RefusePerClient);
  CHECK(t.open() == 3);
  CHECK(m.refused(CloseReason::PerClientLimit) == 1);
  CHECK(m.closed(CloseReason::PerClientLimit) == 1);
  // b back to idle: it is the one to go next.
  t.set_idle(b.admission.id);
  Opened e = open(t, "10.0.0.1");
  CHECK(e.admission.verdict == ConnectionTable::Verdict::Admit);
  CHECK(b.conn->evictions == 1);
  CHECK(c.conn->evictions == 0);
}

TEST_CASE("global limit: the oldest idle connection of all makes room, busy ones never; else 503") {
  ConnectionMetrics m;
  ConnectionTable t({.max_total = 3, .max_per_client = 0}, m);
  Opened a = open(t, "a"), b = open(t, "b"), c = open(t, "c");
  t.set_busy(a.admission.id);
  t.set_busy(b.admission.id);
  t.set_idle(b.admission.id);  // b idle again, newer than c
  Opened d = open(t, "d");
  CHECK(d.admission.verdict == ConnectionTable::Verdict::Admit);
  CHECK(c.conn->evictions == 1);
  CHECK(c.conn->last == CloseReason::GlobalLimit);
  CHECK(a.conn->evictions == 0);  // busy
  CHECK(b.conn->evictions == 0);
  t.set_busy(b.admission.id);
  t.set_busy(d.admission.id);
  Opened e = open(t, "e");
  CHECK(e.admission.verdict == ConnectionTable::Verdict::RefuseGlobal);
  CHECK(m.refused(CloseReason::GlobalLimit) == 1);
  CHECK(m.closed(CloseReason::GlobalLimit) == 1);
  CHECK(m.open() == 3);
  // Out of descriptors: the oldest idle goes; none idle, none taken.
  CHECK(t.take_oldest_idle() == nullptr);
  t.set_idle(a.admission.id);
  CHECK(t.take_oldest_idle() == a.conn);
  CHECK(m.closed(CloseReason::FdLimit) == 1);
  CHECK(t.open() == 2);
}

TEST_CASE("a connection already being destroyed makes room by leaving") {
  ConnectionMetrics m;
  ConnectionTable t({.max_total = 1, .max_per_client = 0}, m);
  ConnectionTable::Id gone_id;
  {
    Opened gone = open(t, "a");
    gone_id = gone.admission.id;
  }  // its owner dropped it; the table still counts it until remove()
  Opened b = open(t, "b");
  CHECK(b.admission.verdict == ConnectionTable::Verdict::Admit);
  CHECK(b.admission.victims.empty());
  t.remove(gone_id);
  CHECK(t.open() == 1);
  t.remove(b.admission.id);
  CHECK(t.open() == 0);
  CHECK(t.wait_empty(std::chrono::steady_clock::now()));
}

TEST_CASE("connection metrics render every reason") {
  ConnectionMetrics m;
  m.count_accepted();
  m.count_closed(CloseReason::HeaderTimeout);
  m.count_refused(CloseReason::PerClientLimit);
  m.set_open(5);
  const std::string text = m.prometheus_text();
  CHECK(text.find("\nk3_router_open_connections 5\n") != std::string::npos);
  CHECK(text.find("\nk3_router_connections_accepted_total 1\n") != std::string::npos);
  CHECK(text.find("\nk3_router_connections_closed_total{reason=\"header_timeout\"} 1\n") != std::string::npos);
  CHECK(text.find("\nk3_router_connections_closed_total{reason=\"idle_timeout\"} 0\n") != std::string::npos);
  CHECK(text.find("\nk3_router_connections_refused_total{reason=\"per_client_limit\"} 1\n") != std::string::npos);
  CHECK(text.find("\nk3_router_connections_refused_total{reason=\"global_limit\"} 0\n") != std::string::npos);
}

TEST_CASE("blocking pool: at most max_threads run, the rest queue in order; stop runs what is queued") {
  BlockingPool pool(2);
  std::mutex mu;
  std::condition_variable cv;
  int running = 0, most = 0, done = 0;
  bool release = false;
  std::vector<int> order;
  for (int i = 0; i < 6; ++i)
    REQUIRE(pool.submit([&, i] {
      std::unique_lock lk(mu);
      most = std::max(most, ++running);
      order.push_back(i);
      cv.notify_all();
      cv.wait(lk, [&] { return release; });
      --running;
      ++done;
    }));
  {
    std::unique_lock lk(mu);
    REQUIRE(cv.wait_for(lk, std::chrono::seconds(30), [&] { return running == 2; }));
    release = true;
    cv.notify_all();
  }
  pool.stop();
  CHECK(done == 6);
  CHECK(most == 2);
  REQUIRE(order.size() == 6);
  CHECK(std::min(order[0], order[1]) == 0);  // the first two queued ran first; the rest waited for them
  CHECK(std::max(order[0], order[1]) == 1);
  CHECK_FALSE(pool.submit([] {}));
}

TEST_CASE("open-file limit: raised to the hard limit when low, and said so") {
  const OpenFileLimit now = raise_open_file_limit(0);  // wants nothing: changes nothing
  REQUIRE(now.error.empty());
  CHECK(now.soft == now.before);
  CHECK(describe_open_file_limit(now, 0).empty());
  const OpenFileLimit raised{.before = 1024, .soft = 4096, .hard = 4096};
  CHECK(describe_open_file_limit(raised, 2000).find("from 1024 to 4096") != std::string::npos);
  const OpenFileLimit low{.before = 1024, .soft = 1024, .hard = 1024};
  CHECK(describe_open_file_limit(low, 10256).find("below the 10256") != std::string::npos);
}
