#!/usr/bin/env bash
# unionmount-testsuite (David Howells' overlayfs test suite, maintained by Amir Goldstein) against
# kernel overlayfs and layercache in both modes, one test at a time.
#
#   bash scripts/unionmount.sh [--impls kernel,layercache,layercache-pt] [--layers N]
#                              [--bin PATH | --worktree | --no-build] [-- TESTS…]
#
# The suite is not fetched or built here: UNIONMOUNT_DIR (default /var/tmp/unionmount-testsuite)
# must be a tree of github.com/amir73il/unionmount-testsuite (its `run` script, Python 3, no build
# step). Each test runs as `./run --ov[=N] [--fuse=layercache] TEST` (the suite stops at a test's
# first failed check, so one invocation per test gives a pass/fail per test), with its layers and
# mountpoint on a tmpfs (UNIONMOUNT_BASEDIR, which the suite reads as --samefs):
# * kernel: `--ov`, the suite's own `mount -t overlay`;
# * layercache: `--fuse=layercache`, as fuse-overlayfs is tested: the suite then runs
#   `mount -t fuse.layercache layercache MNT -orw -olowerdir=…,upperdir=…,workdir=…`, which a
#   `mount` wrapper first in PATH turns into `layercache overlay -o rw,lowerdir=… MNT` (every other
#   mount command goes to mount(8));
# * layercache-pt: the same in FUSE passthrough mode (LAYERCACHE_PASSTHROUGH=1, as -o passthrough).
# --layers N runs `--ov=N` (the upper is rotated into the lower stack up to N times during a test).
# Every implementation runs in its own private mount namespace (unshare), and everything the suite
# left mounted there is unmounted before it ends. layercache is built like the other bench scripts
# (release build of HEAD; --worktree, --no-build or --bin PATH instead).
#
# Writes $UNIONMOUNT_WORK/results-<stamp>/report.md (default work dir
# /var/tmp/layercache-unionmount): passed/failed per implementation, every failure's first error
# line, and the tests layercache fails where kernel overlayfs passes; each test's log beside it.
# ~2-4 minutes per implementation on a 2-CPU machine; not in CI. Exit status: 0 when no layercache
# mode fails a test kernel overlayfs passes, 1 when one does, 2 on a setup error.
set -euo pipefail
# shellcheck source=scripts/lib-bench.sh
. "$(dirname "$0")/lib-bench.sh"

UM=${UNIONMOUNT_DIR:-/var/tmp/unionmount-testsuite}
W=${UNIONMOUNT_WORK:-/var/tmp/layercache-unionmount}

# The inner part, run by the outer one in a private mount namespace:
#   unionmount.sh --inner IMPL OUTDIR LAYERS TESTS…
if [ "${1:-}" = --inner ]; then
  impl=$2 out=$3 layers=$4
  shift 4
  base=$W/base-$impl
  mkdir -p "$base" "$out"
  mount -t tmpfs -o size=512m lcu_base "$base"
  # Whatever the suite left mounted below the base (it leaves its last union mounted), newest
  # first, then the base itself; a FUSE daemon exits when its mount goes.
  inner_cleanup() {
    local m
    (cd "$UM" && UNIONMOUNT_BASEDIR=$base python3 ./run -c >/dev/null 2>&1) || true
    for m in $(awk -v b="$base" 'index($2, b) == 1 { print $2 }' /proc/mounts | tac); do
      umount "$m" 2>/dev/null || umount -l "$m" || true
    done
  }
  trap inner_cleanup EXIT
  how=(--ov)
  [ "$layers" -gt 0 ] && how=("--ov=$layers")
  env_extra=()
  case $impl in
    kernel) ;;
    layercache) how+=(--fuse=layercache); env_extra=(LAYERCACHE_PASSTHROUGH=0) ;;
    layercache-pt) how+=(--fuse=layercache); env_extra=(LAYERCACHE_PASSTHROUGH=1) ;;
  esac
  # The mode must be the one asked for: an fd opened before a copy-up keeps the lower content in
  # passthrough mode only (README, the one rule), so a probe mount tells the two apart.
  if [ "$impl" != kernel ]; then
    p=$base/probe
    mkdir -p "$p/l" "$p/u" "$p/w" "$p/m" && echo lower >"$p/l/f"
    env "${env_extra[@]}" "$LC_BIN" overlay -o "lowerdir=$p/l,upperdir=$p/u,workdir=$p/w" "$p/m" >/dev/null
    exec 3<"$p/m/f"
    echo upper >"$p/m/f"
    read -r seen <&3 || true
    exec 3<&-
    umount "$p/m"
    want=upper
    [ "$impl" = layercache-pt ] && want=lower
    [ "$seen" = "$want" ] || { echo "$impl: an fd opened before a copy-up read '$seen', not '$want': not the mode asked for" >&2; exit 1; }
  fi
  for t in "$@"; do
    rc=0
    (cd "$UM" && env PATH="$W/bin:$PATH" UNIONMOUNT_BASEDIR="$base" "${env_extra[@]}" \
      timeout 600 python3 ./run "${how[@]}" "$t") >"$out/$t.log" 2>&1 || rc=$?
    # The suite leaves the union of its last check mounted: it must be the implementation's.
    fstype=$(awk -v m="$base/m" '$2 == m { t = $3 } END { print t }' /proc/mounts)
    want=overlay
    [ "$impl" = kernel ] || want=fuse.layercache
    if [ "$fstype" != "$want" ]; then
      echo "$t FAIL the union at $base/m was ${fstype:-not mounted}, not $want (exit $rc)"
    elif [ "$rc" -eq 0 ]; then
      echo "$t pass"
    else
      echo "$t FAIL $(grep -m1 -E 'TEST ERROR|Error|error|Traceback' "$out/$t.log" | head -c 300) (exit $rc)"
    fi
  done >"$out/results"
  exit 0
