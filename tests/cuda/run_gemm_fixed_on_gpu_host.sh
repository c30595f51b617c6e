#!/usr/bin/env bash
# One short call on the GPU host for the fixed-order (batch-invariant) GEMM: unpack the offline kit,
# configure + build its test, the batch-invariance test and k3-bench, then (each stage time-limited,
# the whole run kept under BUDGET seconds; logs under OUT_DIR)
#   gemm.log   cuda_test_cuda_gemm_fixed (rows bitwise equal alone across M, close to fp32);
#   inv.log    cuda_test_cuda_batch_invariance "alone*" (engine logits alone == in a batch, bitwise);
#   bench.log  k3-bench engine --batch-invariant at batch 1 / context 1k (incl. the GEMM row).
#   tests/cuda/run_gemm_fixed_on_gpu_host.sh OUT_DIR [BUDGET (default 230)]
set -uo pipefail
OUT=${1:?output dir}
BUDGET=${2:-230}
# shellcheck source=tests/cuda/gpu_host.sh
source "$(dirname "$0")/gpu_host.sh"
gpu_host_setup "$OUT"
timeout 150 ninja -C $B -j16 cuda_test_cuda_gemm_fixed cuda_test_cuda_batch_invariance k3-bench \
  >> "$OUT/build.log" 2>&1 || { grep -E "error|FAILED" -A5 "$OUT/build.log" | head -60; exit 1; }
echo "configure+build: $(( $(date +%s) - T0 )) s" | tee -a "$OUT/build.log"

stage() {  # log, time limit, command...
  gpu_host_stage "$1" "$2" "GEMM|BATCH-INVARIANT|FAILED|passed|failed|SKIPPED|with expansion|rel err|^\|" "${@:3}"
}
left() { echo $(( BUDGET - ($(date +%s) - T0) )); }
stage gemm.log 30 $B/tests/cuda_test_cuda_gemm_fixed
lim=$(( $(left) - 42 )); [ "$lim" -gt 100 ] && lim=100
[ "$lim" -gt 5 ] && stage inv.log "$lim" $B/tests/cuda_test_cuda_batch_invariance "CUDA batch invariance: alone*"
lim=$(( $(left) )); [ "$lim" -gt 40 ] && lim=40
[ "$lim" -gt 5 ] && stage bench.log "$lim" $B/bin/k3-bench engine --steps 5 --batch-invariant --batches 1 --contexts 1024 --prefill 1024 --no-profile
