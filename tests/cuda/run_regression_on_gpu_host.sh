#!/usr/bin/env bash
# One short call on the GPU host that checks a merged tree's CUDA paths end to end (the cache pools,
# the decode graph, the prefix cache and a cluster of separate processes on the one GPU), without the
# long benches: unpack the offline kit, configure + build, then (each stage time-limited; logs under
# OUT_DIR)
#   kda.log, engine.log, decode_graph.log, prefix.log, invariance.log:
#                cuda_test_cuda_attention "cuda kda_decode*" (state and conv rows apart, as a unified
#                cache region lays them out), cuda_test_cuda_engine (k3-tiny and K3 head shapes against
#                the CPU engine, on a unified region), cuda_test_cuda_decode_graph,
#                cuda_test_cuda_prefix_cache, and cuda_test_cuda_batch_invariance "CUDA batch invariance: alone*";
#   gemm_fixed.log, kda_invariant.log:
#                the kernels serving's default (batch-invariant) mode runs, each against its own
#                definition: cuda_test_cuda_gemm_fixed (every row bitwise equal alone, both forms, split
#                and unsplit) and cuda_test_cuda_kda_invariant (chunk calls, row ranges, and the fused
#                decode step against the separate steps, bitwise);
#   weight_fill.log
#                cuda_test_cuda_weight_fill: generated weights drawn on the GPU (whole and a part from
#                its first index, as a DCP rank draws its heads' rows) are the host generator's bits;
#   cluster.log  K3_TEST_BACKEND=cuda cluster_e2e_test_cluster_launcher: k3-router, two k3-prefill
#                stages (streaming their writes) and one k3-decode, all --backend cuda, against
#                k3-generate --backend cuda, 16 concurrent requests among them.
#   tests/cuda/run_regression_on_gpu_host.sh OUT_DIR
set -uo pipefail
OUT=${1:?output dir}
# shellcheck source=tests/cuda/gpu_host.sh
source "$(dirname "$0")/gpu_host.sh"
gpu_host_setup "$OUT"
TESTS="cuda_test_cuda_attention cuda_test_cuda_decode_graph cuda_test_cuda_engine cuda_test_cuda_prefix_cache cuda_test_cuda_batch_invariance
  cuda_test_cuda_gemm_fixed cuda_test_cuda_kda_invariant cuda_test_cuda_weight_fill"
# shellcheck disable=SC2086
timeout 240 ninja -C $B -j16 $TESTS k3-generate k3-genweights k3-router k3-cluster k3-prefill k3-decode \
  cluster_e2e_test_cluster_launcher >> "$OUT/build.log" 2>&1 ||
  { grep -E "error|FAILED" -A5 "$OUT/build.log" | head -60; exit 1; }
echo "configure+build: $(( $(date +%s) - T0 )) s" | tee -a "$OUT/build.log"
PATTERN="GPU-ENGINE|BATCH-INV|DECODE-GRAPH|FAILED|passed|failed|SKIPPED|with expansion"
# Most telling first: a call cut short by its time limit still says the most.
gpu_host_stage kda.log 40 "$PATTERN" $B/tests/cuda_test_cuda_attention "cuda kda_decode*"
gpu_host_stage engine.log 90 "$PATTERN" $B/tests/cuda_test_cuda_engine
gpu_host_stage decode_graph.log 60 "$PATTERN" $B/tests/cuda_test_cuda_decode_graph
gpu_host_stage prefix.log 90 "$PATTERN" $B/tests/cuda_test_cuda_prefix_cache
gpu_host_stage invariance.log 60 "$PATTERN" $B/tests/cuda_test_cuda_batch_invariance "CUDA batch invariance: alone*"
gpu_host_stage gemm_fixed.log 30 "$PATTERN" $B/tests/cuda_test_cuda_gemm_fixed
gpu_host_stage kda_invariant.log 40 "$PATTERN" $B/tests/cuda_test_cuda_kda_invariant
gpu_host_stage weight_fill.log 40 "$PATTERN" $B/tests/cuda_test_cuda_weight_fill
# Catch test names: no comma in a filter (Catch splits filters there).
gpu_host_stage cluster.log 120 "$PATTERN" env K3_TEST_BACKEND=cuda $B/tests/cluster_e2e_test_cluster_launcher \
  "k3-cluster serves OpenAI requests whose greedy tokens equal k3-generate*"
