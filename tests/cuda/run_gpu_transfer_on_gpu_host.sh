#!/usr/bin/env bash
# One call on the GPU host for the transfer with GPU memory on both sides: decode regions that are the
# decode engine's GPU cache, and prefill source images in GPU memory (puts over cuda_ipc, nothing staged
# on the host). Unpacks the offline kit, configures + builds, then (each stage time-limited; logs under
# OUT_DIR)
#   cuda_transfer.log  cuda_test_cuda_transfer: puts between CUDA and host memory in every direction
#                      against the host reference;
#   pd_cuda.log        K3_TEST_MEMORY=cuda transfer_test_pd_transfer: real prefill and decode processes
#                      with GPU regions and GPU sources: every destination byte, an ABORT at every state on
#                      either side, a SIGKILL at every state, deadlines; the pools end as they started;
#   cluster.log        K3_TEST_BACKEND=cuda cluster_e2e_test_cluster_launcher: router + 2 prefill stages
#                      + decode, all --backend cuda (decode cache in its GPU transfer region), 16 concurrent
#                      requests == k3-generate --backend cuda;
#   small-pp2.log, small-pp1.log  k3-bench overlap on k3-small, 8192-token prompt (as
#                      run_overlap_on_gpu_host.sh), with the GPU-resident transfer.
#   tests/cuda/run_gpu_transfer_on_gpu_host.sh OUT_DIR [CHUNK (default 1024)]
set -uo pipefail
OUT=${1:?output dir}
CHUNK=${2:-1024}
# shellcheck source=tests/cuda/gpu_host.sh
source "$(dirname "$0")/gpu_host.sh"
gpu_host_setup "$OUT"
timeout 300 ninja -C $B -j16 cuda_test_cuda_transfer transfer_test_pd_transfer k3-test-peer-pd k3-generate k3-genweights \
  k3-router k3-cluster k3-prefill k3-decode k3-bench cluster_e2e_test_cluster_launcher >> "$OUT/build.log" 2>&1 ||
  { grep -E "error|FAILED" -A5 "$OUT/build.log" | head -60; exit 1; }
echo "configure+build: $(( $(date +%s) - T0 )) s" | tee -a "$OUT/build.log"
PATTERN="FAILED|passed|failed|SKIPPED|with expansion|rc "
gpu_host_stage cuda_transfer.log 60 "$PATTERN" $B/tests/cuda_test_cuda_transfer
gpu_host_stage pd_cuda.log 150 "$PATTERN" env K3_TEST_MEMORY=cuda $B/tests/transfer_test_pd_transfer
gpu_host_stage cluster.log 120 "$PATTERN" env K3_TEST_BACKEND=cuda $B/tests/cluster_e2e_test_cluster_launcher \
  "k3-cluster serves OpenAI requests whose greedy tokens equal k3-generate*"
M=/tmp/k3-small
[[ -f $M/config.json ]] || gpu_host_stage genweights.log 120 "rc|error" \
  $B/bin/k3-genweights --preset k3-small --seed 5 --allow-large --force --quiet --out $M
stage() {  # log, time limit, k3-bench overlap flags...
  gpu_host_stage "$1" "$2" "^overlap|^round|^warm|^[0-9]|median|error|FAILED" \
    $B/bin/k3-bench overlap --model $M --backend cuda --prompt 8192 --chunk "$CHUNK" "${@:3}"
}
stage small-pp2.log 150 --stages 2 --runs 2
stage small-pp1.log 100 --stages 1 --runs 1
