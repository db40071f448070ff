#!/usr/bin/env bash
# The mass expiry of 1M keys at two commits, alternated in one run, so that the machine's drift
# hits both sides alike: `cargo bench --bench expiry -- evict/1M/` (the bare engine, the service
# configuration, the listing alone and the expired log alone; each on time and late) and the
# longest sweep step's lock hold. Each side's bench binary is built (fat LTO, as `cargo bench`
# builds it) from a detached worktree, one after the other, in one shared target directory.
#
# Usage: BEFORE=<commit> [AFTER=HEAD] [ROUNDS=2] [FILTER=evict/1M/] bash bench/evict_ab.sh
# Results: target/evict-ab/table.md (medians, ms; a column per side and round)
set -euo pipefail
cd "$(dirname "$0")/.."
: "${BEFORE:?BEFORE=<commit> to compare against}"
AFTER=${AFTER:-HEAD}
ROUNDS=${ROUNDS:-2}
FILTER=${FILTER:-evict/1M/}
OUT=$PWD/target/evict-ab
mkdir -p "$OUT"
export CARGO_TARGET_DIR=$OUT/target
export TTLWHEEL_BENCH_MAX_KEYS=1000000

build() { # label commit
    local tree=$OUT/tree-$1
    git worktree remove --force "$tree" 2>/dev/null || rm -rf "$tree"
    git worktree prune
    git worktree add -q --detach "$tree" "$2"
    local binary
    binary=$(cd "$tree" && cargo bench --bench expiry --no-run 2>&1 |
        sed -n 's/.*Executable benches\/expiry.rs (\(.*\))/\1/p')
    cp "$binary" "$OUT/expiry-$1"
    git worktree remove --force "$tree"
}
echo "== building $BEFORE and $AFTER" >&2
build before "$BEFORE"
build after "$AFTER"

for round in $(seq "$ROUNDS"); do
    for side in before after; do
        echo "== $side, round $round, $(date +%T), load $(cut -d' ' -f1 /proc/loadavg)" >&2
        "$OUT/expiry-$side" --bench "$FILTER" >"$OUT/$side-$round.log" 2>&1
    done
done

python3 - "$OUT" "$ROUNDS" <<'PY' | tee "$OUT/table.md"
import re, sys
out, rounds = sys.argv[1], int(sys.argv[2])
def medians(path):
    """{cell: median in ms} and the lock-hold line, from one run's criterion output."""
    cells, name, hold = {}, None, ""
    for line in open(path):
        if "lock-hold" in line:
            hold = line.split(";", 1)[-1].strip()
            continue
        if m := re.match(r"^(evict/\S+)", line):
            name = m.group(1)
        if (m := re.search(r"time:\s+\[\S+ \S+ (\S+) (\S+)", line)) and name:
            value, unit = float(m.group(1)), m.group(2)
            cells[name] = value * {"ns": 1e-6, "µs": 1e-3, "us": 1e-3, "ms": 1, "s": 1e3}[unit]
            name = None
    return cells, hold
runs = [(side, r, *medians(f"{out}/{side}-{r}.log"))
        for r in range(1, rounds + 1) for side in ("before", "after")]
names = list(dict.fromkeys(name for run in runs for name in run[2]))
print("| cell | " + " | ".join(f"{side} {r}" for side, r, _, _ in runs) + " |")
print("|---|" + "---|" * len(runs))
for name in names:
    print(f"| `{name}` | " + " | ".join(f"{run[2].get(name, float('nan')):.1f}" for run in runs) + " |")
print("| lock hold (one step) | " + " | ".join(run[3] for run in runs) + " |")
PY
