#!/usr/bin/env bash
# One call on the GPU host for the data plane with device memory: unpack the offline kit (it carries
# UCX 1.22 with the CUDA transports), build k3-bench, the CUDA transfer test and the transfer tests,
# then run them and the benches, every log under OUT_DIR:
#   ucx.log      ucx_info -v and the CUDA transports UCX sees
#   tests.log    cuda_test_cuda_transfer (CUDA -> CUDA/host puts vs the host reference) and the
#                host-memory writer test
#   cuda.log     k3-bench transfer --memory cuda beside ucx_perftest -m cuda, 1 and 16 puts per flush
#   host.log     five consecutive k3-bench transfer runs (host memory): bandwidth and round trip
#   bench/transfer_on_gpu_host.sh OUT_DIR
# Needs .kit/k3-offline-kit.tar.gz (deploy/offline-kit.sh pack).
set -uo pipefail
OUT=${1:?output dir}
mkdir -p "$OUT"
ROOT=$(cd "$(dirname "$0")/.." && pwd)
cd "$ROOT"
deploy/offline-kit.sh unpack .kit/k3-offline-kit.tar.gz /tmp/k3kit >/dev/null || exit 1
# shellcheck disable=SC1091
source /tmp/k3kit/env.sh
{ nvidia-smi -L; nvcc --version | tail -1; nproc; uptime; date -u; } 2>&1 | tee "$OUT/build.log"
B=build-gpu
t0=$(date +%s)
cmake -S . -B $B -G Ninja -DK3_CUDA=ON -DCMAKE_BUILD_TYPE=Release >> "$OUT/build.log" 2>&1 || { tail -40 "$OUT/build.log"; exit 1; }
TESTS="transfer_test_ucx_writer"
# shellcheck disable=SC2086
ninja -C $B -j16 k3-bench cuda_test_cuda_transfer $TESTS >> "$OUT/build.log" 2>&1 ||
  { grep -E "error|FAILED" -A5 "$OUT/build.log" | head -60; exit 1; }
echo "configure+build: $(( $(date +%s) - t0 )) s" | tee -a "$OUT/build.log"
{ ucx_info -v; ucx_info -d | grep -E "Transport|Device" | grep -B1 -i cuda; } > "$OUT/ucx.log" 2>&1
grep -i "transport" "$OUT/ucx.log" | sort | uniq -c
for t in cuda_test_cuda_transfer $TESTS; do
  s=$(date +%s)
  timeout 240 $B/tests/$t 2>&1 | tee -a "$OUT/tests.log" | grep -E "SKIPPED|FAILED|passed|failed" -A3 | tail -6
  echo "$t: rc ${PIPESTATUS[0]}, $(( $(date +%s) - s )) s" | tee -a "$OUT/tests.log"
done
SIZES="16384 65536 262144 1048576 4194304 16777216 67108864"
for w in 1 16; do
  if [[ $w != 1 ]]; then SIZES="16384 65536 262144 1048576"; fi
  echo "== --memory cuda --writes-per-flush $w" | tee -a "$OUT/cuda.log"
  # shellcheck disable=SC2086
  timeout 150 $B/bin/k3-bench transfer --memory cuda --writes-per-flush $w --sizes $SIZES \
    --bytes-per-size 1073741824 --rt-iters 300 2>&1 | grep -v "peer prefill" | tee -a "$OUT/cuda.log"
done
for i in 1 2 3 4 5; do
  echo "== host run $i $(date -u +%T)" | tee -a "$OUT/host.log"
  timeout 120 $B/bin/k3-bench transfer --sizes 16384 1048576 16777216 --bytes-per-size 268435456 \
    --rt-iters 300 2>&1 | grep -v "peer prefill" | tee -a "$OUT/host.log"
done
