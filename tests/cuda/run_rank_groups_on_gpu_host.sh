#!/usr/bin/env bash
# Decode rank groups on the GPU host (docs/RANKS.md, "GPU ranks"): unpack the offline kit, configure +
# build, then (each stage time-limited; logs under OUT_DIR)
#   nccl.log     nccl_test_nccl_comm: the NCCL communicator as a group of one;
#   ranks.log    ranks_test_rank_decode_gpu: one CUDA rank vs the CUDA engine over UCX and NCCL; DCP2,
#                DCP4 and EP2 rank processes sharing GPU 0 over host UCX vs one CUDA rank; with two GPUs or
#                more, DCP2 and EP2 with one GPU per rank over NCCL, and a rank killed mid-step over NCCL
#                failing its group at the step deadline (both SKIPPED on one GPU);
#   cluster.log  K3_TEST_BACKEND=cuda cluster_e2e_test_cluster_group_contracts:
#                four DP2 clusters (single processes, single processes with kv_partitions 2, DCP2 groups,
#                EP2 groups; all on GPU 0), 16 concurrent greedy requests: EP2 == the single processes and
#                DCP2 == the kv_partitions 2 processes, whole (GROUP-TOKENS lines);
#   bench.log    k3-bench ranks --backend cuda --k3-heads: the decode step split into compute and
#                collectives, DCP2 and EP2 sharing GPU 0 over UCX, batch 1 / 16 / 64; with two GPUs or more
#                also one GPU per rank over NCCL.
#   tests/cuda/run_rank_groups_on_gpu_host.sh OUT_DIR
set -uo pipefail
OUT=${1:?output dir}
# shellcheck source=tests/cuda/gpu_host.sh
source "$(dirname "$0")/gpu_host.sh"
gpu_host_setup "$OUT"
TARGETS="ranks_test_rank_decode_gpu k3-test-rank-peer cluster_e2e_test_cluster_group_contracts k3-generate k3-genweights
  k3-router k3-cluster k3-prefill k3-decode k3-bench"
if grep -q "k3serve: NCCL /" "$OUT/build.log"; then TARGETS="$TARGETS nccl_test_nccl_comm"; fi
# shellcheck disable=SC2086
timeout 300 ninja -C $B -j16 $TARGETS >> "$OUT/build.log" 2>&1 ||
  { grep -E "error|FAILED" -A5 "$OUT/build.log" | head -60; exit 1; }
echo "configure+build: $(( $(date +%s) - T0 )) s" | tee -a "$OUT/build.log"
PATTERN="GPU-RANKS|GROUP-TOKENS|FAILED|passed|failed|SKIPPED|with expansion|REQUIRE|CHECK"
[ -x $B/tests/nccl_test_nccl_comm ] && gpu_host_stage nccl.log 60 "$PATTERN" $B/tests/nccl_test_nccl_comm
gpu_host_stage ranks.log 240 "$PATTERN" $B/tests/ranks_test_rank_decode_gpu
gpu_host_stage cluster.log 240 "$PATTERN" env K3_TEST_BACKEND=cuda $B/tests/cluster_e2e_test_cluster_group_contracts
GPUS=$(nvidia-smi -L | wc -l)
{
  for b in 1 16 64; do
    $B/bin/k3-bench ranks --backend cuda --k3-heads --heads 8 --dcp 2 --batch $b --context 2048 --steps 20
    $B/bin/k3-bench ranks --backend cuda --k3-heads --ep 2 --batch $b --context 2048 --steps 20
    if [ "$GPUS" -ge 2 ]; then
      $B/bin/k3-bench ranks --backend cuda --k3-heads --heads 8 --dcp 2 --gpus 2 --collectives nccl --batch $b --context 2048 --steps 20
      $B/bin/k3-bench ranks --backend cuda --k3-heads --ep 2 --gpus 2 --collectives nccl --batch $b --context 2048 --steps 20
    fi
  done
} > "$OUT/bench.log" 2>&1
grep -v "^$" "$OUT/bench.log" | head -60
