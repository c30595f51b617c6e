// A member (rank > 0) of a decode rank group: no control plane of its own. It joins the group's
// communicator, then applies the leader's GroupCommands (group_command.h) until the leader says stop.
// Waiting for the next command sleeps in the Comm with the step deadline: the leader ticks while idle, so a
// leader that died or hung is noticed at that deadline and the member leaves with every cache closed.
// stdout: "GROUP_FAILED <status>" then "FREE <free pages> <pages> <free slots> <slots>" when the group failed.
#pragma once
#include "decode_node/group_worker.h"
#include "decode_node/member_region.h"

namespace k3::decode {

// Returns the process exit code: 0 after a stop command, 1 when the group failed. `region`: this rank's
// own transfer region (the prefill stages write its DCP slices, or its EP requests whole, there).
// stdout: "IMPORTED <id> <position> <bytes> region|command" for every request this rank took, saying
// whether its slice came from its own region or in the leader's command.
// deadlines: the member waits for its first command, and runs the group's first step, under the start-up
// timeout, every other wait under the step deadline (GroupDeadlines; the Comm starts at the start-up one).
int run_group_member(GroupWorker& worker, Comm& comm, MemberRegion* region, const GroupDeadlines& deadlines);

// The IMPORTED line (leader and members print it alike).
void say_imported(const GroupAdmit& a, size_t bytes, bool from_region);

// The lines both the leader and the members print when their group failed (what their caches hold once
// every request was closed: every page and slot free).
void say_group_failed(const Status& why, CachePools& pools);

}  // namespace k3::decode
