#!/usr/bin/env bash
# xfstests (fstests) against layercache and kernel overlayfs: one harness, one test list.
#
#   bash scripts/xfstests.sh [--impls layercache,overlay] [--tests "generic/001 …" | --list FILE]
#                            [--bin PATH | --worktree | --no-build] [--timeout MINUTES]
#                            [--mount-opts OPTS]
#
# The list is xfstests' generic `quick` group less benches/xfstests-exclude.txt (tests that need a
# block-device feature: device-mapper, shutdown, swapfile, DAX, loop, scsi_debug…); --tests runs
# the given tests instead, --list those of FILE (one a line, # comments; benches/xfstests-sample.txt
# is a sample for a loaded machine). Both implementations see the
# same list, the same users and the same bounded filesystems:
#
# * layercache: xfstests' FSTYP=fuse with FUSE_SUBTYP=.layercache. mount(8) → mount.fuse3 runs
#   `layercache SOURCE MNT -o lowerdir=…,upperdir=…,workdir=…`; mount(8) drops PATH, so a small
#   wrapper /usr/local/bin/layercache (removed at exit) execs the binary under test. The lowerdir
#   holds a few files; upper and work sit on a loop-mounted XFS image (one for the test mount, one
#   for the scratch mount; see XFSTESTS_BASE_FS below). TEST_DEV/SCRATCH_DEV are the mount sources /proc/mounts shows
#   (`layercache:<upperdir>`), and a `df` wrapper first in PATH reports `fuse.layercache` as `fuse`
#   (xfstests compares df -T's type column with FSTYP).
# * kernel overlayfs: xfstests' own FSTYP=overlay, with base directories (legacy OVL_BASE_* form)
#   on the same two loop-mounted images; the same few files are put in its test lowerdir.
#
# The images are XFS (mkfs.xfs -m reflink=0), XFSTESTS_BASE_FS=ext4 gives ext4 (the reports
# before 2026-12-02): xfstests sizes its xattr tests by FSTYP, and for FSTYP=fuse it assumes
# what XFS holds (generic/020: 1000 xattrs a file, 64 KiB values), which an ext4 upper cannot
# (one 4 KiB block of xattrs, about 100); kernel overlayfs runs on the same images. reflink is
# off so that both implementations see ext4's feature set otherwise (FUSE has no
# remap_file_range: clone tests would run on kernel overlayfs alone).
#
# xfstests is not built here: XFSTESTS_DIR (default /var/tmp/xfstests) must be a kdave/xfstests
# (git.kernel.org fs/xfs/xfstests-dev) tree built as its README says. This script installs the
# Debian packages xfstests runs (apt-get), creates the users its README names (fsgqa, fsgqa2,
# 123456-fsgqa), builds layercache like the other bench scripts (release build of HEAD; --worktree,
# --no-build or --bin PATH instead) and writes benches/results/<date>-xfstests-<commit>.md:
# passed / failed / not run per implementation, every layercache-only failure with its cause
# (benches/xfstests-causes.txt, diagnosed by hand) and the test's own first differing output line,
# the tests only layercache skips with xfstests' reason, and how long each run took. A whole run is
# ~12-15 minutes per implementation on a 2-CPU machine; not in CI.
#
# Everything lives under XFSTESTS_WORK (default /var/tmp/layercache-xfstests; one run per work dir,
# runs with different work dirs can share the machine; the layercache daemons' warnings and errors
# go to daemon.log there, and the report counts its lines); every mount and loop device it makes is
# undone on exit, also when interrupted. Exit status: 0 when done (whatever the results), 2 on a
# setup error.
set -euo pipefail
# shellcheck source=scripts/lib-bench.sh
. "$(dirname "$0")/lib-bench.sh"

IMPLS=(layercache overlay)
TESTS="" LIST_FILE="" BUILD=1 BUILD_FROM="" BIN="" TIMEOUT_MIN=45 LC_OPTS=""
while [ $# -gt 0 ]; do
  case $1 in
    --impls) IFS=, read -r -a IMPLS <<<"$2"; shift ;;
    --tests) TESTS=$2; shift ;;
    --list) [ -f "$2" ] || die "--list $2: no such file"
      TESTS=$(sed -e 's/#.*//' "$2" | tr -s ' \n' ' '); LIST_FILE=$2; shift ;;
    --worktree) BUILD_FROM=--worktree ;;
    --no-build) BUILD="" ;;
    --bin) BIN=$2; BUILD=""; shift ;;
    --timeout) TIMEOUT_MIN=$2; shift ;;
    # Extra layercache mount options, e.g. `passthrough` (FUSE passthrough mode, as
    # LAYERCACHE_PASSTHROUGH=1, which mount(8) would not pass on to the daemon).
    --mount-opts) LC_OPTS=",$2"; shift ;;
    -h | --help) sed -n '2,44p' "$0"; exit 0 ;;
    *) die "unknown argument $1 (see --help)" ;;
  esac
  shift
