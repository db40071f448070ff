#!/usr/bin/env bash
# Memory per key, ttlwheel against Redis 7, in one run with the same key names (`key:<n>`) and
# TTL: ttlwheel as a user runs it (persistence on, the listing index on), keys registered
# through the batch route; Redis keys set with `SET key val EX ttl` through `redis-cli --pipe`.
# Both figures are resident-set growth over the registration divided by the keys; Redis's
# `used_memory` growth is printed beside it.
#
# Usage: bash bench/memory_vs_redis.sh     KEYS=1000000 TTL_S=3600   (needs redis-server)
# Servers bind 127.0.0.1 only and are stopped by PID. Results: target/bench-memory/.
set -euo pipefail
cd "$(dirname "$0")/.."

KEYS=${KEYS:-1000000}
TTL_S=${TTL_S:-3600}
PORT=${PORT:-17916}
REDIS_PORT=${REDIS_PORT:-17917}
OUT=target/bench-memory
mkdir -p "$OUT"
cargo build --release -q -p ttlwheel -p ttlwheel-load
SERVER=target/release/ttlwheel
LOAD=target/release/ttlwheel-load
TARGET="127.0.0.1:$PORT"
. bench/lib.sh

serve --data-dir "$OUT/data"
rss0=$(rss_kb "$PID")
"$LOAD" --target "$TARGET" batch --keys "$KEYS" --prefix key: --ttl "${TTL_S}s" \
  --warmup 0s --duration 0s >"$OUT/ttlwheel.log" 2>&1 || true
grep -q "preloaded $KEYS keys" "$OUT/ttlwheel.log" || { cat "$OUT/ttlwheel.log" >&2; exit 1; }
rss1=$(rss_kb "$PID")
stop
tw=$(( (rss1 - rss0) * 1024 / KEYS ))

redis-server --port "$REDIS_PORT" --bind 127.0.0.1 --save '' --appendonly no >"$OUT/redis.log" 2>&1 &
PID=$!
for _ in $(seq 50); do redis-cli -p "$REDIS_PORT" ping >/dev/null 2>&1 && break; sleep 0.1; done
used() { redis-cli -p "$REDIS_PORT" info memory | awk -F: '/^used_memory:/ {print $2+0}'; }
rss0=$(rss_kb "$PID"); used0=$(used)
python3 - "$KEYS" "$TTL_S" <<'PY' | redis-cli -p "$REDIS_PORT" --pipe >"$OUT/redis-preload.log"
import sys
count, ttl = int(sys.argv[1]), sys.argv[2].encode()
out = sys.stdout.buffer
for i in range(count):
    key = b"key:%d" % i
    out.write(b"*5\r\n$3\r\nSET\r\n$%d\r\n%s\r\n$3\r\nval\r\n$2\r\nEX\r\n$%d\r\n%s\r\n" % (len(key), key, len(ttl), ttl))
PY
rss1=$(rss_kb "$PID"); used1=$(used)
stop
redis=$(( (rss1 - rss0) * 1024 / KEYS ))
redis_used=$(( (used1 - used0) / KEYS ))
python3 -c "import sys; tw, r, u = map(int, sys.argv[1:]); print(f'{sys.argv[4] if len(sys.argv) > 4 else \"\"}ttlwheel {tw} B/key (RSS growth); Redis {r} B/key (RSS growth), {u} B/key (used_memory): ttlwheel/Redis {tw / r:.2f}x (RSS), {tw / u:.2f}x (used_memory)')" "$tw" "$redis" "$redis_used"
