#!/usr/bin/env bash
# One call on the GPU host: k3-small layer by layer, CUDA vs CPU (cuda_test_cuda_engine
# "k3-small layer by layer*"), with the preset's top-4 routing (topk.log) and with every expert
# routed (dense.log), so that routing flips and a wrong layer kind can be told apart.
#   tests/cuda/run_small_diag_on_gpu_host.sh OUT_DIR [TOKENS (default 128)]
set -uo pipefail
OUT=${1:?output dir}
TOKENS=${2:-128}
# shellcheck source=tests/cuda/gpu_host.sh
source "$(dirname "$0")/gpu_host.sh"
gpu_host_setup "$OUT"
timeout 240 ninja -C $B -j16 cuda_test_cuda_engine >> "$OUT/build.log" 2>&1 ||
  { grep -E "error|FAILED" -A5 "$OUT/build.log" | head -60; exit 1; }
echo "configure+build: $(( $(date +%s) - T0 )) s" | tee -a "$OUT/build.log"
pattern="GPU-DIAG|FAILED|passed|failed|SKIPPED"
K3_DIAG_TOKENS=$TOKENS gpu_host_stage topk.log 200 "$pattern" \
  $B/tests/cuda_test_cuda_engine "k3-small layer by layer*"
K3_DIAG_TOKENS=$TOKENS K3_DIAG_DENSE=1 gpu_host_stage dense.log 240 "$pattern" \
  $B/tests/cuda_test_cuda_engine "k3-small layer by layer*"
