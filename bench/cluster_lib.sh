# Helpers for the bench scripts that run a 3-member ttlwheel cluster (source it after
# bench/lib.sh): starting the members on loopback with their PIDs kept in MEMBER_PIDS (index
# = node id), finding the leader, stopping them by PID. Members listen on API ports
# ${API_BASE}1..3 and peer ports ${PEER_BASE}1..3 (127.0.0.1 only; cluster_throughput.sh uses
# 1788x/1710x, so these default elsewhere).
API_BASE=${API_BASE:-1792}
PEER_BASE=${PEER_BASE:-1793}
MEMBER_PIDS=()

# The API address (host:port) of member $1.
api_of() { echo "127.0.0.1:${API_BASE}$1"; }

# Starts member $1 on data dir $2 (kept if it holds a cluster), its log appended to $3; more
# flags after. Founding members get the initial cluster; `--join` callers pass their own.
start_member() {
    local id=$1 dir=$2 log=$3; shift 3
    "$SERVER" --node-id "$id" --listen "$(api_of "$id")" --cluster-listen "127.0.0.1:${PEER_BASE}$id" \
        --data-dir "$dir" --fsync always "$@" >>"$log" 2>&1 &
    MEMBER_PIDS[$id]=$!
}

# Starts members 1..3 on fresh data dirs $1-1..3 (logs $1-N.log) and waits for a leader.
start_cluster() {
    local prefix=$1 initial="1=127.0.0.1:${PEER_BASE}1,2=127.0.0.1:${PEER_BASE}2,3=127.0.0.1:${PEER_BASE}3"
    for id in 1 2 3; do
        rm -rf "$prefix-$id"
        start_member "$id" "$prefix-$id" "$prefix-$id.log" --initial-cluster "$initial"
    done
    wait_leader
}

# Waits (up to 60 s) until a member says it leads and is ready; sets LEADER_ID and LEADER.
wait_leader() {
    for _ in $(seq 1200); do
        for id in 1 2 3; do
            if curl -sf "http://$(api_of "$id")/readyz" >/dev/null 2>&1 &&
                curl -sf "http://$(api_of "$id")/v1/cluster" | grep -q '"role":"leader"'; then
                LEADER_ID=$id; LEADER=$(api_of "$id"); return
            fi
        done
        sleep 0.05
    done
    echo "no leader within 60 s" >&2; return 1
}

# Stops every member started (SIGKILL by PID, then reaps it).
stop_members() {
    local pid
    for pid in "${MEMBER_PIDS[@]}"; do
        kill -9 "$pid" 2>/dev/null || true
        wait "$pid" 2>/dev/null || true
    done
    MEMBER_PIDS=()
}

# CPU seconds of each member 1..3, space-separated.
members_cpu() { local id; for id in 1 2 3; do printf '%s ' "$(cpu_s "${MEMBER_PIDS[$id]}")"; done; echo; }
