#include "transfer/ucx_driver_common.h"

#include <spdlog/spdlog.h>

namespace k3::transfer {

namespace {
template <class... Ts> struct Overload : Ts... { using Ts::operator()...; };
template <class... Ts> Overload(Ts...) -> Overload<Ts...>;
}  // namespace

uint64_t request_of(const Action& a) {
  return std::visit(Overload{[](const SendAction& s) {
                               return std::visit([](const auto& m) -> uint64_t {
                                 if constexpr (requires { m.request_id; }) return m.request_id; else return 0;
                               }, s.message);
                             },
                             [](const auto& x) -> uint64_t { return x.request_id; }},
                    a);
}


std::string control_name(const Peer& p) {
  switch (p.role) {
    case Role::Router: return "router";
    case Role::Decode: return "decode/" + p.instance;
    case Role::Prefill: return "prefill/" + p.instance + "/" + std::to_string(p.stage);
  }
  return "?";
}

std::optional<Peer> parse_control_name(const std::string& name) {
  if (name == "router") return Peer{.role = Role::Router};
  if (name.rfind("decode/", 0) == 0 && name.size() > 7) return Peer{.role = Role::Decode, .instance = name.substr(7)};
  if (name.rfind("prefill/", 0) == 0) {
    const auto slash = name.rfind('/');
    if (slash <= 8 || slash + 1 >= name.size()) return std::nullopt;
    const std::string stage = name.substr(slash + 1);
    if (stage.find_first_not_of("0123456789") != std::string::npos || stage.size() > 9) return std::nullopt;
    return Peer{.role = Role::Prefill, .instance = name.substr(8, slash - 8),
                .stage = static_cast<uint32_t>(std::stoul(stage))};
  }
  return std::nullopt;
}

std::optional<protocol::Message> decode_or_drop(const ControlEvent& e, protocol::MetricsRegistry* metrics) {
  auto m = protocol::decode(e.payload);
  if (!m.is_ok()) {
    spdlog::warn("dropped a malformed frame from {}: {}", e.peer, m.status().message());
    protocol::metric::count_rejected_frame(metrics);
    return std::nullopt;
  }
  return std::move(m).value();
}

Millis steady_now() {
  return std::chrono::duration_cast<Millis>(std::chrono::steady_clock::now().time_since_epoch());
}

}  // namespace k3::transfer
