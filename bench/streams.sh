#!/usr/bin/env bash
# What live-stream clients cost: single-heartbeat creations (closed loop, CONNECTIONS
# connections, every heartbeat a new key, so every one is a `registered` event) with no
# `GET /v1/events` clients, with CLIENTS idle ones (connected, never reading) and with CLIENTS
# reading ones (`ttlwheel-load streams`). An open-loop sampler sends RATE single heartbeats/s on
# other keys meanwhile (latency from each scheduled time). Persistence on, as a user runs it.
# Reports creations/s, the sampler's p99, the server's CPU time (user + system, /proc/<pid>/stat)
# per event, and for reading clients per event per stream.
#
# Clients are connected and a WARMUP of creations runs before the measured run: idle clients'
# socket buffers fill then (once per client; the time it takes is printed), and what is measured
# is what they cost from then on.
#
# Scenario `delivery` (not in the default SCENARIOS: `SCENARIOS=delivery bash bench/streams.sh`)
# measures how long an event takes to reach the streams instead: CLIENTS reading clients, and
# `ttlwheel-load streams --delivery-rate` creating DELIVERY_RATE new keys/s for DURATION (open
# loop, from the same process, with no other load; the clients stay 1 s more for the last
# events). Reports delivery latency p50/p99/max (from each creation's scheduled time to each
# client's receipt), the events delivered per stream, and the server's CPU time over the run per
# event per stream (CPU / (acknowledged creations x streams connected to the end), which is
# creations x CLIENTS when nothing failed).
#
# Usage: bash bench/streams.sh     CLIENTS=1000 DURATION=10s WARMUP=5s RATE=200 CONNECTIONS=50
#        SCENARIOS="none idle reading" (any of them, and delivery) DELIVERY_RATE=300
# SERVER_ARGS adds server flags (e.g. --socket-send-buffer 0, to compare).
# The server binds 127.0.0.1 only and is stopped by PID. Results: target/bench-streams/.
set -euo pipefail
cd "$(dirname "$0")/.."

CLIENTS=${CLIENTS:-1000}
DURATION=${DURATION:-10s}
WARMUP=${WARMUP:-5s}
RATE=${RATE:-200}
CONNECTIONS=${CONNECTIONS:-50}
SCENARIOS=${SCENARIOS:-none idle reading}
DELIVERY_RATE=${DELIVERY_RATE:-300}
PORT=${PORT:-17919}
OUT=${OUT:-target/bench-streams}

for scenario in $SCENARIOS; do
  case $scenario in
    none | idle | reading | delivery) ;;
    *) echo "unknown scenario $scenario (none, idle, reading, delivery)" >&2; exit 2 ;;
  esac
done

mkdir -p "$OUT"
cargo build --release -q -p ttlwheel -p ttlwheel-load
SERVER=${SERVER:-target/release/ttlwheel}
LOAD=target/release/ttlwheel-load
TARGET="127.0.0.1:$PORT"
. bench/lib.sh
ulimit -n 65536 2>/dev/null || true

seconds=${DURATION%s}

# Waits until the `ttlwheel-load streams` process $1, writing to $2, has its clients connected;
# fails if it exits first.
wait_connected() {
  until grep -q connected "$2" 2>/dev/null; do
    kill -0 "$1" 2>/dev/null || { cat "$2" >&2; exit 1; }
    sleep 0.1
  done
}

# The delivery scenario: the load tool's own creations (DELIVERY_RATE/s for DURATION) to
# CLIENTS reading clients, nothing else; the server's CPU from the clients' connecting to the
# tool's exit (the creations and the 1 s for the last events to arrive).
delivery() {
  # shellcheck disable=SC2086
  serve --data-dir "$OUT/data" --max-stream-clients $((CLIENTS + 10)) ${SERVER_ARGS:-}
  local log="$OUT/streams-delivery.log" streams before after
  "$LOAD" --target "$TARGET" --threads 1 streams --clients "$CLIENTS" --read \
    --delivery-rate "$DELIVERY_RATE" --delivery-drain 1s --duration "$((seconds + 1))s" \
    >"$log" 2>&1 &
  streams=$!
  wait_connected "$streams" "$log"
  before=$(cpu_s "$PID")
  # Exit 1: a creation failed or a delivery is missing; the line below says how many.
  wait "$streams" || echo "delivery: ttlwheel-load reported failures, see $log" >&2
  after=$(cpu_s "$PID")
  field() { result "$log" "delivery.$1"; }
  awk -v rate="$DELIVERY_RATE" -v n="$CLIENTS" -v p50="$(field p50)" -v p99="$(field p99)" \
    -v max="$(field max)" -v received="$(field received)" -v expected="$(field expected)" \
    -v streams="$(field streams)" -v a="$after" -v b="$before" 'BEGIN {
      cpu = a - b
      printf "delivery: %s creations/s to %d streams: p50 %.2f ms p99 %.2f ms max %.2f ms; delivered %d of %d = %.0f events per stream; server CPU %.2f s = %.1f ns per event per stream\n",
        rate, n, p50, p99, max, received, expected, (streams > 0 ? received / streams : 0),
        cpu, (expected > 0 ? cpu * 1e9 / expected : 0)
    }' | tee -a "$OUT/results.txt"
  stop
}

