#!/usr/bin/env bash
# One call on the GPU host for the engine on CUDA: unpack the offline kit, configure + build the CUDA
# tests and the serving binaries, then run the op tests, the engine-vs-CPU test and k3-generate with
# --backend cuda against --backend cpu on a generated k3-tiny.
#   tests/cuda/run_engine_on_gpu_host.sh OUT_DIR [extra ninja targets...]
# Needs .kit/k3-offline-kit.tar.gz (deploy/offline-kit.sh pack). Writes build.log, tests.log,
# generate.log (at most 8 files) to OUT_DIR. EXTRA (env): a command run last, output to extra.log.
set -uo pipefail
OUT=${1:?output dir}
shift
mkdir -p "$OUT"
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
cd "$ROOT"
deploy/offline-kit.sh unpack .kit/k3-offline-kit.tar.gz /tmp/k3kit >/dev/null || exit 1
# shellcheck disable=SC1091
source /tmp/k3kit/env.sh
{ nvidia-smi -L; nvcc --version | tail -1; date -u; } 2>&1 | tee "$OUT/build.log"
B=build-gpu
t0=$(date +%s)
cmake -S . -B $B -G Ninja -DK3_CUDA=ON -DCMAKE_BUILD_TYPE=Release >> "$OUT/build.log" 2>&1 || { tail -40 "$OUT/build.log"; exit 1; }
TARGETS="cuda_test_cuda_ops cuda_test_cuda_engine cuda_test_cuda_batch_invariance k3-generate k3-genweights $*"
# shellcheck disable=SC2086
ninja -C $B -j16 $TARGETS >> "$OUT/build.log" 2>&1 || { grep -E "error|FAILED" -A5 "$OUT/build.log" | head -60; exit 1; }
echo "configure+build: $(( $(date +%s) - t0 )) s" | tee -a "$OUT/build.log"
for t in cuda_test_cuda_ops cuda_test_cuda_engine cuda_test_cuda_batch_invariance; do
  s=$(date +%s)
  timeout 300 $B/tests/$t 2>&1 | tee -a "$OUT/tests.log" | grep -E "GPU-ENGINE|BATCH-INV|FAILED|passed|failed|SKIPPED" -A2 | tail -30
  echo "$t: $(( $(date +%s) - s )) s" | tee -a "$OUT/tests.log"
done
M=/tmp/k3-tiny
$B/bin/k3-genweights --preset k3-tiny --out $M --seed 3 > "$OUT/generate.log" 2>&1
for be in cpu cuda; do
  $B/bin/k3-generate --model $M --prompt "The quick brown fox" --max-tokens 24 --ignore-eos --backend $be 2>&1 |
    tee -a "$OUT/generate.log" | sed "s/^/[$be] /"
done
if [[ -n "${EXTRA:-}" ]]; then
  bash -c "$EXTRA" > "$OUT/extra.log" 2>&1
  tail -40 "$OUT/extra.log"
fi
