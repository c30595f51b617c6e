#!/usr/bin/env bash
# One call on the GPU host for programmatic dependent launch (kernels/cuda/pdl.cuh): first that the
# engine's results are unchanged with it, then what it buys against a build of the same tree with
# -DK3_CUDA_PDL=OFF (every kernel launched in plain stream order, and the fixed-order GEMM without its
# weight prefetch before the wait). Unpack the offline kit, configure +
# build (build-gpu: PDL on; build-nopdl: off, k3-bench only), then (each stage time-limited, the whole
# run kept under BUDGET seconds; logs under OUT_DIR)
#   chain.log    cuda_test_cuda_ops "*programmatic*": 400 dependent kernels, eager and as a graph, each
#                seeing every write before it;
#   graph.log    cuda_test_cuda_decode_graph: decode steps replayed as CUDA graphs == eager, bitwise;
#   inv.log      cuda_test_cuda_batch_invariance "alone*": alone == batched, bitwise (serving's mode);
#   {on,off}_{default,inv}.log
#                k3-bench engine --batches 1 8 64 --contexts 1024 --prefill 1024 --steps 10 --no-profile,
#                the default mode and --batch-invariant, each build in turn (on, off, on, off ...):
#                the graph-timed decode steps and the prefill, with and without programmatic launches.
#   tests/cuda/run_pdl_on_gpu_host.sh OUT_DIR [BUDGET (default 560)]
set -uo pipefail
OUT=${1:?output dir}
BUDGET=${2:-560}
# shellcheck source=tests/cuda/gpu_host.sh
source "$(dirname "$0")/gpu_host.sh"
gpu_host_setup "$OUT"
cmake -S . -B $B -DK3_CUDA_PDL=ON >> "$OUT/build.log" 2>&1 || { tail -20 "$OUT/build.log"; exit 1; }
timeout 240 ninja -C $B -j16 cuda_test_cuda_ops cuda_test_cuda_decode_graph cuda_test_cuda_batch_invariance k3-bench >> "$OUT/build.log" 2>&1 ||
  { grep -E "error|FAILED" -A5 "$OUT/build.log" | head -60; exit 1; }
NOPDL=build-nopdl
{ cmake -S . -B $NOPDL -G Ninja -DK3_CUDA=ON -DCMAKE_BUILD_TYPE=Release -DK3_CUDA_PDL=OFF -DK3_BUILD_TESTS=OFF &&
  timeout 200 ninja -C $NOPDL -j16 k3-bench; } >> "$OUT/build.log" 2>&1 ||
  { grep -E "error|FAILED" -A5 "$OUT/build.log" | head -60; exit 1; }
echo "configure+build (both): $(( $(date +%s) - T0 )) s" | tee -a "$OUT/build.log"

PATTERN="FAILED|passed|failed|SKIPPED|^\| *(1|8|64|1024) *\||kernel switches|ceiling"
left() { echo $(( BUDGET - ($(date +%s) - T0) )); }
gpu_host_stage chain.log 30 "$PATTERN" $B/tests/cuda_test_cuda_ops "*programmatic*"
gpu_host_stage graph.log 60 "$PATTERN" $B/tests/cuda_test_cuda_decode_graph
gpu_host_stage inv.log 90 "$PATTERN" $B/tests/cuda_test_cuda_batch_invariance "CUDA batch invariance: alone*"
ROWS=(engine --batches 1 8 64 --contexts 1024 --prefill 1024 --steps 10 --no-profile)
for round in 1 2; do
  for mode in default inv; do
    extra=(); [ "$mode" = inv ] && extra=(--batch-invariant)
    for build in on off; do
      dir=$B; [ "$build" = off ] && dir=$NOPDL
      lim=$(( $(left) - 5 )); [ "$lim" -gt 75 ] && lim=75
      [ "$lim" -gt 10 ] || { echo "budget spent before ${build}_${mode} round $round"; continue; }
      gpu_host_stage "${build}_${mode}_$round.log" "$lim" "$PATTERN" $dir/bin/k3-bench "${ROWS[@]}" "${extra[@]}"
    done
  done
done