for scenario in $SCENARIOS; do
  if [ "$scenario" = delivery ]; then
    delivery
    continue
  fi
  # shellcheck disable=SC2086
  serve --data-dir "$OUT/data" --max-stream-clients $((CLIENTS + 10)) ${SERVER_ARGS:-}
  # The sampler's keys exist before the clients connect.
  "$LOAD" --target "$TARGET" heartbeat --keys 1000 --prefix probe- --ttl 3600s --duration 0s \
    --warmup 0s --connections 4 >/dev/null 2>&1
  STREAMS=
  if [ "$scenario" != none ]; then
    read_flag=; [ "$scenario" = reading ] && read_flag=--read
    "$LOAD" --target "$TARGET" --threads 1 streams --clients "$CLIENTS" $read_flag \
      --duration "$((seconds + ${WARMUP%s} + 3))s" >"$OUT/streams-$scenario.log" 2>&1 &
    STREAMS=$!
    until grep -q connected "$OUT/streams-$scenario.log" 2>/dev/null; do sleep 0.1; done
  fi
  "$LOAD" --target "$TARGET" heartbeat --sequential --no-preload --keys 1000000000 \
    --prefix "w-$scenario-" --ttl 3600s --connections "$CONNECTIONS" --warmup 0s \
    --duration "$WARMUP" >"$OUT/warmup-$scenario.log" 2>&1
  echo "$scenario: warm-up $(result "$OUT/warmup-$scenario.log" requests_per_s | cut -d. -f1) creations/s, p99 $(result "$OUT/warmup-$scenario.log" latency.p99) ms (closed loop)"
  "$LOAD" --target "$TARGET" heartbeat --keys 1000 --prefix probe- --ttl 3600s --no-preload \
    --rate "$RATE" --connections 4 --warmup 0s --duration "$DURATION" \
    >"$OUT/sampler-$scenario.log" 2>&1 &
  SAMPLER=$!
  before=$(cpu_s "$PID")
  "$LOAD" --target "$TARGET" heartbeat --sequential --no-preload --keys 1000000000 \
    --prefix "c-$scenario-" --ttl 3600s --connections "$CONNECTIONS" --warmup 0s \
    --duration "$DURATION" >"$OUT/creations-$scenario.log" 2>&1
  wait "$SAMPLER"
  after=$(cpu_s "$PID")
  [ -n "$STREAMS" ] && wait "$STREAMS"
  creations=$(result "$OUT/creations-$scenario.log" requests)
  rate=$(result "$OUT/creations-$scenario.log" requests_per_s)
  p99=$(result "$OUT/sampler-$scenario.log" latency.p99)
  max=$(result "$OUT/sampler-$scenario.log" latency.max)
  line=$(awk -v s="$scenario" -v c="$creations" -v r="$rate" -v p="$p99" -v m="$max" \
    -v a="$after" -v b="$before" -v n="$CLIENTS" 'BEGIN {
      cpu = a - b; events = c + 0
      printf "%s: %.0f creations/s, sampler p99 %.2f ms max %.2f ms, server CPU %.2f s = %.2f us per event",
        s, r, p, m, cpu, cpu * 1e6 / events
      if (s == "reading") printf " = %.1f ns per event per stream", cpu * 1e9 / events / n
    }')
  if [ -n "$STREAMS" ]; then
    summary=$(grep '^streams:.*received' "$OUT/streams-$scenario.log" | sed 's/^streams: //')
    line="$line; $summary"
    # The per-stream figure divides by every client: it holds only if none was cut off.
    cut=$(echo "$summary" | awk '{for (i = 2; i <= NF; i++) {
      if ($i ~ /^resets/ || ($i == "ended" && $(i + 1) == "early")) n += $(i - 1)}} END {print n + 0}')
    if [ "$scenario" = reading ] && [ "$cut" -gt 0 ]; then
      line="$line; NOT VALID per stream: $cut of $CLIENTS streams were reset or ended early"
    fi
  fi
  echo "$line" | tee -a "$OUT/results.txt"
  stop
done
