#!/usr/bin/env bash
# Side by side on this machine, in one run: ttlwheel, Redis 7 and etcd 3.4 under the same
# heartbeat workload, plus ttlwheel's soak and storm. Prints one Markdown table (and saves it,
# with every raw log, under $OUT). See README.md, "Load and comparison benchmarks".
#
# Every server binds to 127.0.0.1 only and is stopped by PID when the script exits. Missing
# peers are installed from Debian's packages (needs root).
#
# Knobs (environment): DURATION (20s per throughput run), CONNECTIONS (50), KEYS (1000000),
# SOAK_DURATION (10m), SOAK_KEYS (100000), STORM_KEYS (1000000), ETCD_LEASES (10000), OUT.
set -euo pipefail
cd "$(dirname "$0")/.."

DURATION=${DURATION:-20s}
CONNECTIONS=${CONNECTIONS:-50}
KEYS=${KEYS:-1000000}
SOAK_DURATION=${SOAK_DURATION:-10m}
SOAK_KEYS=${SOAK_KEYS:-100000}
STORM_KEYS=${STORM_KEYS:-1000000}
ETCD_LEASES=${ETCD_LEASES:-10000}
OUT=${OUT:-target/bench-compare}
TTL_S=30
TW_PORT=17878 RECEIVER=127.0.0.1:19797 REDIS_PORT=16379 ETCD_PORT=12379 ETCD_PEER_PORT=12380

mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
LOAD=target/release/ttlwheel-load
PIDS=()
cleanup() {
    for pid in "${PIDS[@]}"; do kill "$pid" 2>/dev/null || true; done
    wait 2>/dev/null || true
}
trap cleanup EXIT

say() { echo "== $*" >&2; }

