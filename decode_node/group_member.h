// A member (rank > 0) of a decode rank group: no control plane of its own. It joins the group's
// communicator, then applies the leader's GroupCommands (group_command.h) until the leader says stop.
// Waiting for the next command sleeps in the Comm with the step deadline: the leader ticks while idle, so a
// leader that died or hung is noticed at that deadline and the member leaves with every cache closed.
// stdout: "GROUP_FAILED <status>" then "FREE <free pages> <pages> <free slots> <slots>" when the group failed.
#pragma once
#include "decode_node/group_worker.h"

namespace k3::decode {

// Returns the process exit code: 0 after a stop command, 1 when the group failed.
int run_group_member(GroupWorker& worker, Comm& comm);

// The lines both the leader and the members print when their group failed (what their caches hold once
// every request was closed: every page and slot free).
void say_group_failed(const Status& why, CachePools& pools);

}  // namespace k3::decode
