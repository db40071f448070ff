#!/usr/bin/env python3
"""Memory of keys with metadata: starts target/release/ttlwheel (memory only), registers KEYS
keys whose `meta` is META_BYTES bytes of JSON (and the same keys without meta, in a second
server), and prints the resident-memory growth per key, for the README's sizing guidance.

Usage: cargo build --release && python3 bench/meta_memory.py [KEYS] [META_BYTES]
Standard library only. Servers bind 127.0.0.1 and are stopped by PID.
"""
import http.client
import json
import os
import signal
import socket
import subprocess
import sys
import time

KEYS = int(sys.argv[1]) if len(sys.argv) > 1 else 1_000_000
META_BYTES = int(sys.argv[2]) if len(sys.argv) > 2 else 4096
BINARY = os.environ.get("TTLWHEEL", "target/release/ttlwheel")


def free_port():
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def rss_bytes(pid):
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError("no VmRSS")


def meta_of(size):
    """A JSON object that serializes to exactly `size` bytes."""
    base = json.dumps({"pad": ""}, separators=(",", ":"))
    return '{"pad":"' + "x" * (size - len(base)) + '"}'


def measure(meta_bytes):
    port = free_port()
    server = subprocess.Popen(
        [BINARY, "--listen", f"127.0.0.1:{port}", "--ephemeral", "--log-format", "text"],
        stderr=subprocess.DEVNULL,
    )
    try:
        for _ in range(500):
            try:
                conn = http.client.HTTPConnection("127.0.0.1", port)
                conn.request("GET", "/healthz")
                if conn.getresponse().status == 200:
                    break
            except OSError:
                time.sleep(0.02)
        time.sleep(0.5)
        before = rss_bytes(server.pid)
        meta = meta_of(meta_bytes) if meta_bytes else None
        per_batch = max(1, min(1000, (1024 * 1024 - 1024) // (meta_bytes + 64)))
        conn = http.client.HTTPConnection("127.0.0.1", port)
        started = time.time()
        for start in range(0, KEYS, per_batch):
            items = []
            for n in range(start, min(KEYS, start + per_batch)):
                item = '{"key":"service-%011d","ttl_s":3600' % n
                items.append(item + (',"meta":' + meta + "}" if meta else "}"))
            body = '{"heartbeats":[' + ",".join(items) + "]}"
            conn.request("POST", "/v1/heartbeats/batch?results=errors", body,
                         {"content-type": "application/json"})
            answer = json.loads(conn.getresponse().read())
            if answer.get("failed", 1) != 0:
                raise RuntimeError(f"batch at {start}: {answer}")
        took = time.time() - started
        time.sleep(1)
        after = rss_bytes(server.pid)
        return after - before, took
    finally:
        server.send_signal(signal.SIGKILL)
        server.wait()


def main():
    plain, _ = measure(0)
    with_meta, took = measure(META_BYTES)
    print(f"keys: {KEYS}, key names 19 bytes")
    print(f"without meta: {plain / KEYS:.0f} B/key ({plain / 2**20:.0f} MiB)")
    print(f"with {META_BYTES} B meta: {with_meta / KEYS:.0f} B/key ({with_meta / 2**30:.2f} GiB), "
          f"registered in {took:.0f} s")
    print(f"meta costs {(with_meta - plain) / KEYS:.0f} B/key for {META_BYTES} B of JSON")


if __name__ == "__main__":
    main()
