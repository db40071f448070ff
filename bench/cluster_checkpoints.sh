#!/usr/bin/env bash
# What renewals cost a 3-member cluster holding 1M keys (issue 28, section 6): the leader keeps
# renewals in memory and every 200 ms (--checkpoint-interval) proposes the keys renewed since
# the last checkpoint with their time left, in entries of at most 4,096 keys, which every member
# syncs and applies. Measured: checkpoint entries and keys per entry, proposal-to-commit latency
# (the leader's ttlwheel_cluster_checkpoint_* metrics, src/cluster/metrics.rs), bytes the
# followers' logs grew by, and the CPU each member used, during
#   - "batch-100k": 100,000 renewals/s of random keys among the 1M, open loop: 100 requests/s
#     of 1,000 through `POST /v1/heartbeats/batch`, 4 connections (the rate the issue names);
#   - "single-max": single heartbeats on random keys, 50 connections, closed loop (as many as
#     the load tool gets through on this machine: the rate is printed);
#   - "idle": no load for the same time (the baseline of each member's CPU).
# ROUNDS rounds, a fresh cluster and 1M keys preloaded each (batches of 1,000, TTL 3600 s);
# release build, `--fsync always`, data dirs on this machine's disk. Medians, ranges.
#
#   bash bench/cluster_checkpoints.sh     # ROUNDS=3 KEYS=1000000 DURATION=20s
set -euo pipefail
cd "$(dirname "$0")/.."
source bench/lib.sh
source bench/cluster_lib.sh
ROUNDS=${ROUNDS:-3}
KEYS=${KEYS:-1000000}
DURATION=${DURATION:-20s}
OUT=${OUT:-$(mktemp -d /var/tmp/ttlwheel-checkpoints.XXXXXX)}
TARGET_DIR=${CARGO_TARGET_DIR:-target}
cargo build --release --quiet -p ttlwheel --bin ttlwheel
cargo build --release --quiet -p ttlwheel-load
SERVER=${SERVER:-$TARGET_DIR/release/ttlwheel}
LOAD=$TARGET_DIR/release/ttlwheel-load
trap stop_members EXIT

# One line of what a run changed: "<cpu s of members 1..3> <log bytes of members 1..3>" plus
# the leader's checkpoint metrics, written to $1.state before and after.
state() { # $1: file to append to; $2: data dir prefix
    local id
    {
        echo "time $(date +%s.%N)"
        echo "cpu $(members_cpu)"
        echo "log $(for id in 1 2 3; do printf '%s ' "$(du -sb "$2-$id/raft/log" | cut -f1)"; done)"
        echo "index $(curl -s "http://$LEADER/v1/cluster" | python3 -c 'import json,sys; print(json.load(sys.stdin)["committed_index"])')"
        curl -s "http://$LEADER/metrics" | grep -E '^ttlwheel_cluster_checkpoint'
    } >>"$1"
    echo "----" >>"$1"
}

# Runs "$@" (or sleeps, for idle) between two states; the load tool's output in $1.log.
measured() {
    local name=$1 data=$2; shift 2
    state "$name.state" "$data"
    if [ "$1" = idle ]; then sleep "${DURATION%s}"; echo "idle" >"$name.log"; else "$@" >"$name.log" 2>&1 || true; fi
    state "$name.state" "$data"
}

for round in $(seq "$ROUNDS"); do
    data="$OUT/c-$round"
    start_cluster "$data"
    echo "round $round: leader $LEADER_ID; preloading $KEYS keys"
    # Preload (batches of 1,000) with 1 ms of load after it: the keys, not the load.
    "$LOAD" --target "$LEADER" heartbeat --keys "$KEYS" --ttl 3600s --connections 1 --warmup 0s \
        --duration 1ms >"$OUT/preload-$round.log" 2>&1
    sleep 2 # the preload's last entries applied everywhere
    echo "$LEADER_ID" >"$OUT/leader-$round"
    measured "$OUT/idle-$round" "$data" idle
    measured "$OUT/batch-100k-$round" "$data" "$LOAD" --target "$LEADER" batch --batch 1000 --rate 100 \
        --keys "$KEYS" --no-preload --ttl 3600s --connections 4 --duration "$DURATION"
    measured "$OUT/single-max-$round" "$data" "$LOAD" --target "$LEADER" heartbeat --keys "$KEYS" \
        --no-preload --ttl 3600s --connections 50 --duration "$DURATION"
    stop_members
    rm -rf "$data"-?/ # 1M keys x 3 members; the logs stay
