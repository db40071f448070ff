"""A 3-member cluster holding 1M keys (issue 28, section 6): a 4th member joining (from the start
of its process to holding every key and to its promotion), and a member restarted after kill -9
(to /readyz 200), on loopback, release build, `--fsync always`, data dirs on this machine's disk.

Two ways the 1M keys got there, each built once and copied into every round's data dirs (a
stopped member's directory is all it has, so a copy starts as the original would):
- "batch": `ttlwheel-load`'s preload, batches of 1,000 through `POST /v1/heartbeats/batch`
  (about 1,000 log entries of 1,000 records). The log is far below the snapshot policy
  (`SnapshotPolicy::LogsSinceLast(1_000_000)` entries, src/cluster/node.rs), so no snapshot
  exists: a joiner is sent the log, and a restarted member replays it.
- "single": KEYS single heartbeats on new keys (50 connections; the proposer groups them into
  entries of ~20-50 keys), then each member is asked for a snapshot (`POST
  /v1/cluster/snapshot`), so every member holds a snapshot of ~1M keys and has purged the log
  before it: a joiner is sent the snapshot, then the few entries after it. Built with the
  data dirs on tmpfs (SHM), which was needed when each single creation was an entry of its
  own (1M entries: 20-40 minutes on the disk here) and still shortens the build (~1 minute).
  The stopped members' directories are then copied to the disk, and every measured run is on
  the disk.

Each round (fresh copies, members 1-3 started and a leader ready; where the leader of the
copied cluster comes back as leader but never becomes ready, a bug described in
`start_founders`, it is killed with -9 and started again after a new election, and the round
records it):
1. restart a follower: kill -9, start it again with the same flags; start -> /readyz 200, and
   start -> its `ttlwheel_keys_alive` back to all keys;
2. restart the leader: kill -9, wait for a new leader, start the old one again; the same times;
3. join: start member 4 with `--join` on an empty data dir (the disk); from the start of its
   process: added as a learner (the leader lists it), snapshot file received (an
   `incoming-*.tmp` in its snapshot dir), snapshot installed (a `snapshot-*` there), all keys
   (`ttlwheel_keys_alive` = the leader's), applied index = the leader's committed index,
   promoted (the leader lists it as a voter), /readyz 200. Polled every POLL seconds.
Medians and ranges over ROUNDS rounds at the end; per-round JSON lines in OUT/results.jsonl.

    SERVER=... LOAD=... ROUNDS=3 KEYS=1000000 BUILDS=batch,single python3 bench/cluster_join_restart.py

Standard library only. Every process it starts is killed by PID on exit."""
import atexit, glob, json, os, shutil, signal, statistics, subprocess, sys, tempfile, time
import urllib.error, urllib.request

TARGET = os.environ.get("CARGO_TARGET_DIR", "target")
SERVER = os.environ.get("SERVER", f"{TARGET}/release/ttlwheel")
LOAD = os.environ.get("LOAD", f"{TARGET}/release/ttlwheel-load")
ROUNDS = int(os.environ.get("ROUNDS", "3"))
KEYS = int(os.environ.get("KEYS", "1000000"))
BUILDS = os.environ.get("BUILDS", "batch,single").split(",")
POLL = float(os.environ.get("POLL", "0.02"))
STUCK_WAIT = float(os.environ.get("STUCK_WAIT", "15"))
OUT = os.environ.get("OUT") or tempfile.mkdtemp(prefix="ttlwheel-join-", dir="/var/tmp")
SHM = os.environ.get("SHM", "/dev/shm")
API = {i: 17950 + i for i in (1, 2, 3, 4)}
PEER = {i: 17960 + i for i in (1, 2, 3, 4)}
INITIAL = ",".join(f"{i}=127.0.0.1:{PEER[i]}" for i in (1, 2, 3))

processes = {}  # node id -> Popen of the member running now


def stop_all():
    for process in list(processes.values()):
        if process.poll() is None:
            process.kill()
            process.wait()
    processes.clear()


atexit.register(stop_all)
signal.signal(signal.SIGTERM, lambda *_: sys.exit(1))


