#!/usr/bin/env bash
# One call on the GPU host for the transfer's overlap with prefill compute: unpack the offline kit,
# build k3-bench, k3-prefill, k3-decode and k3-genweights, generate k3-small (bf16, about 15 GiB), then
# run `k3-bench overlap` with every node on the GPU (--backend cuda: two k3-prefill stages and one
# k3-decode on the one H200), logs under OUT_DIR:
#   build.log     GPU, compiler, configure + build time
#   genweights.log  k3-genweights --preset k3-small
#   small-pp2.log k3-small, 8192-token prompt, 2 stages, chunk CHUNK, streaming (each chunk's rows written
#                 while the next computes): hidden share of the write time and TTFT with transfer vs
#                 transfer skipped (the acceptance figures: >= 0.9, <= 1.05x)
#   small-pp2-nostream.log  the same with --no-stream (writes after the whole prompt): the "before"
#   small-pp1.log the same as small-pp2 on one stage (streamed)
#   tests/cuda/run_overlap_on_gpu_host.sh OUT_DIR [CHUNK (default 1024)] [RUNS (default 2)]
# The stage limits keep the whole call under ten minutes; genweights.log says how long the model took.
# Needs .kit/k3-offline-kit.tar.gz (deploy/offline-kit.sh pack).
set -uo pipefail
OUT=${1:?output dir}
CHUNK=${2:-1024}
RUNS=${3:-2}
# shellcheck source=tests/cuda/gpu_host.sh
source "$(dirname "$0")/gpu_host.sh"
gpu_host_setup "$OUT"
{ nproc; uptime; } >> "$OUT/build.log" 2>&1
t0=$T0
timeout 300 ninja -C $B -j16 k3-bench k3-prefill k3-decode k3-genweights >> "$OUT/build.log" 2>&1 ||
  { grep -E "error|FAILED" -A5 "$OUT/build.log" | head -60; exit 1; }
echo "configure+build: $(( $(date +%s) - t0 )) s" | tee -a "$OUT/build.log"

M=/tmp/k3-small
gpu_host_stage genweights.log 240 "rc|error" \
  $B/bin/k3-genweights --preset k3-small --seed 5 --allow-large --force --quiet --out $M
stage() {  # log, time limit, k3-bench overlap flags...
  gpu_host_stage "$1" "$2" "^overlap|^round|^warm|^[0-9]|median|error|FAILED" \
    $B/bin/k3-bench overlap --model $M --backend cuda --prompt 8192 --chunk "$CHUNK" "${@:3}"
}
stage small-pp2.log 240 --stages 2 --runs "$RUNS"
stage small-pp2-nostream.log 120 --stages 2 --runs 1 --no-stream
stage small-pp1.log 120 --stages 1 --runs 1
