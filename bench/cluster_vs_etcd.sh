#!/usr/bin/env bash
# A 3-member ttlwheel beside a 3-member etcd 3.4, both on loopback on this machine, in one run
# (issue 28, section 6): renewals and creations committed on a quorum.
#
# - renewals: ttlwheel single heartbeats on KEYS preloaded keys (`ttlwheel-load heartbeat`)
#   against etcd lease keep-alives on KEYS granted leases (bench/etcd-load: one
#   LeaseKeepAlive stream per connection, as clientv3 renews), CONNECTIONS connections with
#   one request in flight each, closed loop, on the leader of each (both renew in the leader's
#   memory, off the log);
# - creations: etcd's key with a TTL is a lease grant then a put on it (two proposals, each
#   committed on a quorum and fsynced before its answer), CONNECTIONS connections; ttlwheel's
#   is a heartbeat on a new key, single (CONNECTIONS connections) and in batches of 1,000
#   (`POST /v1/heartbeats/batch`, 4 connections, as bench/cluster_throughput.sh), each
#   committed on a quorum before its answer.
# fsync on for both: etcd always syncs its WAL; ttlwheel runs `--fsync always` (a member
# syncs its Raft log before acknowledging in any case). Data dirs on the same ext4 disk.
# ROUNDS rounds, fresh data dirs each, the two systems taking turns first; medians, ranges.
# CPU seconds of every member and of the load tool are recorded per run (the 2 cores are
# shared by the 3 members and the load tool).
#
#   bash bench/cluster_vs_etcd.sh     # ROUNDS=3 KEYS=100000 CONNECTIONS=50 DURATION=10s
# Needs etcd and etcdctl 3.4 (Debian 12: apt-get install etcd-server etcd-client).
set -euo pipefail
cd "$(dirname "$0")/.."
source bench/lib.sh
source bench/cluster_lib.sh
ROUNDS=${ROUNDS:-3}
KEYS=${KEYS:-100000}
CONNECTIONS=${CONNECTIONS:-50}
DURATION=${DURATION:-10s}
OUT=${OUT:-$(mktemp -d /var/tmp/ttlwheel-vs-etcd.XXXXXX)}
TARGET_DIR=${CARGO_TARGET_DIR:-target}
cargo build --release --quiet -p ttlwheel --bin ttlwheel
cargo build --release --quiet -p ttlwheel-load
cargo build --release --quiet --manifest-path bench/etcd-load/Cargo.toml --target-dir "$TARGET_DIR"
SERVER=${SERVER:-$TARGET_DIR/release/ttlwheel}
LOAD=$TARGET_DIR/release/ttlwheel-load
ETCD_LOAD=$TARGET_DIR/release/etcd-load
ETCD_PIDS=()
stop_etcd() {
    local pid
    for pid in "${ETCD_PIDS[@]}"; do kill -9 "$pid" 2>/dev/null || true; wait "$pid" 2>/dev/null || true; done
    ETCD_PIDS=()
}
trap 'stop_members; stop_etcd' EXIT

