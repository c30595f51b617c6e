#include "decode_node/member_region.h"

#include "engine/kv_cache.h"

namespace k3::decode {

MemberRegion::~MemberRegion() = default;

Result<std::unique_ptr<MemberRegion>> MemberRegion::create(const ModelConfig& cfg, const Backend& backend,
                                                           const RankLayout& layout, const GroupRegionRequest& req,
                                                           const std::string& ucx_net_devices, int cuda_device) {
  if (layout.size() < 2 || layout.rank < 1) return invalid_argument("a member region is for rank > 0 of a rank group");
  std::unique_ptr<MemberRegion> m(new MemberRegion());
  m->layout_ = layout;
  K3_ASSIGN_OR_RETURN(transfer::CacheLayout full, cache_layout(cfg, backend));
  K3_ASSIGN_OR_RETURN(m->rank_layout_, cache_layout(rank_cache_config(cfg, layout), backend));
  // DCP: rank i holds its slice as index i of the group's ranks (region id = its rank). EP: the whole
  // request, as an alternate region of the leader's rank (region id = this rank): the transfer plan
  // addresses the leader's rank, the region id routes the writes here.
  const auto index = static_cast<uint32_t>(layout.dcp_rank());
  const uint32_t region_id = req.first_rank + static_cast<uint32_t>(layout.rank);
  transfer::DecodeLayout group{.ranks = {}, .kda_head_sliced = true};
  for (int i = 0; i < layout.dcp; ++i) group.ranks.push_back(req.first_rank + static_cast<uint32_t>(i));
  K3_ASSIGN_OR_RETURN(auto probe, transfer::RankPoolGeometry::for_rank(full, group, index, region_id, 0, req.page_size,
                                                                      req.num_pages, req.num_slots));
  const transfer::MemoryType type = region_memory_for(backend);
  const std::string what = "the member region in device memory";
  K3_TRY(transfer::prepare_memory_type(type, cuda_device, what));
  K3_ASSIGN_OR_RETURN(auto ctx, transfer::UcxContext::create(UCP_FEATURE_RMA | UCP_FEATURE_TAG, ucx_net_devices));
  K3_ASSIGN_OR_RETURN(m->worker_, transfer::UcxWorker::create(ctx));
  K3_ASSIGN_OR_RETURN(m->memory_, transfer::allocate_owned_region(ctx, type, probe.region_bytes(), 0xEE, what));
  const uint64_t base = reinterpret_cast<uint64_t>(m->memory_.mem->base());
  K3_ASSIGN_OR_RETURN(m->geometry_, transfer::RankPoolGeometry::for_rank(full, group, index, region_id, base, req.page_size,
                                                                        req.num_pages, req.num_slots));
  K3_ASSIGN_OR_RETURN(auto rkey, m->memory_.mem->packed_rkey());
  m->offer_ = {.region_id = region_id, .base = base, .length = m->memory_.mem->length(), .packed_rkey = std::move(rkey),
               .worker_address = m->worker_->address()};
  return m;
}

Result<RegionTables> MemberRegion::tables(std::span<const uint32_t> pages, int64_t slot, int64_t position) {
  progress();
  const RegionEntries entries{.pages = pages,
                              .slot = slot < 0 ? std::nullopt : std::optional<uint32_t>(static_cast<uint32_t>(slot))};
  return region_tables(rank_layout_, geometry_, entries, {memory_.mem->base(), memory_.mem->length()}, memory_.mem->type(),
                       static_cast<uint32_t>(dcp_rows_on(layout_, position)));
}

void MemberRegion::progress() { worker_->progress(); }

}  // namespace k3::decode
