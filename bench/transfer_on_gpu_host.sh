#!/usr/bin/env bash
# One call on the GPU host for the data plane with device memory: unpack the offline kit (it carries
# UCX 1.22 with the CUDA transports), build k3-bench and the CUDA transfer test, then run them, every
# log under OUT_DIR:
#   build.log    GPU, compiler, configure + build time
#   ucx.log      ucx_info -v and the CUDA transports UCX sees
#   tests.log    cuda_test_cuda_transfer (CUDA -> CUDA/host puts, with and without the source's memory
#                handle, and through staging, each against the host reference)
#   cuda-*.log   k3-bench transfer --memory cuda beside ucx_perftest -m cuda, one file per variant
#                (UCX_PROTO_INFO=y: the protocol UCX picked for each put is in the file):
#                  old    --ucx-before-cuda --no-source-memh   (the order and puts before the fix)
#                  ctx    --no-source-memh                     (CUDA context before UCX only)
#                  memh   --ucx-before-cuda                    (source memory handle only)
#                  new    the defaults (both)
#                  new16  the defaults, 16 puts per flush (one request's plan is one write list)
#                  fly2   16 puts per flush, two lists in flight (the next list's puts go while the
#                         oldest one's flush completes)
#                  new16s, fly2s  new16 and fly2 with --same-range: every put of a list copies the same
#                         range, so the bytes touched are one put's, as in ucx_perftest (16 MiB puts
#                         then stay in the GPU's L2 on both sides)
#                  fly2sn fly2s without the batch hint on the puts (--no-batch-hint)
#                  fly2p, fly2sp  fly2 and fly2s whose waits poll for up to 1 ms before sleeping
#                         (--busy-poll-us 1000, since the default with device memory, as in k3-prefill)
#                  fly2s0 fly2s whose waits sleep at once (--busy-poll-us 0, the earlier default)
#   perftest-proto.log  the protocols ucx_perftest -m cuda picks (UCX_PROTO_INFO=y), 1 MiB
#   host.log     k3-bench transfer with host memory (loopback bandwidth and protocol round trip)
#   summary.log  the bandwidth tables and the put protocol lines of every variant
#   bench/transfer_on_gpu_host.sh OUT_DIR [VARIANT...]     (default: every variant above)
# REPEATS=N measures perftest and ours N times each per size, alternately, and prints medians with
# their min-max; BYTES sets the bytes moved per size and measurement (default 256 MiB; 16 MiB puts
# need ~4 GiB for a measurement longer than a few milliseconds).
# Needs .kit/k3-offline-kit.tar.gz (deploy/offline-kit.sh pack).
set -uo pipefail
OUT=${1:?output dir}
shift
VARIANTS=${*:-new old ctx memh new16}
# shellcheck source=tests/cuda/gpu_host.sh
source "$(dirname "$0")/../tests/cuda/gpu_host.sh"
gpu_host_setup "$OUT"
{ nproc; uptime; } >> "$OUT/build.log" 2>&1
t0=$T0
ninja -C $B -j16 k3-bench cuda_test_cuda_transfer >> "$OUT/build.log" 2>&1 ||
  { grep -E "error|FAILED" -A5 "$OUT/build.log" | head -60; exit 1; }
echo "configure+build: $(( $(date +%s) - t0 )) s" | tee -a "$OUT/build.log"
{ ucx_info -v; ucx_info -d | grep -E "Transport|Device" | grep -B1 -i cuda; } > "$OUT/ucx.log" 2>&1
s=$(date +%s)
timeout 60 $B/tests/cuda_test_cuda_transfer > "$OUT/tests.log" 2>&1
echo "cuda_test_cuda_transfer: rc $?, $(( $(date +%s) - s )) s" | tee -a "$OUT/tests.log"
tail -3 "$OUT/tests.log"
SIZES=${SIZES:-16384 1048576 16777216}
# The UCX_PROTO_INFO tables of puts (header + rows), timestamps cut, each distinct line once.
proto_rows() { grep -A9 "by ucp_put" "$1" | sed -E 's/^\[[^]]*\] \[[^]]*\] *//' | grep -v "^[+-]" | awk '!seen[$0]++' | head -40; }
for v in $VARIANTS; do
  case $v in
    old) flags="--ucx-before-cuda --no-source-memh" ;;
    ctx) flags="--no-source-memh" ;;
    memh) flags="--ucx-before-cuda" ;;
    new) flags="" ;;
    new16) flags="--writes-per-flush 16" ;;
    fly2) flags="--writes-per-flush 16 --lists-in-flight 2" ;;
    new16s) flags="--writes-per-flush 16 --same-range" ;;
    fly2s) flags="--writes-per-flush 16 --lists-in-flight 2 --same-range" ;;
    fly2sn) flags="--writes-per-flush 16 --lists-in-flight 2 --same-range --no-batch-hint" ;;
    fly2p) flags="--writes-per-flush 16 --lists-in-flight 2 --busy-poll-us 1000" ;;
    fly2sp) flags="--writes-per-flush 16 --lists-in-flight 2 --same-range --busy-poll-us 1000" ;;
    fly2s0) flags="--writes-per-flush 16 --lists-in-flight 2 --same-range --busy-poll-us 0" ;;
    *) echo "unknown variant $v"; continue ;;
  esac
  echo "== $v: k3-bench transfer --memory cuda $flags $(date -u +%T)" | tee -a "$OUT/summary.log"
  # shellcheck disable=SC2086
  UCX_PROTO_INFO=y timeout 60 $B/bin/k3-bench transfer --memory cuda $flags --sizes $SIZES \
    --bytes-per-size "${BYTES:-268435456}" --repeats "${REPEATS:-1}" --rt-iters 20 > "$OUT/cuda-$v.log" 2>&1
  echo "rc $?" >> "$OUT/summary.log"
  grep -E "^(size|16 KiB|1 MiB|16 MiB)|round trip" "$OUT/cuda-$v.log" | tee -a "$OUT/summary.log"
  proto_rows "$OUT/cuda-$v.log" >> "$OUT/summary.log"
done
# What ucx_perftest picks for the same transfer (server and client, CUDA context first as it does).
p=$((20000 + RANDOM % 20000))
UCX_PROTO_INFO=y timeout 20 ucx_perftest -t ucp_put_bw -s 1048576 -n 200 -p $p -m cuda > "$OUT/perftest-proto.log" 2>&1 &
sleep 1
UCX_PROTO_INFO=y timeout 20 ucx_perftest 127.0.0.1 -t ucp_put_bw -s 1048576 -n 200 -p $p -m cuda >> "$OUT/perftest-proto.log" 2>&1
wait
echo "== perftest put protocols" >> "$OUT/summary.log"
proto_rows "$OUT/perftest-proto.log" >> "$OUT/summary.log"
echo "== host $(date -u +%T)" | tee -a "$OUT/summary.log"
timeout 60 $B/bin/k3-bench transfer --sizes 16384 1048576 16777216 --bytes-per-size 268435456 \
  --rt-iters 300 2>&1 | grep -v "peer prefill" > "$OUT/host.log"
grep -E "^(size|16 KiB|1 MiB|16 MiB)|round trip" "$OUT/host.log" | tee -a "$OUT/summary.log"
