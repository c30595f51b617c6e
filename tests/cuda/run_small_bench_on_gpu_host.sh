#!/usr/bin/env bash
# One call on the GPU host for k3-small's engine figures on one tree: unpack the offline kit, configure +
# build (the CUDA tests, k3-bench and the serving binaries, so that a later call on the same warm machine
# rebuilds nothing), then (each stage time-limited; logs under OUT_DIR)
#   bench.log      k3-bench engine --steps 10: decode at batch 1/8/64/256 x context 1k/8k, eager and
#                  CUDA graph, against the roofline of the same run's copy bandwidth; the time split by
#                  layer type; prefill of 8k and 32k prompts against the bf16 GEMM peak;
#   invariance.log cuda_test_cuda_batch_invariance "CUDA batch invariance for k3-small*": alone vs a
#                  batch of 8 and chunks 1/63/64/65/1000, bitwise;
#   bench_inv.log  the batch-invariant kernels' cost at batch 1 and 64 (decode) and an 8k prefill.
#   tests/cuda/run_small_bench_on_gpu_host.sh OUT_DIR
set -uo pipefail
OUT=${1:?output dir}
# shellcheck source=tests/cuda/gpu_host.sh
source "$(dirname "$0")/gpu_host.sh"
gpu_host_setup "$OUT"
timeout 300 ninja -C $B -j16 cuda_test_cuda_batch_invariance cuda_test_cuda_engine engine_test_cpu_forward_rate \
  k3-bench k3-genweights k3-prefill k3-decode >> "$OUT/build.log" 2>&1 ||
  { grep -E "error|FAILED" -A5 "$OUT/build.log" | head -60; exit 1; }
echo "configure+build: $(( $(date +%s) - T0 )) s" | tee -a "$OUT/build.log"
gpu_host_stage bench.log 260 "^\||ceilings|rc|error" $B/bin/k3-bench engine --steps 10
gpu_host_stage invariance.log 120 "BATCH-INV|FAILED|passed|failed|with expansion" \
  $B/tests/cuda_test_cuda_batch_invariance "CUDA batch invariance for k3-small*"
gpu_host_stage bench_inv.log 80 "^\||ceilings|rc|error" $B/bin/k3-bench engine --steps 5 --batch-invariant \
  --batches 1 64 --contexts 1024 --prefill 8192 --no-profile
