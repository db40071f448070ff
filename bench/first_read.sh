#!/usr/bin/env bash
# What the first reads after a mass expiry cost. The expired log indexes its records only when
# something reads them (`registry::expired`), so after KEYS keys (1M) expire at once the first
# listing of them indexes what the count bound kept (`--expired-max`, 100,000); the counts a
# scrape reads need no indexing. Registers the keys through the batch route with TTL $TTL
# (`--ephemeral`, the guard off), waits $WAIT with no request at all, then times, one after the
# other, two /metrics scrapes, two `GET /v1/keys?state=expired&limit=1`, `GET /v1/services` and
# the creation of one new key (curl's time_total each).
#
# Usage: bash bench/first_read.sh     KEYS=1000000 TTL=8s WAIT=14 ROUNDS=2 SERVER=<binary>
# The server binds 127.0.0.1 only and is stopped by PID. Results: target/bench-first-read/.
set -euo pipefail
cd "$(dirname "$0")/.."
source bench/lib.sh

KEYS=${KEYS:-1000000}
TTL=${TTL:-8s}
WAIT=${WAIT:-14}
ROUNDS=${ROUNDS:-2}
OUT=$PWD/target/bench-first-read
TARGET=127.0.0.1:17982
mkdir -p "$OUT"
: >"$OUT/server.log"
build_server_and_load

timed() { # label, then curl arguments
  local label=$1
  shift
  curl -sf -o /dev/null -w "$label %{time_total}\n" "$@"
}

for round in $(seq "$ROUNDS"); do
  serve --ephemeral --expiry-guard off
  "$LOAD" --target "$TARGET" batch --prefix fr- --keys "$KEYS" --connections 4 --batch 1000 \
    --ttl "$TTL" --duration 0s --warmup 0s >"$OUT/register.log" 2>&1
  sleep "$WAIT"
  {
    timed metrics-1 "http://$TARGET/metrics"
    timed metrics-2 "http://$TARGET/metrics"
    timed expired-list-1 "http://$TARGET/v1/keys?state=expired&limit=1"
    timed expired-list-2 "http://$TARGET/v1/keys?state=expired&limit=1"
    timed services "http://$TARGET/v1/services"
    timed creation -X POST -H 'content-type: application/json' \
      -d '{"key":"fr-fresh","ttl_s":60}' "http://$TARGET/v1/heartbeats"
  } | awk -v round="$round" '{printf "round %s: %s %.1f ms\n", round, $1, $2 * 1000}' \
    | tee -a "$OUT/results.txt"
  alive=$(curl -sf "http://$TARGET/metrics" \
    | awk '$1 ~ /^ttlwheel_keys_alive[{]/ {sum += $2} END {print sum + 0}')
  [ "$alive" = 1 ] || { echo "round $round: $alive keys alive, not 1: raise WAIT" >&2; exit 1; }
  stop
done
