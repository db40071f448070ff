#!/usr/bin/env bash
# What persistence costs, measured in one run against the memory-only service in the same
# script: single and batch renewals, 1M creations through the batch route, the group-commit
# size of --fsync always, restart times (from a snapshot after SIGTERM, and replaying the log
# after kill -9), and the data directory's size per key.
#
# Usage: bash bench/persist.sh            (about 10 minutes with the defaults)
#   ROUNDS=3 DURATION=10s KEYS=1000000 BIG_KEYS=10000000 (0 skips the 10M restart)
#   MODES="ephemeral interval always" (ephemeral must be one: the ratios are against it)
# Servers bind 127.0.0.1 only and are stopped by PID. Results: target/bench-persist/.
set -euo pipefail
cd "$(dirname "$0")/.."

ROUNDS=${ROUNDS:-3}
DURATION=${DURATION:-10s}
KEYS=${KEYS:-1000000}
BIG_KEYS=${BIG_KEYS:-10000000}
PORT=${PORT:-17911}
OUT=target/bench-persist
mkdir -p "$OUT"
cargo build --release -q -p ttlwheel -p ttlwheel-load
SERVER=target/release/ttlwheel
LOAD=target/release/ttlwheel-load
TARGET="127.0.0.1:$PORT"
. bench/lib.sh

# Starts the server with "$@"; sets READY_S to the seconds until /healthz answered 200.
# (Not a command substitution: the server would hold its pipe open, and its PID would be lost.)
start() {
  local started; started=$(date +%s.%N)
  "$SERVER" --listen "$TARGET" "$@" >>"$OUT/server.log" 2>&1 &
  PID=$!
  until curl -sf "http://$TARGET/healthz" >/dev/null 2>&1; do sleep 0.01; done
  READY_S=$(echo "$(date +%s.%N) - $started" | bc)
}

# mode -> flags
flags() {
  case "$1" in
    ephemeral) echo "--ephemeral" ;;
    interval) echo "--data-dir $OUT/data-interval --fsync interval" ;;
    always) echo "--data-dir $OUT/data-always --fsync always" ;;
  esac
}

result() { grep '^RESULT' | sed 's/^RESULT //'; }

: > "$OUT/rows.tsv"
for round in $(seq 1 "$ROUNDS"); do
  for mode in ${MODES:-ephemeral interval always}; do
    rm -rf "$OUT/data-$mode"
    start $(flags "$mode")
    # The preload is the creations: KEYS new keys through the batch route, 4 connections.
    "$LOAD" --target "$TARGET" heartbeat --keys "$KEYS" --connections 50 --duration "$DURATION" \
      --warmup 2s --prefix "p$round-" >"$OUT/hb-$mode-$round.out" 2>"$OUT/hb-$mode-$round.err" || true
    created=$(grep -o 'preloaded [0-9]* keys in [0-9.]* s' "$OUT/hb-$mode-$round.err" | awk '{print $5}')
    single=$(result <"$OUT/hb-$mode-$round.out" | python3 -c 'import json,sys; r=json.load(sys.stdin)["outcome"]; print(r["requests_per_s"], r["latency"]["p99"])')
    syncs=$(curl -s "http://$TARGET/metrics" | awk '/^ttlwheel_log_syncs_total/ {s=$2} /^ttlwheel_log_records_total/ {r=$2} END {print (s>0) ? r/s : 0}')
    "$LOAD" --target "$TARGET" batch --keys "$KEYS" --connections 4 --batch 1000 --duration "$DURATION" \
      --warmup 2s --no-preload --prefix "p$round-" >"$OUT/batch-$mode-$round.out" 2>&1 || true
    batch=$(result <"$OUT/batch-$mode-$round.out" | python3 -c 'import json,sys; print(json.load(sys.stdin)["outcome"]["heartbeats_per_s"])')
    restart_snapshot=0 size=0
    if [ "$mode" != ephemeral ]; then
      stop
      size=$(du -sb "$OUT/data-$mode" | awk '{print $1}')
      start $(flags "$mode")
      restart_snapshot=$READY_S
    fi
    stop
    printf '%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n' "$round" "$mode" "$created" $single "$batch" \
      "$syncs" "$restart_snapshot" "$size" >>"$OUT/rows.tsv"
    echo "round $round $mode: 1M creations ${created}s, single ${single}, batch ${batch}/s, records/sync ${syncs}, restart ${restart_snapshot}s, dir ${size} B"
  done
done

col() { awk -F'\t' -v m="$1" -v c="$2" '$2==m {print $c}' "$OUT/rows.tsv" | median; }
echo
echo "| measure (median of $ROUNDS alternating rounds) | ephemeral | interval | always | interval/ephemeral | always/ephemeral |"
echo "|---|---|---|---|---|---|"
ratio() { if [ -n "$1" ] && [ -n "$2" ]; then printf '%.2f' "$(echo "$1/$2" | bc -l)"; else echo -; fi; }
row() {
  local name=$1 col=$2 e i a
  e=$(col ephemeral "$col"); i=$(col interval "$col"); a=$(col always "$col")
  printf '| %s | %s | %s | %s | %s | %s |\n' "$name" "${e:--}" "${i:--}" "${a:--}" "$(ratio "$i" "$e")" "$(ratio "$a" "$e")"
}
row "single renewals (req/s, 50 connections)" 4
row "single renewals p99 (ms)" 5
row "batch renewals (heartbeats/s)" 6
row "$KEYS creations, batch route (s of client time)" 3
echo "| records per sync (always: the group-commit size) | - | $(col interval 7) | $(col always 7) | | |"
echo "| restart to /healthz 200 with $KEYS keys, from the SIGTERM snapshot (s) | - | $(col interval 8) | $(col always 8) | | |"
per_key() { if [ -n "$1" ]; then printf '%.1f' "$(echo "$1/$KEYS" | bc -l)"; else echo -; fi; }
echo "| data directory after the run (bytes per key) | - | $(per_key "$(col interval 9)") | $(per_key "$(col always 9)") | | |"

if [ "$BIG_KEYS" -gt 0 ]; then
  # BIG_KEYS creations, then kill -9: the restart reads the last periodic snapshot and replays
  # the log after it; then SIGTERM, and the restart reads the shutdown snapshot alone.
  rm -rf "$OUT/data-big"
  start --data-dir "$OUT/data-big"
  "$LOAD" --target "$TARGET" batch --keys "$BIG_KEYS" --connections 4 --batch 1000 --duration 1s \
    --warmup 0s --ttl 3600s --prefix big- >"$OUT/big.out" 2>&1 || true
  grep -o 'preloaded [0-9]* keys in [0-9.]* s' "$OUT/big.out" || true
  kill -9 "$PID"; wait "$PID" 2>/dev/null || true; PID=
  start --data-dir "$OUT/data-big"
  echo "| restart with $BIG_KEYS keys after kill -9 (snapshot + log replay), s | $READY_S |"
  stop
  echo "| data directory with $BIG_KEYS keys, bytes per key | $(du -sb "$OUT/data-big" | awk -v n="$BIG_KEYS" '{printf "%.1f", $1/n}') |"
  start --data-dir "$OUT/data-big"
  echo "| restart with $BIG_KEYS keys from the SIGTERM snapshot, s | $READY_S |"
  grep 'recovered the registry' "$OUT/server.log" | tail -2
  stop
fi
