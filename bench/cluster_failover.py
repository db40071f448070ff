"""Failover of a 3-member cluster on loopback, as its clients see it (issue 28, section 6):
leader kill -9 to the first acknowledged write, and the window of failed heartbeats.

Each round starts three fresh release members (temp data dirs, default fsync), waits for a
leader, then runs two open-loop clients (requests sent at scheduled times, each timed from its
schedule, as wrk2 does), RATE requests/s each, that know all three members and, on a refused
connection, a timeout or a 5xx, retry at once on the next one:
- "create": each request registers a new key (a creation: committed on a quorum before its
  2xx), so its first success after the kill is the new leader's first acknowledged write;
- "renew": each request renews one of 1,000 keys registered before the kill (a renewal: the
  leader's memory, fenced by its lease).
After WARM seconds the leader is killed with SIGKILL; the round lasts AFTER seconds more.

Per round: kill -> first acknowledged creation scheduled after the kill; kill -> new leader seen
by the survivors; per client, the attempts that failed (refused, timed out, 5xx: each retried
on the next member), requests that failed for good, requests later than 100 ms from their
schedule, and the worst latency from schedule. Medians over the rounds at the end.

    EXTRA="--election-timeout 1s --checkpoint-interval 250ms" ...   # the design's first timing

    SERVER=target/release/ttlwheel ROUNDS=5 python3 bench/cluster_failover.py

Standard library only. Every process it starts is killed by PID on exit."""
import json, os, shutil, signal, socket, statistics, subprocess, sys, tempfile, threading, time
import urllib.error, urllib.request

SERVER = os.environ.get("SERVER", "target/release/ttlwheel")
ROUNDS = int(os.environ.get("ROUNDS", "5"))
RATE = float(os.environ.get("RATE", "100"))
WARM = float(os.environ.get("WARM", "3"))
AFTER = float(os.environ.get("AFTER", "6"))
TIMEOUT = float(os.environ.get("REQUEST_TIMEOUT", "1"))
EXTRA = os.environ.get("EXTRA", "").split()

started = []


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def call(base, method, path, body=None):
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(base + path, data=data, method=method,
                                     headers={"content-type": "application/json"})
    with urllib.request.urlopen(request, timeout=TIMEOUT) as answer:
        return answer.status, json.load(answer)


def start_cluster(workdir):
    peers = {i: free_port() for i in (1, 2, 3)}
    apis = {i: free_port() for i in (1, 2, 3)}
    initial = ",".join(f"{i}=127.0.0.1:{p}" for i, p in peers.items())
    members = {}
    for i in (1, 2, 3):
        log = open(os.path.join(workdir, f"member-{i}.log"), "w")
        args = [SERVER, "--node-id", str(i), "--listen", f"127.0.0.1:{apis[i]}",
                "--cluster-listen", f"127.0.0.1:{peers[i]}", "--initial-cluster", initial,
                "--data-dir", os.path.join(workdir, f"data-{i}"), "--log-format", "text"] + EXTRA
        process = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT)
        started.append(process)
        members[i] = (process, f"http://127.0.0.1:{apis[i]}")
    return members


def leader_of(members, among):
    for i in among:
        try:
            _, status = call(members[i][1], "GET", "/v1/cluster")
        except Exception:
            continue
        if status.get("role") == "leader":
            return i
    return None


def wait_leader(members, among, deadline):
    while time.monotonic() < deadline:
        leader = leader_of(members, among)
        if leader is not None:
            return leader, time.monotonic()
        time.sleep(0.01)
    return None, None


