#include "decode_node/group_member.h"

#include <spdlog/spdlog.h>

#include "common/core/node_process.h"

namespace k3::decode {

void say_group_failed(const Status& why, CachePools& pools) {
  say_line("GROUP_FAILED " + why.to_string());
  say_line("FREE " + std::to_string(pools.free_pages()) + " " + std::to_string(pools.options().num_pages) + " " +
           std::to_string(pools.free_slots()) + " " + std::to_string(pools.options().max_seqs));
}

int run_group_member(GroupWorker& worker, Comm& comm) {
  for (;;) {
    auto cmd = recv_group_command(comm, 0);
    Status st = cmd.status();
    if (cmd.is_ok()) {
      if (cmd->stop) {
        worker.close_all();
        say_line("STOPPED");
        return 0;
      }
      for (uint64_t id : cmd->drops) worker.drop(id);
      for (const auto& a : cmd->admits)
        if (st = worker.admit(a); !st.is_ok()) break;
      if (st.is_ok() && cmd->step) {
        auto logits = worker.step(cmd->feeds);
        st = logits.status();
        // Every rank refused the step before touching a cache (a rank out of pages): the leader drops a
        // request and goes on, and so does this rank.
        if (!logits.is_ok() && logits.status().code() == Code::ResourceExhausted) continue;
        if (logits.is_ok() && !logits->empty()) st = send_group_logits(comm, 0, *logits);
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
