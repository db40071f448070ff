#!/usr/bin/env python3
"""A fleet's keys, as bench/memory_fleet.sh registers them: N keys of 27 bytes named like real
instance ids, `svc-NNN/instance-NNNNNNNNNN` (service `n % 1000`, instance `n`, zero-padded),
with the same TTL, either

- `ttlwheel ADDRESS N TTL_S [CONNECTIONS]`: registered through `POST /v1/heartbeats/batch?
  results=errors`, batches of 1,000 over CONNECTIONS keep-alive connections (4 by default),
  exits 1 if any item failed; or
- `redis N TTL_S`: the same keys as Redis commands `SET key "" EX ttl` in RESP on stdout, for
  `redis-cli --pipe` (pipelined).

Standard library only. Keys carry no service and no metadata on either side: the comparison is
one name and one deadline per key.
"""
import http.client
import json
import sys
import threading

BATCH = 1000


def key(n):
    return "svc-%03d/instance-%010d" % (n % 1000, n)


def batch_body(start, end, ttl_s):
    item = '{"key":"%s","ttl_s":' + str(ttl_s) + "}"
    return ('{"heartbeats":[' + ",".join(item % key(n) for n in range(start, end)) + "]}").encode()


def register(address, count, ttl_s, connections):
    host, port = address.rsplit(":", 1)
    starts = list(range(0, count, BATCH))
    failures = []

    def sender(worker):
        conn = http.client.HTTPConnection(host, int(port), timeout=60)
        for start in starts[worker::connections]:
            body = batch_body(start, min(start + BATCH, count), ttl_s)
            conn.request("POST", "/v1/heartbeats/batch?results=errors", body,
                         {"content-type": "application/json"})
            response = conn.getresponse()
            answer = response.read()
            if response.status != 200 or json.loads(answer)["failed"]:
                failures.append((start, response.status, answer[:300]))
                return
        conn.close()

    threads = [threading.Thread(target=sender, args=(w,)) for w in range(connections)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    if failures:
        sys.exit(f"registration failed: {failures[0]}")


def redis_commands(count, ttl_s):
    out = sys.stdout.buffer
    ttl = str(ttl_s).encode()
    chunk = []
    for n in range(count):
        name = key(n).encode()
        chunk.append(b"*5\r\n$3\r\nSET\r\n$%d\r\n%s\r\n$0\r\n\r\n$2\r\nEX\r\n$%d\r\n%s\r\n"
                     % (len(name), name, len(ttl), ttl))
        if len(chunk) == 10_000:
            out.write(b"".join(chunk))
            chunk.clear()
    out.write(b"".join(chunk))


def main():
    assert len(key(0)) == 27 and len(key(9_999_999_999)) == 27
    if sys.argv[1] == "ttlwheel":
        connections = int(sys.argv[5]) if len(sys.argv) > 5 else 4
        register(sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), connections)
    elif sys.argv[1] == "redis":
        redis_commands(int(sys.argv[2]), int(sys.argv[3]))
    else:
        sys.exit(__doc__)


if __name__ == "__main__":
    main()
