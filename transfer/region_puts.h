// The puts of one destination region's write list (plan order) on a prefill stage: from the request's
// source image as the plan has them, or, where the list is rows at a constant source stride (a DCP
// interleave), gathered first into a staging image (gathered_writes.h) and put one contiguous run of the
// region at a time.
#pragma once
#include <memory>
#include <span>
#include <vector>

#include "transfer/plan.h"
#include "transfer/source_arena.h"
#include "transfer/source_image.h"
#include "transfer/ucx_writer.h"

namespace k3::transfer {

struct RegionPuts {
  std::vector<RemoteWrite> writes;
  std::shared_ptr<SourceImage> staging;   // set when gathered: the writes read it, the job keeps it alive
};

// Staging comes from `arena` (may be null) or, for a host source, host memory of its own. Device memory of
// its own would cost a cudaMalloc now and a cudaFree (which waits for the whole device, stalling the
// stage's compute) when the writes end, so without room in an arena a device source's rows go one put
// each, as planned; so do they when the gather copy fails.
RegionPuts region_puts(std::span<const WriteOp> ops, const SourceImage& source, SourceArena* arena);

}  // namespace k3::transfer
