#!/usr/bin/env bash
# Growth without stalls, over HTTP: while the table grows from 0 to KEYS keys through the batch
# route (ttlwheel-load's preload: batches of 1,000 over 4 connections), an open-loop sampler
# sends single heartbeats on other keys at RATE/s (latency counted from each request's
# scheduled time, so a stall shows in full). Persistence on, as a user runs it. The sampler runs
# for SAMPLE (set it near the growth time, printed, so idle time does not dilute the p99).
#
# Usage: bash bench/growth.sh     KEYS=10000000 RATE=200 SAMPLE=20s
# The server binds 127.0.0.1 only and is stopped by PID. Results: target/bench-growth/.
set -euo pipefail
cd "$(dirname "$0")/.."

KEYS=${KEYS:-10000000}
RATE=${RATE:-200}
SAMPLE=${SAMPLE:-20s}
PORT=${PORT:-17915}
OUT=target/bench-growth
mkdir -p "$OUT"
cargo build --release -q -p ttlwheel -p ttlwheel-load
SERVER=${SERVER:-target/release/ttlwheel}
LOAD=target/release/ttlwheel-load
TARGET="127.0.0.1:$PORT"
. bench/lib.sh

# SERVER_ARGS replaces the flags (e.g. --ephemeral, to compare).
# shellcheck disable=SC2086
serve ${SERVER_ARGS:---data-dir $OUT/data}

# The sampler's 1,000 keys are registered by its own preload; its measured run starts after a
# 1 s warm-up, as the growth starts.
"$LOAD" --target "$TARGET" heartbeat --keys 1000 --prefix probe- --ttl 3600s --rate "$RATE" \
  --connections 4 --warmup 1s --duration "$SAMPLE" >"$OUT/sampler.log" 2>&1 &
SAMPLER=$!
sleep 1.5
"$LOAD" --target "$TARGET" batch --keys "$KEYS" --prefix grow- --ttl 3600s --connections 1 \
  --warmup 0s --duration 0s >"$OUT/growth.log" 2>&1 || true
grep 'preloaded' "$OUT/growth.log"
wait "$SAMPLER" || { echo "the sampler failed: see $OUT/sampler.log" >&2; exit 1; }
grep -v '^RESULT' "$OUT/sampler.log" | grep -v preloaded
echo "server CPU (user + system) since start: $(cpu_s "$PID") s"
# By thread name (the stream feed runs on the main thread, named after the binary).
for task in /proc/"$PID"/task/*; do
  awk -v hz="$(getconf CLK_TCK)" '{sub(/^[0-9]+ \(/, ""); name = $0; sub(/\).*/, "", name);
    sub(/^[^)]*\) /, ""); print name, ($12 + $13) / hz}' "$task/stat"
done | awk '{cpu[$1] += $2} END {for (n in cpu) if (cpu[n] >= 0.5) printf "  %s %.1f s\n", n, cpu[n]}' | sort
echo "server RSS after growth: $(awk '/VmRSS/ {printf "%.0f MB", $2 / 1024}' "/proc/$PID/status")"
