#!/usr/bin/env bash
# POSIX conformance: pjdfstest inside a fresh layercache mount, with the same run on kernel
# overlayfs (the bar), fuse-overlayfs and a native directory for reference.
#
#   bash scripts/conformance.sh [--impls native,kernel,fuse-overlayfs,layercache,layercache-pt]
#                               [--worktree] [--no-build] [-- TEST_PATTERNS…]
#
# pjdfstest is the Rust rewrite of github.com/pjd/pjdfstest published on crates.io (crate
# `pjdfstest`, pinned below); it is built once with `cargo install` into
# /var/tmp/layercache-bench/pjdfstest (needs libacl1-dev, installed with apt-get). Its dummy
# users are nobody:nogroup and tests:tests (a system user `tests` is created when missing).
# Each implementation gets a fresh mount at /var/tmp/lcc-IMPL (lower: a few files, empty upper)
# and a tmpfs as the secondary filesystem (EXDEV tests). Kernel overlayfs refuses to create
# character devices 0:0 (its whiteout format) with EPERM, which pjdfstest uses for its `char`
# cases; such failures are the reference's, not bugs. layercache-pt is layercache in FUSE
# passthrough mode (LAYERCACHE_PASSTHROUGH=1, as `-o passthrough`); it is in the default list.
# Prints each summary, the tests each implementation fails, and the differences between each
# layercache mode and kernel overlayfs. Exit status: 0 when no layercache mode fails a test that
# kernel overlayfs passes, 1 when one does, 3 when layercache could not be tested (the reason is
# printed), 2 on a setup error.
set -euo pipefail
# shellcheck source=scripts/lib-bench.sh
. "$(dirname "$0")/lib-bench.sh"

PJD_VERSION=0.2.2
IMPLS=(native kernel fuse-overlayfs layercache layercache-pt)
BUILD=1 BUILD_FROM="" PATTERNS=()
while [ $# -gt 0 ]; do
  case $1 in
    --impls) IFS=, read -r -a IMPLS <<<"$2"; shift ;;
    --worktree) BUILD_FROM=--worktree ;;
    --no-build) BUILD="" ;;
    --) shift; PATTERNS=("$@"); break ;;
    -h | --help) sed -n '2,20p' "$0"; exit 0 ;;
    *) die "unknown argument $1 (see --help)" ;;
  esac
  shift
done

lc_init conformance.sh
lc_need fusermount3:fuse3 fuse-overlayfs:fuse-overlayfs cargo:cargo
B=$LC_BENCH_DIR
PJD=$B/pjdfstest/bin/pjdfstest
if [ ! -x "$PJD" ] || [ "$("$PJD" --version 2>/dev/null | awk '{ print $2 }')" != "$PJD_VERSION" ]; then
  dpkg -s libacl1-dev >/dev/null 2>&1 || { apt-get update -qq >/dev/null; DEBIAN_FRONTEND=noninteractive apt-get install -y -qq libacl1-dev >/dev/null; }
  log "building pjdfstest $PJD_VERSION from crates.io (cargo install, once)"
  if ! CARGO_TARGET_DIR=$B/pjdfstest-target cargo install pjdfstest --version "$PJD_VERSION" --locked \
      --root "$B/pjdfstest" >"$B/pjdfstest-build.log" 2>&1; then
    log "pjdfstest is unavailable: cargo install pjdfstest@$PJD_VERSION failed ($(grep -m1 -E '^error' "$B/pjdfstest-build.log" || tail -1 "$B/pjdfstest-build.log")); the upstream C suite lives on GitHub, which this network does not reach"
    exit 3
  fi
fi
getent passwd tests >/dev/null || useradd --system --user-group --no-create-home --shell /usr/sbin/nologin tests
NOGROUP=$(getent group nogroup >/dev/null && echo nogroup || echo nobody)
cat >"$B/pjdfstest.toml" <<EOF
# written by scripts/conformance.sh
[features]
posix_fallocate = {}
rename_ctime = {}
utime_now = {}
utimensat = {}
[settings]
# longer than the kernel's coarse timestamp granularity (a jiffy), or ctime/mtime checks flake
naptime = 0.05
allow_remount = false
[dummy_auth]
entries = [["nobody", "$NOGROUP"], ["tests", "tests"]]
EOF

