#!/usr/bin/env python3
"""What a connection costs: starts target/release/ttlwheel (memory only), opens N connections
that send half a request header, reads the server's resident memory, closes them, reads it
again, and repeats with a second wave: the second wave must not grow it further.

Usage: cargo build --release && python3 bench/connections.py [N] [WAVES]
Standard library only; the server binds 127.0.0.1 and is stopped by PID.
"""
import resource
import socket
import subprocess
import sys
import time

N = int(sys.argv[1]) if len(sys.argv) > 1 else 10_000
WAVES = int(sys.argv[2]) if len(sys.argv) > 2 else 4
import os
BINARY = os.environ.get("TTLWHEEL", "target/release/ttlwheel")


def rss(pid):
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    return 0


def main():
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    server = subprocess.Popen([BINARY, "--listen", f"127.0.0.1:{port}", "--ephemeral",
                               "--header-read-timeout", "10m"], stderr=subprocess.DEVNULL)
    try:
        time.sleep(1)
        base = rss(server.pid)
        print(f"idle server: {base / 2**20:.1f} MiB")
        for wave in range(1, WAVES + 1):
            conns = []
            for _ in range(N):
                conn = socket.create_connection(("127.0.0.1", port))
                conn.sendall(b"POST /v1/heartbeats HTTP/1.1\r\nHost: x\r\nContent-")
                conns.append(conn)
            time.sleep(2)
            held = rss(server.pid)
            for conn in conns:
                conn.close()
            time.sleep(2)
            after = rss(server.pid)
            print(f"wave {wave}: {N} half-open connections: {held / 2**20:.1f} MiB "
                  f"({(held - base) / N / 1024:.1f} KiB each); after they closed: "
                  f"{after / 2**20:.1f} MiB")
    finally:
        server.kill()
        server.wait()


if __name__ == "__main__":
    main()
