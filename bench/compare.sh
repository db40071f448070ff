#!/usr/bin/env bash
# Side by side on this machine, in one run: ttlwheel, Redis 7 and etcd 3.4 under the same
# heartbeat workload, plus ttlwheel's soak and storm. Prints one Markdown table (and saves it,
# with every raw log, under $OUT). See README.md, "Load and comparison benchmarks".
#
# Every server binds to 127.0.0.1 only and is stopped by PID when the script exits. Missing
# peers are installed from Debian's packages (needs root).
#
# Knobs (environment): DURATION (10s per throughput run), ROUNDS (3), CONNECTIONS (50), KEYS (1000000),
# SOAK_DURATION (10m), SOAK_KEYS (100000), STORM_KEYS (1000000), STORM_LIVE_RATE (10000 heartbeats/s
# beside the storm, open loop), WEBHOOK_BATCH_MAX (100, the batched storm), ETCD_LEASES (10000), OUT.
#
# Redis runs twice: under redis-benchmark (the usual figure), and under ttlwheel-load's redis-set
# mode, the same client and key names as ttlwheel's runs (a second Redis, preloaded with those
# names), so that one ratio compares the servers with nothing else changed: on 2 cores the client
# shares the machine, and redis-benchmark costs more CPU per request than ttlwheel-load.
#
# Latency is also measured open loop (ttlwheel-load --rate: requests on a fixed schedule, latency
# from each scheduled time, as wrk2 does) at 50% and 80% of Redis's measured closed-loop maximum,
# ttlwheel and Redis (redis-set mode) in turn. The tool's timer has a 1 ms grain, so open-loop
# figures carry up to 1 ms of send lateness, the same for both.
set -euo pipefail
cd "$(dirname "$0")/.."

DURATION=${DURATION:-10s}
ROUNDS=${ROUNDS:-3}
CONNECTIONS=${CONNECTIONS:-50}
KEYS=${KEYS:-1000000}
SOAK_DURATION=${SOAK_DURATION:-10m}
SOAK_KEYS=${SOAK_KEYS:-100000}
STORM_KEYS=${STORM_KEYS:-1000000}
STORM_LIVE_RATE=${STORM_LIVE_RATE:-10000}
WEBHOOK_BATCH_MAX=${WEBHOOK_BATCH_MAX:-100}
ETCD_LEASES=${ETCD_LEASES:-10000}
STREAM_CLIENTS=${STREAM_CLIENTS:-1000}
PROFILE=${PROFILE:-1}
OUT=${OUT:-target/bench-compare}
TTL_S=30
TW_PORT=17878 TW1_PORT=17879 RECEIVER=127.0.0.1:19797 REDIS_PORT=16379 REDIS_TOOL_PORT=16380 ETCD_PORT=12379 ETCD_PEER_PORT=12380

mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
LOAD=target/release/ttlwheel-load
# rss_kb and result; this script's own `stop` (by PID argument) and trap replace the library's.
. bench/lib.sh
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

wait_http() { # url
    for _ in $(seq 100); do curl -fsS -o /dev/null "$1" 2>/dev/null && return 0; sleep 0.1; done
    echo "no answer from $1" >&2
    return 1
}

start_ttlwheel() { # extra flags...
    # Persistence on, as a user runs it (--fsync interval, the default), in a fresh data
    # directory per server.
    rm -rf "$OUT/data-$TW_PORT"
    target/release/ttlwheel --listen "127.0.0.1:$TW_PORT" --data-dir "$OUT/data-$TW_PORT" "$@" \
        >>"$OUT/ttlwheel-$TW_PORT.log" 2>&1 &
    TW_PID=$!
    PIDS+=("$TW_PID")
    wait_http "http://127.0.0.1:$TW_PORT/healthz"
}

# A Redis 7 on port $1 (no persistence), its log appended to $2, with any further flags; sets
# REDIS_STARTED to its PID once it answers.
start_redis() { # port, log, extra flags...
    local port=$1 log=$2
    shift 2
    redis-server --port "$port" --bind 127.0.0.1 --save '' --appendonly no "$@" >>"$log" 2>&1 &
    REDIS_STARTED=$!
    PIDS+=("$REDIS_STARTED")
    for _ in $(seq 50); do redis-cli -p "$port" ping >/dev/null 2>&1 && break; sleep 0.1; done
}

stop() { kill "$1" 2>/dev/null || true; wait "$1" 2>/dev/null || true; }

