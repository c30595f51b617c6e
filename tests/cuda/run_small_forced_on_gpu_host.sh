#!/usr/bin/env bash
# One call on the GPU host for k3-small on CUDA against the CPU engine, teacher-forced over
# 8 prompts x POSITIONS (default 512): unpack the offline kit, configure + build the two test
# binaries, then (each stage time-limited; logs under OUT_DIR)
#   rate.log   the CPU prefill rate at k3-small widths on this host's cores (4 layers, 8 x 128
#              tokens) and its estimate of the whole reference's time: read it first if small.log
#              ran out of time;
#   small.log  cuda_test_cuda_engine "k3-small on CUDA*": the CPU reference (every core), then the
#              GPU engine in both modes, the max logit error and the top-1 agreement where decided.
# The CPU reference holds ~30 GB of fp32 weights (docs/PERF.md); the host has 128 GiB.
# ROUTING "dense" runs the k = E variant instead (every expert routed: no routing flips, ~3.5x the
# reference's CPU time).
#   tests/cuda/run_small_forced_on_gpu_host.sh OUT_DIR [POSITIONS (default 512)] [LIMIT_S (default 420)] [topk|dense]
set -uo pipefail
OUT=${1:?output dir}
POS=${2:-512}
LIMIT=${3:-420}
ROUTING=${4:-topk}
FILTER="k3-small on CUDA*"
[[ $ROUTING == dense ]] && FILTER="k3-small (k = E) on CUDA*"
# shellcheck source=tests/cuda/gpu_host.sh
source "$(dirname "$0")/gpu_host.sh"
gpu_host_setup "$OUT"
timeout 240 ninja -C $B -j16 cuda_test_cuda_engine engine_test_cpu_forward_rate >> "$OUT/build.log" 2>&1 ||
  { grep -E "error|FAILED" -A5 "$OUT/build.log" | head -60; exit 1; }
echo "configure+build: $(( $(date +%s) - T0 )) s, $(nproc) cores, $(free -g | awk '/Mem:/{print $2}') GiB" |
  tee -a "$OUT/build.log"
pattern="CPU-RATE|GPU-ENGINE|FAILED|passed|failed|SKIPPED|with expansion"
gpu_host_stage rate.log 90 "$pattern" $B/tests/engine_test_cpu_forward_rate "[perf]"
# Peak resident memory of the comparison (the CPU reference's weights dominate), where GNU time exists.
TIMEV=()
[[ -x /usr/bin/time ]] && TIMEV=(/usr/bin/time -v)
K3_FORCED_POSITIONS=$POS gpu_host_stage small.log "$LIMIT" "$pattern|Maximum resident" \
  "${TIMEV[@]}" $B/tests/cuda_test_cuda_engine "$FILTER"