done

python3 - "$OUT" "$ROUNDS" "${DURATION%s}" <<'PY'
import json, re, statistics, sys
out, rounds, duration = sys.argv[1], int(sys.argv[2]), float(sys.argv[3])

def parse(block):
    state = {"buckets": {}}
    for line in block.strip().splitlines():
        if line.startswith("time "):
            state["time"] = float(line.split()[1])
        elif line.startswith(("cpu ", "log ")):
            state[line[:3]] = [float(x) for x in line[4:].split()]
        elif line.startswith("index "):
            state["index"] = int(line.split()[1])
        else:
            name, value = line.rsplit(" ", 1)
            bucket = re.match(r'(\w+)_bucket\{le="([^"]+)"\}', name)
            if bucket:
                state["buckets"].setdefault(bucket[1], []).append((float(bucket[2]), float(value)))
            else:
                state[name] = float(value)
    return state

def quantile(before, after, metric, q):
    """The upper bound of the bucket holding quantile q of what the run added."""
    pairs = list(zip(before["buckets"].get(metric, []), after["buckets"].get(metric, [])))
    counts = [(le, a - b) for (le, b), (_, a) in pairs]
    total = counts[-1][1] if counts else 0
    for le, cumulative in counts:
        if total and cumulative >= q * total:
            return le
    return float("nan")

def result_line(path):
    lines = [l for l in open(path) if l.startswith("RESULT ")]
    return json.loads(lines[-1][7:])["outcome"] if lines else None

def med(values):
    values = sorted(values)
    return f"{statistics.median(values):.3g} ({values[0]:.3g}-{values[-1]:.3g})"

print(f"rounds: {rounds}; each run {duration:.0f} s after a 3 s warm-up; rates over both; logs in {out}")
for run in ("idle", "batch-100k", "single-max"):
    rows = []
    for r in range(1, rounds + 1):
        leader = int(open(f"{out}/leader-{r}").read()) - 1
        before, after = map(parse, open(f"{out}/{run}-{r}.state").read().split("----")[:2])
        d = lambda name: after.get(name, 0) - before.get(name, 0)
        entries = d("ttlwheel_cluster_checkpoints_total")
        keys = d("ttlwheel_cluster_checkpoint_keys_sum")
        cpu = [a - b for a, b in zip(after["cpu"], before["cpu"])]
        grown = [a - b for a, b in zip(after["log"], before["log"])]
        followers = [i for i in range(3) if i != leader]
        # The window: the load tool's warm-up (3 s, the same load) and measured time.
        window = after["time"] - before["time"]
        entries_in_log = after["index"] - before["index"]
        outcome = result_line(f"{out}/{run}-{r}.log") if run != "idle" else None
        rows.append({
            "renewals_per_s": outcome["heartbeats_per_s"] if outcome else 0,
            "errors": outcome["errors"] if outcome else 0,
            "window_s": window,
            "checkpoint_entries_per_s": entries / window,
            "log_entries_per_s": entries_in_log / window,
            "keys_per_entry": keys / entries if entries else 0,
            "checkpointed_keys_per_s": keys / window,
            "commit_ms_mean": 1000 * d("ttlwheel_cluster_checkpoint_seconds_sum") / entries if entries else 0,
            # p50/p99: the upper bound of the histogram bucket holding it.
            "commit_ms_p50": 1000 * quantile(before, after, "ttlwheel_cluster_checkpoint_seconds", 0.5),
            "commit_ms_p99": 1000 * quantile(before, after, "ttlwheel_cluster_checkpoint_seconds", 0.99),
            "failed": d("ttlwheel_cluster_checkpoints_failed_total"),
            "follower_log_bytes_per_s": statistics.mean(grown[i] for i in followers) / window,
            "bytes_per_entry": statistics.mean(grown[i] for i in followers) / entries_in_log if entries_in_log else 0,
            "leader_cpu_cores": cpu[leader] / window,
            "follower_cpu_cores": statistics.mean(cpu[i] for i in followers) / window,
        })
    print(f"\n{run}: median (min-max) over rounds")
    for key in rows[0]:
        print(f"  {key:26} {med([row[key] for row in rows])}")
    with open(f"{out}/{run}.json", "w") as f:
        json.dump(rows, f)
PY
