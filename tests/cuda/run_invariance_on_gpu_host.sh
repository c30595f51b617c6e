#!/usr/bin/env bash
# One short call on the GPU host for batch/chunk invariance and the engine against the CPU: unpack the
# offline kit, configure + build the CUDA engine tests and k3-bench, then (each stage time-limited,
# most important first; logs under OUT_DIR)
#   inv.log     cuda_test_cuda_batch_invariance (alone == batch of 8 == chunks 1/63/64/65/1000, bitwise;
#               k3-tiny, k3-tiny with K3 heads), inv_small.log the same for k3-small;
#   engine.log  the batch-invariant paths against the CPU engine, teacher-forced (k3-tiny, K3 heads);
#   graph.log   cuda_test_cuda_decode_graph (recorded steps bitwise equal to eager, both modes);
#   small.log   k3-small against the CPU engine, teacher-forced prefill over 8 x POSITIONS;
#   bench.log   k3-bench engine --batch-invariant at batch 1 / context 1k and an 8k prefill.
#   tests/cuda/run_invariance_on_gpu_host.sh OUT_DIR [POSITIONS (default 32)]
set -uo pipefail
OUT=${1:?output dir}
POS=${2:-32}
# shellcheck source=tests/cuda/gpu_host.sh
source "$(dirname "$0")/gpu_host.sh"
gpu_host_setup "$OUT"
t0=$T0
timeout 200 ninja -C $B -j16 cuda_test_cuda_batch_invariance cuda_test_cuda_engine cuda_test_cuda_decode_graph k3-bench \
  >> "$OUT/build.log" 2>&1 || { grep -E "error|FAILED" -A5 "$OUT/build.log" | head -60; exit 1; }
echo "configure+build: $(( $(date +%s) - t0 )) s" | tee -a "$OUT/build.log"

stage() {  # log, time limit, command...
  gpu_host_stage "$1" "$2" "BATCH-INVARIANT|GPU-ENGINE|DECODE-GRAPH|FAILED|passed|failed|SKIPPED|^\|" "${@:3}"
}
stage inv.log 120 $B/tests/cuda_test_cuda_batch_invariance "CUDA batch invariance: alone*"
stage inv_small.log 150 $B/tests/cuda_test_cuda_batch_invariance "CUDA batch invariance for k3-small*"
stage engine.log 40 $B/tests/cuda_test_cuda_engine "batch-invariant CUDA*"
stage graph.log 40 $B/tests/cuda_test_cuda_decode_graph
K3_FORCED_POSITIONS=$POS stage small.log 90 $B/tests/cuda_test_cuda_engine "k3-small on CUDA*"
stage bench.log 45 $B/bin/k3-bench engine --steps 5 --batch-invariant --batches 1 --contexts 1024 --prefill 8192 --no-profile