fi

IMPLS=(kernel layercache layercache-pt)
BUILD=1 BUILD_FROM="" BIN="" LAYERS=0 TESTS=()
while [ $# -gt 0 ]; do
  case $1 in
    --impls) IFS=, read -r -a IMPLS <<<"$2"; shift ;;
    --layers) LAYERS=$2; shift ;;
    --worktree) BUILD_FROM=--worktree ;;
    --no-build) BUILD="" ;;
    --bin) BIN=$2; BUILD=""; shift ;;
    --) shift; TESTS=("$@"); break ;;
    -h | --help) sed -n '2,29p' "$0"; exit 0 ;;
    *) die "unknown argument $1 (see --help)" ;;
  esac
  shift
done
for i in "${IMPLS[@]}"; do
  case $i in kernel | layercache | layercache-pt) ;;
    *) die "--impls: unknown implementation $i (kernel, layercache, layercache-pt)" ;;
  esac
done
[[ $LAYERS =~ ^[0-9]+$ ]] || die "--layers $LAYERS: want a whole number"

lc_init unionmount.sh
lc_need python3:python3 unshare:util-linux
[ -x "$UM/run" ] || die "UNIONMOUNT_DIR=$UM holds no unionmount-testsuite tree (its run script; github.com/amir73il/unionmount-testsuite)"
lc_pick_binary "$BIN" "$BUILD" "$BUILD_FROM"
UMVER=$(git -C "$UM" rev-parse --short=8 HEAD 2>/dev/null || head -c 12 "$UM/.commit" 2>/dev/null || echo "(revision unknown)")

# The suite's own list (tests/*.py, as `run` orders them) when none is given.
if [ ${#TESTS[@]} -eq 0 ]; then
  mapfile -t TESTS < <(python3 - "$UM/run" <<'EOF'
import re, sys
src = open(sys.argv[1]).read()
names = []
for block in re.findall(r"tests \+?= \[(.*?)\]", src, re.S):
    names += re.findall(r'"([a-z0-9-]+)"', block)
# rename-exdev is run only when directory renames are refused (redirect_dir off): both
# implementations here rename directories.
print("\n".join(n for n in names if n != "rename-exdev"))
EOF
  )
fi

mkdir -p "$W/bin"
REAL_MOUNT=$(command -v mount)
cat >"$W/bin/mount" <<EOF
#!/bin/sh
# written by layercache scripts/unionmount.sh: mount -t fuse.layercache SOURCE MNT -oA -oB… runs
# layercache overlay -o A,B… MNT; anything else is mount(8)'s.
if [ "\$1" = -t ] && [ "\$2" = fuse.layercache ]; then
  mnt=\$4 opts=""
  shift 4
  for a in "\$@"; do
    case \$a in -o*) opts="\$opts\${opts:+,}\${a#-o}" ;; *) echo "mount wrapper: unexpected \$a" >&2; exit 1 ;; esac
  done
  exec "$LC_BIN" overlay -o "\$opts" "\$mnt"
fi
exec "$REAL_MOUNT" "\$@"
EOF
chmod +x "$W/bin/mount"

STAMP=$(date +%Y%m%d-%H%M%S)
OUT=$W/results-$STAMP
mkdir -p "$OUT"
declare -A SECS=()
for impl in "${IMPLS[@]}"; do
  log "unionmount-testsuite on $impl (${#TESTS[@]} tests)"
  t0=$(date +%s)
  LAYERCACHE_BIN=$LC_BIN unshare --mount --propagation private bash "$0" --inner "$impl" "$OUT/$impl" "$LAYERS" "${TESTS[@]}" \
    || die "the run on $impl failed to start (see $OUT/$impl)"
  SECS[$impl]=$(($(date +%s) - t0))
done

{
  echo "# unionmount-testsuite $UMVER $STAMP (--ov$([ "$LAYERS" -gt 0 ] && echo "=$LAYERS"))"
  echo
  lc_machine
  echo "layercache: $LC_COMMIT"
  echo
  echo "| implementation | passed | failed | seconds |"
  echo "|---|---|---|---|"
  for impl in "${IMPLS[@]}"; do
    r=$OUT/$impl/results
    echo "| $impl | $(grep -c ' pass$' "$r" || true) | $(grep -c ' FAIL ' "$r" || true) | ${SECS[$impl]} |"
  done
  for impl in "${IMPLS[@]}"; do
    grep -q ' FAIL ' "$OUT/$impl/results" || continue
    echo
    echo "$impl fails:"
    grep ' FAIL ' "$OUT/$impl/results" | sed 's/^/* /'
  done
  if [ -f "$OUT/kernel/results" ]; then
    for impl in layercache layercache-pt; do
      [ -f "$OUT/$impl/results" ] || continue
      echo
      echo "$impl fails, kernel overlayfs passes: $(join <(awk '$2 == "FAIL" { print $1 }' "$OUT/$impl/results" | sort) \
        <(awk '$2 == "pass" { print $1 }' "$OUT/kernel/results" | sort) | tr '\n' ' ')"
    done
  fi
  echo
  echo "logs: $OUT/<implementation>/<test>.log"
} | tee "$OUT/report.md"

for impl in layercache layercache-pt; do
  [ -f "$OUT/$impl/results" ] && [ -f "$OUT/kernel/results" ] || continue
  [ -z "$(join <(awk '$2 == "FAIL" { print $1 }' "$OUT/$impl/results" | sort) \
    <(awk '$2 == "pass" { print $1 }' "$OUT/kernel/results" | sort))" ] || exit 1
done
exit 0
