"""Grants N etcd leases (TTL given) through the HTTP gateway, puts one key on each, and prints
the lease IDs, one a line. Standard library only; 16 threads."""
import base64, json, sys, urllib.request
from concurrent.futures import ThreadPoolExecutor

base, count, ttl = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])


def post(path, body):
    request = urllib.request.Request(base + path, data=json.dumps(body).encode(), method="POST")
    with urllib.request.urlopen(request, timeout=30) as answer:
        return json.load(answer)


def lease(i):
    lease_id = post("/v3/lease/grant", {"TTL": ttl})["ID"]
    key = base64.b64encode(b"key:%012d" % i).decode()
    post("/v3/kv/put", {"key": key, "value": base64.b64encode(b"val").decode(), "lease": lease_id})
    return lease_id


with ThreadPoolExecutor(16) as pool:
    for lease_id in pool.map(lease, range(count)):
        print(lease_id)
