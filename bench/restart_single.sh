#!/usr/bin/env bash
# A single node's restart with KEYS keys (issue 27/28: recovery time): KEYS keys registered
# through the batch route (4 connections, TTL 3600 s), SIGTERM (which writes a snapshot), then
# ROUNDS restarts from that data directory (each stopped with kill -9, so every round reads the
# same snapshot): seconds from the process start to /readyz 200, and the keys it then holds.
#
#   bash bench/restart_single.sh     # SERVER= a built binary, KEYS=1000000 ROUNDS=3
# Binds 127.0.0.1 only; every process it starts is stopped by PID.
set -euo pipefail
cd "$(dirname "$0")/.."
source bench/lib.sh
KEYS=${KEYS:-1000000}
ROUNDS=${ROUNDS:-3}
PORT=${PORT:-17991}
build_server_and_load
DIR=$(mktemp -d /var/tmp/ttlwheel-restart.XXXXXX)
PID=
trap '[ -n "$PID" ] && kill -9 "$PID" 2>/dev/null; rm -rf "$DIR"' EXIT

wait_ready() { until curl -sf "http://127.0.0.1:$PORT/readyz" >/dev/null; do sleep 0.01; done; }

"$SERVER" --listen "127.0.0.1:$PORT" --data-dir "$DIR/data" >"$DIR/server.log" 2>&1 &
PID=$!
wait_ready
"$LOAD" --target "127.0.0.1:$PORT" batch --keys "$KEYS" --ttl 3600s --connections 4 \
    --warmup 0s --duration 0s >"$DIR/load.log" 2>&1 || true
kill -TERM "$PID"; wait "$PID" || true; PID=
for round in $(seq "$ROUNDS"); do
    start=$(date +%s.%N)
    "$SERVER" --listen "127.0.0.1:$PORT" --data-dir "$DIR/data" >>"$DIR/server.log" 2>&1 &
    PID=$!
    wait_ready
    ready=$(date +%s.%N)
    keys=$(curl -s "http://127.0.0.1:$PORT/metrics" | awk '/^ttlwheel_keys_alive/ { n += $2 } END { print n }')
    printf 'round %s: ready after %.2f s, holding %s keys\n' "$round" "$(echo "$ready - $start" | bc)" "$keys"
    kill -9 "$PID"; wait "$PID" 2>/dev/null || true; PID=
done
