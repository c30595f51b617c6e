// How `k3-bench soak` names a failed request's cause, from the client's error text (completion_client):
// "<kind>" or "<kind>:<reason>", kind = http_<status> | stream_error | connection_closed | no_done |
// short_output | connect_failed | other, reason = the protocol's abort reason when the router's message
// names one (alloc_failed, peer_dead, ...), or no_pair / node_down / claim_timeout / queue_full.
#pragma once
#include <string>

namespace k3::bench {

std::string error_cause(const std::string& error_text);
// 429 (admission control said no): a correct answer to overload at any time.
bool is_overload_cause(const std::string& cause);
// What a dead node explains: 503, and stream errors for a peer that died, a transfer cut short, no
// complete pair, or a CLAIM the dead decode never acknowledged. Never alloc_failed or internal.
bool is_node_death_cause(const std::string& cause);

}  // namespace k3::bench
