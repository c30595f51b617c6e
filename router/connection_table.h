// Which HTTP connections are open, from which client, and which of them are idle; decides on each new
// connection whether it fits the limits (global and per source IP), closing the oldest idle connection
// to make room before refusing anyone. Pure bookkeeping (no sockets), so every admission rule is a unit
// test; the server (http_server.cpp) owns one and tells it when a connection turns busy or idle.
//
// "Idle" means: no request being answered, i.e. waiting for the next request or still receiving it
// (header or body: a slowloris client, slow header or slow body, is exactly what we want to close
// first). A connection is busy from the end of its request to the end of its response; busy ones are
// never closed to make room, so a request being answered is never cut off by the limits.
#pragma once
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <list>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include "router/connection_metrics.h"

namespace k3::router {

// An open connection the table may ask to close. evict() may be called from any thread; a connection
// that turned busy meanwhile finishes its response and closes then.
class EvictableConnection {
 public:
  virtual ~EvictableConnection() = default;
  virtual void evict(CloseReason why) = 0;
};

struct ConnectionLimits {
  int max_total = 10000;        // open connections in all
  int max_per_client = 1024;    // open connections per source address; 0 = no per-client limit
};

class ConnectionTable {
 public:
  using Id = uint64_t;
  enum class Verdict { Admit, RefusePerClient, RefuseGlobal };
  struct Admission {
    Verdict verdict = Verdict::Admit;
    Id id = 0;                                                   // set when admitted
    std::vector<std::shared_ptr<EvictableConnection>> victims;   // call evict() on these (outside any lock)
    CloseReason victims_reason = CloseReason::GlobalLimit;
  };

  ConnectionTable(ConnectionLimits limits, ConnectionMetrics& metrics);

  // A new connection from `client`: admitted (as idle), after closing the oldest idle connection of the
  // same client (per-client limit reached) or the oldest idle one of all (global limit reached); refused
  // when every connection that would have to go is busy. Counts refusals and evictions in the metrics.
  Admission admit(const std::string& client, std::weak_ptr<EvictableConnection> conn);
  void set_busy(Id id);  // unknown ids (already evicted or removed) are ignored
  void set_idle(Id id);  // becomes the newest idle connection
  void remove(Id id);
  // Out of file descriptors: the oldest idle connection of all, taken out of the table (nullptr if none).
  std::shared_ptr<EvictableConnection> take_oldest_idle();

  int open() const;
  std::vector<std::shared_ptr<EvictableConnection>> all() const;
  // Waits until no connection is left or the deadline passes; true when empty.
  bool wait_empty(std::chrono::steady_clock::time_point deadline) const;

 private:
  struct Entry {
    std::string client;
    std::weak_ptr<EvictableConnection> conn;
    bool idle = true;
    std::list<Id>::iterator in_all_idle, in_client_idle;
  };
  struct Client {
    int open = 0;
    std::list<Id> idle;  // oldest first
  };
  // Both take the lock as held; the entry leaves the table and its connection is returned (may be null
  // when it is already being destroyed).
  std::shared_ptr<EvictableConnection> erase_locked(Id id);
  void unlink_idle_locked(Entry& e, Client& c);

  const ConnectionLimits limits_;
  ConnectionMetrics& metrics_;
  mutable std::mutex mu_;
  mutable std::condition_variable emptied_;
  Id next_id_ = 1;
  std::unordered_map<Id, Entry> entries_;
  std::unordered_map<std::string, Client> clients_;
  std::list<Id> idle_;  // all idle connections, oldest first
};

}  // namespace k3::router
