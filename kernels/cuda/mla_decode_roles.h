// The MLA decode block with warpgroups in fixed roles (mla_decode_roles.cu): launched by the wgmma
// kernel's launcher (mla_decode_wgmma.cu) when MlaDecodeArgs::wgmma_roles asks for it.
#pragma once
#include <cuda.h>
#include <cuda_runtime.h>

#include "kernels/cuda/launch.h"

namespace k3::cuda {

// Grid (64-head groups, split blocks, B) of 384 threads; KV tiles by TMA through kv_map (boxes of
// box_rows rows, mla_decode_wgmma.cu). Writes a.o / a.lse with one split, else the fp32 partials.
void launch_mla_decode_roles(const MlaDecodeArgs& a, const MlaDecodePlan& plan, float* part_o, float* part_lse,
                             const CUtensorMap& kv_map, int box_rows, cudaStream_t s);

}  // namespace k3::cuda
