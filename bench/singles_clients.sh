#!/usr/bin/env bash
# Single heartbeats against Redis, with the client's own cost in view. On a 2-core machine the
# client shares the cores with the server, so a heavier client leaves the server less CPU: the
# rate of a side-by-side run depends on which client drives each system. This script runs, in
# turns, fresh servers each time, closed loop, CONNECTIONS connections, DURATION each:
#
#   ttlwheel     ttlwheel-load heartbeat, default serving threads, persistence on
#   ttlwheel-1   the same with --threads 1 (one serving thread)
#   ttlwheel-wrk wrk -t1 with bench/heartbeat.lua, default serving threads (if wrk is installed)
#   redis-bench  redis-benchmark SET key EX 600 (as bench/compare.sh and the issues measure Redis)
#   redis-load   ttlwheel-load redis-set: the same tool as ttlwheel's run, speaking RESP
#
# and prints each run's rate, the server's CPU per request and the client's CPU per request,
# then the medians and the ratios against each Redis run.
#
#   bash bench/singles_clients.sh      # ROUNDS=3 KEYS=100000 CONNECTIONS=50 DURATION=10 KINDS=...
# Every server it starts binds 127.0.0.1 and is stopped by PID.
set -euo pipefail
cd "$(dirname "$0")/.."
source bench/lib.sh
ROUNDS=${ROUNDS:-3}
KEYS=${KEYS:-100000}
CONNECTIONS=${CONNECTIONS:-50}
DURATION=${DURATION:-10} # seconds
KINDS=${KINDS:-ttlwheel ttlwheel-1 ttlwheel-wrk redis-bench redis-load}
TARGET=${TARGET:-127.0.0.1:17990}
REDIS_PORT=${REDIS_PORT:-17991}
OUT=${OUT:-$(mktemp -d /var/tmp/ttlwheel-singles-clients.XXXXXX)}
command -v redis-server >/dev/null && command -v redis-benchmark >/dev/null ||
    { echo "needs redis-server and redis-tools (apt-get install redis-server redis-tools)" >&2; exit 1; }
