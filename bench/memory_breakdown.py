#!/usr/bin/env python3
"""Where a fleet registration's RSS growth goes (issue 27: the fixed cost at 10k keys).

For each variant, ROUNDS times: a fresh ttlwheel (`--ephemeral` and the variant's flags and
`_RJEM_MALLOC_CONF`), its RSS once settled (as bench/memory_fleet.sh reads it), N keys registered
as memory_fleet.sh registers them (bench/fleet_keys.py: 27-byte names, TTL 3600 s, batches of
1,000 over 4 connections), its RSS once settled again. Prints each round's growth, split by
mapping from /proc/PID/smaps (the binary's pages, the thread stacks, found by each thread's
stack pointer, and the anonymous rest, the allocator's), and the median growth per variant. One
thing changes at a time, so a variant's difference from the first is what that thing costs.

With JSTATS=1 and a binary built with `--features alloc-jemalloc-stats`, jemalloc's statistics
are printed through gdb (`malloc_stats_print`, to the server's stderr) when the server is empty
and when it is grown, and the differences that matter here are shown: bytes allocated, bytes in
the thread caches, and the slack of the small size classes' slabs (pages a slab holds for
objects that are no longer there, and cannot return to the OS while one object lives).

Usage: python3 bench/memory_breakdown.py [VARIANT...]
  a VARIANT is `name=flags` with `;` between flags, or `name=@MALLOC_CONF` (e.g.
  'no-tcache=@tcache:false', 'one-thread=--threads 1', 'no-ring=--events-ring 1');
  without any, the default set below.
  SERVER=target/release/ttlwheel KEYS=10000 ROUNDS=3 PORT=17950 OUT=target/bench-memory-breakdown
Standard library only (and gdb for JSTATS). Every server binds 127.0.0.1 and is stopped by PID.
"""
import glob
import os
import re
import statistics
import subprocess
import sys
import time
import urllib.request

SERVER = os.environ.get("SERVER", "target/release/ttlwheel")
KEYS = int(os.environ.get("KEYS", "10000"))
ROUNDS = int(os.environ.get("ROUNDS", "3"))
PORT = int(os.environ.get("PORT", "17950"))
OUT = os.environ.get("OUT", "target/bench-memory-breakdown")
JSTATS = os.environ.get("JSTATS") == "1"
SETTLE_MAX_S = 30

DEFAULT_VARIANTS = [
    "as built=",
    "no ring (--events-ring 1)=--events-ring 1",
    "one serving thread=--threads 1",
    "no thread caches=@tcache:false",
    "jemalloc's default thread caches=@tcache_max:32768,tcache_nslots_small_min:20,"
    "tcache_nslots_small_max:200,tcache_nslots_large:20",
    "one arena=@narenas:1",
]


def rss_kb(pid):
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            if line.startswith("VmRSS"):
                return int(line.split()[1])
    raise RuntimeError(f"process {pid} has no VmRSS (it exited?)")


def settled_rss_kb(pid):
    """Two readings a second apart within 0.5 %, as memory_fleet.sh waits."""
    before = rss_kb(pid)
    for _ in range(SETTLE_MAX_S):
        time.sleep(1)
        after = rss_kb(pid)
        if abs(after - before) * 200 <= after:
            return after
        before = after
    return after


def by_kind(pid):
    """RSS in KiB by kind of mapping: binary, stack (threads'), anon (the allocator's), other."""
    stack_pointers = []
    for task in glob.glob(f"/proc/{pid}/task/*"):
        try:
            fields = open(task + "/syscall").read().split()
            if len(fields) >= 3:
                stack_pointers.append(int(fields[-2], 16))
        except (OSError, ValueError):
            pass
    kinds, kind = {}, None
    with open(f"/proc/{pid}/smaps") as smaps:
        for line in smaps:
            parts = line.split()
            if re.match(r"^[0-9a-f]+-[0-9a-f]+ ", line):
                low, high = (int(x, 16) for x in parts[0].split("-"))
                name = parts[5] if len(parts) > 5 else ""
                if name == os.path.realpath(SERVER) or name.endswith("/ttlwheel"):
                    kind = "binary"
                elif name == "[stack]" or any(low <= sp < high for sp in stack_pointers):
                    kind = "stacks"
                elif not name:
                    kind = "anon"
                else:
                    kind = "other"
            elif parts[0] == "Rss:":
                kinds[kind] = kinds.get(kind, 0) + int(parts[1])
    return kinds