done
for i in "${IMPLS[@]}"; do
  case $i in layercache | overlay) ;; *) die "--impls: unknown implementation $i (layercache, overlay)" ;; esac
done

XT=${XFSTESTS_DIR:-/var/tmp/xfstests}
W=${XFSTESTS_WORK:-/var/tmp/layercache-xfstests}
WRAPPER=/usr/local/bin/layercache
WRAPPER_MARK="# written by layercache scripts/xfstests.sh"
# Runs at once (another XFSTESTS_WORK) share the wrapper: each registers WORKDIR<TAB>BINARY here
# and the wrapper execs the binary whose work dir the mount options name.
REG=/run/layercache-xfstests
REG_ENTRY=$REG/$(printf '%s' "$W" | md5sum | cut -c1-12).run
LOOPS=() IMG_MOUNTS=() WRAPPER_LOST=""

# Undo everything, newest first: xfstests' own mounts at our mountpoints (a stacked one included),
# the images, the loop devices, the wrapper. Runs on every exit (lc_init's trap calls lc_cleanup;
# ours wraps it).
xt_cleanup() {
  local rc=$? m i
  for m in "$W/mnt/test" "$W/mnt/scratch" "$W/base-test/ovl-mnt" "$W/base-scratch/ovl-mnt"; do
    for i in 1 2 3 4; do
      lc_is_mounted "$m" || break
      umount "$m" 2>/dev/null || umount -l "$m" 2>/dev/null || true
    done
  done
  for ((i = ${#IMG_MOUNTS[@]} - 1; i >= 0; i--)); do
    lc_is_mounted "${IMG_MOUNTS[i]}" && { umount "${IMG_MOUNTS[i]}" 2>/dev/null || umount -l "${IMG_MOUNTS[i]}"; }
  done
  for i in "${LOOPS[@]}"; do losetup -d "$i" 2>/dev/null || true; done
  rm -f "$REG_ENTRY"
  if [ -f "$WRAPPER" ] && grep -qF "$WRAPPER_MARK" "$WRAPPER" && ! ls "$REG"/*.run >/dev/null 2>&1; then
    rm -f "$WRAPPER"
  fi
  lc_cleanup || true
  return "$rc"
}

lc_init xfstests.sh
mkdir -p "$W"
exec 9>"$W.lock"
flock -n 9 || die "another scripts/xfstests.sh run uses $W (give this one its own XFSTESTS_WORK)"
trap xt_cleanup EXIT
[ -x "$XT/check" ] && [ -x "$XT/ltp/fsstress" ] \
  || die "XFSTESTS_DIR=$XT is not a built xfstests tree (./check and ltp/fsstress); build xfstests as its README says and point XFSTESTS_DIR at it"
[ -f "$LC_REPO/benches/xfstests-exclude.txt" ] || die "benches/xfstests-exclude.txt is missing"

BASE_FS=${XFSTESTS_BASE_FS:-xfs}
case $BASE_FS in
  xfs) MKFS=(mkfs.xfs -q -f -m reflink=0) ;;
  ext4) MKFS=(mkfs.ext4 -q -F) ;;
  *) die "XFSTESTS_BASE_FS=$BASE_FS: want xfs or ext4" ;;
esac
lc_need mount.fuse3:fuse3 losetup:mount mkfs.ext4:e2fsprogs mkfs.xfs:xfsprogs
XT_PKGS=(acl attr bc dump e2fsprogs fio gawk libacl1 libaio1 liburing2 psmisc python3 quota sed uuid-runtime xfsprogs)
missing=()
for p in "${XT_PKGS[@]}"; do dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p"); done
if [ ${#missing[@]} -gt 0 ]; then
  log "installing ${missing[*]} with apt-get"
  apt-get update -qq >/dev/null
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null || die "apt-get install ${missing[*]} failed"
fi
getent group fsgqa >/dev/null || groupadd fsgqa
getent passwd fsgqa >/dev/null || useradd -m -g fsgqa fsgqa
getent passwd fsgqa2 >/dev/null || useradd -m fsgqa2
getent passwd 123456-fsgqa >/dev/null || useradd -m 123456-fsgqa

lc_pick_binary "$BIN" "$BUILD" "$BUILD_FROM"
COMMIT_ID=$(git -C "$LC_REPO" rev-parse --short=7 HEAD)
# The xfstests revision: its git HEAD, or the commit id in .commit of an exported tree.
XVER=$(git -C "$XT" rev-parse --short=8 HEAD 2>/dev/null || head -c 12 "$XT/.commit" 2>/dev/null || echo "(revision unknown)")

# The test list: generic/quick less the exclusions.
if [ -n "$TESTS" ]; then
  read -r -a LIST <<<"$TESTS"
  LIST_DESC="${#LIST[@]} tests of ${LIST_FILE:-the --tests argument} (a subset of the generic quick group)"
else
  mapfile -t LIST < <(awk '$0 ~ / quick( |$)/ { print "generic/" $1 }' "$XT/tests/generic/group.list" \
    | grep -vxF -f <(sed -e 's/#.*//' -e 's/[[:space:]]*$//' -e '/^$/d' "$LC_REPO/benches/xfstests-exclude.txt"))
  nq=$(awk '$0 ~ / quick( |$)/' "$XT/tests/generic/group.list" | wc -l)
  LIST_DESC="the generic quick group ($nq tests) less the $((nq - ${#LIST[@]})) of benches/xfstests-exclude.txt: ${#LIST[@]} tests"
fi
[ ${#LIST[@]} -gt 0 ] || die "the test list is empty"

# Two bounded filesystems (sparse images of $BASE_FS on loop devices): never the machine's disk.
mkdir -p "$W/mnt/test" "$W/mnt/scratch" "$W/base-test" "$W/base-scratch"
for n in test scratch; do
  lc_is_mounted "$W/base-$n" && die "$W/base-$n is already mounted (another run of this script?)"
  rm -f "$W/$n.img"
  truncate -s "${XFSTESTS_IMAGE_SIZE:-4G}" "$W/$n.img"
  "${MKFS[@]}" "$W/$n.img"
  dev=$(losetup -f --show "$W/$n.img")
  LOOPS+=("$dev")
  mount "$dev" "$W/base-$n"
  IMG_MOUNTS+=("$W/base-$n")
done

# mount.fuse3 runs `layercache …` with a PATH-less environment: /usr/local/bin it is.
if [ -e "$WRAPPER" ] && ! grep -qF "$REG" "$WRAPPER"; then
  die "$WRAPPER exists and is not this script's wrapper (or an older one's, still in use); move it away or wait"
fi
mkdir -p "$REG"
printf '%s\t%s\n' "$W" "$LC_BIN" >"$REG_ENTRY"
# A temp name of this run's own: two runs started together each write the same wrapper.
wtmp=$WRAPPER.$$.tmp
cat >"$wtmp" <<EOF
#!/bin/sh
$WRAPPER_MARK (removed when the last run exits)
for f in $REG/*.run; do
  [ -f "\$f" ] || continue
  IFS='$(printf '\t')' read -r w bin <"\$f"
  # Each daemon's warnings and errors (the node index, refused requests) in the run's work dir.
  case " \$* " in *"\$w/"*) LAYERCACHE_DAEMON_LOG=\$w/daemon.log exec "\$bin" "\$@" ;; esac
done
echo "layercache (xfstests wrapper): no scripts/xfstests.sh run owns: \$*" >&2
exit 1
EOF
chmod 755 "$wtmp"
mv "$wtmp" "$WRAPPER"
mkdir -p "$W/bin"
printf '#!/bin/sh\n# df -T for xfstests: a fuse.layercache mount is FSTYP=fuse\n/usr/bin/df "$@" | sed "s/ fuse\\.layercache / fuse /"\n' >"$W/bin/df"
chmod 755 "$W/bin/df"

few_files() { # DIR: the few lower files every implementation starts with
  mkdir -p "$1/dir/sub"
  echo lower >"$1/file"
  echo nested >"$1/dir/sub/file"
  head -c 65536 /dev/urandom >"$1/dir/blob"
  ln -s file "$1/link"
}

# run_impl IMPL: one xfstests run; results in $W/results-IMPL, check's output in $W/IMPL.log.
run_impl() {
  local impl=$1 cfg=$W/$1.config t0
  rm -rf "$W/results-$impl" "$W/daemon.log" "${W:?}/base-test/"* "${W:?}/base-scratch/"*
  case $impl in
    layercache)
      for n in test scratch; do mkdir -p "$W/base-$n/upper" "$W/base-$n/work"; few_files "$W/base-$n/lower"; done
      cat >"$cfg" <<EOF
export FSTYP=fuse
export FUSE_SUBTYP=.layercache
export TEST_DEV=layercache:$W/base-test/upper
export TEST_DIR=$W/mnt/test
export SCRATCH_DEV=layercache:$W/base-scratch/upper
export SCRATCH_MNT=$W/mnt/scratch
export TEST_FS_MOUNT_OPTS="-o lowerdir=$W/base-test/lower,upperdir=$W/base-test/upper,workdir=$W/base-test/work$LC_OPTS"
export MOUNT_OPTIONS="-o lowerdir=$W/base-scratch/lower,upperdir=$W/base-scratch/upper,workdir=$W/base-scratch/work$LC_OPTS"
EOF
      ;;
    overlay)
      few_files "$W/base-test/ovl-lower"
      cat >"$cfg" <<EOF
export FSTYP=overlay
export TEST_DEV=$W/base-test
export TEST_DIR=$W/base-test/ovl-mnt
export SCRATCH_DEV=$W/base-scratch
export SCRATCH_MNT=$W/base-scratch/ovl-mnt
EOF
      # xfstests checks the base's d_type with common/xfs's _xfs_has_feature for an XFS base
      # (common/rc _supports_filetype) but sources common/xfs only for FSTYP=xfs: without this
      # every overlay test is "not run: upper fs needs to support d_type".
      [ "$BASE_FS" != xfs ] || cat >>"$cfg" <<'EOF'
type _xfs_has_feature >/dev/null 2>&1 || {
  _xfs_has_feature() { xfs_info "$(stat -c %m "$1")" 2>/dev/null | grep -qw "$2=1"; }
  export -f _xfs_has_feature
}
EOF
      ;;
  esac
  log "$impl: ${#LIST[@]} tests (log: $W/$impl.log)"
  t0=$(date +%s)
  (cd "$XT" && PATH="$W/bin:$PATH" HOST_OPTIONS=$cfg RESULT_BASE="$W/results-$impl" \
    timeout --foreground -k 30 "${TIMEOUT_MIN}m" ./check "${LIST[@]}") >"$W/$impl.log" 2>&1 || true
  echo $(($(date +%s) - t0)) >"$W/$impl.secs"
  if [ "$impl" = layercache ] && ! grep -qF "$REG" "$WRAPPER" 2>/dev/null; then
    WRAPPER_LOST=1
    log "warning: $WRAPPER was replaced or removed during the run (another script?)"
  fi
  for m in "$W/mnt/test" "$W/mnt/scratch" "$W/base-test/ovl-mnt" "$W/base-scratch/ovl-mnt"; do
    lc_is_mounted "$m" && { umount "$m" 2>/dev/null || umount -l "$m"; }
  done
  log "$impl: done in $(cat "$W/$impl.secs") s"
}

# status IMPL TEST: passed | failed | notrun | missing (never reached: the run timed out)
status() {
  local log=$W/$1.log
  if grep -qE "^Not run:.* $2( |\$)" <(sed 's/^Not run:/Not run: /' "$log"); then echo notrun
  elif grep -qE "^Failures:.* $2( |\$)" <(sed 's/^Failures:/Failures: /' "$log"); then echo failed
  elif grep -qE "^(Ran:|Passed all)" "$log" && grep -qE "^$2 " "$log"; then echo passed
  elif [ -f "$W/results-$1/$2.notrun" ]; then echo notrun
  elif [ -f "$W/results-$1/$2.out.bad" ]; then echo failed
  elif grep -qE "^$2 +[0-9]+s" "$log"; then echo passed
  else echo missing
  fi
}

# first_diff IMPL TEST: the test's own first differing output line (or why it failed).
first_diff() {
  local bad=$W/results-$1/$2.out.bad line
  if [ -f "$bad" ]; then
    line=$(diff "$XT/tests/$2.out" "$bad" 2>/dev/null | grep -m1 '^>' | cut -c3- || true)
    [ -n "$line" ] || line=$(diff "$XT/tests/$2.out" "$bad" 2>/dev/null | grep -m1 '^<' | sed 's/^< /missing: /' || true)
  fi
  [ -n "${line:-}" ] || line=$(awk -v t="$2" '$1 == t { $1 = ""; print; exit }' "$W/$1.log")
  printf '%s' "$line" | tr '|`' '/\x27' | cut -c1-160
}

for impl in "${IMPLS[@]}"; do run_impl "$impl"; done

# The report.
mkdir -p "$LC_REPO/benches/results"
REPORT=$LC_REPO/benches/results/$(date -u +%Y-%m-%d)-xfstests-$COMMIT_ID${LC_OPTS:+-${LC_OPTS#,}}.md
declare -A ST
for impl in "${IMPLS[@]}"; do
  for t in "${LIST[@]}"; do ST[$impl,$t]=$(status "$impl" "$t"); done
done
count() { local n=0 t; for t in "${LIST[@]}"; do [ "${ST[$1,$t]}" = "$2" ] && n=$((n + 1)); done; echo $n; }
cause() { awk -v t="$1" '$1 == t { $1 = ""; sub(/^ +/, ""); print; exit }' "$LC_REPO/benches/xfstests-causes.txt" 2>/dev/null; }
{
  echo "# xfstests: layercache and kernel overlayfs ($(date -u +%Y-%m-%d), commit $COMMIT_ID)"
  echo
  echo "\`bash scripts/xfstests.sh${LIST_FILE:+ --list $LIST_FILE}\` — xfstests $XVER, $LIST_DESC."
  [ -z "$LC_OPTS" ] || echo "layercache mounted with the extra options \`${LC_OPTS#,}\` (--mount-opts)."
  echo "One harness, one list; upper/work on loop-mounted $BASE_FS images (\`${MKFS[*]}\`) of ${XFSTESTS_IMAGE_SIZE:-4G} each."
  [ ! -s "$W/daemon.log" ] || echo "layercache daemons' log: $(wc -l <"$W/daemon.log") lines ($W/daemon.log; warnings and errors only)."
  [ -z "$WRAPPER_LOST" ] || echo "**Warning: $WRAPPER was replaced during the layercache run; some mounts may have run another binary.**"
  echo
  lc_machine | sed 's/^/    /'
  echo
  echo "| implementation | passed | failed | not run | never reached | wall time |"
  echo "|---|---|---|---|---|---|"
  for impl in "${IMPLS[@]}"; do
    echo "| $impl | $(count "$impl" passed) | $(count "$impl" failed) | $(count "$impl" notrun) | $(count "$impl" missing) | $(($(cat "$W/$impl.secs") / 60)) min $(($(cat "$W/$impl.secs") % 60)) s |"
  done
  echo
  if [[ " ${IMPLS[*]} " == *" layercache "* ]]; then
    echo "## Every layercache failure"
    echo
    echo "Cause: benches/xfstests-causes.txt (diagnosed by hand). Diagnostic: the test's first output line that differs from its golden output (or check's reason)."
    echo
    echo "| test | kernel overlayfs | cause | diagnostic |"
    echo "|---|---|---|---|"
    for t in "${LIST[@]}"; do
      [ "${ST[layercache,$t]}" = failed ] || continue
      echo "| $t | ${ST[overlay,$t]:-not measured} | $(cause "$t" || true) | \`$(first_diff layercache "$t")\` |"
    done
    echo
    echo "## Not run on layercache, run on kernel overlayfs"
    echo
    echo "| test | kernel overlayfs | xfstests' reason on layercache |"
    echo "|---|---|---|"
    for t in "${LIST[@]}"; do
      [ "${ST[layercache,$t]}" = notrun ] && [ -n "${ST[overlay,$t]:-}" ] && [ "${ST[overlay,$t]}" != notrun ] || continue
      echo "| $t | ${ST[overlay,$t]} | $(head -1 "$W/results-layercache/$t.notrun" 2>/dev/null | tr '|' '/' | cut -c1-160) |"
    done
    echo
  fi
  for impl in "${IMPLS[@]}"; do
    [ "$impl" = layercache ] && continue
    echo "## $impl failures"
    echo
    for t in "${LIST[@]}"; do
      if [ "${ST[$impl,$t]}" = failed ]; then echo "* $t: \`$(first_diff "$impl" "$t")\`"; fi
    done
    echo
  done
  echo "## Not-run reasons (count per implementation)"
  echo
  for impl in "${IMPLS[@]}"; do
    echo "$impl:"
    echo
    for t in "${LIST[@]}"; do
      if [ "${ST[$impl,$t]}" = notrun ]; then head -1 "$W/results-$impl/$t.notrun" 2>/dev/null | sed 's/[0-9][0-9]*/N/g' || true; fi
    done | sort | uniq -c | sort -rn | sed 's/^ *\([0-9]*\) \(.*\)/* \1 × \2/'
    echo
  done
} >"$REPORT"
log "report: $REPORT"
