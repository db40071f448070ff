#!/usr/bin/env bash
# Where a single (unbatched) creation's time goes on a 3-member cluster: one key per request,
# one log entry per request, CONNECTIONS connections closed loop. Each round runs it twice,
# once with the members' data dirs on this machine's disk and once on tmpfs (SHM, where an
# fsync costs nothing), and counts the members' syscalls meanwhile (perf stat tracepoints:
# fdatasync, and recvfrom as the followers' peer requests). What it shows: on the leader one
# fdatasync per entry whatever the concurrency (openraft 0.9's RaftCore awaits each append's
# flush before it takes the next client write: `append_to_log` in core/raft_core.rs), so the
# rate follows the disk's sync latency, not the load.
#
#   bash bench/cluster_single_creations.sh     # ROUNDS=3 CONNECTIONS=50 DURATION=10s
# Root (perf). Every process it starts is stopped by PID.
set -euo pipefail
cd "$(dirname "$0")/.."
source bench/lib.sh
source bench/cluster_lib.sh
ROUNDS=${ROUNDS:-3}
CONNECTIONS=${CONNECTIONS:-50}
DURATION=${DURATION:-10s}
SHM=${SHM:-/dev/shm}
OUT=${OUT:-$(mktemp -d /var/tmp/ttlwheel-single-creations.XXXXXX)}
TARGET_DIR=${CARGO_TARGET_DIR:-target}
cargo build --release --quiet -p ttlwheel --bin ttlwheel
cargo build --release --quiet -p ttlwheel-load
SERVER=${SERVER:-$TARGET_DIR/release/ttlwheel}
LOAD=$TARGET_DIR/release/ttlwheel-load
SHM_DIR=$(mktemp -d "$SHM/ttlwheel-single-creations.XXXXXX")
PERF_PIDS=()
cleanup() {
    local pid
    for pid in "${PERF_PIDS[@]}"; do kill -INT "$pid" 2>/dev/null || true; done
    stop_members
    rm -rf "$SHM_DIR"
}
trap cleanup EXIT
SECONDS_RUN=${DURATION%s}

committed() { curl -s "http://$LEADER/v1/cluster" | python3 -c 'import json,sys; print(json.load(sys.stdin)["committed_index"])'; }

run() { # $1: disk|tmpfs; $2: round; $3: data dir prefix
    local name="$OUT/$1-$2" id
    start_cluster "$3"
    "$LOAD" --target "$LEADER" heartbeat --keys 100000000 --no-preload --prefix "s$2-" --ttl 600s \
        --connections "$CONNECTIONS" --warmup 3s --duration "$DURATION" >"$name.log" 2>&1 &
    local load=$!
    sleep 3 # the warm-up
    local first; first=$(committed)
    PERF_PIDS=()
    for id in 1 2 3; do
        perf stat -x, -e syscalls:sys_enter_fdatasync,syscalls:sys_enter_recvfrom \
            -p "${MEMBER_PIDS[$id]}" -o "$name.perf-$id" -- sleep "$SECONDS_RUN" &
        PERF_PIDS+=($!)
    done
    wait "${PERF_PIDS[@]}"
    PERF_PIDS=()
    local last; last=$(committed)
    wait "$load" || true
    echo "$LEADER_ID $first $last" >"$name.index"
    stop_members
    rm -rf "$3"-?/
}

for round in $(seq "$ROUNDS"); do
    if (( round % 2 )); then
        run disk "$round" "$OUT/disk-$round"; run tmpfs "$round" "$SHM_DIR/tmpfs-$round"
    else
        run tmpfs "$round" "$SHM_DIR/tmpfs-$round"; run disk "$round" "$OUT/disk-$round"
    fi
done

python3 - "$OUT" "$ROUNDS" "$SECONDS_RUN" <<'PY'
import json, statistics, sys
out, rounds, seconds = sys.argv[1], int(sys.argv[2]), float(sys.argv[3])

def counts(path):
    found = {}
    for line in open(path):
        parts = line.strip().split(",")
        if len(parts) > 2 and parts[2].startswith("syscalls:"):
            found[parts[2].split("sys_enter_")[1]] = float(parts[0])
    return found

def spread(values):
    values = sorted(values)
    return f"{statistics.median(values):.3g} ({values[0]:.3g}-{values[-1]:.3g})"

print(f"rounds: {rounds}; single creations, {seconds:.0f} s measured; logs in {out}")
for where in ("disk", "tmpfs"):
    rows = {"creations_per_s": [], "entries_per_s": [], "leader_fdatasync_per_entry": [],
            "follower_peer_requests_per_s": [], "entries_per_follower_request": []}
    for r in range(1, rounds + 1):
        name = f"{out}/{where}-{r}"
        leader, first, last = map(int, open(f"{name}.index").read().split())
        entries = last - first
        lines = [l for l in open(f"{name}.log") if l.startswith("RESULT ")]
        rows["creations_per_s"].append(json.loads(lines[-1][7:])["outcome"]["heartbeats_per_s"])
        rows["entries_per_s"].append(entries / seconds)
        rows["leader_fdatasync_per_entry"].append(counts(f"{name}.perf-{leader}")["fdatasync"] / entries)
        followers = [i for i in (1, 2, 3) if i != leader]
        requests = statistics.mean(counts(f"{name}.perf-{i}")["recvfrom"] for i in followers)
        rows["follower_peer_requests_per_s"].append(requests / seconds)
        rows["entries_per_follower_request"].append(entries / requests)
    print(f"\n{where}: median (min-max)")
    for key, values in rows.items():
        print(f"  {key:32} {spread(values)}")
PY
