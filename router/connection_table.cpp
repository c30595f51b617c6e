#include "router/connection_table.h"

namespace k3::router {

ConnectionTable::ConnectionTable(ConnectionLimits limits, ConnectionMetrics& metrics) : limits_(limits), metrics_(metrics) {}

void ConnectionTable::unlink_idle_locked(Entry& e, Client& c) {
  if (!e.idle) return;
  idle_.erase(e.in_all_idle);
  c.idle.erase(e.in_client_idle);
  e.idle = false;
}

std::shared_ptr<EvictableConnection> ConnectionTable::erase_locked(Id id) {
  auto it = entries_.find(id);
  if (it == entries_.end()) return nullptr;
  auto cit = clients_.find(it->second.client);
  unlink_idle_locked(it->second, cit->second);
  auto conn = it->second.conn.lock();
  if (--cit->second.open == 0) clients_.erase(cit);
  entries_.erase(it);
  metrics_.set_open(static_cast<int64_t>(entries_.size()));
  if (entries_.empty()) emptied_.notify_all();
  return conn;
}

ConnectionTable::Admission ConnectionTable::admit(const std::string& client, std::weak_ptr<EvictableConnection> conn) {
  Admission a;
  std::lock_guard lk(mu_);
  auto cit = clients_.find(client);
  if (limits_.max_per_client > 0 && cit != clients_.end() && cit->second.open >= limits_.max_per_client) {
    if (cit->second.idle.empty()) {
      metrics_.count_refused(CloseReason::PerClientLimit);
      a.verdict = Verdict::RefusePerClient;
      return a;
    }
    a.victims_reason = CloseReason::PerClientLimit;
    // erase_locked may drop the client's record when this was its last connection: look it up again.
    a.victims.push_back(erase_locked(cit->second.idle.front()));
    metrics_.count_closed(CloseReason::PerClientLimit);
  } else if (static_cast<int>(entries_.size()) >= limits_.max_total) {
    if (idle_.empty()) {
      metrics_.count_refused(CloseReason::GlobalLimit);
      a.verdict = Verdict::RefuseGlobal;
      return a;
    }
    a.victims_reason = CloseReason::GlobalLimit;
    a.victims.push_back(erase_locked(idle_.front()));
    metrics_.count_closed(CloseReason::GlobalLimit);
  }
  std::erase(a.victims, nullptr);  // one already being destroyed has made room by leaving
  a.id = next_id_++;
  Client& c = clients_[client];
  ++c.open;
  Entry& e = entries_[a.id];
  e.client = client;
  e.conn = std::move(conn);
  e.in_all_idle = idle_.insert(idle_.end(), a.id);
  e.in_client_idle = c.idle.insert(c.idle.end(), a.id);
  metrics_.set_open(static_cast<int64_t>(entries_.size()));
  return a;
}

void ConnectionTable::set_busy(Id id) {
  std::lock_guard lk(mu_);
  auto it = entries_.find(id);
  if (it == entries_.end()) return;
  unlink_idle_locked(it->second, clients_.at(it->second.client));
}

void ConnectionTable::set_idle(Id id) {
  std::lock_guard lk(mu_);
  auto it = entries_.find(id);
  if (it == entries_.end()) return;
  Entry& e = it->second;
  Client& c = clients_.at(e.client);
  unlink_idle_locked(e, c);
  e.in_all_idle = idle_.insert(idle_.end(), id);
  e.in_client_idle = c.idle.insert(c.idle.end(), id);
  e.idle = true;
}

void ConnectionTable::remove(Id id) {
  std::lock_guard lk(mu_);
  erase_locked(id);
}

std::shared_ptr<EvictableConnection> ConnectionTable::take_oldest_idle() {
  std::lock_guard lk(mu_);
  while (!idle_.empty()) {
    auto conn = erase_locked(idle_.front());
    if (conn) {
      metrics_.count_closed(CloseReason::FdLimit);
      return conn;
    }
  }
  return nullptr;
}

int ConnectionTable::open() const {
  std::lock_guard lk(mu_);
  return static_cast<int>(entries_.size());
}

std::vector<std::shared_ptr<EvictableConnection>> ConnectionTable::all() const {
  std::lock_guard lk(mu_);
  std::vector<std::shared_ptr<EvictableConnection>> out;
  out.reserve(entries_.size());
  for (const auto& [id, e] : entries_)
    if (auto c = e.conn.lock()) out.push_back(std::move(c));
  return out;
}

bool ConnectionTable::wait_empty(std::chrono::steady_clock::time_point deadline) const {
  std::unique_lock lk(mu_);
  return emptied_.wait_until(lk, deadline, [&] { return entries_.empty(); });
}

}  // namespace k3::router
