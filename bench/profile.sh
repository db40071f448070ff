#!/usr/bin/env bash
# Profiles the server on the single-heartbeat path: a frame-pointer release build under
# `ttlwheel-load heartbeat`, sampled by `perf record`, drawn as a flame graph by inferno, and
# summed into the categories BENCHMARKS.md quotes. Needs Debian's linux-perf (installed if
# missing; root) and inferno (`cargo install inferno`, done if missing).
#
# Output: target/profile/heartbeat.svg and target/profile/summary.txt.
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=target/profile
PORT=17979
mkdir -p "$OUT"
command -v perf >/dev/null || { apt-get update -qq && apt-get install -y -qq linux-perf >/dev/null; }
command -v inferno-flamegraph >/dev/null || cargo install -q inferno
RUSTFLAGS="-C force-frame-pointers=yes" cargo build --release -q -p ttlwheel -p ttlwheel-load --target-dir "$OUT/build"
# Persistence on, as a user runs it, in a fresh data directory (the embedded default would be
# ./ttlwheel-data, and recovering an old one there delays the start).
rm -rf "$OUT/data"
"$OUT/build/release/ttlwheel" --listen "127.0.0.1:$PORT" --data-dir "$OUT/data" >"$OUT/server.log" 2>&1 &
SERVER=$!
trap 'kill $SERVER 2>/dev/null || true' EXIT
until curl -sf "http://127.0.0.1:$PORT/healthz" >/dev/null 2>&1; do sleep 0.05; done
"$OUT/build/release/ttlwheel-load" --target "127.0.0.1:$PORT" heartbeat --keys 1000000 \
    --connections 50 --duration 14s --warmup 1s >"$OUT/load.log" 2>&1 &
LOAD=$!
sleep 8 # past the preload of 1M keys and the warm-up
cpu_s() { awk -v hz="$(getconf CLK_TCK)" '{print ($14 + $15) / hz}' "/proc/$1/stat"; }
cpu_before=$(cpu_s "$SERVER")
perf record -g -e cpu-clock -F 2000 -p "$SERVER" -o "$OUT/perf.data" -- sleep 6 2>/dev/null
cpu_after=$(cpu_s "$SERVER")
wait "$LOAD" || true
perf script -i "$OUT/perf.data" 2>/dev/null | inferno-collapse-perf >"$OUT/heartbeat.folded"
inferno-flamegraph --title "ttlwheel: POST /v1/heartbeats, 50 connections" \
    <"$OUT/heartbeat.folded" >"$OUT/heartbeat.svg"
python3 - "$OUT/heartbeat.folded" <<'PY' | tee "$OUT/summary.txt"
import collections, sys
# Each sample once, in the first category its stack matches (order matters: syscalls first).
categories = [
    ("kernel: send (writev, incl. loopback delivery)", ("writev",)),
    ("kernel: receive (recv)", ("recv",)),
    ("kernel: epoll / futex / scheduling", ("epoll_wait", "do_futex", "__schedule")),
    ("registry (shard lookup, renewal, wheel)", ("ttlwheel::registry::",)),
    ("request body and JSON parsing", ("JsonBytes", "parse_json", "is_json", "to_bytes")),
    ("handler rest (validation, answer, serialization)", ("ttlwheel::http::heartbeats::", "ttlwheel::types::")),
    ("request metrics layer", ("observe::Record",)),
    ("malloc / free", ("malloc", "free")),
    ("hyper and axum (HTTP/1 codec, routing)", ("hyper", "axum")),
]
totals, total = collections.Counter(), 0
for line in open(sys.argv[1]):
    stack, count = line.rsplit(" ", 1)
    count = int(count)
    total += count
    name = next((n for n, keys in categories if any(k in stack for k in keys)), "other")
    totals[name] += count
for name, count in totals.most_common():
    print(f"{100 * count / total:5.1f}%  {name}")
PY
grep -E "req/s|latency" "$OUT/load.log"
# Server CPU (user + system) per request over the sampled 6 s, at the run's mean request rate.
rate=$(grep -o '[0-9]* req/s' "$OUT/load.log" | head -1 | cut -d' ' -f1)
awk -v a="$cpu_after" -v b="$cpu_before" -v r="$rate" 'BEGIN {
  printf "server CPU: %.2f s in 6 s at %d req/s = %.1f us per request\n", a - b, r, (a - b) * 1e6 / (r * 6)
}' | tee -a "$OUT/summary.txt"
