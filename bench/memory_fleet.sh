#!/usr/bin/env bash
# Memory as a user sees it, ttlwheel beside Redis 7, at the sizes fleets have (issue 27): for
# each size, a FRESH ttlwheel (memory only, otherwise default flags) and a FRESH redis-server
# (127.0.0.1, no persistence), the resident memory (VmRSS) of each empty process, the keys
# registered (27-byte names `svc-NNN/instance-NNNNNNNNNN`, TTL 3600 s: ttlwheel through the batch
# route, batches of 1,000 over 4 connections; Redis `SET key "" EX 3600` pipelined through
# `redis-cli --pipe`; bench/fleet_keys.py makes both), then the resident memory once it has
# settled (two readings a second apart within 0.5 %, at most SETTLE_MAX_S). The figure is the
# whole process's growth over its empty self: allocator, threads, the event ring and buffers
# count.
#
# Usage: bash bench/memory_fleet.sh
#   SIZES="10000 100000 1000000"  the sizes (add 10000000 for 10M: minutes, ~2 GB of RSS)
#   SERVER=target/release/ttlwheel  the binary (build it yourself when you set this)
#   FLAGS="--events-ring 1024"      extra ttlwheel flags (default: none beyond --ephemeral)
#   PERSIST=1                       persistence on, as `cargo run --release` runs it (a fresh
#                                   data directory per size, under $OUT), instead of --ephemeral
#   REDIS=0                         skip Redis (ttlwheel's columns only)
#   CONNECTIONS=4 TTL_S=3600 PORT=17916 REDIS_PORT=17917 OUT=target/bench-memory-fleet
# Needs redis-server and redis-cli (Debian: apt-get install redis-server). Every process binds
# 127.0.0.1 and is stopped by PID, also when the script fails. The table is printed and saved
# as $OUT/table.md.
set -euo pipefail
cd "$(dirname "$0")/.."

SIZES=${SIZES:-"10000 100000 1000000"}
TTL_S=${TTL_S:-3600}
CONNECTIONS=${CONNECTIONS:-4}
PORT=${PORT:-17916}
REDIS_PORT=${REDIS_PORT:-17917}
REDIS=${REDIS:-1}
SETTLE_MAX_S=${SETTLE_MAX_S:-30}
FLAGS=${FLAGS:-}
OUT=${OUT:-target/bench-memory-fleet}
mkdir -p "$OUT"
if [ -z "${SERVER:-}" ]; then
  cargo build --release -q -p ttlwheel
  SERVER=target/release/ttlwheel
fi
TARGET="127.0.0.1:$PORT"
. bench/lib.sh

# Waits until process $1's RSS holds still (two readings a second apart within 0.5 %, or
# SETTLE_MAX_S seconds), then prints it in KiB.
settled_rss_kb() {
  local before after
  before=$(rss_kb "$1")
  for _ in $(seq "$SETTLE_MAX_S"); do
    sleep 1
    after=$(rss_kb "$1")
    if [ $(( (after > before ? after - before : before - after) * 200 )) -le "$after" ]; then
      break
    fi
    before=$after
  done
  echo "$after"
}

mib() { awk -v kb="$1" 'BEGIN { printf "%.1f", kb / 1024 }'; }

# ttlwheel at $1 keys: sets TW_EMPTY and TW_GROWN (KiB) and TW_TOOK (s). Runs in this shell, not
# a subshell, so that the EXIT trap knows the server's PID.
ttlwheel_at() {
  # shellcheck disable=SC2086 # FLAGS is a list of flags
  if [ "${PERSIST:-0}" = 1 ]; then
    rm -rf "$OUT/data"
    serve --data-dir "$OUT/data" $FLAGS
  else
    serve --ephemeral $FLAGS
  fi
  local start
  TW_EMPTY=$(settled_rss_kb "$PID")
  start=$(date +%s.%N)
  python3 bench/fleet_keys.py ttlwheel "$TARGET" "$1" "$TTL_S" "$CONNECTIONS"
  TW_TOOK=$(awk -v s="$start" -v e="$(date +%s.%N)" 'BEGIN { printf "%.1f", e - s }')
  TW_GROWN=$(settled_rss_kb "$PID")
  curl -s "http://$TARGET/metrics" >"$OUT/metrics-$1.txt"
  stop
}

# Redis at $1 keys: sets R_EMPTY and R_GROWN (KiB) and R_USED (used_memory's growth, bytes).
redis_at() {
  redis-server --port "$REDIS_PORT" --bind 127.0.0.1 --save '' --appendonly no \
    >"$OUT/redis.log" 2>&1 &
  PID=$!
  for _ in $(seq 100); do redis-cli -p "$REDIS_PORT" ping >/dev/null 2>&1 && break; sleep 0.05; done
  used() { redis-cli -p "$REDIS_PORT" info memory | awk -F: '/^used_memory:/ {print $2+0}'; }
  local used0
  R_EMPTY=$(settled_rss_kb "$PID")
  used0=$(used)
  python3 bench/fleet_keys.py redis "$1" "$TTL_S" \
    | redis-cli -p "$REDIS_PORT" --pipe >"$OUT/redis-pipe-$1.log"
  grep -q "errors: 0, replies: $1" "$OUT/redis-pipe-$1.log" \
    || { cat "$OUT/redis-pipe-$1.log" >&2; exit 1; }
  [ "$(redis-cli -p "$REDIS_PORT" dbsize)" = "$1" ] || { echo "redis holds the wrong count" >&2; exit 1; }
  R_GROWN=$(settled_rss_kb "$PID")
  R_USED=$(($(used) - used0))
  stop
}

{
  echo "ttlwheel: $SERVER $([ "${PERSIST:-0}" = 1 ] && echo "--data-dir (fresh)" || echo --ephemeral) $FLAGS ($(git rev-parse --short HEAD)); $(redis-server --version | cut -d' ' -f1-3)"
  echo "load when started: $(uptime | sed 's/.*load average/load average/')"
  echo
  echo "| keys | ttlwheel empty | ttlwheel growth | B/key | Redis empty | Redis growth | B/key | ratio |"
  echo "|---|---|---|---|---|---|---|---|"
} | tee "$OUT/table.md"
for keys in $SIZES; do
  ttlwheel_at "$keys"
  tw_growth=$((TW_GROWN - TW_EMPTY))
  if [ "$REDIS" = 1 ]; then
    redis_at "$keys"
    r_growth=$((R_GROWN - R_EMPTY))
    ratio=$(awk -v a="$tw_growth" -v b="$r_growth" 'BEGIN { printf "%.2f×", a / b }')
    redis_cells="$(mib "$R_EMPTY") MiB | +$(mib "$r_growth") MiB | $((r_growth * 1024 / keys)) | $ratio"
  else
    redis_cells=" | | |"
  fi
  echo "| $keys | $(mib "$TW_EMPTY") MiB | +$(mib "$tw_growth") MiB | $((tw_growth * 1024 / keys)) | $redis_cells |" \
    | tee -a "$OUT/table.md"
  echo "  (ttlwheel registered $keys keys in $TW_TOOK s${R_USED:+; Redis used_memory +$((R_USED / 1024)) KiB})" >&2
done
