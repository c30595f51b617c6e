#!/usr/bin/env bash
# One call on the GPU host for the prefix cache on CUDA: unpack the offline kit, configure + build the
# CUDA prefix-cache test and the serving binaries, then
#   tests.log     cuda_test_cuda_prefix_cache: the engine on CUDA with the cache on gives the tokens of
#                 the engine on CUDA with it off (randomized shared-prefix workload, evictions, flush);
#   cluster.log   cluster_e2e_test_cluster_prefix_cache with K3_TEST_BACKEND=cuda: router + a PP2
#                 prefill instance with the cache + decode, all on the one GPU, against k3-generate;
#   drift.log     the same binary's stage-drift case (a stage restarted and a request aborted on one
#                 stage only), on the GPU.
#   tests/cuda/run_prefix_cache_on_gpu_host.sh OUT_DIR
# Needs .kit/k3-offline-kit.tar.gz (deploy/offline-kit.sh pack). Each stage has its own time limit so
# that the whole call stays under 10 minutes.
set -uo pipefail
OUT=${1:?output dir}
shift
# shellcheck source=tests/cuda/gpu_host.sh
source "$(dirname "$0")/gpu_host.sh"
gpu_host_setup "$OUT"
timeout 300 ninja -C "$B" -j16 cuda_test_cuda_prefix_cache k3-generate k3-genweights k3-router k3-cluster \
  k3-prefill k3-decode cluster_e2e_test_cluster_prefix_cache >> "$OUT/build.log" 2>&1 ||
  { grep -E "error|FAILED" -A5 "$OUT/build.log" | head -60; exit 1; }
echo "configure+build: $(( $(date +%s) - T0 )) s" | tee -a "$OUT/build.log"

PATTERN="FAILED|passed|failed|SKIPPED|with expansion"
gpu_host_stage tests.log 150 "$PATTERN" "$B/tests/cuda_test_cuda_prefix_cache"
# Catch test names: no comma in a filter (Catch splits filters there).
gpu_host_stage cluster.log 200 "$PATTERN" env K3_TEST_BACKEND=cuda "$B/tests/cluster_e2e_test_cluster_prefix_cache" \
  "prefill stages with the prefix cache serve the same tokens as without it*"
gpu_host_stage drift.log 150 "$PATTERN" env K3_TEST_BACKEND=cuda "$B/tests/cluster_e2e_test_cluster_prefix_cache" \
  "[drift]"