fmt() { python3 -c "import sys; v=float(sys.argv[1]); print(f'{v:,.${2:-0}f}')" "$1"; }

ensure_packages
say "building"
cargo build --release -q -p ttlwheel -p ttlwheel-load

ROWS=()
row() { ROWS+=("| $* |"); }

# ---- Throughput: every system preloaded with $KEYS keys, then the runs alternate ----
# The machine is shared and its speed drifts by tens of percent over minutes, so the
# throughput runs take turns, ROUNDS times, and the table shows each one's median.
say "ttlwheel: registering $KEYS keys (one worker per core)"
start_ttlwheel
TW_DEFAULT=$TW_PID
rss0=$(rss_kb "$TW_PID")
$LOAD --target "127.0.0.1:$TW_PORT" heartbeat --keys "$KEYS" --prefix key: --ttl ${TTL_S}s \
    --connections 1 --duration 1s --warmup 0s >"$OUT/ttlwheel-preload.log" 2>&1
rss1=$(rss_kb "$TW_PID")
TW_BYTES_PER_KEY=$(( (rss1 - rss0) * 1024 / KEYS ))
say "ttlwheel --serving shared (one work-stealing runtime, the default before per-core): registering $KEYS keys"
TW_PORT=$TW1_PORT start_ttlwheel --serving shared
TW_SHARED=$TW_PID
$LOAD --target "127.0.0.1:$TW1_PORT" heartbeat --keys "$KEYS" --prefix key: --ttl ${TTL_S}s \
    --connections 1 --duration 1s --warmup 0s >"$OUT/ttlwheel-shared-preload.log" 2>&1
say "redis: registering $KEYS keys"
start_redis "$REDIS_PORT" "$OUT/redis.log" --notify-keyspace-events Ex
REDIS_PID=$REDIS_STARTED
rss0=$(rss_kb "$REDIS_PID")
python3 bench/redis_keys.py "$KEYS" "$TTL_S" | redis-cli -p "$REDIS_PORT" --pipe >"$OUT/redis-preload.log"
rss1=$(rss_kb "$REDIS_PID")
REDIS_BYTES_PER_KEY=$(( (rss1 - rss0) * 1024 / KEYS ))
say "redis, for ttlwheel-load's redis-set: registering $KEYS keys under the tool's names"
start_redis "$REDIS_TOOL_PORT" "$OUT/redis-tool.log"
REDIS_TOOL_PID=$REDIS_STARTED
python3 bench/redis_keys.py "$KEYS" "$TTL_S" plain | redis-cli -p "$REDIS_TOOL_PORT" --pipe >"$OUT/redis-tool-preload.log"
redis_bench() { # log name, extra flags
    # redis-benchmark runs a number of requests, not a time: aim at about $DURATION.
    local seconds rate=70000
    [[ -n "$2" ]] && rate=400000
    seconds=$(python3 -c "import sys; print(int(sys.argv[1].rstrip('s')))" "$DURATION")
    redis-benchmark -p "$REDIS_PORT" -c "$CONNECTIONS" -n $(( seconds * rate )) -r "$KEYS" $2 --csv \
        SET key:__rand_int__ val EX "$TTL_S" 2>/dev/null | tail -1 >"$OUT/$1.csv"
}
REDIS_REQUESTS=$(( ${DURATION%s} * 70000 )) # redis_bench's -n without -P
# Runs a command and writes to a file the server CPU seconds (user + system) it cost the process
# $1 and its own wall seconds: `cpu_of PID FILE COMMAND...`.
cpu_of() {
    local pid=$1 file=$2 before after started
    shift 2
    before=$(cpu_s "$pid") started=$(date +%s.%N)
    "$@"
    after=$(cpu_s "$pid")
    python3 -c "import sys, time; print(float(sys.argv[2]) - float(sys.argv[1]), time.time() - float(sys.argv[3]))" \
        "$before" "$after" "$started" >"$file"
}
for round in $(seq "$ROUNDS"); do
    say "throughput round $round of $ROUNDS"
    cpu_of "$TW_DEFAULT" "$OUT/ttlwheel-heartbeat-$round.cpu" \
        $LOAD --target "127.0.0.1:$TW_PORT" heartbeat --keys "$KEYS" --prefix key: --ttl ${TTL_S}s \
        --connections "$CONNECTIONS" --duration "$DURATION" --no-preload >"$OUT/ttlwheel-heartbeat-$round.log"
    cpu_of "$REDIS_PID" "$OUT/redis-unpipelined-$round.cpu" redis_bench "redis-unpipelined-$round" ""
    cpu_of "$REDIS_TOOL_PID" "$OUT/redis-tool-$round.cpu" \
        $LOAD --target "127.0.0.1:$REDIS_TOOL_PORT" redis-set --keys "$KEYS" --prefix key: --ttl ${TTL_S}s \
        --connections "$CONNECTIONS" --duration "$DURATION" >"$OUT/redis-tool-$round.log"
    $LOAD --target "127.0.0.1:$TW1_PORT" heartbeat --keys "$KEYS" --prefix key: --ttl ${TTL_S}s \
        --connections "$CONNECTIONS" --duration "$DURATION" --no-preload >"$OUT/ttlwheel-shared-heartbeat-$round.log"
    $LOAD --target "127.0.0.1:$TW_PORT" heartbeat --keys "$KEYS" --prefix key: --ttl ${TTL_S}s \
        --connections "$CONNECTIONS" --duration "$DURATION" --no-preload --prefer-minimal >"$OUT/ttlwheel-minimal-heartbeat-$round.log"
    redis_bench "redis-pipelined-$round" "-P 16"
    $LOAD --target "127.0.0.1:$TW_PORT" batch --keys "$KEYS" --prefix key: --ttl ${TTL_S}s \
        --connections 4 --duration "$DURATION" --no-preload >"$OUT/ttlwheel-batch-$round.log"
    grep -h -E "^(heartbeat|batch|redis-set): " "$OUT/ttlwheel-heartbeat-$round.log" \
        "$OUT/ttlwheel-shared-heartbeat-$round.log" "$OUT/ttlwheel-minimal-heartbeat-$round.log" \
        "$OUT/ttlwheel-batch-$round.log" "$OUT/redis-tool-$round.log" >&2
    cut -d, -f1,2 "$OUT/redis-unpipelined-$round.csv" "$OUT/redis-pipelined-$round.csv" >&2
