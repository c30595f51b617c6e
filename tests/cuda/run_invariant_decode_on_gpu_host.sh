#!/usr/bin/env bash
# One call on the GPU host for the decode step serving's batch-invariant mode runs: first the bitwise
# tests of its kernel forms, then what they buy. Unpack the offline kit, configure + build, then (each
# stage time-limited, the whole run kept under BUDGET seconds, most telling first; logs under OUT_DIR)
#   kda_invariant.log  cuda_test_cuda_kda_invariant: the fused KDA decode in batch-invariant mode gives
#                      the separate steps' bits (what keeps CudaBackend::set_kda_decode_matches_steps on
#                      by default), chunk calls and row ranges;
#   moe_forms.log      cuda_test_cuda_ops "*grouped GEMM*": the grouped MoE GEMM's narrow and wide forms
#                      give the same bits; gemm_fixed.log the fixed-order GEMM's rows equal alone;
#   inv.log            cuda_test_cuda_batch_invariance "alone*" (the engine, alone == batched, bitwise);
#   tables.log         k3-bench engine --gemm-only: the GEMM table and the routed experts' table (the
#                      default mode, the invariant grouped GEMM by the grid, wide, narrow), graph-timed;
#   steps.log, steps_separate.log
#                      k3-bench engine --batch-invariant decode rows at batch 1 and 64 (context 1024),
#                      the step split by layer type, with the fused KDA decode (the default) and with
#                      --kda-decode-separate.
#   tests/cuda/run_invariant_decode_on_gpu_host.sh OUT_DIR [BUDGET (default 540)]
set -uo pipefail
OUT=${1:?output dir}
BUDGET=${2:-540}
# shellcheck source=tests/cuda/gpu_host.sh
source "$(dirname "$0")/gpu_host.sh"
gpu_host_setup "$OUT"
timeout 200 ninja -C $B -j16 cuda_test_cuda_kda_invariant cuda_test_cuda_ops cuda_test_cuda_gemm_fixed \
  cuda_test_cuda_batch_invariance k3-bench >> "$OUT/build.log" 2>&1 ||
  { grep -E "error|FAILED" -A5 "$OUT/build.log" | head -60; exit 1; }
echo "configure+build: $(( $(date +%s) - T0 )) s" | tee -a "$OUT/build.log"

stage() {  # log, time limit, command...
  gpu_host_stage "$1" "$2" "KDA|MoE|GEMM|BATCH-INVARIANT|FAILED|passed|failed|SKIPPED|with expansion|kernel switches|^\|" "${@:3}"
}
left() { echo $(( BUDGET - ($(date +%s) - T0) )); }
stage kda_invariant.log 40 $B/tests/cuda_test_cuda_kda_invariant
stage moe_forms.log 40 $B/tests/cuda_test_cuda_ops "*grouped GEMM*"
stage gemm_fixed.log 30 $B/tests/cuda_test_cuda_gemm_fixed
lim=$(( $(left) - 200 )); [ "$lim" -gt 90 ] && lim=90
[ "$lim" -gt 5 ] && stage inv.log "$lim" $B/tests/cuda_test_cuda_batch_invariance "CUDA batch invariance: alone*"
lim=$(( $(left) - 130 )); [ "$lim" -gt 60 ] && lim=60
[ "$lim" -gt 5 ] && stage tables.log "$lim" $B/bin/k3-bench engine --gemm-only
ROWS=(engine --batch-invariant --steps 5 --batches 1 64 --contexts 1024 --prefill 1024)
lim=$(( ($(left) - 5) / 2 )); [ "$lim" -gt 60 ] && lim=60
[ "$lim" -gt 5 ] && stage steps.log "$lim" $B/bin/k3-bench "${ROWS[@]}"
lim=$(( $(left) - 5 )); [ "$lim" -gt 60 ] && lim=60
[ "$lim" -gt 5 ] && stage steps_separate.log "$lim" $B/bin/k3-bench "${ROWS[@]}" --kda-decode-separate
