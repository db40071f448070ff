#!/usr/bin/env python3
"""Prints the renewal table of BENCHMARKS.md from criterion's results (target/criterion).

Each figure is criterion's median time per operation; ops/s is its inverse (for two threads:
both threads together). Run after `cargo bench --bench expiry`.
"""
import json
import pathlib
import sys

ROOT = pathlib.Path(sys.argv[1] if len(sys.argv) > 1 else "target/criterion")
SIZES = ["10k", "100k", "1M", "10M"]
STRUCTURES = ["ttlwheel-wheel", "ttlwheel-heap", "dashmap+bucket-sets", "map+full-scan",
              "btreemap", "binaryheap-lazy", "tokio-delayqueue"]


def median_ns(group, function, parameter=None):
    parts = [group, function] + ([parameter] if parameter else [])
    path = ROOT.joinpath(*[p.replace("/", "_") for p in parts], "new", "estimates.json")
    if not path.exists():
        return None
    return json.loads(path.read_text())["median"]["point_estimate"]


def cell(ns):
    if ns is None:
        return "n/a"
    rate = 1e9 / ns
    rate_text = f"{rate / 1e6:.2f}M/s" if rate >= 1e6 else f"{rate / 1e3:.0f}k/s"
    return f"{ns:.0f} ns ({rate_text})"


def main():
    for threads in ["1t", "2t"]:
        print(f"\nRenew, {threads[0]} thread(s): median ns per renewal (renewals per second)\n")
        print("| structure | " + " | ".join(SIZES) + " |")
        print("|---|" + "---|" * len(SIZES))
        for structure in STRUCTURES:
            row = [cell(median_ns(f"renew_{size}", structure, threads)) for size in SIZES]
            print(f"| {structure} | " + " | ".join(row) + " |")
    print("\nOther measurements (median)\n")
    others = [
        ("heap-ops_1M", "expire", "registry EXPIRE on a random heap key, 1M keys"),
        ("heap-ops_1M", "persist+expire", "registry PERSIST then EXPIRE on a random key, 1M keys (two ops)"),
        ("heap-arity_1M", "binary", "DeadlineHeap<2> upsert of a random slot, 1M slots"),
        ("heap-arity_1M", "4-ary", "DeadlineHeap<4> upsert of a random slot, 1M slots"),
        ("list-100_1M", "unfiltered", "a page of 100 alive keys, 1M registered"),
        ("list-100_1M", "by-service", "a page of 100, filtered by service (1 of 10)"),
        ("list-100_1M", "by-prefix", "a page of 100, filtered by prefix"),
        ("list-100_1M", "from-cursor", "a page of 100 from a cursor mid-way"),
        ("evict_1M", "one-tick-engine", "one tick expiring 1M keys, bare engine"),
        ("evict_1M", "one-tick", "one tick expiring 1M keys, service configuration (listing on)"),
    ]
    print("| measurement | median |")
    print("|---|---|")
    for group, function, label in others:
        ns = median_ns(group, function)
        if ns is None:
            shown = "n/a"
        elif ns > 1e6:
            shown = f"{ns / 1e6:.1f} ms"
        elif ns > 1e3:
            shown = f"{ns / 1e3:.0f} µs"
        else:
            shown = f"{ns:.0f} ns"
        print(f"| {label} | {shown} |")

if __name__ == "__main__":
    main()