done
REDIS_MAX=$(python3 - "$OUT" "$ROUNDS" <<'PY'
import csv, statistics, sys
out, rounds = sys.argv[1], int(sys.argv[2])
print(statistics.median(float(list(csv.reader(open(f"{out}/redis-unpipelined-{r}.csv")))[-1][1]) for r in range(1, rounds + 1)))
PY
)
OPEN_RATES=()
for percent in 50 80; do
    rate=$(python3 -c "import sys; print(int(float(sys.argv[1]) * int(sys.argv[2]) / 100))" "$REDIS_MAX" "$percent")
    OPEN_RATES+=("$percent:$rate")
    say "open loop at $percent% of Redis's max: $rate requests/s"
    $LOAD --target "127.0.0.1:$TW_PORT" heartbeat --keys "$KEYS" --prefix key: --ttl ${TTL_S}s \
        --connections "$CONNECTIONS" --duration "$DURATION" --no-preload --rate "$rate" >"$OUT/ttlwheel-open-$percent.log"
    $LOAD --target "127.0.0.1:$REDIS_TOOL_PORT" redis-set --keys "$KEYS" --prefix key: --ttl ${TTL_S}s \
        --connections "$CONNECTIONS" --duration "$DURATION" --rate "$rate" >"$OUT/redis-open-$percent.log"
    grep -h "latency" "$OUT/ttlwheel-open-$percent.log" "$OUT/redis-open-$percent.log" >&2
done
stop "$TW_DEFAULT"
stop "$TW_SHARED"
stop "$REDIS_PID"
stop "$REDIS_TOOL_PID"

# The median over the rounds of a field of the tool's RESULT lines, or of a CSV column.
median_result() { # log prefix, field
    local values=()
    for round in $(seq "$ROUNDS"); do values+=("$(result "$OUT/$1-$round.log" "$2")"); done
    python3 -c "import statistics, sys; print(statistics.median(map(float, sys.argv[1:])))" "${values[@]}"
}
median_csv() { # csv prefix, column
    python3 - "$OUT" "$1" "$2" "$ROUNDS" <<'PY'
import csv, statistics, sys
out, prefix, column, rounds = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
values = [float(list(csv.reader(open(f"{out}/{prefix}-{r}.csv")))[-1][column]) for r in range(1, rounds + 1)]
print(statistics.median(values))
PY
}
# Median over the rounds of server CPU microseconds per request. Each stdin line is a round's
# request count ("count N": redis-benchmark's fixed -n) or its measured rate ("rate R": the
# load tool, whose wall time includes its warm-up at about the same rate).
median_cpu_us() { # cpu file prefix
    local prefix=$1 values=() round=0 kind n
    while read -r kind n; do
        round=$((round + 1))
        values+=("$(awk -v k="$kind" -v n="$n" '{printf "%f", $1 * 1e6 / (k == "rate" ? n * $2 : n)}' "$OUT/$prefix-$round.cpu")")
    done
    python3 -c "import statistics, sys; print(f'{statistics.median(map(float, sys.argv[1:])):.1f}')" "${values[@]}"
}
TW_CPU_US=$(for round in $(seq "$ROUNDS"); do echo "rate $(result "$OUT/ttlwheel-heartbeat-$round.log" requests_per_s)"; done \
    | median_cpu_us ttlwheel-heartbeat)
