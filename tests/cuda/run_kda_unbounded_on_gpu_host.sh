#!/usr/bin/env bash
# One short call on the GPU host for the chunked KDA prefill with Kimi Linear's unbounded (softplus)
# gate: unpack the offline kit, configure + build the attention test and k3-bench, then (each stage
# time-limited, the whole run kept under BUDGET seconds; logs under OUT_DIR)
#   kda.log      cuda_test_cuda_attention "cuda kda*": the unbounded-gate variant against the CPU
#                recurrence (gates down to -1e5, lengths 1..300, varlen), and the bounded kernel's,
#                checkpoint and decode tests unchanged;
#   engine.log   cuda_test_cuda_engine "kimi-linear-tiny*": the whole model with the softplus gate and
#                the 48B's head shapes, its 256-token prefill through that variant, against the CPU engine;
#   bench.log    k3-bench kernels --only kda_chunk: the bounded rows and the _softplus rows;
#   prefill.log  k3-bench engine --preset kimi-linear-48b, decode at batch 1 and 64, prefill of 1024 and 4096 tokens (the chunked
#                kernel now serves Kimi Linear's prefill; the token recurrence did before).
#   tests/cuda/run_kda_unbounded_on_gpu_host.sh OUT_DIR [BUDGET (default 420)]
set -uo pipefail
OUT=${1:?output dir}
BUDGET=${2:-420}
# shellcheck source=tests/cuda/gpu_host.sh
source "$(dirname "$0")/gpu_host.sh"
gpu_host_setup "$OUT"
timeout 240 ninja -C $B -j16 cuda_test_cuda_attention cuda_test_cuda_engine k3-bench >> "$OUT/build.log" 2>&1 ||
  { grep -E "error|FAILED" -A5 "$OUT/build.log" | head -60; exit 1; }
echo "configure+build: $(( $(date +%s) - T0 )) s" | tee -a "$OUT/build.log"

stage() {  # log, time limit, command...
  gpu_host_stage "$1" "$2" "FAILED|passed|failed|SKIPPED|rel err|worst|GPU-ENGINE|kda_chunk|prefill|^\|" "${@:3}"
}
left() { echo $(( BUDGET - ($(date +%s) - T0) )); }
stage kda.log 90 $B/tests/cuda_test_cuda_attention "cuda kda*"
stage engine.log 60 $B/tests/cuda_test_cuda_engine "kimi-linear-tiny*"
lim=$(( $(left) - 60 )); [ "$lim" -gt 60 ] && lim=60
[ "$lim" -gt 5 ] && stage bench.log "$lim" $B/bin/k3-bench kernels --only kda_chunk
lim=$(( $(left) )); [ "$lim" -gt 5 ] &&
  stage prefill.log "$lim" $B/bin/k3-bench engine --preset kimi-linear-48b --batches 1 64 --contexts 1024 \
    --prefill 1024 4096 --steps 5 --no-profile
