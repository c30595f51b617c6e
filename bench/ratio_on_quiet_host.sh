#!/usr/bin/env bash
# The P:D ratio experiment on a quiet host (one where every node process has a core of its own), on
# CPU with k3-tiny: generate the model, take a capacity profile of one prefill instance and one decode
# rank, then run `k3-bench ratio` over the splits 1:3, 2:2 and 3:1 of 4 processes with the same open-loop
# workload. The rate is set from the profile, between the capacity of 2 and of 3 prefill instances
# (RATE_FACTOR / S(INPUT)), so that the splits differ; the TTFT SLA is TTFT_FACTOR x S(INPUT).
#   bench/ratio_on_quiet_host.sh BUILD_DIR OUT_DIR [INPUT (256)] [REQUESTS (120)]
# Env: RATE_FACTOR (2.5), TTFT_FACTOR (4), OUTPUT (16), ITL_MS (50).
# Writes OUT_DIR/{host.log,profile.json,profile.log,ratio.json,ratio.log}; prints the RATIO verdict line.
set -uo pipefail
B=${1:?build dir}
OUT=${2:?output dir}
L=${3:-256}
N=${4:-120}
RATE_FACTOR=${RATE_FACTOR:-2.5}
TTFT_FACTOR=${TTFT_FACTOR:-4}
OUTPUT=${OUTPUT:-16}
ITL_MS=${ITL_MS:-50}
mkdir -p "$OUT"
B=$(cd "$B" && pwd)
W=$(mktemp -d)
trap 'rm -rf "$W"' EXIT
{ nproc; uptime; lscpu | grep -E "Model name|^CPU\(s\)"; date -u; } > "$OUT/host.log" 2>&1
cat > "$W/spec.json" <<JSON
{
  "model": "$W/model",
  "generate": {"preset": "k3-tiny", "seed": 0},
  "router": {"host": "127.0.0.1", "port": 0, "placement": "least-loaded"},
  "prefill": [{"id": "p", "stages": 1, "chunk_size": 256, "max_requests": 8}],
  "decode": [{"id": "d", "ranks": 1, "max_requests": 8}],
  "threads": 1,
  "backend": "cpu",
  "timeouts": {"heartbeat_ms": 200, "heartbeat_misses": 5, "claim_ms": 5000, "startup_s": 180, "shutdown_ms": 5000}
}
JSON
cd "$W" || exit 1
"$B/bin/k3-bench" profile --spawn-cluster spec.json --model model --input-lens "64,$L,512" --batches 1,2,4,8 \
  --output-len "$OUTPUT" --reps 5 --out "$OUT/profile.json" > "$OUT/profile.log" 2>&1 ||
  { tail -20 "$OUT/profile.log"; exit 1; }
S=$(python3 -c "import json,sys; p=json.load(open('$OUT/profile.json')); print([e['seconds'] for e in p['prefill'] if e['input_tokens']==$L][0])")
RATE=$(python3 -c "print(round($RATE_FACTOR / $S, 2))")
TTFT=$(python3 -c "print(int($TTFT_FACTOR * $S * 1000))")
echo "S($L) = $S s; rate $RATE req/s; TTFT SLA $TTFT ms; ITL SLA $ITL_MS ms; $N requests" | tee -a "$OUT/host.log"
"$B/bin/k3-bench" ratio --spec spec.json --profile "$OUT/profile.json" --model model --total 4 \
  --splits 1:3,2:2,3:1 --rate "$RATE" --requests "$N" --input "$L" --output "$OUTPUT" --ttft-ms "$TTFT" \
  --itl-ms "$ITL_MS" --out "$OUT/ratio.json" > "$OUT/ratio.log" 2>&1
rc=$?
grep -E "^RATIO|recommended|split|goodput" "$OUT/ratio.log" | tail -20
exit $rc
