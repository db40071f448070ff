#!/usr/bin/env bash
# Where a 3-member cluster's CPU goes during single creations (one new key per request,
# CONNECTIONS connections, closed loop, as bench/cluster_vs_etcd.sh runs them): each member's CPU
# seconds over PERF_SECONDS, and a `perf record -e cpu-clock` profile of the members in
# PERF_IDS (default: the leader), summed by thread and by symbol.
#
#   bash bench/cluster_profile.sh     # CONNECTIONS=50 DURATION=16s PERF_SECONDS=8 PERF=1
# Root (perf; on this VM the default event records nothing: cpu-clock does). PERF=0 measures
# the rate and the CPU without perf. Every process it starts is stopped by PID.
set -euo pipefail
cd "$(dirname "$0")/.."
source bench/lib.sh
source bench/cluster_lib.sh
CONNECTIONS=${CONNECTIONS:-50}
DURATION=${DURATION:-16s}
PERF_SECONDS=${PERF_SECONDS:-8}
OUT=${OUT:-$(mktemp -d /var/tmp/ttlwheel-cluster-profile.XXXXXX)}
build_server_and_load
PERF_PIDS=()
cleanup() {
    local pid
    for pid in "${PERF_PIDS[@]}"; do kill -INT "$pid" 2>/dev/null || true; done
    stop_members
}
trap cleanup EXIT

start_cluster "$OUT/m"
echo "leader: member $LEADER_ID"
"$LOAD" --target "$LEADER" heartbeat --keys 100000000 --no-preload --prefix "s-" --ttl 600s \
    --connections "$CONNECTIONS" --duration "$DURATION" >"$OUT/load.log" 2>&1 &
load=$!
sleep 4
if [ "${PERF:-1}" = 1 ]; then
    for id in ${PERF_IDS:-$LEADER_ID}; do
        perf record -e cpu-clock -F 999 -o "$OUT/perf-$id.data" -p "${MEMBER_PIDS[$id]}" \
            -- sleep "$PERF_SECONDS" >/dev/null 2>&1 &
        PERF_PIDS+=($!)
    done
fi
before=$(members_cpu); sleep "$PERF_SECONDS"; after=$(members_cpu)
wait "$load"
for pid in "${PERF_PIDS[@]}"; do wait "$pid" || true; done
PERF_PIDS=()
grep -E "req/s|p50" "$OUT/load.log"
echo "members' CPU seconds over ${PERF_SECONDS} s (members 1 2 3): before $before, after $after"
for id in ${PERF_IDS:-$LEADER_ID}; do
    [ -f "$OUT/perf-$id.data" ] || continue
    echo "--- member $id, by thread"
    perf report -i "$OUT/perf-$id.data" --no-children --sort comm 2>/dev/null | grep -v '^#' | grep -v '^$' | head -6
    echo "--- member $id, by symbol"
    perf report -i "$OUT/perf-$id.data" --no-children --sort dso,symbol 2>/dev/null |
        grep -v '^#' | grep -v '^$' | cut -c1-120 | head -25
done
echo "logs and profiles in $OUT"
