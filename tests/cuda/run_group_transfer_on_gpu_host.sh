#!/usr/bin/env bash
# Prefill writing to a decode rank group over UCX on the GPU host (docs/PERF.md, "GPU rank groups with their
# transfer regions in device memory"): every
# process on GPU 0, the group's transfer regions in device memory, so the stages' puts go GPU to GPU over
# cuda_ipc. Unpack the offline kit, configure + build, generate k3-small (about 15 GiB), then (logs under
# OUT_DIR)
#   perftest.log   ucx_perftest -t ucp_put_bw -m cuda, 16 MiB puts between two processes on GPU 0: the
#                  anchor, measured in the same call;
#   overlap-*.log  k3-bench overlap --backend cuda, k3-small, an 8192-token prompt in 1024-token chunks, two
#                  prefill stages, decode as one rank, a DCP2 group and an EP2 group: TTFT with / without
#                  the transfer, the share of the write time hidden behind compute, MB written and the
#                  write rate (the write batches' bytes over their time).
#   tests/cuda/run_group_transfer_on_gpu_host.sh OUT_DIR [PROMPT]
#   (DECODES="one dcp2 ep2" by default: which decode sides to run; RUNS rounds after the warm-up, 1)
set -uo pipefail
OUT=${1:?output dir}
PROMPT=${2:-8192}
# shellcheck source=tests/cuda/gpu_host.sh
source "$(dirname "$0")/gpu_host.sh"
gpu_host_setup "$OUT"
timeout 300 ninja -C $B -j16 k3-bench k3-genweights k3-prefill k3-decode >> "$OUT/build.log" 2>&1 ||
  { grep -E "error|FAILED" -A5 "$OUT/build.log" | head -60; exit 1; }
echo "configure+build: $(( $(date +%s) - T0 )) s" | tee -a "$OUT/build.log"
M=/tmp/k3-small
[[ -f $M/config.json ]] || gpu_host_stage genweights.log 120 "rc|error" \
  $B/bin/k3-genweights --preset k3-small --seed 5 --allow-large --force --quiet --out $M
p=$((20000 + RANDOM % 20000))
{ timeout 30 ucx_perftest -t ucp_put_bw -s 16777216 -n 200 -p $p -m cuda & sleep 1
  timeout 30 ucx_perftest 127.0.0.1 -t ucp_put_bw -s 16777216 -n 200 -p $p -m cuda; wait; } > "$OUT/perftest.log" 2>&1
grep -E "Final|MB/s|bandwidth" "$OUT/perftest.log" | tail -4
PATTERN="overlap:|median|^warm|^[0-9]"
for g in "one:" "dcp2:--group-dcp 2" "ep2:--group-ep 2"; do
  [[ " ${DECODES:-one dcp2 ep2} " == *" ${g%%:*} "* ]] || continue
  # shellcheck disable=SC2086
  gpu_host_stage "overlap-${g%%:*}.log" "${OVERLAP_LIMIT:-200}" "$PATTERN" $B/bin/k3-bench overlap --model $M \
    --backend cuda --prompt "$PROMPT" --chunk 1024 --stages 2 --runs "${RUNS:-1}" --timeout-s 120 ${g#*:}
done
