#!/usr/bin/env bash
# One call on the GPU host: k3-small layer by layer, CUDA vs CPU (cuda_test_cuda_engine
# "k3-small layer by layer*"), with the preset's top-4 routing (topk.log) and with every expert
# routed (dense.log), so that routing flips and a wrong layer kind can be told apart; then one CUDA rank
# with kv_partitions 2 against kv_partitions 1 (ranks_test_rank_decode_gpu "[diag]", partitions.log), with
# top-4 routing and with every expert routed: whether partitioned attention parts from the one-pass
# engine only through the expert choice.
#   tests/cuda/run_small_diag_on_gpu_host.sh OUT_DIR [TOKENS (default 128)]
#   (STAGES="topk dense partitions" by default: which of the three to run; one call has room for about two)
set -uo pipefail
OUT=${1:?output dir}
TOKENS=${2:-128}
# shellcheck source=tests/cuda/gpu_host.sh
source "$(dirname "$0")/gpu_host.sh"
gpu_host_setup "$OUT"
timeout 240 ninja -C $B -j16 cuda_test_cuda_engine ranks_test_rank_decode_gpu >> "$OUT/build.log" 2>&1 ||
  { grep -E "error|FAILED" -A5 "$OUT/build.log" | head -60; exit 1; }
echo "configure+build: $(( $(date +%s) - T0 )) s" | tee -a "$OUT/build.log"
pattern="GPU-DIAG|FAILED|passed|failed|SKIPPED"
STAGES=${STAGES:-topk dense partitions}
[[ " $STAGES " == *" topk "* ]] && K3_DIAG_TOKENS=$TOKENS gpu_host_stage topk.log 200 "$pattern" \
  $B/tests/cuda_test_cuda_engine "k3-small layer by layer*"
[[ " $STAGES " == *" dense "* ]] && K3_DIAG_TOKENS=$TOKENS K3_DIAG_DENSE=1 gpu_host_stage dense.log 240 "$pattern" \
  $B/tests/cuda_test_cuda_engine "k3-small layer by layer*"
[[ " $STAGES " == *" partitions "* ]] && gpu_host_stage partitions.log 300 "GPU-RANKS|FAILED|passed|failed|SKIPPED" \
  $B/tests/ranks_test_rank_decode_gpu "[diag]"
exit 0
