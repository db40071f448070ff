#!/usr/bin/env bash
# The engine at two commits, in one run: the renewal benchmark (`cargo bench --bench expiry --
# renew/`, 10k to 10M keys, 1 and 2 threads) for ttlwheel and the design card's baseline
# (`dashmap` + per-second bucket sets), the mass expiry of 1M keys (`evict/1M`) and pages of
# 100 of a 1M-key registry (`list-100/1M`), at OLD (default 8f58701: the `DashMap` key index
# beside the shards) and at the working tree (one store), one after the other. Prints median
# ns per renewal and each side's ratio to the baseline of its own run (the baseline is the same
# code in both, so the ratios cancel the machine's drift), the eviction and listing medians;
# then, for each side, the growth benchmark (the slowest creation while growing to 10M keys)
# and the memory benchmark (bytes per key).
#
# Usage: bash bench/index_ab.sh            OLD=<commit>  TTLWHEEL_BENCH_MAX_KEYS=1000000 (quicker)
# Results: target/index-ab/table.md
set -euo pipefail
cd "$(dirname "$0")/.."
OLD=${OLD:-8f58701}
OUT=target/index-ab
mkdir -p "$OUT"
export TTLWHEEL_BENCH_SUBJECTS=ttlwheel-wheel,dashmap+bucket-sets

# The old side's worktree (and its build, which takes minutes) is kept between runs while it is
# at OLD; `KEEP=0` removes it at the end.
if [ "$(git -C "$OUT/old" rev-parse HEAD 2>/dev/null)" != "$(git rev-parse "$OLD^{commit}")" ]; then
    git worktree remove --force "$OUT/old" 2>/dev/null || true
    rm -rf "$OUT/old"
    git worktree prune
    git worktree add -q --detach "$OUT/old" "$OLD"
fi
rm -rf "$OUT/new"
[ "${KEEP:-1}" = 1 ] || trap 'git worktree remove --force "$OUT/old" 2>/dev/null || true' EXIT

run() { # directory, label
    local log=$PWD/$OUT/$2.log
    (cd "$1" && CARGO_TARGET_DIR="$PWD/target" cargo bench -q --bench expiry -- 'renew/|evict/1M/one-tick|list-100/' >"$log" 2>&1)
    mkdir -p "$OUT/$2"
    cp -r "$1/target/criterion/." "$OUT/$2/"
    (cd "$1" && CARGO_TARGET_DIR="$PWD/target" cargo bench -q --bench growth 2>&1 | grep '^growth/' >>"$log")
    (cd "$1" && CARGO_TARGET_DIR="$PWD/target" cargo bench -q --bench memory 2>&1 | grep '^memory/' >>"$log")
}
echo "== at $OLD" >&2
run "$OUT/old" old
echo "== at the working tree" >&2
run . new

python3 - "$OUT" <<'PY' | tee "$OUT/table.md"
import json, os, sys
out = sys.argv[1]
def ns(side, size, subject, threads):
    path = f"{out}/{side}/renew_{size}/{subject}/{threads}t/new/estimates.json"
    return json.load(open(path))["median"]["point_estimate"]
sizes = [s for s in ("10k", "100k", "1M", "10M") if os.path.exists(f"{out}/new/renew_{s}")]
print("| keys | threads | old | its baseline | old/baseline | new | its baseline | new/baseline | new/old |")
print("|---|---|---|---|---|---|---|---|---|")
for size in sizes:
    for threads in (1, 2):
        o, ob = ns("old", size, "ttlwheel-wheel", threads), ns("old", size, "dashmap+bucket-sets", threads)
        n, nb = ns("new", size, "ttlwheel-wheel", threads), ns("new", size, "dashmap+bucket-sets", threads)
        print(f"| {size} | {threads} | {o:.0f} | {ob:.0f} | {o/ob:.2f} | {n:.0f} | {nb:.0f} | {n/nb:.2f} | {(n/nb)/(o/ob):.2f} |")
def median_ms(side, path):
    try:
        return json.load(open(f"{out}/{side}/{path}/new/estimates.json"))["median"]["point_estimate"] / 1e6
    except FileNotFoundError:
        return None
print()
print("| benchmark | old (ms) | new (ms) | new/old |")
print("|---|---|---|---|")
for path in ["evict_1M/one-tick-engine_on-time", "evict_1M/one-tick-engine_late", "evict_1M/one-tick_on-time",
             "evict_1M/one-tick_late", "list-100_1M/unfiltered", "list-100_1M/from-cursor",
             "list-100_1M/by-service", "list-100_1M/by-prefix"]:
    o, n = median_ms("old", path), median_ms("new", path)
    if o is not None and n is not None:
        print(f"| {path} | {o:.3f} | {n:.3f} | {n/o:.2f} |")
PY
echo
for side in old new; do
    echo "$side:"
    grep -E '^(growth|memory)/' "$OUT/$side.log" | sed 's/^/- /'
done | tee -a "$OUT/table.md"