class Client(threading.Thread):
    """An open-loop client: request n is due at start + n / RATE; latency from that instant."""

    def __init__(self, name, bases, body_of, start, end):
        super().__init__(daemon=True)
        self.name_, self.bases, self.body_of = name, bases, body_of
        self.start_at, self.end = start, end
        self.results = []  # (scheduled, completed, ok, retries)
        self.member = 0

    def run(self):
        n = 0
        while True:
            due = self.start_at + n / RATE
            if due >= self.end:
                return
            pause = due - time.monotonic()
            if pause > 0:
                time.sleep(pause)
            retries, ok = 0, False
            while not ok and time.monotonic() < self.end + 5:
                try:
                    status, _ = call(self.bases[self.member], "POST", "/v1/heartbeats",
                                     self.body_of(n))
                    ok = 200 <= status < 300
                except (urllib.error.URLError, OSError, ValueError):
                    ok = False
                if not ok:
                    retries += 1
                    self.member = (self.member + 1) % len(self.bases)
                    time.sleep(0.005)
            self.results.append((due, time.monotonic(), ok, retries))
            n += 1


def one_round(number):
    workdir = tempfile.mkdtemp(prefix="ttlwheel-failover-")
    members = {}
    try:
        members = start_cluster(workdir)
        leader, _ = wait_leader(members, (1, 2, 3), time.monotonic() + 30)
        if leader is None:
            sys.exit("no leader within 30 s")
        bases = [members[i][1] for i in (1, 2, 3)]
        # Keys the renewing client renews, registered first (through the leader).
        for chunk in range(10):
            call(members[leader][1], "POST", "/v1/heartbeats/batch", {"heartbeats": [
                {"key": f"renew-{k}", "ttl_s": 60} for k in range(chunk * 100, chunk * 100 + 100)]})
        start = time.monotonic() + 0.2
        end = start + WARM + AFTER
        creator = Client("create", bases, lambda n: {"key": f"create-{number}-{n}", "ttl_s": 60},
                         start, end)
        renewer = Client("renew", bases[::-1], lambda n: {"key": f"renew-{n % 1000}", "ttl_s": 60},
                         start, end)
        creator.start(); renewer.start()
        time.sleep(max(0, start + WARM - time.monotonic()))
        killed_at = time.monotonic()
        members[leader][0].send_signal(signal.SIGKILL)
        members[leader][0].wait()
        survivors = [i for i in (1, 2, 3) if i != leader]
        new_leader, seen_at = wait_leader(members, survivors, killed_at + 30)
        creator.join(); renewer.join()
        after = [r for r in creator.results if r[0] >= killed_at and r[2]]
        first_write = min((r[1] for r in after), default=float("nan")) - killed_at
        row = {"round": number, "old_leader": leader, "new_leader": new_leader,
               "kill_to_leader_s": (seen_at - killed_at) if seen_at else float("nan"),
               "kill_to_first_write_s": first_write}
        for client in (creator, renewer):
            # A client sends in order, so a request that waits for the new leader delays the
            # ones due after it: each is timed from its schedule, as wrk2 does.
            late = [r for r in client.results if r[1] - r[0] > 0.1]
            row[client.name_ + "_attempts_failed"] = sum(r[3] for r in client.results)
            row[client.name_ + "_attempts_failed_before_kill"] = sum(
                r[3] for r in client.results if r[1] < killed_at)
            row[client.name_ + "_failed"] = sum(1 for r in client.results if not r[2])
            row[client.name_ + "_late_over_100ms"] = len(late)
            row[client.name_ + "_max_latency_s"] = max(r[1] - r[0] for r in client.results)
            row[client.name_ + "_sent"] = len(client.results)
        return row
    finally:
        for process, _ in members.values():
            if process.poll() is None:
                process.kill()
                process.wait()
        shutil.rmtree(workdir, ignore_errors=True)


def main():
    rows = []
    try:
        for number in range(ROUNDS):
            row = one_round(number)
            rows.append(row)
            print(json.dumps({k: (round(v, 3) if isinstance(v, float) else v)
                              for k, v in row.items()}), flush=True)
    finally:
        for process in started:
            if process.poll() is None:
                process.kill()
    keys = [k for k in rows[0] if k not in ("round", "old_leader", "new_leader")]
    print("medians over", len(rows), "rounds:")
    for key in keys:
        values = [r[key] for r in rows]
        print(f"  {key}: median {statistics.median(values):.3f}  min {min(values):.3f}"
              f"  max {max(values):.3f}")


if __name__ == "__main__":
    main()
