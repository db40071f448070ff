#!/usr/bin/env bash
# Renewals must not grow memory: KEYS keys with a long TTL (3600 s), each renewed once a second
# in order (ttlwheel-load batch --sequential, open loop at KEYS/1000 requests of 1,000 per
# second) for DURATION, persistence on. Samples the server's RSS every 10 s and prints it, then
# the growth over minutes 2 to the end (target: <= 5 %).
#
# Usage: bash bench/renewal_memory.sh     KEYS=100000 DURATION=10m TTL=3600s
# The server binds 127.0.0.1 only and is stopped by PID. Results: target/bench-renewal-memory/.
set -euo pipefail
cd "$(dirname "$0")/.."

KEYS=${KEYS:-100000}
DURATION=${DURATION:-10m}
TTL=${TTL:-3600s}
PORT=${PORT:-17914}
OUT=${OUT:-target/bench-renewal-memory}
mkdir -p "$OUT"
cargo build --release -q -p ttlwheel -p ttlwheel-load
SERVER=${SERVER:-target/release/ttlwheel}
LOAD=target/release/ttlwheel-load
TARGET="127.0.0.1:$PORT"
. bench/lib.sh

serve --data-dir "$OUT/data"
rss_mb() { awk '{printf "%.1f", $1 / 1024}' <<<"$(rss_kb "$PID")"; }

echo "idle: $(rss_mb) MB"
"$LOAD" --target "$TARGET" batch --keys "$KEYS" --ttl "$TTL" --sequential \
  --rate "$((KEYS / 1000))" --connections 4 --warmup 0s --duration "$DURATION" \
  >"$OUT/load.log" 2>&1 &
LOAD_PID=$!
: >"$OUT/rss.tsv"
started=$(date +%s)
while kill -0 "$LOAD_PID" 2>/dev/null; do
  sleep 10
  kill -0 "$LOAD_PID" 2>/dev/null || break
  echo -e "$(( $(date +%s) - started ))\t$(rss_mb)" | tee -a "$OUT/rss.tsv"
done
wait "$LOAD_PID" || { echo "the load failed: see $OUT/load.log" >&2; exit 1; }
grep -v '^RESULT' "$OUT/load.log" | tail -3
python3 - "$OUT/rss.tsv" <<'PY'
import sys
rows = [tuple(map(float, line.split())) for line in open(sys.argv[1]) if line.strip()]
def at(seconds):  # the first sample at or after `seconds` (the last one for a short run)
    return next((rss for t, rss in rows if t >= seconds), rows[-1][1])
last_t, last = rows[-1]
print(f"RSS at 1 min {at(60):.1f} MB, at 2 min {at(120):.1f} MB, at {last_t / 60:.1f} min "
      f"{last:.1f} MB: growth over minutes 2-{last_t / 60:.0f} {(last - at(120)) / at(120) * 100:+.1f} %")
PY