def jemalloc_stats(pid, path):
    """jemalloc's statistics, printed by the server itself (gdb calls malloc_stats_print)."""
    log = os.readlink(f"/proc/{pid}/fd/2")
    start = os.path.getsize(log)
    subprocess.run(["gdb", "-p", str(pid), "-batch", "-ex",
                    "call (void)_rjem_malloc_stats_print((void*)0,(void*)0,(char*)0)"],
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=True)
    with open(log, "rb") as server_log:
        server_log.seek(start)
        text = server_log.read().decode(errors="replace")
    with open(path, "w") as out:
        out.write(text)
    return summarize(text)


def summarize(text):
    """Merged arenas: allocated, tcache bytes, small slabs' bytes and their slack."""
    merged = text[text.index("Merged arenas stats:"):]
    end = re.search(r"^arenas\[", merged, re.M)
    merged = merged[:end.start()] if end else merged
    summary = {}
    for name in ("allocated", "tcache_bytes", "resident"):
        found = re.search(rf"^{name}:\s+(\d+)", merged, re.M) or re.search(
            rf"^total:\s+(\d+)", merged, re.M)
        summary[name] = int(found.group(1))
    start = merged.index("bins:")
    bins = merged[start:merged.index("large:", start)]
    used = slabs = 0
    for line in bins.splitlines()[1:]:
        fields = line.split()
        if len(fields) > 15 and fields[0].isdigit():
            # size ind allocated nmalloc (#/s) ndalloc (#/s) nrequests (#/s) nshards curregs
            # curslabs nonfull_slabs regs pgs ...
            used += int(fields[2])
            slabs += int(fields[11]) * int(fields[14]) * 4096
    summary["small slabs"] = slabs
    summary["small slack"] = slabs - used
    return summary


def one_round(name, flags, conf, port):
    env = dict(os.environ)
    if conf:
        env["_RJEM_MALLOC_CONF"] = conf
    log = open(f"{OUT}/server.log", "a")
    server = subprocess.Popen([SERVER, "--listen", f"127.0.0.1:{port}", "--ephemeral", *flags],
                              stdout=log, stderr=log, env=env)
    try:
        for _ in range(500):
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=1).read()
                break
            except OSError:
                time.sleep(0.02)
        stats = {}
        if JSTATS:
            stats["empty"] = jemalloc_stats(server.pid, f"{OUT}/{port}-empty.txt")
        empty, kinds_empty = settled_rss_kb(server.pid), by_kind(server.pid)
        subprocess.run(["python3", "bench/fleet_keys.py", "ttlwheel", f"127.0.0.1:{port}",
                        str(KEYS), "3600", "4"], check=True)
        grown, kinds_grown = settled_rss_kb(server.pid), by_kind(server.pid)
        if JSTATS:
            stats["grown"] = jemalloc_stats(server.pid, f"{OUT}/{port}-grown.txt")
        metrics = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics").read().decode()
        ring = re.search(r"^ttlwheel_sse_ring_bytes (\S+)", metrics, re.M).group(1)
    finally:
        server.terminate()
        server.wait()
    kinds = {k: kinds_grown.get(k, 0) - kinds_empty.get(k, 0)
             for k in sorted(set(kinds_empty) | set(kinds_grown))}
    split = ", ".join(f"{k} {v:+d}" for k, v in kinds.items() if v)
    print(f"  {name}: empty {empty} KiB, growth {grown - empty:+d} KiB ({split}; "
          f"ring {float(ring) / 1024:.0f} KiB)")
    if stats:
        print("    jemalloc, empty -> grown: " + ", ".join(
            f"{k} {stats['empty'][k] // 1024} -> {stats['grown'][k] // 1024} KiB"
            for k in stats["empty"]))
    return grown - empty


def main():
    os.chdir(os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
    os.makedirs(OUT, exist_ok=True)
    variants = []
    for spec in sys.argv[1:] or DEFAULT_VARIANTS:
        name, _, setting = spec.partition("=")
        if setting.startswith("@"):
            variants.append((name, [], setting[1:]))
        else:
            variants.append((name, [f for f in setting.split(" ") if f], ""))
    print(f"{SERVER}, {KEYS} keys, {ROUNDS} rounds, load {open('/proc/loadavg').read().split()[0]}")
    growth = {name: [] for name, _, _ in variants}
    port = PORT
    for _ in range(ROUNDS):
        for name, flags, conf in variants:
            port += 1
            growth[name].append(one_round(name, flags, conf, port))
    print("| variant | growth, KiB (median) | against the first |")
    print("|---|---|---|")
    first = statistics.median(growth[variants[0][0]])
    for name, _, _ in variants:
        median = statistics.median(growth[name])
        print(f"| {name} | {median:+.0f} ({', '.join(map(str, growth[name]))}) | {median - first:+.0f} |")


if __name__ == "__main__":
    main()
