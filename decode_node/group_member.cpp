#include "decode_node/group_member.h"

#include <spdlog/spdlog.h>

#include "common/core/node_process.h"

namespace k3::decode {

void say_group_failed(const Status& why, CachePools& pools) {
  say_line("GROUP_FAILED " + why.to_string());
  say_line("FREE " + std::to_string(pools.free_pages()) + " " + std::to_string(pools.options().num_pages) + " " +
           std::to_string(pools.free_slots()) + " " + std::to_string(pools.options().max_seqs));
}

void say_imported(const GroupAdmit& a, size_t bytes, bool from_region) {
  say_line("IMPORTED " + std::to_string(a.id) + " " + std::to_string(a.position) + " " + std::to_string(bytes) +
           (from_region ? " region" : " command"));
}

namespace {

// One admit of a command: the rank's share is read from its own region (the leader names where), or, for
// an admit that carries it, taken from the command.
Status admit_one(GroupWorker& worker, MemberRegion* region, GroupAdmit& a) {
  if (a.from_region) {
    if (!region) return invalid_argument("request " + std::to_string(a.id) + ": read from a region this rank does not own");
    K3_ASSIGN_OR_RETURN(RegionTables t, region->tables(a.page_ids, a.slot, a.position));
    K3_TRY(worker.admit_from(a, t.tables));
    say_imported(a, t.image.total_bytes, true);
    return Status::ok();
  }
  K3_TRY(worker.admit(a));
  say_imported(a, a.image.size(), false);
  return Status::ok();
}

}  // namespace

int run_group_member(GroupWorker& worker, Comm& comm, MemberRegion* region, const GroupDeadlines& deadlines) {
  deadlines.use(deadlines.startup);
  bool commanded = false, stepped = false;
  // The leader learns this rank's room before it admits anything onto it.
  if (Status st = send_group_room(comm, 0, worker.room()); !st.is_ok()) {
    spdlog::error("decode group rank {}: {}", comm.rank(), st.to_string());
    say_group_failed(st, worker.caches());
    return 1;
  }
  for (;;) {
    auto cmd = recv_group_command(comm, 0);
    Status st = cmd.status();
    const bool first_step = cmd.is_ok() && cmd->step && !stepped;
    if (!commanded || first_step) deadlines.use(first_step ? deadlines.startup : deadlines.step);
    commanded = true;
    if (cmd.is_ok()) {
      if (region) region->progress();
      if (cmd->stop) {
        worker.close_all();
        say_line("STOPPED");
        return 0;
      }
      for (uint64_t id : cmd->drops) worker.drop(id);
      for (auto& a : cmd->admits)
        if (st = admit_one(worker, region, a); !st.is_ok()) break;
      if (st.is_ok() && cmd->step) {
        const bool returns = members_return_logits(worker.model().layout());
        auto logits = worker.step(cmd->feeds, {}, returns);
        st = logits.status();
        // Every rank refused the step before touching a cache (a rank out of pages): the leader drops a
        // request and goes on, and so does this rank.
        if (!logits.is_ok() && logits.status().code() == Code::ResourceExhausted) st = Status::ok();
        else if (logits.is_ok() && !logits->empty()) st = send_group_logits(comm, 0, *logits);  // none unless `returns`
      }
      // Every command is answered with this rank's room (the leader's admission input).
      if (st.is_ok()) st = send_group_room(comm, 0, worker.room());
      if (first_step) {
        stepped = true;
        deadlines.use(deadlines.step);
      }
      if (st.is_ok()) continue;
    }
    spdlog::error("decode group rank {}: {}", comm.rank(), st.to_string());
    worker.close_all();
    say_group_failed(st, worker.caches());
    return 1;
  }
}

}  // namespace k3::decode
