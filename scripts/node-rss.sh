#!/usr/bin/env bash
# Daemon memory over a walk of a huge lower, twice, with the kernel forgetting the nodes in
# between (issue 15: node-table entries of lower paths must be pruned, RSS must fall back).
#
#   bash scripts/node-rss.sh [BINARY] [DIRS] [FILES_PER_DIR]
#
# Builds a lower of DIRS (default 1000) directories of FILES_PER_DIR (default 1000) empty files
# on a tmpfs (half of them hard links of the other half, so both node-id kinds — lower inode ids
# and per-path ids — are exercised), mounts it with BINARY (default: the bench's release build,
# see scripts/lib-bench.sh), and prints the daemon's VmRSS (and VmHWM, the peak) at each step:
# after mounting, after `find -ls` (one LOOKUP or readdirplus entry per name), after
# `drop_caches` made the kernel forget every node (the kernel's FORGETs are asynchronous, so the
# script waits until RSS has not changed for 2 s, at most 60 s), and the same again for a second
# walk (PASSES=N in the environment for N walks). Needs root; works under $LAYERCACHE_BENCH_DIR/node-rss and unmounts on exit.
set -euo pipefail
# shellcheck source=scripts/lib-bench.sh
. "$(dirname "$0")/lib-bench.sh"
BIN=${1:-$LC_BIN} DIRS=${2:-1000} FILES=${3:-1000} PASSES=${PASSES:-2}
[ -x "$BIN" ] || die "no layercache binary at $BIN (build it first)"
case "$DIRS$FILES" in *[!0-9]*) die "DIRS and FILES_PER_DIR must be numbers, got '$DIRS' '$FILES'" ;; esac
lc_init node-rss.sh
R=$LC_BENCH_DIR/node-rss
mkdir -p "$R"
lc_is_mounted "$R" && die "$R is still mounted from an earlier run"
mount -t tmpfs -o size=4g,nr_inodes=0 tmpfs "$R"
lc_register tmpfs "$R"
mkdir -p "$R/l" "$R/u" "$R/w" "$R/m"
log "making $((DIRS * FILES)) entries in $DIRS directories"
python3 - "$R/l" "$DIRS" "$FILES" <<'EOF'
import os, sys
root, dirs, files = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
for d in range(dirs):
    p = f"{root}/d{d:05d}"
    os.mkdir(p)
    for f in range(0, files, 2):
        a = f"{p}/f{f:05d}"
        open(a, "w").close()
        if f + 1 < files:
            os.link(a, f"{p}/f{f + 1:05d}")
EOF
timeout 60 "$BIN" overlay -o "lowerdir=$R/l,upperdir=$R/u,workdir=$R/w" "$R/m"
lc_register layercache "$R/m"
pid=${LC_DAEMON[$R/m]:-}
[ -n "$pid" ] || die "no daemon pid found for $R/m"
kib() { awk -v k="$1" '$1 == k":" { print $2 }' "/proc/$pid/status"; }
report() {
  printf '%-34s VmRSS %7d KiB (heap and other anonymous %7d KiB)   VmHWM %7d KiB\n' \
    "$1" "$(kib VmRSS)" "$(kib RssAnon)" "$(kib VmHWM)"
}
# Waits until the daemon's RSS has not changed for 2 s (the kernel forgets asynchronously).
settle() {
  local last=-1 same=0 now i
  for i in $(seq 120); do
    now=$(kib VmRSS)
    if [ "$now" = "$last" ]; then same=$((same + 1)); else same=0; fi
    [ "$same" -ge 4 ] && return 0
    last=$now
    sleep 0.5
  done
  log "RSS still changing after 60 s"
}
walk() {
  local t0 t1
  t0=$(lc_now); find "$R/m" -ls >/dev/null; t1=$(lc_now)
  log "walk $1: $(( (t1 - t0) / 1000 )) ms"
}
echo "entries: $((DIRS * FILES + DIRS)) ($DIRS dirs, half the files hard links), $(nproc) CPUs, load $(cut -d' ' -f1-3 /proc/loadavg)"
report "mounted"
for pass in $(seq "$PASSES"); do
  walk "$pass"
  report "after walk $pass"
  sync; echo 2 >/proc/sys/vm/drop_caches
  settle
  report "after walk $pass + kernel forgot"
done
lc_umount "$R/m"
