# shellcheck shell=bash
# Helpers shared by scripts/bench.sh, scripts/ready.sh and scripts/conformance.sh (source it; do not
# run it). Everything these scripts create lives under $LC_BENCH_DIR (default
# /var/tmp/layercache-bench); every mount they make is registered here and unmounted by the EXIT
# trap that lc_init installs, also when a script fails or is interrupted.

LC_REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
LC_BENCH_DIR=${LAYERCACHE_BENCH_DIR:-/var/tmp/layercache-bench}
# Release builds go to their own target dir so they never disturb the developers' debug builds.
LC_TARGET=${LAYERCACHE_BENCH_TARGET:-$LC_BENCH_DIR/target}
LC_BIN=${LAYERCACHE_BIN:-$LC_TARGET/release/layercache}
LC_SRC=$LC_BENCH_DIR/src          # a clean export of the committed HEAD (see lc_build)
LC_COMMIT=""                      # what was built (commit id, or "worktree")
LC_MOUNTS=()                      # every mountpoint we mounted, in order
declare -gA LC_DAEMON=()          # mountpoint -> pid of its FUSE daemon

log() { printf '[%s] %s\n' "$(date +%H:%M:%S)" "$*" >&2; }
die() { log "error: $*"; exit 2; }

# lc_init NAME: checks that we are root, creates the work dir and installs the cleanup trap.
lc_init() {
  [ "$(id -u)" -eq 0 ] || die "$1 must run as root (it mounts overlays and drops the page cache)"
  mkdir -p "$LC_BENCH_DIR"
  trap lc_cleanup EXIT
  trap 'log "interrupted"; exit 130' INT TERM HUP
}

