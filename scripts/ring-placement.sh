#!/usr/bin/env bash
# Where the FUSE-over-io_uring entry threads of a layercache daemon run around a streamed read
# (overlay/ring.rs): a scheduling outcome, so measured here rather than asserted in
# tests/overlay_uring.rs (which keeps the behaviour checks: the data comes back intact, the
# readahead window, threads confined by taskset stay there).
#
#   bash scripts/ring-placement.sh [BINARY] [RUNS]
#
# Each run mounts a fresh 64 MiB lower file, streams it with 1 MiB reads from CPU 0 (taskset),
# counts queue 0's ring threads whose affinity was widened for the stream ("spread"), sends 10
# forced GETATTRs from CPU 0 and counts again; the policy wants spread > 0 after the stream and
# fewer after the GETATTRs (the kernel hands a queue's requests to the entry freed last). Prints
# one line per run and how many runs showed both. Needs root, two CPUs and FUSE over io_uring
# (/sys/module/fuse/parameters/enable_uring); works under $LAYERCACHE_BENCH_DIR/ring-placement
# and unmounts on exit.
set -euo pipefail
# shellcheck source=scripts/lib-bench.sh
. "$(dirname "$0")/lib-bench.sh"
BIN=${1:-$LC_BIN} RUNS=${2:-10}
[ -x "$BIN" ] || die "no layercache binary at $BIN (build it first)"
[ "$(nproc)" -ge 2 ] || die "needs two CPUs"
[ -e /sys/module/fuse/parameters/enable_uring ] || die "this kernel has no FUSE over io_uring"
lc_init ring-placement.sh
R=$LC_BENCH_DIR/ring-placement

# spread PID: queue 0's ring threads whose affinity is wider than CPU 0.
spread() {
  local n=0 t
  for t in /proc/"$1"/task/*; do
    case "$(cat "$t/comm")" in fuser-uring-0.*) ;; *) continue ;; esac
    [ "$(awk '/^Cpus_allowed_list/ {print $2}' "$t/status")" = 0 ] || n=$((n + 1))
  done
  echo "$n"
}

good=0
for run in $(seq "$RUNS"); do
  rm -rf "$R" && mkdir -p "$R/l" "$R/u" "$R/w" "$R/m"
  head -c $((64 << 20)) /dev/urandom >"$R/l/big"
  timeout 60 "$BIN" overlay -o "lowerdir=$R/l,upperdir=$R/u,workdir=$R/w" "$R/m"
  lc_register layercache "$R/m"
  pid=${LC_DAEMON[$R/m]}
  exec 7<"$R/m/big"   # held open: a close would send a request of its own
  taskset -c 0 dd if="$R/m/big" of=/dev/null bs=1M status=none
  before=$(spread "$pid")
  for _ in $(seq 10); do taskset -c 0 stat --cached=never -c %s "$R/m/big" >/dev/null; done
  after=$(spread "$pid")
  exec 7<&-
  ok=no
  if [ "$before" -gt 0 ] && [ "$after" -lt "$before" ]; then ok=yes good=$((good + 1)); fi
  echo "run $run: spread after the stream $before, after 10 GETATTRs $after ($ok)"
  lc_umount "$R/m"
done
echo "placement as intended in $good of $RUNS runs"
rm -rf "$R"