LC_STATUS="not requested"
has_impl() { [[ " ${IMPLS[*]} " == *" $1 "* ]]; }
LC_IMPLS=()
for impl in layercache layercache-pt; do has_impl "$impl" && LC_IMPLS+=("$impl"); done
if [ ${#LC_IMPLS[@]} -gt 0 ]; then
  if [ -n "$BUILD" ] && ! lc_build $BUILD_FROM; then
    LC_STATUS="release build failed (see $B/build.log)"
  elif [ ! -x "$LC_BIN" ]; then
    LC_STATUS="no binary at $LC_BIN"
  else
    [ -n "$LC_COMMIT" ] || LC_COMMIT=$(lc_prebuilt_commit)
    LC_STATUS="ok ($LC_COMMIT)"
  fi
fi

SEC=$B/conformance/secondary
mkdir -p "$SEC"
mount -t tmpfs -o size=64m tmpfs "$SEC"
lc_register tmpfs "$SEC"

STAMP=$(date +%Y%m%d-%H%M%S)
OUT=$B/results/conformance-$STAMP
mkdir -p "$OUT"
declare -A SUMMARY=()
for impl in "${IMPLS[@]}"; do
  if [[ $impl == layercache* ]] && [[ $LC_STATUS != ok* ]]; then SUMMARY[$impl]="not run: $LC_STATUS"; continue; fi
  r=$B/conformance/$impl
  # a short mountpoint: socket tests bind() paths below it, and sun_path holds only 108 bytes
  m=/var/tmp/lcc-$impl
  rm -rf "$r" && mkdir -p "$r/lower/dir" "$m"
  echo "lower file" >"$r/lower/file" && ln -s file "$r/lower/link"
  lower=$r/lower
  [ "$impl" = native ] && lower=$r/native && mkdir -p "$lower"
  if ! lc_mount "$impl" "$lower" "$r/upper" "$r/work" "$m"; then
    SUMMARY[$impl]="not run: mount failed: $(lc_mount_error)"
    [[ $impl != layercache* ]] || LC_STATUS="mount failed: $(lc_mount_error)"
    lc_umount "$m"; rmdir "$m" 2>/dev/null || true; continue
  fi
  mkdir -p "$m/t" "$SEC/$impl"
  log "pjdfstest on $impl"
  rc=0
  (cd "$B" && RUST_BACKTRACE=0 timeout 1800 "$PJD" -c "$B/pjdfstest.toml" -p "$m/t" \
    -s "$SEC/$impl" "${PATTERNS[@]}") >"$OUT/$impl.log" 2>&1 || rc=$?
  lc_umount "$m"
  lc_is_mounted "$m" || rmdir "$m" 2>/dev/null || true
  SUMMARY[$impl]=$(grep -m1 '^Summary:' "$OUT/$impl.log" | sed 's/^Summary: //' || true)
  [ -n "${SUMMARY[$impl]}" ] || SUMMARY[$impl]="no summary (exit status $rc; see $OUT/$impl.log)"
  [ "$rc" -ne 124 ] || SUMMARY[$impl]+=" — TIMED OUT after 30 min"
  grep -E '[[:space:]]FAILED$' "$OUT/$impl.log" | awk '{ print $1 }' | sort -u >"$OUT/$impl.failed" || true
done

{
  echo "# pjdfstest $PJD_VERSION conformance $STAMP"
  echo
  lc_machine
  echo "layercache: $LC_STATUS"
  echo
  echo "| implementation | summary |"
  echo "|---|---|"
  for impl in "${IMPLS[@]}"; do echo "| $impl | ${SUMMARY[$impl]} |"; done
  for impl in "${IMPLS[@]}"; do
    f=$OUT/$impl.failed
    [ -s "$f" ] || continue
    echo
    echo "$impl fails ($(wc -l <"$f")): $(tr '\n' ' ' <"$f")"
  done
  for impl in "${LC_IMPLS[@]}"; do
    [ -f "$OUT/$impl.failed" ] && [ -f "$OUT/kernel.failed" ] || continue
    echo
    echo "$impl fails, kernel overlayfs passes: $(comm -23 "$OUT/$impl.failed" "$OUT/kernel.failed" | tr '\n' ' ')"
    echo "kernel overlayfs fails, $impl passes: $(comm -13 "$OUT/$impl.failed" "$OUT/kernel.failed" | tr '\n' ' ')"
  done
  echo
  echo "logs: $OUT/<implementation>.log"
} | tee "$OUT/report.md"

if [[ $LC_STATUS != ok* ]] && [ ${#LC_IMPLS[@]} -gt 0 ]; then
  log "layercache could not be tested: $LC_STATUS"; exit 3
fi
status=0
for impl in "${LC_IMPLS[@]}"; do
  if [[ ${SUMMARY[$impl]} != *failed* ]]; then
    log "$impl's pjdfstest run ended without a summary"; status=1
  elif [ -f "$OUT/$impl.failed" ] && [ -f "$OUT/kernel.failed" ] \
      && [ -n "$(comm -23 "$OUT/$impl.failed" "$OUT/kernel.failed")" ]; then
    status=1
  fi
done
exit "$status"