def base(i):
    return f"http://127.0.0.1:{API[i]}"


def get(i, path, timeout=1.0):
    """(status, body text) of GET path on member i; (None, None) if it does not answer."""
    try:
        with urllib.request.urlopen(base(i) + path, timeout=timeout) as answer:
            return answer.status, answer.read().decode()
    except urllib.error.HTTPError as error:
        return error.code, error.read().decode()
    except (urllib.error.URLError, OSError, ValueError):
        return None, None


def take_snapshot(i):
    request = urllib.request.Request(base(i) + "/v1/cluster/snapshot", data=b"", method="POST")
    with urllib.request.urlopen(request, timeout=300) as answer:
        answer.read()


def cluster(i):
    status, body = get(i, "/v1/cluster")
    return json.loads(body) if status == 200 else None


def keys_alive(i):
    status, body = get(i, "/metrics", timeout=5.0)
    if status != 200:
        return None
    return sum(float(line.rsplit(" ", 1)[1]) for line in body.splitlines()
               if line.startswith("ttlwheel_keys_alive{"))


def ready(i):
    return get(i, "/readyz")[0] == 200


def start(i, data, log, extra):
    args = [SERVER, "--node-id", str(i), "--listen", f"127.0.0.1:{API[i]}",
            "--cluster-listen", f"127.0.0.1:{PEER[i]}", "--data-dir", data, "--fsync", "always",
            "--log-format", "text"] + extra
    with open(log, "a") as out:
        out.write(f"---- {time.strftime('%H:%M:%S')} start {' '.join(args)}\n")
        out.flush()
        processes[i] = subprocess.Popen(args, stdout=out, stderr=subprocess.STDOUT)
    return time.monotonic()


def kill(i):
    process = processes.pop(i)
    process.kill()
    process.wait()


def stop_clean(i):
    """SIGTERM, then SIGKILL after 60 s."""
    process = processes.pop(i)
    process.terminate()
    try:
        process.wait(60)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()


def wait_for(what, check, limit=120.0):
    deadline = time.monotonic() + limit
    while time.monotonic() < deadline:
        value = check()
        if value:
            return value
        time.sleep(POLL)
    raise SystemExit(f"timed out after {limit:.0f} s waiting for {what}")


def leader_among(ids):
    for i in ids:
        state = cluster(i)
        if state and state["role"] == "leader" and ready(i):
            return i
    return None


def start_founders(dirs, logs, stuck=None):
    """Starts members 1-3 and returns the leader once it is ready.

    With `stuck` (a dict), a leader that stays unready for STUCK_WAIT seconds is recorded in
    it, killed with -9 (the two others then elect a leader of a new term) and started again:
    openraft 0.9 restores a member that led when it stopped as the leader of the same term at
    start-up (`Engine::startup`), without a new blank entry, and ttlwheel promotes a leader
    (lets it serve) only when the blank entry of its term is applied; when that entry is
    inside the snapshot, nothing applies it again and the leader answers 503 for good
    (BENCHMARKS.md, "1M keys: a new member, a restart")."""
    for i in (1, 2, 3):
        start(i, dirs[i], logs[i], ["--initial-cluster", INITIAL])
    if stuck is None:
        return wait_for("a leader", lambda: leader_among((1, 2, 3)))
    began = time.monotonic()
    try:
        return wait_for("a leader", lambda: leader_among((1, 2, 3)), limit=STUCK_WAIT)
    except SystemExit:
        pass
    unready = [i for i in (1, 2, 3) if (cluster(i) or {}).get("role") == "leader"]
    if not unready:
        raise SystemExit("no leader at all after a whole-cluster start")
    status, body = get(unready[0], "/readyz")
    stuck.update({"member": unready[0], "waited_s": round(time.monotonic() - began, 1),
                  "readyz": f"{status} {body}"})
    print(f"whole-cluster start: leader {unready[0]} not ready after {STUCK_WAIT:.0f} s "
          f"({status} {body}); kill -9 and start it again", flush=True)
    kill(unready[0])
    leader = wait_for("a new leader", lambda: leader_among([i for i in (1, 2, 3) if i != unready[0]]))
    start(unready[0], dirs[unready[0]], logs[unready[0]], ["--initial-cluster", INITIAL])
    wait_for("the restarted member ready", lambda: ready(unready[0]))
    return leader