command -v wrk >/dev/null || KINDS=${KINDS//ttlwheel-wrk/}
build_server_and_load

REDIS_PID=
stop_redis() { [ -n "$REDIS_PID" ] && kill "$REDIS_PID" 2>/dev/null && wait "$REDIS_PID" 2>/dev/null; REDIS_PID=; true; }
trap 'stop; stop_redis' EXIT

# Runs a client and prints the CPU seconds it used (user + system), its output to $1.
client_cpu() {
    python3 - "$@" <<'PY'
import resource, subprocess, sys
with open(sys.argv[1], "w") as out:
    subprocess.run(sys.argv[2:], stdout=out, stderr=subprocess.STDOUT, check=True)
usage = resource.getrusage(resource.RUSAGE_CHILDREN)
print(usage.ru_utime + usage.ru_stime)
PY
}

# One line: kind, requests/s, server us/request, client us/request. Arguments: kind, rate,
# requests, server CPU seconds, client CPU seconds.
line() { python3 -c "r=$2; n=$3; print(f'$1 {r:.0f} {($4)/n*1e6:.2f} {($5)/n*1e6:.2f}')"; }

ttlwheel_run() { # $1: kind, then the server's extra flags
    local kind=$1 && shift
    serve --data-dir "$OUT/data" "$@"
    "$LOAD" --target "$TARGET" heartbeat --keys "$KEYS" --ttl 600s --connections "$CONNECTIONS" \
        --duration 2s >/dev/null 2>&1 # preload and warm up
    local before client after rate
    before=$(cpu_s "$PID")
    if [ "$kind" = ttlwheel-wrk ]; then
        client=$(KEYS=$KEYS client_cpu "$OUT/$kind.log" wrk -t1 -c"$CONNECTIONS" -d"${DURATION}s" \
            -s bench/heartbeat.lua "http://$TARGET")
        ! grep -q "Non-2xx" "$OUT/$kind.log" || { cat "$OUT/$kind.log" >&2; exit 1; }
        rate=$(awk '/^Requests\/sec/ {print $2}' "$OUT/$kind.log")
    else
        client=$(client_cpu "$OUT/$kind.log" "$LOAD" --target "$TARGET" heartbeat --keys "$KEYS" \
            --ttl 600s --connections "$CONNECTIONS" --duration "${DURATION}s" --warmup 0s --no-preload)
        rate=$(result "$OUT/$kind.log" requests_per_s)
    fi
    after=$(cpu_s "$PID")
    stop
    line "$kind" "$rate" "$rate*$DURATION" "$after-$before" "$client"
}

redis_run() { # $1: kind
    redis-server --port "$REDIS_PORT" --bind 127.0.0.1 --save '' --appendonly no >/dev/null 2>&1 &
    REDIS_PID=$!
    until redis-cli -p "$REDIS_PORT" ping >/dev/null 2>&1; do sleep 0.01; done
    # Warm up with the run's own client and keys (2 s at ~100k/s sets nearly all KEYS).
    if [ "$1" = redis-bench ]; then
        redis-benchmark -p "$REDIS_PORT" -c "$CONNECTIONS" -n 200000 -r "$KEYS" -q \
            SET key:__rand_int__ val EX 600 >/dev/null 2>&1
    else
        "$LOAD" --target "127.0.0.1:$REDIS_PORT" redis-set --keys "$KEYS" --ttl 600s \
            --connections "$CONNECTIONS" --duration 2s --warmup 0s >/dev/null 2>&1
    fi
    local before client after rate count
    before=$(cpu_s "$REDIS_PID")
    if [ "$1" = redis-bench ]; then
        # A count, not a time: about DURATION at 100,000 requests/s.
        count=$((DURATION * 100000))
        local start=$EPOCHREALTIME
        client=$(client_cpu "$OUT/$1.log" redis-benchmark -p "$REDIS_PORT" -c "$CONNECTIONS" \
            -n "$count" -r "$KEYS" -q SET key:__rand_int__ val EX 600)
        rate=$(python3 -c "print($count / ($EPOCHREALTIME - $start))")
    else
        client=$(client_cpu "$OUT/$1.log" "$LOAD" --target "127.0.0.1:$REDIS_PORT" redis-set \
            --keys "$KEYS" --ttl 600s --connections "$CONNECTIONS" --duration "${DURATION}s" \
            --warmup 0s)
        rate=$(result "$OUT/$1.log" requests_per_s)
        count=$(python3 -c "print($rate * $DURATION)")
    fi
    after=$(cpu_s "$REDIS_PID")
    stop_redis
    line "$1" "$rate" "$count" "$after-$before" "$client"
}

run() {
    case $1 in
        ttlwheel | ttlwheel-wrk) ttlwheel_run "$1" ;;
        ttlwheel-1) ttlwheel_run "$1" --threads 1 ;;
        redis-*) redis_run "$1" ;;
    esac
}

echo "kind req/s server_us/req client_us/req" | tee "$OUT/runs.txt"
for _ in $(seq "$ROUNDS"); do
    for kind in $KINDS; do run "$kind" | tee -a "$OUT/runs.txt"; done
done
python3 - "$OUT/runs.txt" <<'PY'
import statistics, sys
rows = [l.split() for l in open(sys.argv[1]).read().splitlines()[1:]]
kinds = list(dict.fromkeys(r[0] for r in rows))
med = {k: [statistics.median(float(r[i]) for r in rows if r[0] == k) for i in (1, 2, 3)] for k in kinds}
print("\n| run | req/s (median) | server us/request | client us/request |")
print("|---|---|---|---|")
for k in kinds:
    print(f"| {k} | {med[k][0]:,.0f} | {med[k][1]:.1f} | {med[k][2]:.1f} |")
for redis in [k for k in kinds if k.startswith("redis")]:
    ratios = ", ".join(f"{k} {med[k][0] / med[redis][0]:.2f}x" for k in kinds if k.startswith("ttlwheel"))
    print(f"\nagainst {redis}: {ratios}")
PY
echo "logs in $OUT"
