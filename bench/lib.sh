# Helpers shared by the bench scripts (source it after `cd` to the repository root): for scripts
# that run one server at a time, the server's PID and stopping it (also on exit; compare.sh
# replaces both with its own); for all, the median of a column, a process's RSS and CPU time,
# and a field of ttlwheel-load's RESULT line.
PID=

# Stops the server started last, if any (by PID: servers bind 127.0.0.1 only).
stop() { [ -n "$PID" ] && kill "$PID" 2>/dev/null && wait "$PID" 2>/dev/null; PID=; true; }
trap stop EXIT

# The median of the numbers on stdin, one per line.
median() { sort -g | awk '{a[NR]=$1} END {if (NR) print (NR%2) ? a[(NR+1)/2] : (a[NR/2]+a[NR/2+1])/2}'; }

# Starts $SERVER on $TARGET with the given flags, its log appended to $OUT/server.log, and waits
# until it answers /healthz; `stop` stops it. $OUT/data is emptied first (pass
# `--data-dir "$OUT/data"` for persistence on, as a user runs it).
serve() {
  rm -rf "$OUT/data"
  "$SERVER" --listen "$TARGET" "$@" >>"$OUT/server.log" 2>&1 &
  PID=$!
  until curl -sf "http://$TARGET/healthz" >/dev/null 2>&1; do sleep 0.01; done
}

# Builds what a script runs and sets SERVER (the release ttlwheel, unless SERVER is given: a
# binary built elsewhere, to compare) and LOAD (ttlwheel-load), in CARGO_TARGET_DIR if set.
build_server_and_load() {
    local target_dir=${CARGO_TARGET_DIR:-target}
    if [ -z "${SERVER:-}" ]; then
        cargo build --release --quiet -p ttlwheel --bin ttlwheel
        SERVER=$target_dir/release/ttlwheel
    fi
    cargo build --release --quiet -p ttlwheel-load
    LOAD=$target_dir/release/ttlwheel-load
}

# Resident memory of process $1, in KiB.
rss_kb() { awk '/^VmRSS/ {print $2}' "/proc/$1/status"; }

# CPU seconds (user + system) process $1 has used so far.
cpu_s() { awk -v hz="$(getconf CLK_TCK)" '{print ($14 + $15) / hz}' "/proc/$1/stat"; }

# The field at a dotted path (e.g. latency.p99) in the last RESULT line ttlwheel-load wrote to $1.
result() {
    python3 - "$1" "$2" <<'PY'
import json, sys
line = [l for l in open(sys.argv[1]) if l.startswith("RESULT ")][-1]
value = json.loads(line[len("RESULT "):])["outcome"]
for part in sys.argv[2].split("."):
    value = value[part]
print(value)
PY
}