REDIS_CPU_US=$(for round in $(seq "$ROUNDS"); do echo "count $REDIS_REQUESTS"; done | median_cpu_us redis-unpipelined)
REDIS_TOOL_CPU_US=$(for round in $(seq "$ROUNDS"); do echo "rate $(result "$OUT/redis-tool-$round.log" requests_per_s)"; done \
    | median_cpu_us redis-tool)
TW_HB=$(median_result ttlwheel-heartbeat requests_per_s)
TW_SHARED_HB=$(median_result ttlwheel-shared-heartbeat requests_per_s)
TW_MIN_HB=$(median_result ttlwheel-minimal-heartbeat requests_per_s)
TW_BATCH=$(median_result ttlwheel-batch heartbeats_per_s)
REDIS_HB=$(median_csv redis-unpipelined 1)
REDIS_P16=$(median_csv redis-pipelined 1)
REDIS_TOOL_HB=$(median_result redis-tool requests_per_s)

# ---- etcd 3.4: keep-alive throughput and memory ----
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

# ---- Expiry: ttlwheel's soak and storm, Redis's keyspace notifications ----
say "ttlwheel: soak, $SOAK_KEYS keys for $SOAK_DURATION"
start_ttlwheel --webhook-url "http://$RECEIVER/hook"
soak_status=0
$LOAD --target "127.0.0.1:$TW_PORT" soak --keys "$SOAK_KEYS" --duration "$SOAK_DURATION" \
    --receiver "$RECEIVER" | tee "$OUT/ttlwheel-soak.log" || soak_status=$?
stop "$TW_PID"

storm_status=0
# The storm with one event per webhook request and batched, then batched with the shared
# runtime (the serving mode before per-core), for the serving mode's effect on heartbeats.
STORMS=("1 per-core" "$WEBHOOK_BATCH_MAX per-core" "$WEBHOOK_BATCH_MAX shared")
for storm in "${STORMS[@]}"; do
    read -r batch_max serving <<<"$storm"
    say "ttlwheel: storm, $STORM_KEYS keys expiring in the same second, --webhook-batch-max $batch_max --serving $serving (expiry guard off: it would hold them)"
    start_ttlwheel --webhook-url "http://$RECEIVER/hook" --expiry-guard off --webhook-batch-max "$batch_max" --serving "$serving"
    $LOAD --target "127.0.0.1:$TW_PORT" storm --keys "$STORM_KEYS" --receiver "$RECEIVER" \
        --live-rate "$STORM_LIVE_RATE" | tee "$OUT/ttlwheel-storm-batch-$batch_max-$serving.log" || storm_status=$?
    stop "$TW_PID"
done

# ---- Stream clients and the profile: their own scripts, run as parts of this one ----
say "ttlwheel: creations with no, $STREAM_CLIENTS idle and $STREAM_CLIENTS reading stream clients, and delivery at 300 creations/s (bench/streams.sh)"
rm -f "$OUT/streams/results.txt"
# `reading` drives creations closed loop, faster than a thousand readers on this machine can
# read (most are dropped a ring behind, and its line says so); `delivery` measures readers
# that keep up, at 300 creations/s.
OUT="$OUT/streams" CLIENTS="$STREAM_CLIENTS" SCENARIOS="none idle reading delivery" \
    bash bench/streams.sh >&2
if [ "$PROFILE" = 1 ]; then
    say "ttlwheel: where a single heartbeat's server CPU goes (bench/profile.sh)"
    bash bench/profile.sh >&2
    cp target/profile/summary.txt "$OUT/profile-summary.txt"
    cp target/profile/heartbeat.svg "$OUT/heartbeat.svg"
fi

