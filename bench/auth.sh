#!/usr/bin/env bash
# What authentication costs on the heartbeat path: single heartbeats (ttlwheel-load heartbeat,
# 50 connections, random keys) against a server with tokens and one without, in alternating
# rounds of one run, persistence on (a fresh data directory per server, the default a user runs).
# Prints the medians and the ratio (auth on / auth off).
#
# Usage: bash bench/auth.sh      ROUNDS=3 DURATION=10s KEYS=100000
# Servers bind 127.0.0.1 only and are stopped by PID. Results: target/bench-auth/.
set -euo pipefail
cd "$(dirname "$0")/.."

ROUNDS=${ROUNDS:-3}
DURATION=${DURATION:-10s}
KEYS=${KEYS:-100000}
PORT=${PORT:-17913}
OUT=target/bench-auth
mkdir -p "$OUT"
cargo build --release -q -p ttlwheel -p ttlwheel-load
SERVER=target/release/ttlwheel
LOAD=target/release/ttlwheel-load
TARGET="127.0.0.1:$PORT"
. bench/lib.sh

start() { serve --data-dir "$OUT/data" "$@"; }

# A token with a heartbeat scope narrowed to the load's key prefix (the common production shape).
minted=$("$SERVER" token new --id load --scope "heartbeat:prefix=load-" --description bench)
TOKEN=$(echo "$minted" | grep -o 'ttlw_load_[A-Za-z0-9_-]*')
echo "{\"tokens\": [$(echo "$minted" | grep '^{')]}" > "$OUT/tokens.json"

result() { grep '^RESULT' | sed 's/^RESULT //' | python3 -c 'import json,sys; r=json.load(sys.stdin)["outcome"]; print(r["requests_per_s"], r["latency"]["p99"])'; }

: > "$OUT/rows.tsv"
for round in $(seq 1 "$ROUNDS"); do
  for mode in off on; do
    if [ "$mode" = on ]; then
      start --auth-tokens "$OUT/tokens.json"
      token=(--token "$TOKEN")
    else
      start
      token=()
    fi
    "$LOAD" --target "$TARGET" "${token[@]}" heartbeat --keys "$KEYS" --connections 50 \
      --duration "$DURATION" --warmup 2s >"$OUT/hb-$mode-$round.out" 2>"$OUT/hb-$mode-$round.err" || true
    row=$(result <"$OUT/hb-$mode-$round.out")
    echo -e "$mode\t$round\t$row" | tee -a "$OUT/rows.tsv"
    stop
  done
done

off=$(awk '$1=="off" {print $3}' "$OUT/rows.tsv" | median)
on=$(awk '$1=="on" {print $3}' "$OUT/rows.tsv" | median)
off_p99=$(awk '$1=="off" {print $4}' "$OUT/rows.tsv" | median)
on_p99=$(awk '$1=="on" {print $4}' "$OUT/rows.tsv" | median)
echo
echo "| auth | heartbeats/s (median of $ROUNDS) | p99 ms (median) |"
echo "|---|---|---|"
echo "| off | $off | $off_p99 |"
echo "| on (bearer token, heartbeat scope narrowed to a prefix) | $on | $on_p99 |"
echo "ratio on/off: $(echo "scale=3; $on / $off" | bc)"
