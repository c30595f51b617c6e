// The transfer region a member rank of a decode group owns (docs/RANKS.md, "Transfer"): mapped with the
// rank's own UCX worker in its own process, in device memory on a GPU rank, so the prefill stages write straight into it: a DCP rank's
// slice of every request, or the whole of each request an EP group places on this rank. The leader keeps the bookkeeping (its RankPool of this region: which pages and
// slot a request holds) and tells the rank, when the request joins, where its slice is; the rank reads it
// from here into its caches. Pages stay allocated at the leader until the request ends, which is after the
// rank has read them (the rank reads before it joins the step that follows the command).
#pragma once
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "decode_node/group_command.h"
#include "decode_node/region_image.h"
#include "engine/rank_layout.h"
#include "transfer/owned_region.h"
#include "transfer/ucx_memory.h"

namespace k3 {
class Backend;
}

namespace k3::decode {

class MemberRegion {
 public:
  // `layout`: the group's, with this rank's index. The geometry is the one the leader computes for this
  // rank (the model's full cache layout, KDA heads sliced per rank, the pool sizes of `req`).
  // On a GPU backend the region is device memory of `cuda_device` (the prefill stages' puts land on the
  // GPU; the rank imports by device gathers), otherwise host memory.
  static Result<std::unique_ptr<MemberRegion>> create(const ModelConfig& cfg, const Backend& backend,
                                                      const RankLayout& layout, const GroupRegionRequest& req,
                                                      const std::string& ucx_net_devices, int cuda_device);
  ~MemberRegion();

  // What the leader publishes for this rank: base, length, packed rkey, this worker's address.
  const protocol::MemoryRegion& offer() const { return offer_; }
  // Where this rank's share of a request whose `position` tokens the group holds is in the region: the
  // pages and slot the leader named (DCP: the rank's rows p % N == rank of the prompt, its KDA heads; EP:
  // every row and head), as tables GroupWorker::admit_from reads in place.
  Result<RegionTables> tables(std::span<const uint32_t> pages, int64_t slot, int64_t position);
  // Lets the worker serve transports that need the target's progress (emulated RMA over tcp); on one host
  // the writes land through shared memory without it.
  void progress();

 private:
  MemberRegion() = default;

  RankLayout layout_;
  transfer::CacheLayout rank_layout_;
  transfer::RankPoolGeometry geometry_;
  std::shared_ptr<transfer::UcxWorker> worker_;
  transfer::OwnedRegion memory_;
  protocol::MemoryRegion offer_;
};

}  // namespace k3::decode
