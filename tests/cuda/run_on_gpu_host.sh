#!/usr/bin/env bash
# One call on the GPU host: unpack the offline kit, configure + build with only CUDA (+ NCCL) there,
# run the CUDA-vs-CPU tests, the fla/PyTorch references and `k3-bench kernels`.
#   tests/cuda/run_on_gpu_host.sh OUT_DIR [--no-ref] [--all]
# Needs .kit/k3-offline-kit.tar.gz (deploy/offline-kit.sh pack) and, for the references, the
# fla-core and sgl-flash-mla (FlashMLA) wheels in .whl/ (docs/PERF.md says how). Writes at most 9
# files to OUT_DIR: build.log, resources.txt, tests.log, ref.json, ref.log, ours.json, bench.md (and
# crosscheck.json, crosscheck.log).
# TESTS: the CUDA test binaries to build and run (default: all six kernel suites below).
# CROSSCHECK=1: also bench/fla_crosscheck.py (our kda_chunk through k3-op against fla's chunk_kda
# on unseen shapes) -> OUT_DIR/crosscheck.json, crosscheck.log.
# REF_ARGS: extra bench/fla_reference.py flags (e.g. --skip-fla to time FlashMLA and PyTorch only).
# REF_BASE: reference JSON of an earlier run on the same kind of GPU; keys this run did not time (with
# --skip-fla: fla's, whose autotuning costs ~90 s a prefill shape) are taken from it, and ref.json
# lists them under "from_earlier_run".
set -uo pipefail
OUT=${1:?output dir}
shift
REF=1 ALL=0
for a in "$@"; do
  case $a in --no-ref) REF=0 ;; --all) ALL=1 ;; esac
done
# shellcheck source=tests/cuda/gpu_host.sh
source "$(dirname "$0")/gpu_host.sh"
gpu_host_setup "$OUT"
t0=$T0
TESTS=${TESTS:-cuda_test_cuda_mma cuda_test_cuda_wgmma cuda_test_cuda_ops cuda_test_cuda_attention cuda_test_cuda_mla cuda_test_cuda_registry}
TARGETS="$TESTS k3-op k3-bench"
[[ $ALL == 1 ]] && TARGETS=all
ninja -C $B -j16 $TARGETS >> "$OUT/build.log" 2>&1 || { grep -E "error|FAILED" -A5 "$OUT/build.log" | head -60; exit 1; }
echo "configure+build: $(( $(date +%s) - t0 )) s"
cuobjdump --dump-resource-usage $B/lib/libk3_kernels.a 2>/dev/null | grep -E "Function|REG" > "$OUT/resources.txt"
# TEST_TIMEOUT / BENCH_TIMEOUT (s): a suite or the bench that hangs is stopped there, and the rest of
# the call still runs.
for t in $TESTS; do
  timeout "${TEST_TIMEOUT:-1200}" $B/tests/$t 2>&1 | tee -a "$OUT/tests.log" | tail -25
  [[ ${PIPESTATUS[0]} == 124 ]] && echo "$t: stopped after ${TEST_TIMEOUT:-1200} s" | tee -a "$OUT/tests.log"
done
if [[ $REF == 1 || ${CROSSCHECK:-0} == 1 ]]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/fla_core-*.whl .whl/sgl_flash_mla-*.whl
fi
if [[ $REF == 1 ]]; then
  # shellcheck disable=SC2086
  PYTHONUNBUFFERED=1 PYTHONPATH=/tmp/site timeout "${REF_TIMEOUT:-300}" python3 bench/fla_reference.py --out "$OUT/ref.json" ${REF_ARGS:-} > "$OUT/ref.log" 2>&1
  grep -E "flashmla|failed|first call" "$OUT/ref.log" | head -20
  if [[ -n ${REF_BASE:-} && -f $REF_BASE ]]; then
    python3 - "$REF_BASE" "$OUT/ref.json" <<'PY'
import json, sys
base, cur = json.load(open(sys.argv[1])), json.load(open(sys.argv[2]))
added = [k for k in base if k not in cur and k not in ("device", "torch")]
for k in added:
    cur[k] = base[k]
cur["from_earlier_run"] = added
json.dump(cur, open(sys.argv[2], "w"), indent=1)
print("reference keys from the earlier run:", ", ".join(added))
PY
  fi
fi
# REF_JSON: reuse reference timings of an earlier run (with --no-ref); default: this run's.
# BENCH_ARGS: extra k3-bench kernels flags, e.g. "--only kda_decode,mla_decode".
# shellcheck disable=SC2086
timeout "${BENCH_TIMEOUT:-3600}" $B/bin/k3-bench kernels --ref "${REF_JSON:-$OUT/ref.json}" --json "$OUT/ours.json" \
  ${BENCH_ARGS:-} 2>&1 | tee "$OUT/bench.md"
# Last: fla compiles and tunes its kernels on first use (more than 80 s on an H200: give it 300);
# the timings above are safe.
if [[ ${CROSSCHECK:-0} == 1 ]]; then
  PYTHONUNBUFFERED=1 PYTHONPATH=/tmp/site timeout "${CROSSCHECK_TIMEOUT:-300}" python3 bench/fla_crosscheck.py --k3-op $B/bin/k3-op \
    --out "$OUT/crosscheck.json" > "$OUT/crosscheck.log" 2>&1
  tail -8 "$OUT/crosscheck.log"
fi
