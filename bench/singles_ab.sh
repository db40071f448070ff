#!/usr/bin/env bash
# Two server binaries taking turns on the same single-heartbeat run: renewals of KEYS preloaded
# keys, CONNECTIONS connections, closed loop, DURATION each, a fresh server with persistence on
# every time; each run's rate, p99 and the server's CPU per request. For a change on the
# request path, where the difference is a few percent and the machine's noise as much: read
# the medians and the pairs, not one run.
#
#   BEFORE=<binary> AFTER=<binary> bash bench/singles_ab.sh    # ROUNDS=3 KEYS=100000 ...
# Every server it starts is stopped by PID.
set -euo pipefail
cd "$(dirname "$0")/.."
source bench/lib.sh
ROUNDS=${ROUNDS:-3}
KEYS=${KEYS:-100000}
CONNECTIONS=${CONNECTIONS:-50}
DURATION=${DURATION:-10s}
TARGET=${TARGET:-127.0.0.1:17990}
OUT=${OUT:-$(mktemp -d /var/tmp/ttlwheel-singles-ab.XXXXXX)}
TARGET_DIR=${CARGO_TARGET_DIR:-target}
cargo build --release --quiet -p ttlwheel-load
LOAD=$TARGET_DIR/release/ttlwheel-load
: "${BEFORE:?set BEFORE to the binary before the change}" "${AFTER:?and AFTER to the one after}"

run() { # $1: name, $2: binary
    SERVER=$2 serve --data-dir "$OUT/data"
    "$LOAD" --target "$TARGET" heartbeat --keys "$KEYS" --ttl 600s --connections "$CONNECTIONS" \
        --duration 3s >/dev/null 2>&1 # preload and warm up
    local before after
    before=$(cpu_s "$PID")
    "$LOAD" --target "$TARGET" heartbeat --keys "$KEYS" --ttl 600s --connections "$CONNECTIONS" \
        --duration "$DURATION" --warmup 0s --no-preload >"$OUT/$1.log" 2>&1
    after=$(cpu_s "$PID")
    stop
    local rate p99
    rate=$(result "$OUT/$1.log" requests_per_s)
    p99=$(result "$OUT/$1.log" latency.p99)
    python3 -c "r=$rate; c=$after-$before; print(f'$1: {r:,.0f} req/s, p99 $p99 ms, server CPU {c:.2f} s = {c/(r*${DURATION%s})*1e6:.1f} us/request')"
}

for round in $(seq "$ROUNDS"); do
    run "before-$round" "$BEFORE"
    run "after-$round" "$AFTER"
done
echo "logs in $OUT"
