#include "common/protocol/metrics.h"

#include <algorithm>

#include "common/core/status.h"

namespace k3::protocol {
namespace {

bool valid_name(const std::string& n) {
  if (n.empty()) return false;
  for (size_t i = 0; i < n.size(); ++i) {
    const char c = n[i];
    const bool alpha = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_' || c == ':';
    if (!alpha && !(i > 0 && c >= '0' && c <= '9')) return false;
  }
  return true;
}

std::string escape_label_value(const std::string& v) {
  std::string out;
  for (char c : v) {
    if (c == '\\') out += "\\\\";
    else if (c == '"') out += "\\\"";
    else if (c == '\n') out += "\\n";
    else out += c;
  }
  return out;
}

// `{a="x",b="y"}` or empty; also the key that identifies a sample inside its family.
std::string label_text(const Labels& labels) {
  if (labels.empty()) return "";
  std::string s = "{";
  for (size_t i = 0; i < labels.size(); ++i) {
    K3_CHECK(valid_name(labels[i].first) && labels[i].first.rfind("__", 0) != 0,
             "invalid metric label name '" + labels[i].first + "'");
    s += (i ? "," : "") + labels[i].first + "=\"" + escape_label_value(labels[i].second) + "\"";
  }
  return s + "}";
}

}  // namespace

struct MetricsRegistry::Family {
  bool is_counter = true;
  std::string help;
  // unique_ptr: references handed out stay valid when the map grows.
  std::map<std::string, std::unique_ptr<Counter>> counters;
  std::map<std::string, std::unique_ptr<Gauge>> gauges;
};

MetricsRegistry::MetricsRegistry() = default;
MetricsRegistry::~MetricsRegistry() = default;

MetricsRegistry::Family& MetricsRegistry::family(const std::string& name, bool is_counter,
                                                 const std::string& help) {
  K3_CHECK(valid_name(name), "invalid metric name '" + name + "'");
  auto& f = families_[name];
  if (!f) {
    f = std::make_unique<Family>();
    f->is_counter = is_counter;
    f->help = help;
  }
  K3_CHECK(f->is_counter == is_counter,
           "metric '" + name + "' already registered as a " + (f->is_counter ? "counter" : "gauge"));
  if (f->help.empty()) f->help = help;
  return *f;
}

Counter& MetricsRegistry::counter(const std::string& name, const Labels& labels, const std::string& help) {
  std::lock_guard lock(mu_);
  auto& slot = family(name, true, help).counters[label_text(labels)];
  if (!slot) slot = std::make_unique<Counter>();
  return *slot;
}

Gauge& MetricsRegistry::gauge(const std::string& name, const Labels& labels, const std::string& help) {
  std::lock_guard lock(mu_);
  auto& slot = family(name, false, help).gauges[label_text(labels)];
  if (!slot) slot = std::make_unique<Gauge>();
  return *slot;
}

uint64_t MetricsRegistry::counter_value(const std::string& name, const Labels& labels) const {
  std::lock_guard lock(mu_);
  auto f = families_.find(name);
  if (f == families_.end() || !f->second->is_counter) return 0;
  auto c = f->second->counters.find(label_text(labels));
  return c == f->second->counters.end() ? 0 : c->second->value();
}

int64_t MetricsRegistry::gauge_value(const std::string& name, const Labels& labels) const {
  std::lock_guard lock(mu_);
  auto f = families_.find(name);
  if (f == families_.end() || f->second->is_counter) return 0;
  auto g = f->second->gauges.find(label_text(labels));
  return g == f->second->gauges.end() ? 0 : g->second->value();
}

std::string MetricsRegistry::prometheus_text() const {
  std::lock_guard lock(mu_);
  std::string out;
  for (const auto& [name, f] : families_) {  // std::map: sorted by name, then by label text
    if (!f->help.empty()) {
      std::string help;
      for (char c : f->help) help += c == '\n' ? std::string("\\n") : c == '\\' ? std::string("\\\\") : std::string(1, c);
      out += "# HELP " + name + " " + help + "\n";
    }
    out += "# TYPE " + name + (f->is_counter ? " counter\n" : " gauge\n");
    if (f->is_counter)
      for (const auto& [labels, c] : f->counters) out += name + labels + " " + std::to_string(c->value()) + "\n";
    else
      for (const auto& [labels, g] : f->gauges) out += name + labels + " " + std::to_string(g->value()) + "\n";
  }
  return out;
}

namespace metric {

void count_bytes(MetricsRegistry* m, uint64_t bytes) {
  if (m) m->counter(kBytes, {}, "Bytes written by the transfer data plane").add(bytes);
}
void count_transfer(MetricsRegistry* m) {
  if (m) m->counter(kTransfers, {}, "Completed per-stage request transfers").add();
}
void count_failure(MetricsRegistry* m, AbortReason cause) {
  if (m) m->counter(kFailures, {{"cause", abort_reason_name(cause)}}, "Requests ended by abort or failure, by cause").add();
}
void count_transition(MetricsRegistry* m, RequestState from, RequestState to) {
  if (m)
    m->counter(kTransitions, {{"from", state_name(from)}, {"to", state_name(to)}},
               "Request state transitions").add();
}
void count_rejected_frame(MetricsRegistry* m) {
  if (m) m->counter(kRejectedFrames, {}, "Control frames rejected by the decoder").add();
}

void set_active_requests(MetricsRegistry* m, int64_t n) {
  if (m) m->gauge(kActiveRequests, {}, "Requests this process holds state for").set(n);
}
void set_region_bytes(MetricsRegistry* m, uint32_t region, const std::string& memory, uint64_t bytes) {
  if (m)
    m->gauge(kRegionBytes, {{"memory", memory}, {"region", std::to_string(region)}},
             "Bytes of a registered region the transfer writes into, by where it lives").set(int64_t(bytes));
}
void count_source_bytes(MetricsRegistry* m, const std::string& memory, uint64_t bytes) {
  if (m) m->counter(kSourceBytes, {{"memory", memory}}, "Bytes a prefill stage posted for writing, by where the source lives").add(bytes);
}
void count_gathered_puts(MetricsRegistry* m, uint64_t planned, uint64_t posted) {
  if (!m) return;
  m->counter(kPlannedPuts, {}, "Puts of write lists a prefill stage gathered through a staging image, as planned").add(planned);
  m->counter(kGatheredPuts, {}, "Puts those gathered write lists took instead").add(posted);
}
void set_pool_free_bytes(MetricsRegistry* m, uint32_t rank, uint64_t bytes) {
  if (m) m->gauge(kPoolFreeBytes, {{"rank", std::to_string(rank)}}, "Free bytes of a decode rank's pool").set(int64_t(bytes));
}

}  // namespace metric
}  // namespace k3::protocol
