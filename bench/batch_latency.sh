#!/usr/bin/env bash
# Single heartbeats behind batches (issue 27, target 3): while 1M keys are registered through
# the batch route (batches of 1,000 over 4 connections, as fast as the server takes them), an
# open-loop sampler sends single heartbeats at 200/s on other keys over 4 connections, each at
# its scheduled time, and reports p50/p99/max latency counted from that time (ttlwheel-load's
# `--rate`). Each round starts a fresh server (memory only, default flags), so every round
# registers into an empty registry. Then, on the last server, batch throughput closed loop
# (renewals of the 1M keys, 4 connections, batches of 1,000).
#
# Usage: bash bench/batch_latency.sh
#   ROUNDS=3 KEYS=1000000 RATE=200 WINDOW=2s THROUGHPUT_DURATION=10s
#   SERVER=<binary> LOAD=<binary>  (e.g. an older build, for before/after; build them yourself)
#   PORT=17930 OUT=target/bench-batch-latency
# The sampler measures for WINDOW, starting as the registration starts: the registration time
# is printed beside it, so a window longer than the registration (which would dilute the
# percentiles with quiet time) shows. Latency on a shared machine is noisy: the script prints
# `uptime` at the start and end. Every process binds 127.0.0.1 and is stopped by PID.
set -euo pipefail
cd "$(dirname "$0")/.."

ROUNDS=${ROUNDS:-3}
KEYS=${KEYS:-1000000}
RATE=${RATE:-200}
WINDOW=${WINDOW:-2s}
THROUGHPUT_DURATION=${THROUGHPUT_DURATION:-10s}
PORT=${PORT:-17930}
OUT=${OUT:-target/bench-batch-latency}
mkdir -p "$OUT"
if [ -z "${SERVER:-}" ] || [ -z "${LOAD:-}" ]; then
  cargo build --release -q -p ttlwheel -p ttlwheel-load
fi
SERVER=${SERVER:-target/release/ttlwheel}
LOAD=${LOAD:-target/release/ttlwheel-load}
TARGET="127.0.0.1:$PORT"
. bench/lib.sh
SAMPLER=
stop_all() { [ -n "$SAMPLER" ] && kill "$SAMPLER" 2>/dev/null; stop; }
trap stop_all EXIT

echo "server: $SERVER; load at start: $(uptime | sed 's/.*load average/load average/')"
echo "| round | registration | keys/s | sampler n | p50 ms | p99 ms | max ms |"
echo "|---|---|---|---|---|---|---|"
for round in $(seq "$ROUNDS"); do
  serve --ephemeral
  # The sampler registers its own 1,000 keys first (a few ms), warms up 0.5 s, then measures.
  "$LOAD" --target "$TARGET" heartbeat --prefix probe- --keys 1000 --connections 4 \
    --rate "$RATE" --warmup 0.5s --duration "$WINDOW" >"$OUT/sampler-$round.log" 2>&1 &
  SAMPLER=$!
  sleep 0.5
  "$LOAD" --target "$TARGET" batch --prefix reg- --keys "$KEYS" --connections 4 --batch 1000 \
    --warmup 0s --duration 0s >"$OUT/register-$round.log" 2>&1 || true
  wait "$SAMPLER" || true
  SAMPLER=
  took=$(sed -n 's/.*preloaded [0-9]* keys in \([0-9.]*\) s.*/\1/p' "$OUT/register-$round.log")
  [ -n "$took" ] || { cat "$OUT/register-$round.log" >&2; exit 1; }
  ms() { result "$OUT/sampler-$round.log" "latency.$1"; }
  echo "| $round | $took s | $(awk -v k="$KEYS" -v t="$took" 'BEGIN { printf "%.0f", k / t }') | $(ms count) | $(ms p50) | $(ms p99) | $(ms max) |"
  [ "$round" = "$ROUNDS" ] || stop
done
"$LOAD" --target "$TARGET" batch --prefix reg- --keys "$KEYS" --connections 4 --batch 1000 \
  --no-preload --warmup 2s --duration "$THROUGHPUT_DURATION" >"$OUT/throughput.log" 2>&1
echo "batch throughput (renewals of the $KEYS keys, closed loop, 4 connections): $(result "$OUT/throughput.log" heartbeats_per_s | cut -d. -f1) heartbeats/s"
echo "load at end: $(uptime | sed 's/.*load average/load average/')"
