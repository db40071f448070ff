#!/usr/bin/env bash
# Every figure of the engine issue (issue 15) in one run, one measurement after the other on the
# same build, each by the script or benchmark that owns it:
#   1. expiry to the millisecond: a soak (server-measured lateness of wheel and heap keys), and
#      `cargo bench --bench expiry -- evict/1M` (1M keys due in one second);
#   2. memory: bench/memory_fleet.sh at 1M keys (against Redis, same names) and the memory
#      benchmark at 1M and 10M (in bench/index_ab.sh); a page of 100 keys at 1M
#      (`list-100/1M`); the 1M eviction with the listing index (`evict/1M/one-tick`);
#   3. renewals against the `dashmap` + bucket-sets baseline, 10k to 10M, 1 and 2 threads, with
#      our own index (OLD) and the `DashMap` index: bench/index_ab.sh;
#   4. 1M creations through the batch route: bench/creations.sh;
#   5. growth to 10M: the growth benchmark (in bench/index_ab.sh) and bench/growth.sh (over
#      HTTP, open-loop sampler);
#   6. renewals must not grow memory: bench/renewal_memory.sh (10 minutes).
# Persistence on wherever a server runs. Takes about 45 minutes. Knobs: SOAK_DURATION (90s),
# RENEWAL_DURATION (10m), INDEX_AB (1; 0 skips bench/index_ab.sh, for a quick look).
# Results: target/bench-engine/summary.md (every step's log beside it).
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=target/bench-engine
SOAK_DURATION=${SOAK_DURATION:-90s}
RENEWAL_DURATION=${RENEWAL_DURATION:-10m}
INDEX_AB=${INDEX_AB:-1}
PORT=17320 RECEIVER=127.0.0.1:17321
mkdir -p "$OUT"
SUMMARY="$OUT/summary.md"
say() { echo "== $*" >&2; }
section() { printf '\n### %s\n\n```\n' "$1" >>"$SUMMARY"; cat >>"$SUMMARY"; printf '```\n' >>"$SUMMARY"; }

cargo build --release -q -p ttlwheel -p ttlwheel-load
echo "Measured $(date -u +%Y-%m-%d) at $(git rev-parse --short HEAD)$(git diff --quiet || echo ' (plus uncommitted changes)'), $(nproc) cores." >"$SUMMARY"

if [ "$INDEX_AB" = 1 ]; then
    say "3 (and 2, 5): renewals, growth and memory with each index (bench/index_ab.sh)"
    bash bench/index_ab.sh >&2
    section "3. Renewals, growth and memory benchmarks, each index (bench/index_ab.sh)" <target/index-ab/table.md
fi

say "1: soak, $SOAK_DURATION"
rm -rf "$OUT/soak-data"
target/release/ttlwheel --listen "127.0.0.1:$PORT" --data-dir "$OUT/soak-data" \
    --webhook-url "http://$RECEIVER/hook" >"$OUT/soak-server.log" 2>&1 &
SERVER=$!
trap 'kill $SERVER 2>/dev/null || true' EXIT
until curl -sf "http://127.0.0.1:$PORT/healthz" >/dev/null 2>&1; do sleep 0.05; done
target/release/ttlwheel-load --target "127.0.0.1:$PORT" soak --keys 20000 \
    --duration "$SOAK_DURATION" --receiver "$RECEIVER" >"$OUT/soak.log" 2>&1 || true
kill "$SERVER"; wait "$SERVER" 2>/dev/null || true
grep '^soak:' "$OUT/soak.log" | section "1. Soak (20,000 keys, $SOAK_DURATION)"

say "1, 2: mass eviction and a page of the listing (criterion)"
cargo bench -q --bench expiry -- 'evict/1M|list-100/1M' 2>&1 | tee "$OUT/criterion.log" >&2
grep -E '^(evict|list-100)/|time:' "$OUT/criterion.log" | section "1, 2. Mass eviction of 1M keys and a page of 100 at 1M (cargo bench --bench expiry -- 'evict/1M|list-100/1M')"

say "2: memory against Redis (bench/memory_fleet.sh)"
SIZES=1000000 bash bench/memory_fleet.sh 2>/dev/null | tail -1 | section "2. Memory against Redis at 1M keys (bench/memory_fleet.sh: keys, ttlwheel empty, growth, B/key, Redis empty, growth, B/key, ratio)"

say "4: creations (bench/creations.sh)"
bash bench/creations.sh 2>&1 | grep -E 'creations, median' | section "4. 1M creations through the batch route (bench/creations.sh)"

say "5: growth to 10M over HTTP (bench/growth.sh)"
bash bench/growth.sh 2>&1 | section "5. Growth to 10M keys over HTTP, open-loop sampler at 200/s (bench/growth.sh)"

say "6: renewals and memory (bench/renewal_memory.sh, $RENEWAL_DURATION)"
DURATION="$RENEWAL_DURATION" bash bench/renewal_memory.sh 2>&1 | tail -1 \
    | section "6. RSS under renewals of 100k long-TTL keys (bench/renewal_memory.sh, $RENEWAL_DURATION)"

cat "$SUMMARY"
