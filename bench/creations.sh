#!/usr/bin/env bash
# Creations: KEYS new keys through the batch route (`ttlwheel-load`'s preload: batches of 1,000
# over 4 connections), persistence on (--fsync interval, the default) and memory-only, ROUNDS
# times each, alternating. Reports the client's wall time and the server's CPU time (user +
# system, from /proc/<pid>/stat) spent on the creations; the issue's target is server time.
#
# Usage: bash bench/creations.sh      KEYS=1000000 ROUNDS=3
# The server binds 127.0.0.1 only and is stopped by PID. Results: target/bench-creations/.
set -euo pipefail
cd "$(dirname "$0")/.."

KEYS=${KEYS:-1000000}
ROUNDS=${ROUNDS:-3}
PORT=${PORT:-17918}
OUT=${OUT:-target/bench-creations}
mkdir -p "$OUT"
cargo build --release -q -p ttlwheel -p ttlwheel-load
SERVER=${SERVER:-target/release/ttlwheel}
LOAD=target/release/ttlwheel-load
TARGET="127.0.0.1:$PORT"
. bench/lib.sh

: >"$OUT/results.tsv"
for round in $(seq "$ROUNDS"); do
  for mode in persistent ephemeral; do
    if [ "$mode" = persistent ]; then serve --data-dir "$OUT/data"; else serve --ephemeral; fi
    before=$(cpu_s "$PID")
    "$LOAD" --target "$TARGET" batch --keys "$KEYS" --connections 1 --duration 0s --warmup 0s \
      >"$OUT/load.log" 2>&1 || true
    after=$(cpu_s "$PID")
    wall=$(grep -o 'preloaded [0-9]* keys in [0-9.]* s' "$OUT/load.log" | awk '{print $5}')
    cpu=$(awk -v a="$after" -v b="$before" 'BEGIN {printf "%.2f", a - b}')
    echo -e "$mode\t$wall\t$cpu" | tee -a "$OUT/results.tsv"
    stop
  done
done
for mode in persistent ephemeral; do
  wall=$(awk -v m="$mode" '$1 == m {print $2}' "$OUT/results.tsv" | median)
  cpu=$(awk -v m="$mode" '$1 == m {print $3}' "$OUT/results.tsv" | median)
  echo "$mode: $KEYS creations, median of $ROUNDS: ${wall} s wall (client), ${cpu} s server CPU"
done