ensure_packages() {
    local missing=()
    command -v redis-server >/dev/null || missing+=(redis-server)
    command -v redis-benchmark >/dev/null || missing+=(redis-tools)
    command -v etcd >/dev/null || missing+=(etcd-server)
    command -v wrk >/dev/null || missing+=(wrk)
    command -v python3 >/dev/null || missing+=(python3)
    if ((${#missing[@]})); then
        say "installing ${missing[*]}"
        apt-get update -qq
        DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null
    fi
    # The Debian package starts a system Redis; it is left alone (ours uses its own port).
}

rss_kb() { awk '/^VmRSS/ {print $2}' "/proc/$1/status"; }

# The field at a dotted path in the tool's RESULT line of a log.
result() {
    python3 - "$1" "$2" <<'PY'
import json, sys
line = [l for l in open(sys.argv[1]) if l.startswith("RESULT ")][-1]
value = json.loads(line[len("RESULT "):])["outcome"]
for part in sys.argv[2].split("."):
    value = value[part]
print(value)
PY
}

wait_http() { # url
    for _ in $(seq 100); do curl -fsS -o /dev/null "$1" 2>/dev/null && return 0; sleep 0.1; done
    echo "no answer from $1" >&2
    return 1
}

start_ttlwheel() { # extra flags...
    target/release/ttlwheel --listen "127.0.0.1:$TW_PORT" "$@" >"$OUT/ttlwheel.log" 2>&1 &
    TW_PID=$!
    PIDS+=("$TW_PID")
    wait_http "http://127.0.0.1:$TW_PORT/healthz"
}

stop() { kill "$1" 2>/dev/null || true; wait "$1" 2>/dev/null || true; }

fmt() { python3 -c "import sys; v=float(sys.argv[1]); print(f'{v:,.${2:-0}f}')" "$1"; }

ensure_packages
say "building"
cargo build --release --bins -q

ROWS=()
row() { ROWS+=("| $* |"); }

# ---- ttlwheel: single heartbeats and batches on 1M keys (default threads: one per core),
# then single heartbeats on one event loop (`--threads 1`, as Redis runs) ----
say "ttlwheel: registering $KEYS keys, then single heartbeats"
start_ttlwheel
rss0=$(rss_kb "$TW_PID")
$LOAD --target "127.0.0.1:$TW_PORT" heartbeat --keys "$KEYS" --prefix key: --ttl ${TTL_S}s \
    --connections 1 --duration 1s --warmup 0s >"$OUT/ttlwheel-preload.log" 2>&1
rss1=$(rss_kb "$TW_PID")
TW_BYTES_PER_KEY=$(( (rss1 - rss0) * 1024 / KEYS ))
$LOAD --target "127.0.0.1:$TW_PORT" heartbeat --keys "$KEYS" --prefix key: --ttl ${TTL_S}s \
    --connections "$CONNECTIONS" --duration "$DURATION" --no-preload | tee "$OUT/ttlwheel-heartbeat.log"
say "ttlwheel: batches"
$LOAD --target "127.0.0.1:$TW_PORT" batch --keys "$KEYS" --prefix key: --ttl ${TTL_S}s \
    --connections 4 --duration "$DURATION" --no-preload | tee "$OUT/ttlwheel-batch.log"
stop "$TW_PID"
say "ttlwheel --threads 1: single heartbeats"
start_ttlwheel --threads 1
$LOAD --target "127.0.0.1:$TW_PORT" heartbeat --keys "$KEYS" --prefix key: --ttl ${TTL_S}s \
    --connections "$CONNECTIONS" --duration "$DURATION" | tee "$OUT/ttlwheel-heartbeat-1thread.log"
stop "$TW_PID"

# ---- ttlwheel: soak (expiry lateness, false expirations) ----
say "ttlwheel: soak, $SOAK_KEYS keys for $SOAK_DURATION"
start_ttlwheel --webhook-url "http://$RECEIVER/hook"
soak_status=0
$LOAD --target "127.0.0.1:$TW_PORT" soak --keys "$SOAK_KEYS" --duration "$SOAK_DURATION" \
    --receiver "$RECEIVER" | tee "$OUT/ttlwheel-soak.log" || soak_status=$?
stop "$TW_PID"

# ---- ttlwheel: storm ----
say "ttlwheel: storm, $STORM_KEYS keys expiring in the same second"
start_ttlwheel --webhook-url "http://$RECEIVER/hook"
storm_status=0
$LOAD --target "127.0.0.1:$TW_PORT" storm --keys "$STORM_KEYS" --receiver "$RECEIVER" \
    | tee "$OUT/ttlwheel-storm.log" || storm_status=$?
stop "$TW_PID"

h="$OUT/ttlwheel-heartbeat.log" b="$OUT/ttlwheel-batch.log" s="$OUT/ttlwheel-soak.log"
TW_LATENESS="wheel $(fmt "$(result "$s" wheel_lateness.p50)") / $(fmt "$(result "$s" wheel_lateness.p99)") ms; heap $(fmt "$(result "$s" heap_lateness.p50)" 1) / $(fmt "$(result "$s" heap_lateness.p99)" 1) ms"
row "ttlwheel | \`POST /v1/heartbeats\` | $CONNECTIONS | $(fmt "$(result "$h" requests_per_s)") | $(result "$h" latency.p50) | $(result "$h" latency.p99) | $TW_BYTES_PER_KEY | $TW_LATENESS"
h1="$OUT/ttlwheel-heartbeat-1thread.log"
row "ttlwheel \`--threads 1\` | \`POST /v1/heartbeats\` | $CONNECTIONS | $(fmt "$(result "$h1" requests_per_s)") | $(result "$h1" latency.p50) | $(result "$h1" latency.p99) | (same) | (same)"
row "ttlwheel | \`POST /v1/heartbeats/batch?results=errors\`, 1,000 per request | 4 | $(fmt "$(result "$b" heartbeats_per_s)") heartbeats/s | $(result "$b" latency.p50) (per request) | $(result "$b" latency.p99) | (same) | (same)"

# ---- Redis 7 ----
say "redis: $KEYS keys, SET EX unpipelined and -P 16"
redis-server --port "$REDIS_PORT" --bind 127.0.0.1 --save '' --appendonly no \
    --notify-keyspace-events Ex >"$OUT/redis.log" 2>&1 &
REDIS_PID=$!
PIDS+=("$REDIS_PID")
for _ in $(seq 50); do redis-cli -p "$REDIS_PORT" ping >/dev/null 2>&1 && break; sleep 0.1; done
rss0=$(rss_kb "$REDIS_PID")
python3 bench/redis_keys.py "$KEYS" "$TTL_S" | redis-cli -p "$REDIS_PORT" --pipe >"$OUT/redis-preload.log"
rss1=$(rss_kb "$REDIS_PID")
REDIS_BYTES_PER_KEY=$(( (rss1 - rss0) * 1024 / KEYS ))
redis_bench() { # label, extra flags
    # redis-benchmark runs a number of requests, not a time: aim at about $DURATION.
    local seconds rate=70000
    [[ -n "$2" ]] && rate=400000
    seconds=$(python3 -c "import sys; print(int(sys.argv[1].rstrip('s')))" "$DURATION")
    local requests=$(( seconds * rate ))
    redis-benchmark -p "$REDIS_PORT" -c "$CONNECTIONS" -n "$requests" -r "$KEYS" $2 --csv \
        SET key:__rand_int__ val EX "$TTL_S" 2>/dev/null | tail -1 | tee "$OUT/redis-$1.csv"
}
redis_bench unpipelined ""
redis_bench pipelined "-P 16"
csv() { python3 -c "import csv,sys; r=list(csv.reader(open(sys.argv[1])))[-1]; print(r[int(sys.argv[2])])" "$@"; }
say "redis: expiry lateness (10,000 keys, no other keys; then beside 90,000 live keys)"
redis-cli -p "$REDIS_PORT" flushall >/dev/null
$LOAD --target "127.0.0.1:$REDIS_PORT" redis-expiry --keys 10000 --live-keys 0 --ttl 5s \
    | tee "$OUT/redis-expiry.log" || true
redis-cli -p "$REDIS_PORT" flushall >/dev/null
$LOAD --target "127.0.0.1:$REDIS_PORT" redis-expiry --keys 10000 --live-keys 90000 --ttl 5s --wait 60s \
    | tee "$OUT/redis-expiry-live.log" || true
stop "$REDIS_PID"
r="$OUT/redis-expiry.log" rl="$OUT/redis-expiry-live.log"
REDIS_LATENESS="$(fmt "$(result "$r" lateness.p50)") / $(fmt "$(result "$r" lateness.p99)") ms; beside 90k live keys: $(fmt "$(result "$rl" lateness.p50)") / $(fmt "$(result "$rl" lateness.p99)") ms, $(result "$rl" missing) of 10,000 not expired after 60 s"
row "Redis 7 | \`SET key val EX $TTL_S\` | $CONNECTIONS | $(fmt "$(csv "$OUT/redis-unpipelined.csv" 1)") | $(csv "$OUT/redis-unpipelined.csv" 4) | $(csv "$OUT/redis-unpipelined.csv" 6) | $REDIS_BYTES_PER_KEY | $REDIS_LATENESS"
row "Redis 7 | \`SET key val EX $TTL_S\`, \`-P 16\` | $CONNECTIONS | $(fmt "$(csv "$OUT/redis-pipelined.csv" 1)") | $(csv "$OUT/redis-pipelined.csv" 4) | $(csv "$OUT/redis-pipelined.csv" 6) | (same) | (same)"

# ---- etcd 3.4 ----
say "etcd: $ETCD_LEASES leases with a key each, keep-alive through the gateway"
rm -rf "$OUT/etcd-data"
etcd --name bench --data-dir "$OUT/etcd-data" \
    --listen-client-urls "http://127.0.0.1:$ETCD_PORT" --advertise-client-urls "http://127.0.0.1:$ETCD_PORT" \
    --listen-peer-urls "http://127.0.0.1:$ETCD_PEER_PORT" --initial-advertise-peer-urls "http://127.0.0.1:$ETCD_PEER_PORT" \
    --initial-cluster "bench=http://127.0.0.1:$ETCD_PEER_PORT" >"$OUT/etcd.log" 2>&1 &
ETCD_PID=$!
PIDS+=("$ETCD_PID")
wait_http "http://127.0.0.1:$ETCD_PORT/health"
rss0=$(rss_kb "$ETCD_PID")
python3 bench/etcd_leases.py "http://127.0.0.1:$ETCD_PORT" "$ETCD_LEASES" 600 >"$OUT/etcd-leases.txt"
rss1=$(rss_kb "$ETCD_PID")
ETCD_BYTES_PER_KEY=$(( (rss1 - rss0) * 1024 / ETCD_LEASES ))
LEASES_FILE="$OUT/etcd-leases.txt" wrk -t2 -c"$CONNECTIONS" -d"$DURATION" --latency \
    -s bench/etcd_keepalive.lua "http://127.0.0.1:$ETCD_PORT" | tee "$OUT/etcd-wrk.log"
say "etcd: expiry lateness (1,000 keys beside 9,000 live ones)"
$LOAD --target "127.0.0.1:$ETCD_PORT" etcd-expiry --keys 1000 --live-keys 9000 --ttl 5s \
    | tee "$OUT/etcd-expiry.log" || true
stop "$ETCD_PID"
wrk_field() { awk -v k="$1" '$1 == k {print $2}' "$OUT/etcd-wrk.log" | head -1; }
to_ms() { python3 -c "
import sys; v=sys.argv[1]
for unit, factor in (('us', 0.001), ('ms', 1), ('s', 1000)):
    if v.endswith(unit) and (unit != 's' or not v.endswith(('us', 'ms'))):
        print(round(float(v[:-len(unit)]) * factor, 3)); break" "$1"; }
e="$OUT/etcd-expiry.log"
row "etcd 3.4 | \`POST /v3/lease/keepalive\` (gateway, wrk) | $CONNECTIONS | $(fmt "$(awk '/^Requests\/sec/ {print $2}' "$OUT/etcd-wrk.log")") | $(to_ms "$(wrk_field 50%)") | $(to_ms "$(wrk_field 99%)") | $ETCD_BYTES_PER_KEY (at $(fmt "$ETCD_LEASES") leases) | $(fmt "$(result "$e" lateness.p50)") / $(fmt "$(result "$e" lateness.p99)") ms"

# ---- the table ----
{
    echo "Measured $(date -u +%Y-%m-%d), $(nproc) cores ($(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ *//')), load tool and server on the same machine."
    echo
    echo "| system | operation | connections | ops/s | p50 ms | p99 ms | bytes/key at $(fmt "$KEYS") keys | expiry lateness p50 / p99 |"
    echo "|---|---|---|---|---|---|---|---|"
    printf '%s\n' "${ROWS[@]}"
    echo
    sed -n 's/^soak: /- soak: /p' "$OUT/ttlwheel-soak.log"
    sed -n 's/^storm: /- storm: /p' "$OUT/ttlwheel-storm.log"
} | tee "$OUT/table.md"
if ((soak_status != 0 || storm_status != 0)); then
    echo "soak exit $soak_status, storm exit $storm_status: see $OUT" >&2
    exit 1
fi