def snapshots_in(data):
    return sorted(glob.glob(os.path.join(data, "raft", "snapshots", "snapshot-*.ttlw")))


def build(kind):
    """Builds the 1M-key cluster once; returns the dir holding data-1..3 (stopped). With
    PRISTINE_FROM=<an earlier OUT>, that run's copy is used instead."""
    pristine = os.path.join(OUT, f"pristine-{kind}")
    earlier = os.environ.get("PRISTINE_FROM")
    if earlier and os.path.isdir(os.path.join(earlier, f"pristine-{kind}")):
        print(f"build {kind}: reusing {earlier}/pristine-{kind}", flush=True)
        return os.path.join(earlier, f"pristine-{kind}")
    root = pristine if kind == "batch" else tempfile.mkdtemp(prefix="ttlwheel-build-", dir=SHM)
    dirs = {i: os.path.join(root, f"data-{i}") for i in (1, 2, 3)}
    logs = {i: os.path.join(OUT, f"build-{kind}-{i}.log") for i in (1, 2, 3)}
    leader = start_founders(dirs, logs)
    began = time.monotonic()
    load_log = open(os.path.join(OUT, f"build-{kind}-load.log"), "w")
    if kind == "batch":
        subprocess.run([LOAD, "--target", f"127.0.0.1:{API[leader]}", "heartbeat", "--keys", str(KEYS),
                        "--ttl", "3600s", "--connections", "1", "--warmup", "0s", "--duration", "1ms"],
                       stdout=load_log, stderr=subprocess.STDOUT, check=True)
    else:
        load = subprocess.Popen([LOAD, "--target", f"127.0.0.1:{API[leader]}", "heartbeat", "--keys",
                                 str(KEYS), "--no-preload", "--sequential", "--ttl", "3600s",
                                 "--connections", "50", "--warmup", "0s", "--duration", "3000s"],
                                stdout=load_log, stderr=subprocess.STDOUT)
        try:
            wait_for("the single creations", lambda: (keys_alive(leader) or 0) >= KEYS, limit=3000)
        finally:
            load.terminate()
            load.wait()
    created = time.monotonic() - began
    state = cluster(leader)
    print(f"build {kind}: {KEYS} keys in {created:.1f} s ({KEYS / created:.0f}/s), "
          f"leader {leader} committed index {state['committed_index']}", flush=True)
    if kind == "single":
        # Single creations are grouped into entries of ~20-50 keys (cluster/group_commit.rs), so
        # the log stays far below the size bound that triggers a snapshot: ask each member for
        # one (`POST /v1/cluster/snapshot`, answered once it is written).
        for i in (1, 2, 3):
            take_snapshot(i)
        wait_for("a snapshot on every member", lambda: all(snapshots_in(dirs[i]) for i in (1, 2, 3)),
                 limit=600)
        time.sleep(2)  # the purge after the snapshot
        print(f"build single: snapshots {[os.path.basename(snapshots_in(dirs[i])[-1]) for i in (1, 2, 3)]}, "
              f"{os.path.getsize(snapshots_in(dirs[leader])[-1]) / 1e6:.1f} MB", flush=True)
    for i in (1, 2, 3):
        stop_clean(i)
    if root != pristine:
        shutil.copytree(root, pristine, symlinks=True)
        shutil.rmtree(root)
    return pristine


def restart(i, dirs, logs, total):
    """Starts member i (killed with -9 before) again: seconds to /readyz 200 and to holding all
    keys."""
    started = start(i, dirs[i], logs[i], ["--initial-cluster", INITIAL])
    times = {}
    def check():
        # Each instant is taken once the answer is in: a member answers some requests only
        # once its start-up is done.
        if "ready" not in times and ready(i):
            times["ready"] = time.monotonic() - started
        if "keys" not in times and keys_alive(i) == total:
            times["keys"] = time.monotonic() - started
        return len(times) == 2
    wait_for(f"member {i} ready after its restart", check)
    return times


