// The MLA decode rows of `k3-bench kernels` (kernels_bench.cpp): one shape in one form of the kernel,
// timed as CUDA-graph replays against its floor and the public kernels. CUDA builds only.
#pragma once
#ifdef K3_HAVE_CUDA
#include <cstdint>
#include <string>
#include <vector>

#include "bench/kernel_timing.h"
#include "kernels/cuda/cuda_backend.h"

namespace k3::bench {

// One configuration of the MLA decode kernels (CudaBackend's switches) and the suffix its line gets.
// wgmma: set_mla_decode_wgmma (the default, on, takes H >= 64); off (with --with-mma) reports the
// mma.sync kernel for those shapes as "_mma". For H >= 64, the default is the seesaw form; beside
// it: the exact running max instead of the lazy one ("_exact"), the lockstep form ("_lockstep"),
// with the 32-head transposed block for the last head group ("_lockstep_t32tail"), the 32-head
// transposed blocks for every group ("_t32"), S split over dims between the warpgroups
// ("_splits"), KV tiles by per-thread cp.async instead of TMA ("_cpasync"), the L2 prefetch
// (l2_prefetch >= 0, default off; no longer printed: slower in every measured call, "_pfN"); the
// head groups of a request launched as one cluster ("_cluster"); the seesaw block that keeps P in
// registers and refills each half of a stage on its own, which the default takes on splits of 8192
// tokens or more, forced on ("_halves") and off ("_nohalves"); the 48-head transposed seesaw blocks
// forced on ("_t48"); the blocks of three warpgroups in fixed roles over three stages ("_roles");
// the batch-invariant mode that serving runs, whose splits are of a fixed size
// ("_inv"); the context cut into n splits whatever the plan says ("_sN", --mla-splits).
struct MlaVariant {
  bool wgmma = true, split_s = false, tma = true, lazy = true, seesaw = true, cluster = false, invariant = false;
  bool roles = false;
  int l2_prefetch = -1, t32 = 0, halves = 2, t48 = 0, splits = 0;
  int invariant_split = 0;  // > 0 with `invariant`: that split size instead of the backend's ("_invN")
  // > 0: every request's pages are these few, so the cache rows stay in L2 and no tile waits for
  // memory: how fast the kernel would run if its loads were hidden. A diagnostic, "_l2hot" (its
  // bytes and floor are those of the real shape, which it does not move).
  int hot_pages = 0;
  // How the context was cut, when not by the plan.
  std::string plan_suffix() const {
    std::string s = invariant ? "_inv" + (invariant_split > 0 ? std::to_string(invariant_split) : std::string()) : "";
    return splits > 0 ? s + "_s" + std::to_string(splits) : s;
  }
  std::string halves_suffix() const { return halves == 1 ? "_halves" : halves == 0 ? "_nohalves" : ""; }
  std::string suffix(int64_t H) const {
    if (hot_pages > 0)
      return (roles ? "_roles" : t48 == 1 ? "_t48" : !seesaw ? "_lockstep" : halves_suffix()) + std::string("_l2hot");
    if (H < 64) return plan_suffix();
    if (!wgmma) return "_mma";
    if (roles) return (lazy ? "_roles" : "_roles_exact") + plan_suffix();
    std::string s = t48 == 1 ? "_t48" : t32 == 2 ? "_t32" : split_s ? "_splits" : !tma ? "_cpasync" : !seesaw ? "_lockstep" : halves_suffix();
    if (t32 == 1 && !seesaw) s += "_t32tail";
    if (l2_prefetch >= 0) s += "_pf" + std::to_string(l2_prefetch);
    if (!lazy) s += "_exact";
    if (cluster) s += "_cluster";
    return s + plan_suffix();
  }
};

// Times mla_decode at B requests of `ctx` cached tokens and H heads (K3's latent 512 + rope 64) in the
// form `v` names, and appends its line (with FlashMLA's key for 64 and 96 heads, PyTorch's for all).
void mla_decode_case(cuda::CudaBackend& be, int64_t B, int64_t H, int64_t ctx, bool quick, std::vector<Line>& lines,
                     const MlaVariant& v = {});

}  // namespace k3::bench
#endif  // K3_HAVE_CUDA
