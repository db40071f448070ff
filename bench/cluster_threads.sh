#!/usr/bin/env bash
# CPU per thread of each of 3 members during single creations (one new key per request,
# CONNECTIONS connections, closed loop): the clock ticks (1/100 s) each thread used over
# WINDOW seconds, from /proc/<pid>/task/*/stat. With CONNECTIONS=1 each entry carries one key,
# so ticks / (rate x WINDOW) is a member's fixed cost per Raft entry, thread by thread.
#
#   bash bench/cluster_threads.sh     # CONNECTIONS=1 WINDOW=5 (SERVER= a built binary)
# Every process it starts is stopped by PID; binds 127.0.0.1 only.
set -euo pipefail
cd "$(dirname "$0")/.."
source bench/lib.sh
source bench/cluster_lib.sh
CONNECTIONS=${CONNECTIONS:-1}
WINDOW=${WINDOW:-5}
build_server_and_load
OUT=${OUT:-$(mktemp -d /var/tmp/ttlwheel-cluster-threads.XXXXXX)}
trap stop_members EXIT

# Ticks used by each thread name of process $1 (threads of one name summed).
thread_ticks() {
    local task
    for task in /proc/"$1"/task/*; do
        awk -v name="$(cat "$task/comm")" '{ print name, $14 + $15 }' "$task/stat"
    done | awk '{ ticks[$1] += $2 } END { for (name in ticks) print name, ticks[name] }' | sort
}

start_cluster "$OUT/m"
"$LOAD" --target "$LEADER" heartbeat --keys 100000000 --no-preload --prefix "s-" --ttl 600s \
    --connections "$CONNECTIONS" --duration "$((WINDOW + 5))s" >"$OUT/load.log" 2>&1 &
load=$!
sleep 3
for id in 1 2 3; do thread_ticks "${MEMBER_PIDS[$id]}" >"$OUT/before-$id"; done
sleep "$WINDOW"
for id in 1 2 3; do thread_ticks "${MEMBER_PIDS[$id]}" >"$OUT/after-$id"; done
wait "$load"
grep -E "req/s|p50" "$OUT/load.log"
for id in 1 2 3; do
    echo "member $id (leader: member $LEADER_ID), ticks over ${WINDOW} s:"
    join "$OUT/before-$id" "$OUT/after-$id" | awk '{ if ($3 > $2) print "   ", $1, $3 - $2 }'
done
