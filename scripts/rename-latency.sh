#!/usr/bin/env bash
# Worst lookup latency seen by another process while `mv` renames a 10,000-entry lower directory
# on a layercache mount (issue 15: the rename must not stall other requests; target < 50 ms).
#
#   bash scripts/rename-latency.sh [BINARY] [RUNS]
#
# BINARY defaults to the bench's release build ($LAYERCACHE_BENCH_DIR/target/release/layercache,
# see scripts/lib-bench.sh; build it with scripts/bench.sh or cargo build --release). Each run
# makes a fresh lower with big/ (10,000 files) and other/, mounts it, and while `mv big big2`
# runs, a Python loop stats new names in other/ (each a LOOKUP the daemon must answer; in big's
# own parent the kernel itself holds the directory lock during a rename). Needs root; works
# under $LAYERCACHE_BENCH_DIR/rename-latency and unmounts on exit.
set -euo pipefail
# shellcheck source=scripts/lib-bench.sh
. "$(dirname "$0")/lib-bench.sh"
BIN=${1:-$LC_BIN} RUNS=${2:-3}
[ -x "$BIN" ] || die "no layercache binary at $BIN (build it first)"
lc_init rename-latency.sh
R=$LC_BENCH_DIR/rename-latency
for run in $(seq "$RUNS"); do
  rm -rf "$R" && mkdir -p "$R/l/big" "$R/l/other" "$R/u" "$R/w" "$R/m"
  python3 -c '
import sys
for i in range(10000):
    open(f"{sys.argv[1]}/f{i:05d}", "w").write("x" * 100)' "$R/l/big"
  timeout 60 "$BIN" overlay -o "lowerdir=$R/l,upperdir=$R/u,workdir=$R/w" "$R/m"
  lc_register layercache "$R/m"
  ls "$R/m" >/dev/null
  rm -f "$R/done"
  python3 -c '
import os, sys, time
mnt, done = sys.argv[1], sys.argv[2]
worst, n = 0.0, 0
while not os.path.exists(done):
    t = time.perf_counter()
    try:
        os.stat(f"{mnt}/other/nope-{n}")
    except FileNotFoundError:
        pass
    worst = max(worst, time.perf_counter() - t)
    n += 1
print(f"lookups {n}, worst {worst * 1000:.1f} ms", end="")' "$R/m" "$R/done" >"$R/lookups" &
  py=$!
  t0=$(lc_now); mv "$R/m/big" "$R/m/big2"; t1=$(lc_now)
  touch "$R/done"; wait "$py"
  echo "run $run: mv $(( (t1 - t0) / 1000 )) ms, $(cat "$R/lookups")"
  lc_umount "$R/m"
done
rm -rf "$R"