say "redis: expiry lateness (10,000 keys, no other keys; then beside 90,000 live keys)"
start_redis "$REDIS_PORT" "$OUT/redis.log" --notify-keyspace-events Ex
REDIS_PID=$REDIS_STARTED
$LOAD --target "127.0.0.1:$REDIS_PORT" redis-expiry --keys 10000 --live-keys 0 --ttl 5s \
    | tee "$OUT/redis-expiry.log" || true
redis-cli -p "$REDIS_PORT" flushall >/dev/null
$LOAD --target "127.0.0.1:$REDIS_PORT" redis-expiry --keys 10000 --live-keys 90000 --ttl 5s --wait 60s \
    | tee "$OUT/redis-expiry-live.log" || true
stop "$REDIS_PID"

# ---- rows ----
s="$OUT/ttlwheel-soak.log"
TW_LATENESS="wheel $(fmt "$(result "$s" wheel_lateness.p50)") / $(fmt "$(result "$s" wheel_lateness.p99)") ms; heap $(fmt "$(result "$s" heap_lateness.p50)" 1) / $(fmt "$(result "$s" heap_lateness.p99)" 1) ms"
median_ms() { fmt "$(median_result "$1" "$2")" 3; }
row "ttlwheel | \`POST /v1/heartbeats\` | $CONNECTIONS | $(fmt "$TW_HB") | $(median_ms ttlwheel-heartbeat latency.p50) | $(median_ms ttlwheel-heartbeat latency.p99) | $TW_BYTES_PER_KEY | $TW_LATENESS"
row "ttlwheel | \`POST /v1/heartbeats\`, \`Prefer: return=minimal\` (204) | $CONNECTIONS | $(fmt "$TW_MIN_HB") | $(median_ms ttlwheel-minimal-heartbeat latency.p50) | $(median_ms ttlwheel-minimal-heartbeat latency.p99) | (same) | (same)"
row "ttlwheel \`--serving shared\` | \`POST /v1/heartbeats\` | $CONNECTIONS | $(fmt "$TW_SHARED_HB") | $(median_ms ttlwheel-shared-heartbeat latency.p50) | $(median_ms ttlwheel-shared-heartbeat latency.p99) | (same) | (same)"
row "ttlwheel | \`POST /v1/heartbeats/batch?results=errors\`, 1,000 per request | 4 | $(fmt "$TW_BATCH") heartbeats/s | $(median_ms ttlwheel-batch latency.p50) (per request) | $(median_ms ttlwheel-batch latency.p99) | (same) | (same)"
r="$OUT/redis-expiry.log" rl="$OUT/redis-expiry-live.log"
REDIS_LATENESS="$(fmt "$(result "$r" lateness.p50)") / $(fmt "$(result "$r" lateness.p99)") ms; beside 90k live keys: $(fmt "$(result "$rl" lateness.p50)") / $(fmt "$(result "$rl" lateness.p99)") ms, $(result "$rl" missing) of 10,000 not expired after 60 s"
row "Redis 7 | \`SET key val EX $TTL_S\` | $CONNECTIONS | $(fmt "$REDIS_HB") | $(fmt "$(median_csv redis-unpipelined 4)" 3) | $(fmt "$(median_csv redis-unpipelined 6)" 3) | $REDIS_BYTES_PER_KEY | $REDIS_LATENESS"
row "Redis 7 under ttlwheel-load (ttlwheel's client) | \`SET key val EX $TTL_S\` | $CONNECTIONS | $(fmt "$REDIS_TOOL_HB") | $(median_ms redis-tool latency.p50) | $(median_ms redis-tool latency.p99) | (same) | (same)"
row "Redis 7 | \`SET key val EX $TTL_S\`, \`-P 16\` | $CONNECTIONS | $(fmt "$REDIS_P16") | $(fmt "$(median_csv redis-pipelined 4)" 3) | $(fmt "$(median_csv redis-pipelined 6)" 3) | (same) | (same)"
wrk_field() { awk -v k="$1" '$1 == k {print $2}' "$OUT/etcd-wrk.log" | head -1; }
to_ms() { python3 -c "
import sys; v=sys.argv[1]
for unit, factor in (('us', 0.001), ('ms', 1), ('s', 1000)):
    if v.endswith(unit) and (unit != 's' or not v.endswith(('us', 'ms'))):
        print(round(float(v[:-len(unit)]) * factor, 3)); break" "$1"; }
e="$OUT/etcd-expiry.log"
row "etcd 3.4 | \`POST /v3/lease/keepalive\` (gateway, wrk) | $CONNECTIONS | $(fmt "$(awk '/^Requests\/sec/ {print $2}' "$OUT/etcd-wrk.log")") | $(to_ms "$(wrk_field 50%)") | $(to_ms "$(wrk_field 99%)") | $ETCD_BYTES_PER_KEY (at $(fmt "$ETCD_LEASES") leases) | $(fmt "$(result "$e" lateness.p50)") / $(fmt "$(result "$e" lateness.p99)") ms"
RATIOS="Ratios (medians of $ROUNDS alternating rounds): single heartbeat $(python3 -c "import sys; h, m, s, r = map(float, sys.argv[1:]); print(f'{h/r:.2f}x Redis ({m/r:.2f}x with return=minimal, {s/r:.2f}x with --serving shared; per-core/shared {h/s:.2f}x)')" "$TW_HB" "$TW_MIN_HB" "$TW_SHARED_HB" "$REDIS_HB"), $(python3 -c "import sys; print(f'{float(sys.argv[1])/float(sys.argv[2]):.2f}x')" "$TW_HB" "$REDIS_TOOL_HB") Redis with the same client (ttlwheel-load); batch $(python3 -c "import sys; print(f'{float(sys.argv[1])/float(sys.argv[2]):.1f}x Redis -P 16')" "$TW_BATCH" "$REDIS_P16"); memory $(python3 -c "import sys; print(f'{int(sys.argv[1])/int(sys.argv[2]):.2f}x Redis')" "$TW_BYTES_PER_KEY" "$REDIS_BYTES_PER_KEY")."

# ---- the table ----
{
    echo "Measured $(date -u +%Y-%m-%d), $(nproc) cores ($(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ *//')), load tool and server on the same machine."
    echo
    echo "| system | operation | connections | ops/s | p50 ms | p99 ms | bytes/key at $(fmt "$KEYS") keys | expiry lateness p50 / p99 |"
    echo "|---|---|---|---|---|---|---|---|"
    printf '%s\n' "${ROWS[@]}"
    echo
    echo "$RATIOS"
    echo
    echo "Server CPU (user + system) per single heartbeat: ttlwheel $TW_CPU_US us, Redis \`SET EX\` $REDIS_CPU_US us under redis-benchmark and $REDIS_TOOL_CPU_US us under ttlwheel-load (medians of the throughput rounds)."
    echo
    sed -n 's/^soak: /- soak: /p' "$OUT/ttlwheel-soak.log"
    for storm in "${STORMS[@]}"; do
        read -r batch_max serving <<<"$storm"
        echo "- storm with \`--webhook-batch-max $batch_max --serving $serving\` (background heartbeats open loop at $STORM_LIVE_RATE/s):"
        sed -n 's/^storm: /  - /p' "$OUT/ttlwheel-storm-batch-$batch_max-$serving.log"
    done
    echo
    echo "Stream clients (bench/streams.sh, $STREAM_CLIENTS clients; creations closed loop, sampler open loop; delivery open loop at 300 creations/s):"
    sed 's/^/- /' "$OUT/streams/results.txt"
    if [ "$PROFILE" = 1 ]; then
        echo
        echo "Where a single heartbeat's server CPU goes (bench/profile.sh; flame graph: $OUT/heartbeat.svg):"
        echo
        sed 's/^/    /' "$OUT/profile-summary.txt"
    fi
    echo
    echo "Open loop, single heartbeats, $CONNECTIONS connections, latency from each scheduled time (ms):"
    echo
    echo "| rate | ttlwheel p50 | ttlwheel p99 | ttlwheel max | Redis p50 | Redis p99 | Redis max |"
    echo "|---|---|---|---|---|---|---|"
    for entry in "${OPEN_RATES[@]}"; do
        percent=${entry%%:*} rate=${entry##*:}
        t="$OUT/ttlwheel-open-$percent.log" r="$OUT/redis-open-$percent.log"
        echo "| $(fmt "$rate")/s ($percent% of Redis's max) | $(result "$t" latency.p50) | $(result "$t" latency.p99) | $(result "$t" latency.max) | $(result "$r" latency.p50) | $(result "$r" latency.p99) | $(result "$r" latency.max) |"
    done
} | tee "$OUT/table.md"
if ((soak_status != 0 || storm_status != 0)); then
    echo "soak exit $soak_status, storm exit $storm_status: see $OUT" >&2
    exit 1
fi
