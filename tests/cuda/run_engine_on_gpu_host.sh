#!/usr/bin/env bash
# One call on the GPU host for the engine on CUDA: unpack the offline kit, configure + build the CUDA
# tests, the serving binaries (k3-router too: the kit carries its Boost headers) and k3-bench, then
#   tests.log     the op tests, engine-vs-CPU, batch invariance and the decode-graph test;
#   generate.log  k3-generate --backend cuda against --backend cpu on a generated k3-tiny;
#   cluster.log   router + k3-prefill (2 stages) + k3-decode all --backend cuda on the one GPU against
#                 k3-generate --backend cuda (K3_TEST_BACKEND=cuda, tests/cluster_e2e/test_cluster_launcher.cpp);
#   bench.log     k3-bench engine on k3-small (eager vs graph decode, launches, split by layer type,
#                 prefill), bench_inv.log the same with batch-invariant GEMMs at a few points.
#   tests/cuda/run_engine_on_gpu_host.sh OUT_DIR [extra ninja targets...]
# Needs .kit/k3-offline-kit.tar.gz (deploy/offline-kit.sh pack). Each stage has its own time limit so
# that one call stays under 10 minutes. EXTRA (env): a command run last, output to extra.log.
set -uo pipefail
OUT=${1:?output dir}
shift
# shellcheck source=tests/cuda/gpu_host.sh
source "$(dirname "$0")/gpu_host.sh"
gpu_host_setup "$OUT"
t0=$T0
TESTS="cuda_test_cuda_ops cuda_test_cuda_engine cuda_test_cuda_batch_invariance cuda_test_cuda_decode_graph"
# shellcheck disable=SC2086
timeout 300 ninja -C $B -j16 $TESTS k3-generate k3-genweights k3-bench "$@" >> "$OUT/build.log" 2>&1 ||
  { grep -E "error|FAILED" -A5 "$OUT/build.log" | head -60; exit 1; }
CLUSTER=0
if timeout 200 ninja -C $B -j16 k3-router k3-cluster k3-prefill k3-decode cluster_e2e_test_cluster_launcher \
     >> "$OUT/build.log" 2>&1; then CLUSTER=1; else echo "cluster binaries did not build (build.log)" | tee -a "$OUT/build.log"; fi
echo "configure+build: $(( $(date +%s) - t0 )) s" | tee -a "$OUT/build.log"

run_test() {  # name, time limit
  local s
  s=$(date +%s)
  timeout "$2" $B/tests/"$1" 2>&1 | tee -a "$OUT/tests.log" |
    grep -E "GPU-ENGINE|BATCH-INV|DECODE-GRAPH|FAILED|passed|failed|SKIPPED" -A2 | tail -30
  echo "$1: rc ${PIPESTATUS[0]}, $(( $(date +%s) - s )) s" | tee -a "$OUT/tests.log"
}
run_test cuda_test_cuda_decode_graph 90
run_test cuda_test_cuda_ops 60
run_test cuda_test_cuda_engine 90

s=$(date +%s)
timeout 200 $B/bin/k3-bench engine --steps 10 > "$OUT/bench.log" 2>&1
echo "bench: rc $?, $(( $(date +%s) - s )) s" | tee -a "$OUT/bench.log"
grep -E "^\||ceilings|upload" "$OUT/bench.log" | head -70

if [[ $CLUSTER == 1 ]]; then
  s=$(date +%s)
  K3_TEST_BACKEND=cuda timeout 180 $B/tests/cluster_e2e_test_cluster_launcher \
    "k3-cluster serves OpenAI requests whose greedy tokens equal k3-generate*" > "$OUT/cluster.log" 2>&1  # no comma: Catch splits filters there
  echo "cluster (cuda): rc $?, $(( $(date +%s) - s )) s" | tee -a "$OUT/cluster.log"
  grep -E "FAILED|passed|failed|with expansion" -A3 "$OUT/cluster.log" | tail -30
fi

run_test cuda_test_cuda_batch_invariance 90
s=$(date +%s)
timeout 60 $B/bin/k3-bench engine --steps 5 --batch-invariant --batches 1 64 --contexts 1024 --prefill 8192 \
  --no-profile > "$OUT/bench_inv.log" 2>&1
echo "bench --batch-invariant: rc $?, $(( $(date +%s) - s )) s" | tee -a "$OUT/bench_inv.log"
grep -E "^\|" "$OUT/bench_inv.log" | tail -8

M=/tmp/k3-tiny
$B/bin/k3-genweights --preset k3-tiny --out $M --seed 3 > "$OUT/generate.log" 2>&1
for be in cpu cuda; do
  timeout 30 $B/bin/k3-generate --model $M --prompt "The quick brown fox" --max-tokens 24 --ignore-eos --backend $be 2>&1 |
    tee -a "$OUT/generate.log" | sed "s/^/[$be] /" | tail -3
done
if [[ -n "${EXTRA:-}" ]]; then
  bash -c "$EXTRA" > "$OUT/extra.log" 2>&1
  tail -40 "$OUT/extra.log"
fi