def join(leader, data, log, total):
    """Starts member 4 with --join; the instants (s from its start) of each step."""
    started = start(4, data, log, ["--join", base(leader)])
    snapshot_dir = os.path.join(data, "raft", "snapshots")
    times = {}
    def mark(name, condition):
        if name not in times and condition():
            times[name] = time.monotonic() - started
    def check():
        state = cluster(leader) or {"members": []}
        me = [m for m in state["members"] if m["id"] == 4]
        target = state.get("committed_index", 0)
        mark("added", lambda: bool(me))
        mark("snapshot_received", lambda: bool(glob.glob(os.path.join(snapshot_dir, "incoming-*.tmp"))
                                               or glob.glob(os.path.join(snapshot_dir, "snapshot-*"))))
        mark("snapshot_installed", lambda: bool(glob.glob(os.path.join(snapshot_dir, "snapshot-*"))))
        mark("all_keys", lambda: keys_alive(4) == total)
        mark("applied", lambda: ((cluster(4) or {}).get("applied_index") or 0) >= target > 0)
        mark("promoted", lambda: bool(me) and me[0]["voter"])
        mark("ready", lambda: ready(4))
        return all(k in times for k in ("added", "all_keys", "applied", "promoted", "ready"))
    wait_for("the joiner", check, limit=300)
    return times


def one_round(kind, pristine, r):
    workdir = os.path.join(OUT, f"{kind}-{r}")
    shutil.copytree(pristine, workdir, symlinks=True)
    dirs = {i: os.path.join(workdir, f"data-{i}") for i in (1, 2, 3, 4)}
    logs = {i: f"{workdir}-member-{i}.log" for i in (1, 2, 3, 4)}
    stuck = {}
    leader = start_founders(dirs, logs, stuck)
    total = wait_for("the leader's keys", lambda: keys_alive(leader))
    result = {"build": kind, "round": r, "keys": total, "whole_start_stuck_leader": stuck or None}
    follower = min(i for i in (1, 2, 3) if i != leader)
    kill(follower)
    result["restart_follower"] = restart(follower, dirs, logs, total)
    kill(leader)
    new_leader = wait_for("a new leader", lambda: leader_among([i for i in (1, 2, 3) if i != leader]))
    result["restart_leader"] = restart(leader, dirs, logs, total)
    state = cluster(new_leader)
    result["committed_index"] = state["committed_index"]
    result["join"] = join(new_leader, dirs[4], logs[4], total)
    stop_all()
    print(json.dumps(result), flush=True)
    with open(os.path.join(OUT, "results.jsonl"), "a") as out:
        out.write(json.dumps(result) + "\n")
    shutil.rmtree(workdir)  # the data (the logs stay beside it)
    return result


def spread(values):
    values = sorted(v for v in values if v is not None)
    if not values:
        return "-"
    return f"{statistics.median(values):.2f} s ({values[0]:.2f}-{values[-1]:.2f})"


def main():
    print(f"out: {OUT}", flush=True)
    for kind in BUILDS:
        pristine = build(kind)
        results = [one_round(kind, pristine, r) for r in range(1, ROUNDS + 1)]
        print(f"\n{kind}: {ROUNDS} rounds, {results[0]['keys']:.0f} keys, median (min-max) from the process start")
        stuck = [r["round"] for r in results if r["whole_start_stuck_leader"]]
        print(f"  whole-cluster start: the old leader stayed unready (killed, restarted) in rounds {stuck or 'none'}")
        for step in ("restart_follower", "restart_leader"):
            for what in ("ready", "keys"):
                print(f"  {step} to {what}: {spread([r[step].get(what) for r in results])}")
        for what in ("added", "snapshot_received", "snapshot_installed", "all_keys", "applied",
                     "promoted", "ready"):
            print(f"  join to {what}: {spread([r['join'].get(what) for r in results])}")
        print(flush=True)


if __name__ == "__main__":
    main()
