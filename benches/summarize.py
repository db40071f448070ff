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
    print("\nHeap operations at 1M keys, and one tick evicting 1M keys\n")
    for group, function in [("heap-ops_1M", "expire"), ("heap-ops_1M", "persist+expire"), ("evict_1M", "one-tick")]:
        ns = median_ns(group, function)
        shown = "n/a" if ns is None else (f"{ns / 1e6:.1f} ms" if ns > 1e6 else f"{ns:.0f} ns")
        print(f"- {group.replace('_', '/')}/{function}: {shown}")


if __name__ == "__main__":
    main()
