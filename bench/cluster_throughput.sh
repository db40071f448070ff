#!/usr/bin/env bash
# A 3-member cluster's throughput against a single node, in one run (issue 28, section 6), all
# on this machine, persistence on with the default fsync, release builds:
# - renewals: single heartbeats on KEYS preloaded keys over 50 connections (closed loop), on the
#   single node and on the cluster's leader (renewals are the leader's memory; every 200 ms it
#   checkpoints the keys renewed, which replicates to the followers: their CPU is reported);
# - creations: batches of 1,000 new keys over 4 connections, committed on a quorum before each
#   answer (`--no-preload` on a 100M-key space: nearly every heartbeat creates a key).
# ROUNDS runs of each, alternating single node and cluster; medians. The followers run on the
# same 2 cores as the leader and the load tool, so the cluster pays for all three members here.
#
#   bash bench/cluster_throughput.sh        # ROUNDS=3 KEYS=100000 DURATION=10s by default
set -euo pipefail
cd "$(dirname "$0")/.."
source bench/lib.sh
ROUNDS=${ROUNDS:-3}
KEYS=${KEYS:-100000}
DURATION=${DURATION:-10s}
OUT=${OUT:-$(mktemp -d /tmp/ttlwheel-cluster-tp.XXXXXX)}
cargo build --release --quiet --bin ttlwheel -p ttlwheel
cargo build --release --quiet -p ttlwheel-load
SERVER=${SERVER:-target/release/ttlwheel}
LOAD=target/release/ttlwheel-load
TARGET=127.0.0.1:17878
PIDS=()
stop_all() { for pid in "${PIDS[@]}"; do kill -9 "$pid" 2>/dev/null || true; done; PIDS=(); stop; }
trap stop_all EXIT

renew() { # $1: API host:port; $2: log
    "$LOAD" --target "$1" heartbeat --keys "$KEYS" --connections 50 --duration "$DURATION" >"$2" 2>&1
}
create() { # $1: API host:port; $2: log; $3: key prefix
    "$LOAD" --target "$1" batch --batch 1000 --connections 4 --keys 100000000 --no-preload \
        --prefix "$3" --duration "$DURATION" >"$2" 2>&1
}

start_cluster() { # starts members 1..3 under $OUT/c-$1; sets LEADER (its API) and LEADER_ID
    local initial="1=127.0.0.1:17101,2=127.0.0.1:17102,3=127.0.0.1:17103"
    for id in 1 2 3; do
        rm -rf "$OUT/c-$1-$id"
        "$SERVER" --node-id "$id" --listen "127.0.0.1:1788$id" --cluster-listen "127.0.0.1:1710$id" \
            --initial-cluster "$initial" --data-dir "$OUT/c-$1-$id" >>"$OUT/cluster.log" 2>&1 &
        PIDS+=($!)
    done
    for _ in $(seq 600); do
        for id in 1 2 3; do
            if curl -sf "http://127.0.0.1:1788$id/readyz" >/dev/null 2>&1 &&
                curl -sf "http://127.0.0.1:1788$id/v1/cluster" | grep -q '"role":"leader"'; then
                LEADER="127.0.0.1:1788$id"; LEADER_ID=$id; return
            fi
        done
        sleep 0.05
    done
    echo "no leader" >&2; exit 1
}

for round in $(seq "$ROUNDS"); do
    serve --data-dir "$OUT/data"
    renew "$TARGET" "$OUT/single-renew-$round.log"
    create "$TARGET" "$OUT/single-create-$round.log" "c$round-"
    stop
    start_cluster "$round"   # not in a subshell: PIDS must stay set
    leader=$LEADER leader_id=$LEADER_ID
    before=(); for i in 0 1 2; do before+=("$(cpu_s "${PIDS[$i]}")"); done
    renew "$leader" "$OUT/cluster-renew-$round.log"
    after=(); for i in 0 1 2; do after+=("$(cpu_s "${PIDS[$i]}")"); done
    for i in 0 1 2; do
        role=follower; [[ $((i + 1)) == "$leader_id" ]] && role=leader
        echo "$round $role $(python3 -c "print(${after[$i]} - ${before[$i]})")" >>"$OUT/cluster-cpu.txt"
    done
    curl -s "http://$leader/metrics" | grep -E '^ttlwheel_cluster_checkpoint_(keys|seconds)_(sum|count)|^ttlwheel_cluster_checkpoints_' \
        >"$OUT/cluster-metrics-$round.txt"
    create "$leader" "$OUT/cluster-create-$round.log" "c$round-"
    stop_all
done

med() { for round in $(seq "$ROUNDS"); do result "$OUT/$1-$round.log" "$2"; done | median; }
echo "rounds: $ROUNDS; keys renewed: $KEYS; each run $DURATION; logs in $OUT"
single_renew=$(med single-renew requests_per_s); cluster_renew=$(med cluster-renew requests_per_s)
single_create=$(med single-create heartbeats_per_s); cluster_create=$(med cluster-create heartbeats_per_s)
echo "renewals/s (single heartbeats, 50 connections): single node $single_renew, cluster leader $cluster_renew, ratio $(python3 -c "print(round($cluster_renew / $single_renew, 2))")"
echo "creations/s (batches of 1,000, 4 connections): single node $single_create, cluster $cluster_create, ratio $(python3 -c "print(round($cluster_create / $single_create, 2))")"
echo "CPU seconds during the cluster's renewal runs (round role seconds):"; cat "$OUT/cluster-cpu.txt"
echo "checkpoints (leader's /metrics after each renewal run):"; cat "$OUT"/cluster-metrics-*.txt
