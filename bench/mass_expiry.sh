#!/usr/bin/env bash
# The mass expiry of KEYS keys (1M) in the running service, the figure that issue 27 bounds at
# 150 ms where `cargo bench --bench expiry -- evict/1M/` measures the registry alone. The release
# binary runs with persistence on, as a user runs it (each expiry is a log record), then with
# `--ephemeral`. No stream client and no webhook are attached, but the stream's ring takes
# every event as always. The mass-expiry guard is off (on, it would hold such an expiry, as it
# should). The keys are registered through the batch route (4 connections, 1,000 per request)
# with TTL $TTL, so they fall due over a second or two. The script waits until none is alive.
#
# Reported per run, from /metrics and /proc over the expiry:
# - the ticker's sweep steps: their time in all (`ttlwheel_sweep_duration_seconds`: sum) and
#   how many;
# - the server's CPU time (every thread: the ticker, the stream's feed, the log's writer);
# - the expiry lateness's p99 and max, as the histogram's bucket bounds.
#
# Usage: bash bench/mass_expiry.sh     KEYS=1000000 TTL=8s ROUNDS=2 SERVER=<binary>
#        MODES="persistence ephemeral" (either or both) SERVER_ARGS="<more server flags>"
#        PREFIX=mx- (each key is PREFIX and a number: `PREFIX=svc-042/instance-0000` makes
#        names of 22 to 27 bytes, most of them 27, as fleets name instances)
# The server binds 127.0.0.1 only and is stopped by PID. Results: target/bench-mass-expiry/.
set -euo pipefail
cd "$(dirname "$0")/.."
source bench/lib.sh

KEYS=${KEYS:-1000000}
TTL=${TTL:-8s}
PREFIX=${PREFIX:-mx-}
ROUNDS=${ROUNDS:-2}
OUT=$PWD/target/bench-mass-expiry
TARGET=127.0.0.1:17981
mkdir -p "$OUT"
: >"$OUT/server.log"
build_server_and_load

# The value of metric $2 (a full series name, e.g. `ttlwheel_keys_alive`) in the scrape $1.
metric() { awk -v name="$2" '$1 == name {print $2}' "$1"; }

# Keys alive in the scrape $1, whatever their timer.
alive() { awk '$1 ~ /^ttlwheel_keys_alive[{]/ {sum += $2} END {print sum + 0}' "$1"; }

scrape() { curl -sf "http://$TARGET/metrics" >"$1"; }

# The smallest bucket bound of the lateness histogram that holds fraction $3 of the expiries
# counted between scrapes $1 and $2 (`+Inf` past the last bound).
lateness_bound() {
  python3 - "$1" "$2" "$3" <<'PY'
import re, sys
def buckets(path):
    found = {}
    for line in open(path):
        m = re.match(r'ttlwheel_expiry_lateness_seconds_bucket\{le="([^"]+)"\} (\S+)', line)
        if m:
            found[m.group(1)] = float(m.group(2))
    return found
before, after, share = buckets(sys.argv[1]), buckets(sys.argv[2]), float(sys.argv[3])
counts = sorted(((float(le), after[le] - before.get(le, 0)) for le in after), key=lambda b: b[0])
total = counts[-1][1]
for le, count in counts:
    if total and count >= share * total:
        print("+Inf" if le == float("inf") else f"{le * 1000:g} ms")
        break
PY
}

run() { # label, then server flags
  local label=$1
  shift
  # shellcheck disable=SC2086
  serve --expiry-guard off "$@" ${SERVER_ARGS:-}
  "$LOAD" --target "$TARGET" batch --prefix "$PREFIX" --keys "$KEYS" --connections 4 --batch 1000 \
    --ttl "$TTL" --duration 0s --warmup 0s >"$OUT/register-$label.log" 2>&1
  scrape "$OUT/before.txt"
  local cpu_before
  cpu_before=$(cpu_s "$PID")
  local registered
  registered=$(alive "$OUT/before.txt")
  [ "$registered" -ge "$KEYS" ] || { echo "$label: only $registered keys registered" >&2; exit 1; }
  # Done when no key is alive and every expiry was counted: the counters come from the event
  # bus, whose subscriber may still be taking the last events when the last key has left
  # (on a busy machine a run once read 999,024 of 1M). The CPU figure includes that work.
  local e_before waited=0
  e_before=$(metric "$OUT/before.txt" ttlwheel_expirations_total)
  # A fresh server: an expiry before the registration ended would be missed by the figures.
  awk -v e0="$e_before" 'BEGIN { exit !(e0 == 0) }' \
    || { echo "$label: keys expired before the registration ended; raise TTL" >&2; exit 1; }
  until scrape "$OUT/after.txt" && [ "$(alive "$OUT/after.txt")" = 0 ] \
    && awk -v e0="$e_before" -v e1="$(metric "$OUT/after.txt" ttlwheel_expirations_total)" \
      -v keys="$KEYS" 'BEGIN { exit !(e1 - e0 >= keys) }'; do
    sleep 0.2
    waited=$((waited + 1))
    [ "$waited" -lt 600 ] || { echo "$label: not every expiry counted after 2 min" >&2; exit 1; }
  done
  local cpu_after
  cpu_after=$(cpu_s "$PID")
  awk -v label="$label" -v c0="$cpu_before" -v c1="$cpu_after" \
    -v s0="$(metric "$OUT/before.txt" ttlwheel_sweep_duration_seconds_sum)" \
    -v s1="$(metric "$OUT/after.txt" ttlwheel_sweep_duration_seconds_sum)" \
    -v n0="$(metric "$OUT/before.txt" ttlwheel_sweep_duration_seconds_count)" \
    -v n1="$(metric "$OUT/after.txt" ttlwheel_sweep_duration_seconds_count)" \
    -v e0="$(metric "$OUT/before.txt" ttlwheel_expirations_total)" \
    -v e1="$(metric "$OUT/after.txt" ttlwheel_expirations_total)" \
    -v p99="$(lateness_bound "$OUT/before.txt" "$OUT/after.txt" 0.99)" \
    -v max="$(lateness_bound "$OUT/before.txt" "$OUT/after.txt" 1)" 'BEGIN {
      printf "%s: %d expired; sweep steps %.1f ms in all (%d steps); server CPU %.2f s; lateness p99 <= %s, max <= %s\n",
        label, e1 - e0, (s1 - s0) * 1000, n1 - n0, c1 - c0, p99, max
    }' | tee -a "$OUT/results.txt"
  stop
}

: >"$OUT/results.txt"
for round in $(seq "$ROUNDS"); do
  for mode in ${MODES:-persistence ephemeral}; do
    case $mode in
      persistence) run "persistence-$round" --data-dir "$OUT/data" ;;
      ephemeral) run "ephemeral-$round" --ephemeral ;;
      *) echo "unknown mode $mode (persistence, ephemeral)" >&2; exit 2 ;;
    esac
  done
done
