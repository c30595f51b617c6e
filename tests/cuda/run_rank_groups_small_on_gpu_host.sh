#!/usr/bin/env bash
# Decode rank groups serving k3-small (93 layers, 16 heads, 32 experts top-4, random bf16 weights) on the
# GPU host, every process on GPU 0 and the groups' collectives through the host: unpack the offline kit,
# configure + build, generate k3-small (about 15 GiB), then (logs under OUT_DIR)
#   comm.log        transfer_test_comm: the host collectives the groups step with, over this host's UCX,
#                   small (eager) and large (rendezvous) messages;
#   genweights.log  k3-genweights --preset k3-small
#   cluster.log     K3_TEST_BACKEND=cuda K3_TEST_MODEL=<k3-small> cluster_e2e_test_cluster_group_contracts:
#                   four DP2 clusters (single processes, one process with
#                   kv_partitions 2, DCP2 groups, EP2 groups), 16 concurrent greedy requests each; EP2 ==
#                   the single processes and DCP2 == the kv_partitions 2 process, whole (GROUP-TOKENS lines;
#                   GROUP-RUN lines: each cluster's start, requests and stop); every node's log lines
#                   (info) in OUT_DIR/nodes.log (a section per run), and their warnings and errors printed.
#   stacks.log      with STACKS_AFTER=S: every thread's stack of each k3-decode process alive S seconds
#                   into the cluster stage (cuda-gdb attached in batch mode), to tell where a step waits.
# (Few files: a GPU host returns at most eight.)
#   tests/cuda/run_rank_groups_small_on_gpu_host.sh OUT_DIR
#   (K3_TEST_GROUP_RUNS=dcp2,ep2 runs only those clusters; K3_TEST_DEFAULT_WINDOWS=1 keeps the deploy
#   files' 600 ms liveness window and 2 s step deadline instead of the test's 10 s and 30 s for this host;
#   CLUSTER_LIMIT, the cluster stage's seconds)
set -uo pipefail
OUT=${1:?output dir}
# shellcheck source=tests/cuda/gpu_host.sh
source "$(dirname "$0")/gpu_host.sh"
gpu_host_setup "$OUT"
# shellcheck disable=SC2086
timeout 300 ninja -C $B -j16 cluster_e2e_test_cluster_group_contracts transfer_test_comm k3-test-peer-comm \
  k3-genweights k3-router k3-cluster k3-prefill k3-decode >> "$OUT/build.log" 2>&1 || { grep -E "error|FAILED" -A5 "$OUT/build.log" | head -60; exit 1; }
echo "configure+build: $(( $(date +%s) - T0 )) s" | tee -a "$OUT/build.log"
gpu_host_stage comm.log 120 "passed|failed|FAILED" $B/tests/transfer_test_comm
M=/tmp/k3-small
[[ -f $M/config.json ]] || gpu_host_stage genweights.log 120 "rc|error" \
  $B/bin/k3-genweights --preset k3-small --seed 5 --allow-large --force --quiet --out $M
if [[ -n ${STACKS_AFTER:-} ]]; then
  ( sleep "$STACKS_AFTER"
    for pid in $(pgrep -f "bin/k3-decode"); do
      { tr '\0' ' ' < "/proc/$pid/cmdline"; echo; timeout 120 cuda-gdb -p "$pid" -batch -ex "thread apply all bt"; } \
        > "/tmp/stacks-$pid.log" 2>&1 &
    done
    wait
    cat /tmp/stacks-*.log > "$OUT/stacks.log" 2>/dev/null
    rm -f /tmp/stacks-*.log ) &
fi
PATTERN="GROUP-TOKENS|GROUP-RUN|FAILED|passed|failed|SKIPPED|with expansion|REQUIRE|CHECK|error"
gpu_host_stage cluster.log "${CLUSTER_LIMIT:-420}" "$PATTERN" env K3_TEST_BACKEND=cuda K3_TEST_MODEL=$M \
  K3_TEST_LOG_DIR="$OUT/logs" $B/tests/cluster_e2e_test_cluster_group_contracts
# Every node log of every run as one file (files nested deeper do not come back from the GPU host), and
# what they said about failures.
for d in "$OUT"/logs/*/; do
  [[ -d $d ]] || continue
  echo "=== run $(basename "$d")"
  for f in "$d"*.log; do echo "== $(basename "$f")"; grep -v tag_match "$f"; done
done > "$OUT/nodes.log"
rm -rf "$OUT/logs"
grep -h -i -E "warn|error|fail|down \(|deadline|timed out" "$OUT/nodes.log" | head -40
wait
nvidia-smi --query-gpu=memory.used,memory.total --format=csv >> "$OUT/cluster.log" 2>&1