# Starts etcd members 1..3 on fresh dirs $1-1..3 (client ports 2379N, peer ports 2380N) and
# sets ETCD_LEADER to the leader's client URL.
start_etcd() {
    local prefix=$1 initial="e1=http://127.0.0.1:23801,e2=http://127.0.0.1:23802,e3=http://127.0.0.1:23803"
    for id in 1 2 3; do
        rm -rf "$prefix-$id"
        etcd --name "e$id" --data-dir "$prefix-$id" --logger zap --log-outputs stderr \
            --listen-client-urls "http://127.0.0.1:2379$id" --advertise-client-urls "http://127.0.0.1:2379$id" \
            --listen-peer-urls "http://127.0.0.1:2380$id" --initial-advertise-peer-urls "http://127.0.0.1:2380$id" \
            --initial-cluster "$initial" --initial-cluster-state new --initial-cluster-token bench \
            >"$prefix-$id.log" 2>&1 &
        ETCD_PIDS[$id]=$!
    done
    for _ in $(seq 600); do
        ETCD_LEADER=$(ETCDCTL_API=3 etcdctl --command-timeout=1s \
            --endpoints http://127.0.0.1:23791,http://127.0.0.1:23792,http://127.0.0.1:23793 \
            endpoint status -w json 2>/dev/null | python3 -c '
import json, sys
for member in json.load(sys.stdin):
    status = member["Status"]
    if status["header"]["member_id"] == status["leader"]:
        print(member["Endpoint"])' 2>/dev/null || true)
        [ -n "$ETCD_LEADER" ] && return
        sleep 0.1
    done
    echo "etcd elected no leader" >&2; return 1
}
etcd_cpu() { local id; for id in 1 2 3; do printf '%s ' "$(cpu_s "${ETCD_PIDS[$id]}")"; done; echo; }

# Runs "$@" (a load tool) with its output in $1.log and its CPU in $1.client-cpu, and the
# members' CPU during it in $1.cpu ("before" and "after" lines, member 1..3); $2 names the
# function giving the members' CPU.
measured() {
    local name=$1 cpu_of=$2; shift 2
    "$cpu_of" >"$name.cpu"
    # A run that saw errors exits 1: its errors are reported below, not fatal here.
    /usr/bin/time -f '%U %S' -o "$name.client-cpu" "$@" >"$name.log" 2>&1 || true
    "$cpu_of" >>"$name.cpu"
}

run_etcd() { # $1: round
    local r=$1
    start_etcd "$OUT/etcd-$r"
    echo "round $r: etcd leader $ETCD_LEADER"
    measured "$OUT/etcd-keepalive-$r" etcd_cpu "$ETCD_LOAD" --endpoint "$ETCD_LEADER" \
        --connections "$CONNECTIONS" --duration "$DURATION" keepalive --leases "$KEYS"
    measured "$OUT/etcd-grant-put-$r" etcd_cpu "$ETCD_LOAD" --endpoint "$ETCD_LEADER" \
        --connections "$CONNECTIONS" --duration "$DURATION" grant-put --prefix "r$r/"
    stop_etcd
}

run_ttlwheel() { # $1: round
    local r=$1
    start_cluster "$OUT/ttlwheel-$r"
    echo "round $r: ttlwheel leader $LEADER"
    measured "$OUT/ttlwheel-renew-$r" members_cpu "$LOAD" --target "$LEADER" heartbeat \
        --keys "$KEYS" --ttl 600s --connections "$CONNECTIONS" --duration "$DURATION"
    measured "$OUT/ttlwheel-create-single-$r" members_cpu "$LOAD" --target "$LEADER" heartbeat \
        --keys 100000000 --no-preload --prefix "s$r-" --ttl 600s --connections "$CONNECTIONS" --duration "$DURATION"
    measured "$OUT/ttlwheel-create-batch-$r" members_cpu "$LOAD" --target "$LEADER" batch --batch 1000 \
        --keys 100000000 --no-preload --prefix "b$r-" --ttl 600s --connections 4 --duration "$DURATION"
    stop_members
}

# Median fdatasync latency of a 100-byte append on the data dirs' disk, in ms: ttlwheel's
# single creations pay one per entry on the leader (see BENCHMARKS.md), so each round logs it.
fsync_probe() {
    python3 - "$OUT/fsync-probe" <<'PY'
import os, statistics, sys, time
fd = os.open(sys.argv[1], os.O_WRONLY | os.O_CREAT | os.O_APPEND)
times = []
for _ in range(300):
    start = time.perf_counter(); os.write(fd, b"x" * 100); os.fdatasync(fd)
    times.append((time.perf_counter() - start) * 1000)
os.close(fd); os.unlink(sys.argv[1])
print(f"{statistics.median(times):.2f}")
PY
}

for round in $(seq "$ROUNDS"); do
    echo "round $round: fdatasync p50 $(fsync_probe) ms before" | tee -a "$OUT/fsync.txt"
    if (( round % 2 )); then run_etcd "$round"; run_ttlwheel "$round"; else run_ttlwheel "$round"; run_etcd "$round"; fi
done

# "median (min-max)" of a RESULT field over the rounds of run $1.
summary() {
    local values
    values=$(for r in $(seq "$ROUNDS"); do result "$OUT/$1-$r.log" "$2"; done)
    printf '%.0f (%.0f-%.0f)' "$(echo "$values" | median)" "$(echo "$values" | sort -g | head -1)" "$(echo "$values" | sort -g | tail -1)"
}
# Median over the rounds of run $1 of: CPU seconds of the members (leader, the two others
# summed) and of the load tool, per second of the run.
cpu_summary() {
    python3 - "$OUT" "$1" "$ROUNDS" <<'PY'
import statistics, sys
out, run, rounds = sys.argv[1], sys.argv[2], int(sys.argv[3])
members, client = [], []
for r in range(1, rounds + 1):
    before, after = (list(map(float, line.split())) for line in open(f"{out}/{run}-{r}.cpu"))
    used = sorted((a - b for a, b in zip(after, before)), reverse=True)
    members.append(used)
    client.append(sum(map(float, open(f"{out}/{run}-{r}.client-cpu").read().split())))
med = lambda xs: statistics.median(xs)
print(f"members' CPU s (busiest, others): {med([m[0] for m in members]):.1f}, "
      f"{med([m[1] + m[2] for m in members]):.1f}; load tool {med(client):.1f} (incl. warm-up and preload)")
PY
}
echo
cat "$OUT/fsync.txt"
echo "rounds: $ROUNDS; $KEYS keys/leases renewed; $CONNECTIONS connections; each run $DURATION after 3 s warm-up; logs in $OUT"
echo "renewals/s     etcd keep-alive     $(summary etcd-keepalive requests_per_s)   $(cpu_summary etcd-keepalive)"
echo "renewals/s     ttlwheel heartbeat  $(summary ttlwheel-renew requests_per_s)   $(cpu_summary ttlwheel-renew)"
echo "creations/s    etcd grant+put      $(summary etcd-grant-put requests_per_s)   $(cpu_summary etcd-grant-put)"
echo "creations/s    ttlwheel single     $(summary ttlwheel-create-single heartbeats_per_s)   $(cpu_summary ttlwheel-create-single)"
echo "creations/s    ttlwheel batched    $(summary ttlwheel-create-batch heartbeats_per_s)   $(cpu_summary ttlwheel-create-batch)"
for run in etcd-keepalive etcd-grant-put; do
    echo "$run latency p50/p99 ms per round: $(for r in $(seq "$ROUNDS"); do printf '%s/%s ' "$(result "$OUT/$run-$r.log" latency.p50_ms)" "$(result "$OUT/$run-$r.log" latency.p99_ms)"; done)"
done
for run in ttlwheel-renew ttlwheel-create-single ttlwheel-create-batch; do
    echo "$run latency per round: $(for r in $(seq "$ROUNDS"); do grep 'latency (' "$OUT/$run-$r.log" | sed 's/.*) //' | tr '\n' ' '; echo -n '| '; done)"
done
for run in etcd-keepalive etcd-grant-put ttlwheel-renew ttlwheel-create-single ttlwheel-create-batch; do
    echo "$run errors per round: $(for r in $(seq "$ROUNDS"); do printf '%s ' "$(result "$OUT/$run-$r.log" errors)"; done)"
done
echo "ttlwheel leaders' replication timeouts to a follower per round (WARN lines):"
for r in $(seq "$ROUNDS"); do printf '  round %s: %s\n' "$r" "$(cat "$OUT"/ttlwheel-"$r"-?.log | grep 'WARN openraft::replication: error replication' | grep -c 'timed out' || true)"; done