# lc_need CMD:PKG …: installs the Debian packages whose command is missing.
lc_need() {
  local spec cmd pkg need=()
  for spec in "$@"; do
    cmd=${spec%%:*} pkg=${spec#*:}
    command -v "$cmd" >/dev/null 2>&1 || need+=("$pkg")
  done
  [ ${#need[@]} -eq 0 ] && return 0
  log "installing ${need[*]} with apt-get"
  apt-get update -qq >/dev/null
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need[@]}" >/dev/null
}

# lc_build [--worktree]: release build of layercache into $LC_TARGET. By default it builds the
# committed HEAD (exported with git archive into $LC_SRC), not the shared working tree, where other
# engineers may be in the middle of an edit. Returns non-zero (and logs why) when the build fails.
lc_build() {
  local head stamp="$LC_SRC/.lc-commit" dir
  if [ "${1:-}" = "--worktree" ]; then
    dir=$LC_REPO LC_COMMIT="worktree@$(git -C "$LC_REPO" rev-parse --short HEAD)"
  else
    head=$(git -C "$LC_REPO" rev-parse HEAD)
    if [ "$(cat "$stamp" 2>/dev/null)" != "$head" ]; then
      rm -rf "$LC_SRC" && mkdir -p "$LC_SRC"
      # --touch: fresh mtimes, so cargo never mistakes new content for an up-to-date build
      git -C "$LC_REPO" archive "$head" | tar -x --touch -C "$LC_SRC"
      echo "$head" >"$stamp"
    fi
    dir=$LC_SRC LC_COMMIT=${head:0:12}
  fi
  log "building layercache ($LC_COMMIT) in release mode into $LC_TARGET"
  if ! (cd "$dir" && CARGO_TARGET_DIR=$LC_TARGET cargo build --release --quiet --bin layercache) \
      >"$LC_BENCH_DIR/build.log" 2>&1; then
    log "layercache build failed (see $LC_BENCH_DIR/build.log): $(grep -m1 -E '^error' "$LC_BENCH_DIR/build.log" || tail -1 "$LC_BENCH_DIR/build.log")"
    return 1
  fi
}

# lc_pick_binary BIN BUILD BUILD_FROM: sets LC_BIN and LC_COMMIT for a script's --bin PATH (BIN
# non-empty), a release build of HEAD (BUILD non-empty; BUILD_FROM --worktree builds the work
# tree) or --no-build (the last build); exits 2 when there is no binary then.
lc_pick_binary() {
  if [ -n "$1" ]; then
    LC_BIN=$(realpath "$1") LC_COMMIT="$(git -C "$LC_REPO" rev-parse --short=12 HEAD) ($1)"
  elif [ -n "$2" ]; then
    lc_build $3 || exit 2
  else
    LC_COMMIT=$(lc_prebuilt_commit)
  fi
  [ -x "$LC_BIN" ] || die "no layercache binary at $LC_BIN"
}

# lc_prebuilt_commit: describes a binary used with --no-build (the last commit lc_build exported).
lc_prebuilt_commit() {
  if [ -f "$LC_SRC/.lc-commit" ] && [ "$LC_BIN" = "$LC_TARGET/release/layercache" ]; then
    echo "$(cut -c1-12 "$LC_SRC/.lc-commit") (prebuilt)"
  else
    echo "prebuilt $LC_BIN"
  fi
}

# Microseconds since the epoch, without a fork.
lc_now() { local t=${EPOCHREALTIME/./}; echo "$((10#$t))"; }

lc_drop_caches() { sync; echo 3 >/proc/sys/vm/drop_caches; }

lc_is_mounted() { awk -v p="$1" '$2 == p { f = 1 } END { exit !f }' /proc/mounts; }

# lc_daemon_pid MOUNTPOINT: the pid of the process serving a FUSE mount (it has the mountpoint as
# an argument and holds /dev/fuse open).
lc_daemon_pid() {
  local p a fd args
  for p in /proc/[0-9]*; do
    [ "${p#/proc/}" = "$$" ] && continue
    mapfile -d "" args 2>/dev/null <"$p/cmdline" || continue
    for a in "${args[@]}"; do
      [ "$a" = "$1" ] || continue
      for fd in "$p"/fd/*; do
        [ "$(readlink "$fd" 2>/dev/null)" = /dev/fuse ] && { echo "${p#/proc/}"; return 0; }
      done
    done
  done
  return 1
}

# lc_mount IMPL LOWER UPPER WORK MOUNTPOINT: mounts one implementation; returns when the mount
# command returned. IMPL is native (a bind mount of LOWER: same code path as the plain directory),
# kernel (overlayfs), fuse-overlayfs, layercache, layercache-pt (layercache with FUSE
# passthrough, LAYERCACHE_PASSTHROUGH=1), layercache-user (layercache mounted by the unprivileged
# user $LC_USER through fusermount3, with allow_other so that the workloads run as root as for
# the others; see lc_user_env) or layercache-user-nouring (the same with LAYERCACHE_URING=0, the
# /dev/fuse read loop). Errors go to $LC_BENCH_DIR/mount.err.
lc_mount() {
  local impl=$1 lower=$2 upper=$3 work=$4 mnt=$5 rc=0
  mkdir -p "$mnt"
  [ "$impl" = native ] || mkdir -p "$upper" "$work"
  lc_mount_cmd "$@" || rc=$?
  lc_register "$impl" "$mnt"
  [ "$rc" -eq 0 ] || return "$rc"
  lc_is_mounted "$mnt" || { echo "mount command succeeded but nothing is mounted" >>"$LC_BENCH_DIR/mount.err"; return 1; }
}

# lc_mount_cmd IMPL LOWER UPPER WORK MOUNTPOINT: only the mount command (directories must exist;
# the caller registers the mount with lc_register). Used directly where mount latency is timed.
lc_mount_cmd() {
  local impl=$1 lower=$2 mnt=$5 opts="lowerdir=$2,upperdir=$3,workdir=$4"
  case $impl in
    native) timeout 60 mount --bind "$lower" "$mnt" 2>"$LC_BENCH_DIR/mount.err" ;;
    kernel) timeout 60 mount -t overlay overlay -o "$opts" "$mnt" 2>"$LC_BENCH_DIR/mount.err" ;;
    fuse-overlayfs) timeout 60 fuse-overlayfs -o "$opts" "$mnt" 2>"$LC_BENCH_DIR/mount.err" ;;
    layercache) timeout 60 "$LC_BIN" overlay -o "$opts" "$mnt" >/dev/null 2>"$LC_BENCH_DIR/mount.err" ;;
    layercache-pt) LAYERCACHE_PASSTHROUGH=1 timeout 60 "$LC_BIN" overlay -o "$opts" "$mnt" >/dev/null 2>"$LC_BENCH_DIR/mount.err" ;;
    layercache-user | layercache-user-nouring)
      chown "$LC_USER:$LC_USER" "$3" "$4" "$mnt"
      env LAYERCACHE_URING=$([ "$impl" = layercache-user ] && echo 1 || echo 0) \
        setpriv --reuid="$LC_USER" --regid="$LC_USER" --clear-groups --inh-caps=-all \
        env PATH=/usr/bin:/bin HOME=/ timeout 60 "$LC_BIN" overlay -o "$opts,allow_other" "$mnt" \
        >/dev/null 2>"$LC_BENCH_DIR/mount.err" ;;
    *) die "unknown implementation $impl" ;;
  esac
}

# lc_register IMPL MOUNTPOINT: remembers a mount (for lc_cleanup) and its FUSE daemon's pid.
lc_register() {
  lc_is_mounted "$2" || return 0
  LC_MOUNTS+=("$2")
  case $1 in
    fuse-overlayfs | layercache*) LC_DAEMON[$2]=$(lc_daemon_pid "$2" || true) ;;
  esac
}

# lc_mount_error: the first line of the last mount error.
lc_mount_error() { head -c 300 "$LC_BENCH_DIR/mount.err" 2>/dev/null | head -1; }

# lc_umount MOUNTPOINT: unmounts (lazily as a last resort) and waits for its FUSE daemon to exit.
lc_umount() {
  local mnt=$1 pid i
  if lc_is_mounted "$mnt"; then
    umount "$mnt" 2>/dev/null || { sleep 0.3; umount "$mnt" 2>/dev/null; } \
      || { log "umount $mnt failed, detaching lazily"; umount -l "$mnt" 2>/dev/null || true; }
  fi
  pid=${LC_DAEMON[$mnt]:-}
  if [ -n "$pid" ]; then
    for i in $(seq 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
    if kill -0 "$pid" 2>/dev/null; then
      log "daemon $pid of $mnt still running after unmount, terminating it"
      kill "$pid" 2>/dev/null || true
    fi
    unset "LC_DAEMON[$mnt]"
  fi
}

# The EXIT trap: unmount everything we mounted, newest first (nested mounts come off first).
lc_cleanup() {
  local rc=$? i
  for ((i = ${#LC_MOUNTS[@]} - 1; i >= 0; i--)); do
    lc_is_mounted "${LC_MOUNTS[i]}" && lc_umount "${LC_MOUNTS[i]}"
  done
  LC_MOUNTS=()
  return "$rc"
}

# The unprivileged user of the layercache-user implementations (created when missing; the
# overlay tests use the same one).
LC_USER=${LAYERCACHE_BENCH_USER:-lc-test-rootless}

# lc_user_env: makes a user's FUSE mount possible without changing the host: re-executes the
# calling script ("$0" "$@" given as arguments) in a private mount namespace (unshare -m) where
# /dev/fuse is a 0666 node (what udev makes it; a container may leave it 0600) and
# /etc/fuse.conf has user_allow_other (so the mounts can admit root, which runs the workloads),
# and creates $LC_USER. Every implementation then runs in that namespace alike; its mounts die
# with it.
lc_user_env() {
  id -u "$LC_USER" >/dev/null 2>&1 \
    || useradd --system --user-group --no-create-home --shell /usr/sbin/nologin "$LC_USER"
  if [ -z "${LC_USER_NS:-}" ]; then
    LC_USER_NS=1 exec unshare -m --propagation private bash "$@"
  fi
  local d=$LC_BENCH_DIR/userns
  mkdir -p "$d" && mount -t tmpfs tmpfs "$d"
  mknod "$d/fuse" c 10 229 && chmod 0666 "$d/fuse" && mount --bind "$d/fuse" /dev/fuse
  echo user_allow_other >"$d/fuse.conf" && mount --bind "$d/fuse.conf" /etc/fuse.conf
  chmod 0755 "$LC_BENCH_DIR"
}

# lc_median N…: the median of integers.
lc_median() {
  printf '%s\n' "$@" | sort -n | awk '{ a[NR] = $1 } END {
    if (NR == 0) exit 1
    if (NR % 2) print a[(NR + 1) / 2]; else printf "%d\n", (a[NR / 2] + a[NR / 2 + 1]) / 2 }'
}

# lc_fmt_us MICROSECONDS: human duration.
lc_fmt_us() {
  awk -v u="$1" 'BEGIN {
    if (u < 10000) printf "%.2f ms", u / 1000
    else if (u < 1000000) printf "%.0f ms", u / 1000
    else if (u < 100000000) printf "%.2f s", u / 1000000
    else printf "%.0f s", u / 1000000 }'
}

# lc_ratio A B: A/B formatted as "1.23×".
lc_ratio() { awk -v a="$1" -v b="$2" 'BEGIN { if (b > 0) printf "%.2f×", a / b; else print "?" }'; }

# lc_machine: one paragraph describing the machine, for the reports.
lc_machine() {
  local cpu mem fs
  cpu=$(awk -F': ' '/^model name/ { print $2; exit }' /proc/cpuinfo)
  mem=$(awk '/^MemTotal/ { printf "%.0f GiB", $2 / 1048576 }' /proc/meminfo)
  fs=$(findmnt -no FSTYPE -T "$LC_BENCH_DIR" 2>/dev/null || echo "?")
  echo "machine: $(nproc) × ${cpu:-unknown CPU}, $mem RAM, Linux $(uname -r), $(. /etc/os-release && echo "$PRETTY_NAME"); bench dir on $fs"
  echo "load average (1/5/15 min) when the report was written: $(cut -d' ' -f1-3 /proc/loadavg) — other work on the machine shows up as noise"
  echo "tools: fuse-overlayfs $(fuse-overlayfs --version 2>/dev/null | awk '/^fuse-overlayfs: version/ { print $3; exit }'), node $(node --version 2>/dev/null), npm $(npm --version 2>/dev/null), layercache ${LC_COMMIT:-not built}"
}

# lc_npm_lower: creates (once) $LC_BENCH_DIR/lower = the fixture's installed node_modules (npm ci
# with its own npm cache $LC_BENCH_DIR/npm-cache, which the offline fill reuses) + package files +
# a 512 MiB file big.bin. Reused while the lockfile is unchanged.
LC_FIXTURES=${LAYERCACHE_FIXTURES:-$LC_REPO/../shared/fixtures}
[ -d "$LC_FIXTURES" ] || LC_FIXTURES=/work/shared/fixtures
LC_LOWER=$LC_BENCH_DIR/lower
LC_NPM_CACHE=$LC_BENCH_DIR/npm-cache
LC_BIG_SIZE=$((512 * 1024 * 1024))
lc_npm_lower() {
  local fx=$LC_FIXTURES/npm-app stamp sum
  [ -f "$fx/package-lock.json" ] || die "fixture $fx/package-lock.json is missing"
  sum=$(sha256sum "$fx/package-lock.json" | cut -c1-16)
  stamp=$LC_LOWER/.lc-ready
  if [ "$(cat "$stamp" 2>/dev/null)" != "$sum" ]; then
    log "installing the npm fixture into $LC_LOWER (npm ci, once)"
    rm -rf "$LC_LOWER" && mkdir -p "$LC_LOWER" "$LC_NPM_CACHE"
    cp "$fx/package.json" "$fx/package-lock.json" "$LC_LOWER/"
    (cd "$LC_LOWER" && npm ci --cache "$LC_NPM_CACHE" --no-audit --no-fund --loglevel=error) >&2
    echo "$sum" >"$stamp"
  fi
  if [ "$(stat -c %s "$LC_LOWER/big.bin" 2>/dev/null)" != "$LC_BIG_SIZE" ]; then
    log "creating the 512 MiB file $LC_LOWER/big.bin"
    head -c "$LC_BIG_SIZE" /dev/urandom >"$LC_LOWER/big.bin.tmp"
    mv "$LC_LOWER/big.bin.tmp" "$LC_LOWER/big.bin"
  fi
}

# lc_tree N: a generated tree of about N entries (1000 empty files per directory), made once.
lc_tree() {
  local n=$1 dir=$LC_BENCH_DIR/tree-$1
  if [ ! -f "$dir/.lc-ready" ]; then
    log "generating a $n-entry tree in $dir (once)"
    rm -rf "$dir"
    python3 - "$dir" "$n" <<'EOF'
import os, sys
root, n = sys.argv[1], int(sys.argv[2])
per, made = 1000, 0
d = 0
while made < n:
    path = os.path.join(root, "g%03d" % (d // 100), "d%05d" % d)
    os.makedirs(path)
    for f in range(min(per, n - made)):
        os.close(os.open(os.path.join(path, "f%04d" % f), os.O_CREAT | os.O_WRONLY, 0o644))
    made += per
    d += 1
EOF
    touch "$dir/.lc-ready"
  fi
  echo "$dir"
}
