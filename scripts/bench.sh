#!/usr/bin/env bash
# Side-by-side benchmark: native directory, kernel overlayfs, fuse-overlayfs and layercache over
# the installed node_modules of ../shared/fixtures/npm-app plus a 512 MiB file (issue 4).
#
#   bash scripts/bench.sh [--quick] [--runs N]
#                         [--impls native,kernel,fuse-overlayfs,layercache,layercache-pt,
#                                  layercache-user,layercache-user-nouring]
#                         [--only walk,readall,require,seqread,pagecache,copyup,fill,mount,store,tree,density,
#                                 kinds,warmstart]
#                         [--tree N] [--worktree] [--no-build]
#
# Every cell is the median of N runs (default 5; --quick: 3 runs and a 100,000-entry tree), each
# on a freshly mounted overlay with a fresh upper dir; the implementations take turns inside each
# run so that drift on a shared machine hits them alike. Read workloads are measured three ways:
#   first = 1st pass on a fresh mount, right after the same pass over the lower directory itself
#           (so the lower's page cache is warm and only the mount's own caches are empty),
#   warm  = 2nd pass on the same mount,
#   cold  = 1st pass on a fresh mount after `echo 3 > /proc/sys/vm/drop_caches`.
# pagecache = the page cache held after 4 fresh mounts of one lower were each read fully (caches
# dropped first; counted in a memory cgroup of their own): kernel overlayfs shares the lower's
# pages, a FUSE mount without passthrough keeps its own copy. layercache-pt is layercache with FUSE passthrough (LAYERCACHE_PASSTHROUGH=1).
# layercache-user is layercache mounted without root, by the user lc-test-rootless through
# fusermount3 (with allow_other, so the workloads run as root for every implementation);
# layercache-user-nouring the same without FUSE over io_uring (LAYERCACHE_URING=0). With either,
# the whole run happens in a private mount namespace where /dev/fuse is 0666 and
# /etc/fuse.conf has user_allow_other (lc_user_env); the report adds their ratio to layercache
# as root (target: a rootless mount costs ≤ 10 % more).
# density = page cache held by N = 1, 4, 8 runs (mounts) of one layer, each reading its view
# fully while the others hold theirs (caches dropped first, counted in a memory cgroup): the npm
# tree alone, the npm tree + the 512 MiB file, and a layer of 6 x 48 MiB .so-like files + 4,000
# small ones (generated once), a venv with numpy and pandas (python3 -m venv + pip, made once) and
# the target dir of the cargo-app fixture after `cargo build` (made once); two rounds, the larger
# sample kept; then, with 4 runs holding the npm + 512 MiB layer, the 512 MiB
# file's first and warm read in a fresh run (median of 6). Ratios to native (one read of the
# files; N bind mounts of the lower) and to kernel overlayfs. Before pagecache and density count,
# the daemons' executables and the libraries they load are read outside the counted cgroup: they
# are shared by every run on the machine (the report gives their size), the layer's pages are not.
# kinds = the first walk and the first read-all of each density layer on a fresh mount, right
# after the same pass over the lower (its page cache warm), with the layer's files and bytes in
# files of >= 1 MiB (what `run`'s passthrough `auto` decides from).
# warmstart = warm mounts of `layercache run` (an exact hit that changed nothing keeps its mount
# idle for LAYERCACHE_WARM_IDLE, default 2 min; the next run of the layer adopts it). A store of
# its own under /var/tmp/layercache-bench/warmstart holds the README example's two caches
# (presets node_modules and npm; their setups copy the fixture's installed node_modules and npm
# cache, made once). The first walk (find node_modules -printf), first read-all (tar of
# node_modules), node require (as above) and node require of 30 packages (bench-lazy.sh's
# list), each timed inside COMMAND (the run's own start-up left out),
# for: kernel overlayfs and fuse-overlayfs on a fresh mount right after the same pass over the
# lower (as `first` above); layercache cold = `LAYERCACHE_WARM_IDLE=0 layercache run`, right
# after the same pass over the layer's own tree in the store; layercache warm = a run right
# after a run of the same layer and workload that left its mount idle (counted only when its
# --json line says warm: true; how many did is reported); cold and warm again with `run
# --passthrough off` (no-open mode). Also hit -> COMMAND start (from
# launching `layercache run` to COMMAND's first instruction) cold and warm. Then N
# concurrent hits (LAYERCACHE_BENCH_CONCURRENT, default 32; each in its own workdir, COMMAND
# `true` and node require) with warm mounts off, on with none idle, and on right after such a
# burst (what it left idle): failures, slowest run, runs that adopted, and at the peak the
# layercache processes (runs, their pid-namespace inits, daemons, idle ones included) plus their
# COMMANDs' processes with their total RSS and PSS (sampled every 50 ms). `--only warmstart`
# measures kernel, fuse-overlayfs and layercache unless --impls says otherwise.
# Ratios are to kernel overlayfs measured in the same run. layercache is built in release mode
# from the committed HEAD (--worktree: from the working tree) and left out, with the reason
# printed, while it does not build or mount. Needs root; installs fuse3, fuse-overlayfs, nodejs,
# npm with apt-get when missing; everything it creates lives under /var/tmp/layercache-bench;
# an EXIT trap unmounts everything it mounted. Results: printed, and kept in
# /var/tmp/layercache-bench/results/.
set -euo pipefail
# shellcheck source=scripts/lib-bench.sh
. "$(dirname "$0")/lib-bench.sh"

ARGS=("$@")
RUNS=5 TREE_N=1000000 TMO=900 BUILD=1 BUILD_FROM="" QUICK=""
IMPLS=(native kernel fuse-overlayfs layercache layercache-pt layercache-user)
ALL_WORKLOADS="walk readall require seqread pagecache copyup fill mount store tree density kinds warmstart"
WORKLOADS=$ALL_WORKLOADS
while [ $# -gt 0 ]; do
  case $1 in
    --quick) QUICK=1 RUNS=3 TREE_N=100000 ;;
    --runs) RUNS=$2; shift ;;
    --impls) IFS=, read -r -a IMPLS <<<"$2"; IMPLS_GIVEN=1; shift ;;
    --only) WORKLOADS=${2//,/ }; shift ;;
    --tree) TREE_N=$2; shift ;;
    --worktree) BUILD_FROM=--worktree ;;
    --no-build) BUILD="" ;;
    -h | --help) sed -n '2,66p' "$0"; exit 0 ;;
    *) die "unknown argument $1 (see --help)" ;;
  esac
  shift
done
for w in $WORKLOADS; do [[ " $ALL_WORKLOADS " == *" $w "* ]] || die "unknown workload $w"; done
# warmstart alone needs only these (and no namespace of its own for the rootless mounts)
[ -n "${IMPLS_GIVEN:-}" ] || [ "$(echo $WORKLOADS)" != warmstart ] || IMPLS=(kernel fuse-overlayfs layercache)
want() { [[ " $WORKLOADS " == *" $1 "* ]]; }
has_impl() { [[ " ${IMPLS[*]} " == *" $1 "* ]]; }

lc_init bench.sh
for i in "${IMPLS[@]}"; do
  if [[ $i = layercache-user* ]]; then lc_user_env "$0" "${ARGS[@]}"; break; fi
done
lc_need fusermount3:fuse3 fuse-overlayfs:fuse-overlayfs node:nodejs npm:npm python3:python3
B=$LC_BENCH_DIR
mkdir -p "$B/results" "$B/empty"
declare -A RES=() FAIL=() NOTE=()
LC_STATUS="not requested"

# --- layercache: build and probe -------------------------------------------------------------
lc_probe() {
  local p=$B/probe
  rm -rf "$p" && mkdir -p "$p/lower" "$p/mnt"
  echo hello >"$p/lower/probe.txt"
  if ! lc_mount layercache "$p/lower" "$p/upper" "$p/work" "$p/mnt"; then
    LC_STATUS="overlay mount failed: $(lc_mount_error)"
    lc_umount "$p/mnt"; return 1
  fi
  if [ "$(timeout 20 cat "$p/mnt/probe.txt" 2>/dev/null)" != hello ]; then
    LC_STATUS="mounted, but reading a lower file through the mount failed"
    lc_umount "$p/mnt"; return 1
  fi
  lc_umount "$p/mnt"
  LC_STATUS="ok ($LC_COMMIT)"
}
if has_impl layercache; then
  if [ -n "$BUILD" ] && ! lc_build $BUILD_FROM; then
    LC_STATUS="release build failed ($(grep -m1 -E '^error' "$B/build.log" || echo "see $B/build.log"))"
  elif [ ! -x "$LC_BIN" ]; then
    LC_STATUS="no binary at $LC_BIN"
  else
    [ -n "$LC_COMMIT" ] || LC_COMMIT=$(lc_prebuilt_commit)
    lc_probe || true
  fi
  log "layercache: $LC_STATUS"
  if [[ $LC_STATUS != ok* ]]; then
    keep=(); for i in "${IMPLS[@]}"; do [[ $i = layercache* ]] || keep+=("$i"); done; IMPLS=("${keep[@]}")
  fi
fi
[ ${#IMPLS[@]} -gt 0 ] || die "no implementation left to measure"

lc_npm_lower
# The fixture's largest direct dependencies that load with require() (up to 5).
# shellcheck disable=SC2016 # JavaScript, not shell
REQUIRE_PKGS=$(cd "$LC_LOWER" && node -e '
  const pj = require("./package.json");
  const names = Object.keys({ ...pj.dependencies, ...pj.devDependencies });
  const { execFileSync } = require("child_process");
  const size = (n) => +execFileSync("du", ["-sk", "node_modules/" + n]).toString().split("\t")[0];
  const ok = (n) => { try { execFileSync(process.execPath, ["-e", `require(${JSON.stringify(n)})`], { stdio: "ignore" }); return true } catch { return false } };
  console.log(names.filter(ok).sort((a, b) => size(b) - size(a)).slice(0, 5).join(" "));')
REQUIRE_JS=""
for p in $REQUIRE_PKGS; do REQUIRE_JS+="require('$p');"; done
log "node require workload: $REQUIRE_PKGS"

# --- workloads (each takes the mountpoint; external commands run under timeout) ----------------
w_walk() { timeout "$TMO" find "$1" -printf '%s %m\n' >/dev/null; }
w_readall() { timeout "$TMO" tar -C "$1" -cf - node_modules | cat >/dev/null; }
w_require() { (cd "$1" && exec timeout "$TMO" node -e "$REQUIRE_JS") >/dev/null; }
w_seqread() { timeout "$TMO" dd if="$1/big.bin" of=/dev/null bs=1M status=none; }
# shellcheck disable=SC2016 # $1 belongs to the inner sh
w_copyup() { timeout "$TMO" sh -c 'printf x >>"$1"' _ "$1/big.bin"; }
w_fill() {
  (cd "$1/.." && exec timeout "$TMO" npm ci --offline --no-audit --no-fund --loglevel=error \
    --cache "$LC_NPM_CACHE") >/dev/null && [ -f "$1/react/package.json" ]
}

# measure KEY FUNC ARG: times FUNC ARG (µs) into RES[KEY], or records why it failed in FAIL[KEY].
measure() {
  local key=$1 t0 t1
  t0=${EPOCHREALTIME/./}
  if "$2" "$3" 2>"$B/cmd.err"; then
    t1=${EPOCHREALTIME/./}
    RES[$key]+="$((10#$t1 - 10#$t0)) "
  else
    FAIL[$key]="failed: $(head -c 200 "$B/cmd.err" | head -1)"
    return 1
  fi
}

# fresh IMPL LOWER: a new mount of IMPL over LOWER at $B/run/IMPL/mnt with an empty upper dir.
fresh() {
  local r=$B/run/$1
  [ -n "${FRESH_MNT:-}" ] && lc_umount "$FRESH_MNT"
  rm -rf "$r/upper" "$r/work"
  FRESH_MNT=$r/mnt
  lc_mount "$1" "$2" "$r/upper" "$r/work" "$FRESH_MNT" || {
    FAILED_MOUNT="mount failed: $(lc_mount_error)"; return 1; }
}
done_mount() { [ -z "${FRESH_MNT:-}" ] || lc_umount "$FRESH_MNT"; FRESH_MNT=""; }

read_run() { # WORKLOAD IMPL
  local w=$1 i=$2
  # "first" means: the lower's own page cache warm, the new mount's caches empty
  "w_$w" "$LC_LOWER" >/dev/null 2>&1 || true
  if fresh "$i" "$LC_LOWER"; then
    if measure "$w first $i" "w_$w" "$FRESH_MNT"; then measure "$w warm $i" "w_$w" "$FRESH_MNT" || true; fi
  else FAIL["$w first $i"]=$FAILED_MOUNT; fi
  done_mount
  if fresh "$i" "$LC_LOWER"; then
    lc_drop_caches
    measure "$w cold $i" "w_$w" "$FRESH_MNT" || true
  else FAIL["$w cold $i"]=$FAILED_MOUNT; fi
  done_mount
}

# The memory cgroup directory of this shell and the memory.stat field that counts its page
# cache ("v1-dir cache" or "v2-dir file"); empty when there is none to use.
pc_cgroup() {
  local line path
  line=$(grep -m1 -E '^[0-9]+:memory:' /proc/self/cgroup || true)
  if [ -n "$line" ] && [ -d "/sys/fs/cgroup/memory${line#*:memory:}" ]; then
    echo "/sys/fs/cgroup/memory${line#*:memory:} cache"; return
  fi
  path=$(grep -m1 '^0::' /proc/self/cgroup | cut -d: -f3- || true)
  [ -f "/sys/fs/cgroup$path/memory.stat" ] && echo "/sys/fs/cgroup$path file"
}

# warm_daemons: reads the daemons' executables and the shared libraries they load into the page
# cache (from outside a counting cgroup): one copy serves every run on the machine.
DAEMON_BINS=("$LC_BIN" "$(command -v fuse-overlayfs || true)")
warm_daemons() {
  local f
  for f in "${DAEMON_BINS[@]}"; do
    [ -f "$f" ] || continue
    cat "$f" >/dev/null
    ldd "$f" 2>/dev/null | awk '$3 ~ /^\// { print $3 }' | xargs -r cat >/dev/null
  done
}

# page cache: 4 fresh mounts of IMPL over the lower, each read fully, caches dropped first.
# The mounts, their daemons and the readers run in a memory cgroup of their own, whose page
# cache (memory.stat) is what they brought in — other work on the machine does not count; the
# growth of "Cached" in /proc/meminfo is the fallback without cgroups. KiB into "pagecache IMPL".
pagecache_run() {
  local i=$1 r=$B/run/$1 k cg field kib
  read -r cg field <<<"$(pc_cgroup)"
  if [ -n "${cg:-}" ]; then
    cg=$cg/lcbench-$$; rmdir "$cg" 2>/dev/null || true; mkdir "$cg"
  fi
  lc_drop_caches
  warm_daemons
  kib=$(
    local before after ok=1
    if [ -n "${cg:-}" ]; then echo "$BASHPID" >"$cg/cgroup.procs"; fi
    before=$(awk '/^Cached:/ { print $2 }' /proc/meminfo)
    for k in 1 2 3 4; do
      rm -rf "$r/pc$k"
      if lc_mount "$i" "$LC_LOWER" "$r/pc$k/upper" "$r/pc$k/work" "$r/pc$k/mnt" 2>/dev/null; then
        timeout "$TMO" tar -C "$r/pc$k/mnt" -cf - node_modules | wc -c >/dev/null || ok=""
      else ok=""; fi
    done
    after=$(awk '/^Cached:/ { print $2 }' /proc/meminfo)
    if [ -z "$ok" ]; then echo FAIL
    elif [ -n "${cg:-}" ]; then awk -v f="$field" '$1 == f { print int($2 / 1024) }' "$cg/memory.stat"
    else echo $((after - before)); fi
    for k in 1 2 3 4; do lc_umount "$r/pc$k/mnt"; rm -rf "$r/pc$k"; done
  )
  if [ -n "${cg:-}" ]; then
    # the subshell is gone; anything left (a daemon that outlived its mount) moves out
    while read -r p; do echo "$p" >"${cg%/*}/cgroup.procs" 2>/dev/null || true; done <"$cg/cgroup.procs"
    rmdir "$cg" 2>/dev/null || true
  fi
  if [ "$kib" = FAIL ]; then FAIL["pagecache $i"]="mount or read failed: $(lc_mount_error)"
  else RES["pagecache $i"]+="$kib "; fi
}

copyup_run() {
  local i=$1
  # Start from a clean disk: otherwise the writeback of the previous implementation's 512 MiB
  # copy (and the journal commit of deleting it) lands inside this one's timing.
  if fresh "$i" "$LC_LOWER"; then sync; measure "copyup $i" w_copyup "$FRESH_MNT" || true
  else FAIL["copyup $i"]=$FAILED_MOUNT; fi
  done_mount
  # native appended to the lower itself: put it back
  [ "$i" != native ] || truncate -s "$LC_BIG_SIZE" "$LC_LOWER/big.bin"
}

fill_run() {
  local i=$1 r=$B/run/$1 lower=$B/empty
  rm -rf "$r/proj" "$r/fill-lower"
  mkdir -p "$r/proj/node_modules"
  cp "$LC_LOWER/package.json" "$LC_LOWER/package-lock.json" "$r/proj/"
  if [ "$i" = native ]; then lower=$r/fill-lower; mkdir -p "$lower"; fi
  rm -rf "$r/upper" "$r/work"
  if lc_mount "$i" "$lower" "$r/upper" "$r/work" "$r/proj/node_modules"; then
    FRESH_MNT=$r/proj/node_modules
    measure "fill $i" w_fill "$FRESH_MNT" || true
  else FAIL["fill $i"]="mount failed: $(lc_mount_error)"; fi
  done_mount
  rm -rf "$r/proj" "$r/fill-lower" "$r/upper" "$r/work"
}

# mount latency: from launching the mount command to the first successful stat of a file in it.
mount_run() { # KEY IMPL LOWER FILE
  local key=$1 i=$2 lower=$3 file=$4 r=$B/run/$2 t0 t1 deadline ok=""
  rm -rf "$r/upper" "$r/work"; mkdir -p "$r/upper" "$r/work" "$r/mnt"
  t0=${EPOCHREALTIME/./}
  if lc_mount_cmd "$i" "$lower" "$r/upper" "$r/work" "$r/mnt"; then
    deadline=$((10#$t0 + 10000000))
    while :; do
      [ -e "$r/mnt/$file" ] && { ok=1; break; }
      [ "${EPOCHREALTIME/./}" -lt "$deadline" ] || break
    done
  fi
  t1=${EPOCHREALTIME/./}
  lc_register "$i" "$r/mnt"
  if [ -n "$ok" ]; then RES[$key]+="$((10#$t1 - 10#$t0)) "
  else FAIL[$key]="not ready within 10 s: $(lc_mount_error)"; fi
  lc_umount "$r/mnt"
}

# layercache store: miss mount, fill, promote (commit), umount, then the hit lookup of the same key.
store_run() {
  local run=$1 s=$B/store r=$B/run/store t0 t1 mnt
  mnt=$r/proj/node_modules
  rm -rf "$s" "$r"; mkdir -p "$mnt"
  cp "$LC_LOWER/package.json" "$LC_LOWER/package-lock.json" "$r/proj/"
  lcs() { timeout 600 "$LC_BIN" --store "$s" "$@"; }
  t0=${EPOCHREALTIME/./}
  if ! lcs mount --project bench --cache node_modules --key "bench-fill-$run" "$mnt" >"$B/mount.json" 2>"$B/cmd.err"; then
    lc_register layercache "$mnt"; lc_umount "$mnt"
    FAIL["store miss $run"]="layercache mount: $(head -1 "$B/cmd.err")"; return 0
  fi
  t1=${EPOCHREALTIME/./}; RES["store miss"]+="$((10#$t1 - 10#$t0)) "
  lc_register layercache "$mnt"
  measure "store fill" w_fill "$mnt" || { lc_umount "$mnt"; return 0; }
  t0=${EPOCHREALTIME/./}
  if lcs commit "$mnt" >"$B/commit.out" 2>"$B/cmd.err"; then
    t1=${EPOCHREALTIME/./}; RES["store promote"]+="$((10#$t1 - 10#$t0)) "
  else FAIL["store promote"]="layercache commit: $(head -1 "$B/cmd.err")"; fi
  lcs umount "$mnt" >/dev/null 2>"$B/cmd.err" || NOTE["store umount"]="layercache umount: $(head -1 "$B/cmd.err")"
  lc_umount "$mnt"
  [ -z "${FAIL["store promote"]:-}" ] || return 0
  t0=${EPOCHREALTIME/./}
  if lcs mount --project bench --cache node_modules --key "bench-fill-$run" "$mnt" >"$B/mount.json" 2>"$B/cmd.err"; then
    t1=${EPOCHREALTIME/./}
    while [ ! -e "$mnt/react/package.json" ] && [ $((10#${EPOCHREALTIME/./} - 10#$t1)) -lt 10000000 ]; do :; done
    RES["store hit"]+="$((10#$t1 - 10#$t0)) "
    RES["store hit-ready"]+="$((10#${EPOCHREALTIME/./} - 10#$t0)) "
    grep -q '"hit"' "$B/mount.json" || NOTE["store hit"]="second mount did not report a hit: $(head -c 200 "$B/mount.json")"
    lc_register layercache "$mnt"
    lcs umount "$mnt" >/dev/null 2>&1 || true
    lc_umount "$mnt"
  else
    lc_register layercache "$mnt"; lc_umount "$mnt"
    FAIL["store hit"]="layercache mount (hit): $(head -1 "$B/cmd.err")"
  fi
}

# the generated tree: mount latency over a huge lower, a first-pass walk, and daemon peak RSS.
tree_run() {
  local i=$1 t=$2 pid rss
  mount_run "tree-mount $i" "$i" "$t" g000/d00000/f0000
  if fresh "$i" "$t"; then
    measure "tree-walk $i" w_walk "$FRESH_MNT" || true
    pid=${LC_DAEMON[$FRESH_MNT]:-}
    if [ -n "$pid" ]; then
      rss=$(awk '/^VmHWM/ { print $2 }' "/proc/$pid/status" 2>/dev/null || true)
      [ -z "$rss" ] || RES["tree-rss $i"]="$rss"
    fi
  else FAIL["tree-walk $i"]=$FAILED_MOUNT; fi
  done_mount
}

# --- density: page cache of N runs of one layer ---------------------------------------------
# A layer of a few large .so-like files and many small ones (a venv's shape), made once.
SO_LOWER=$B/so-lower
so_lower() {
  [ -f "$SO_LOWER/.lc-ready" ] && return 0
  log "generating the .so-like layer in $SO_LOWER (once)"
  rm -rf "$SO_LOWER" && mkdir -p "$SO_LOWER/lib" "$SO_LOWER/pkg"
  for k in 1 2 3 4 5 6; do head -c $((48 << 20)) /dev/urandom >"$SO_LOWER/lib/lib$k.so"; done
  python3 - "$SO_LOWER/pkg" <<'EOF2'
import os, sys
root = sys.argv[1]
for d in range(100):
    p = os.path.join(root, "m%02d" % d)
    os.makedirs(p)
    for f in range(40):
        with open(os.path.join(p, "f%02d.py" % f), "wb") as fh:
            fh.write(os.urandom(1024 + 97 * f))
EOF2
  touch "$SO_LOWER/.lc-ready"
}
# A venv with numpy and pandas (PyPI), made once; a failure is logged and the set is left out.
VENV_LOWER=$B/venv-lower
venv_lower() {
  [ -f "$VENV_LOWER/.lc-ready" ] && return 0
  log "creating a venv with numpy and pandas in $VENV_LOWER (once)"
  rm -rf "$VENV_LOWER" && mkdir -p "$VENV_LOWER"
  python3 -m venv "$VENV_LOWER/venv" >&2 && "$VENV_LOWER/venv/bin/pip" install -q numpy pandas >&2 \
    && touch "$VENV_LOWER/.lc-ready"
}
# The target dir of the cargo-app fixture after a debug `cargo build` (crates.io), made once.
CARGO_LOWER=$B/cargo-lower
cargo_lower() {
  [ -f "$CARGO_LOWER/.lc-ready" ] && return 0
  log "building the cargo-app fixture into $CARGO_LOWER/target (once)"
  rm -rf "$CARGO_LOWER" && mkdir -p "$CARGO_LOWER"
  cp -r "$LC_FIXTURES/cargo-app/." "$CARGO_LOWER/" \
    && (cd "$CARGO_LOWER" && CARGO_TARGET_DIR=$CARGO_LOWER/target cargo build -q) >&2 \
    && touch "$CARGO_LOWER/.lc-ready"
}
# The density sets whose lower could be made.
d_sets() {
  local set
  for set in ${LAYERCACHE_DENSITY_SETS:-npm npmbig so venv cargo}; do
    case $set in
      so) so_lower ;;
      venv) venv_lower || { log "no venv layer: left out"; continue; } ;;
      cargo) cargo_lower || { log "no cargo target layer: left out"; continue; } ;;
    esac
    echo "$set"
  done
}
# d_top SET: what one run of layer SET reads (its whole view), relative to the mount.
d_top() {
  case $1 in
    npm) echo node_modules ;;
    npmbig) echo node_modules big.bin ;;
    so) echo lib pkg ;;
    venv) echo venv ;;
    cargo) echo target ;;
  esac
}
# d_read SET MNT: reads what one run of layer SET reads.
# shellcheck disable=SC2046 # d_top's words are the top entries
d_read() { tar -C "$2" -cf - $(d_top "$1") | wc -c >/dev/null; }
d_lower() {
  case $1 in
    so) echo "$SO_LOWER" ;;
    venv) echo "$VENV_LOWER" ;;
    cargo) echo "$CARGO_LOWER" ;;
    *) echo "$LC_LOWER" ;;
  esac
}
d_name() {
  case $1 in
    npm) echo "npm tree" ;;
    npmbig) echo "npm tree + 512 MiB" ;;
    so) echo "6 × 48 MiB .so + 4,000 small" ;;
    venv) echo "venv (numpy, pandas)" ;;
    cargo) echo "cargo target dir" ;;
  esac
}
# d_counts SET: "FILES LARGE_BYTES" of what a run of SET reads (regular files; bytes in files of
# >= 1 MiB), the two figures PassthroughChoice::decide takes from a layer's manifest.
d_counts() {
  local lower
  lower=$(d_lower "$1")
  # shellcheck disable=SC2046
  (cd "$lower" && find $(d_top "$1") -type f -printf '%s\n') \
    | awk '{ n++; if ($1 >= 1048576) l += $1 } END { printf "%d %d\n", n, l }'
}
# d_drop LOWER: drops the page cache until fincore shows less than 1 MiB of LOWER's big files
# resident (one drop_caches can leave pages in place on a busy machine), at most 5 times.
d_drop() {
  local t res
  for t in 1 2 3 4 5; do
    lc_drop_caches
    res=$(find "$1" -type f -size +1M -exec fincore --bytes --noheadings -o RES {} + | awk '{ s += $1 } END { print s + 0 }')
    [ "$res" -lt $((1 << 20)) ] && return 0
    log "after drop_caches $t: $((res >> 20)) MiB of $1 still resident"; sleep 1
  done
}
# density_run IMPL SET N [BIG]: page cache (KiB) of N mounts of IMPL over SET's layer, each read
# fully, into RES["density SET N IMPL"]; with BIG, then the 512 MiB file's first and warm read
# in one more fresh mount (µs) into RES["dbig first|warm IMPL"].
density_run() {
  local i=$1 set=$2 n=$3 big=${4:-} r=$B/run/$1 lower k cg field kib t0 t1
  lower=$(d_lower "$set")
  read -r cg field <<<"$(pc_cgroup)"
  if [ -n "${cg:-}" ]; then cg=$cg/lcbench-$$; rmdir "$cg" 2>/dev/null || true; mkdir "$cg"; fi
  d_drop "$lower"
  warm_daemons
  kib=$(
    ok=1
    if [ -n "${cg:-}" ]; then echo "$BASHPID" >"$cg/cgroup.procs"; fi
    before=$(awk '/^Cached:/ { print $2 }' /proc/meminfo)
    for k in $(seq "$n"); do
      rm -rf "$r/d$k"
      if lc_mount "$i" "$lower" "$r/d$k/upper" "$r/d$k/work" "$r/d$k/mnt" 2>/dev/null; then
        timeout "$TMO" bash -c "$(declare -f d_read d_top); d_read $set $r/d$k/mnt" || ok=""
      else ok=""; fi
    done
    after=$(awk '/^Cached:/ { print $2 }' /proc/meminfo)
    if [ -z "$ok" ]; then echo FAIL
    elif [ -n "${cg:-}" ]; then awk -v f="$field" '$1 == f { print int($2 / 1024) }' "$cg/memory.stat"
    else echo $((after - before)); fi
    if [ -n "$big" ] && [ -n "$ok" ]; then
      for k in 1 2 3; do
        rm -rf "$r/dbig"
        lc_mount "$i" "$lower" "$r/dbig/upper" "$r/dbig/work" "$r/dbig/mnt" 2>/dev/null || continue
        t0=${EPOCHREALTIME/./}; dd if="$r/dbig/mnt/big.bin" of=/dev/null bs=1M status=none; t1=${EPOCHREALTIME/./}
        echo "first $((10#$t1 - 10#$t0))" >>"$B/dbig.$i"
        t0=${EPOCHREALTIME/./}; dd if="$r/dbig/mnt/big.bin" of=/dev/null bs=1M status=none; t1=${EPOCHREALTIME/./}
        echo "warm $((10#$t1 - 10#$t0))" >>"$B/dbig.$i"
        lc_umount "$r/dbig/mnt"; rm -rf "$r/dbig"
      done
    fi
    for k in $(seq "$n"); do lc_umount "$r/d$k/mnt"; rm -rf "$r/d$k"; done
  )
  if [ -n "${cg:-}" ]; then
    while read -r p; do echo "$p" >"${cg%/*}/cgroup.procs" 2>/dev/null || true; done <"$cg/cgroup.procs"
    rmdir "$cg" 2>/dev/null || true
  fi
  if [ "$kib" = FAIL ]; then FAIL["density $set $n $i"]="mount or read failed: $(lc_mount_error)"
  else RES["density $set $n $i"]+="$kib "; fi
  if [ -f "$B/dbig.$i" ]; then
    while read -r p v; do RES["dbig $p $i"]+="$v "; done <"$B/dbig.$i"
    rm -f "$B/dbig.$i"
  fi
}

# kinds_run SET IMPL: the first walk and the first read-all of layer SET on fresh mounts of IMPL,
# each right after the same pass over the lower, into RES["kinds walk|read SET IMPL"].
k_read() { timeout "$TMO" bash -c "$(declare -f d_read d_top); d_read $KSET $1"; }
kinds_run() {
  local lower
  KSET=$1 lower=$(d_lower "$1")
  w_walk "$lower" >/dev/null 2>&1 || true
  if fresh "$2" "$lower"; then measure "kinds walk $1 $2" w_walk "$FRESH_MNT" || true
  else FAIL["kinds walk $1 $2"]=$FAILED_MOUNT; fi
  done_mount
  k_read "$lower" >/dev/null 2>&1 || true
  if fresh "$2" "$lower"; then measure "kinds read $1 $2" k_read "$FRESH_MNT" || true
  else FAIL["kinds read $1 $2"]=$FAILED_MOUNT; fi
  done_mount
}

# --- warmstart: warm mounts of `layercache run` ----------------------------------------------
WS_DIR=$B/warmstart                    # the store, workdirs and views of these runs (kept)
WS_STORE=$WS_DIR/store
WS_N=${LAYERCACHE_BENCH_CONCURRENT:-32}
WS_OK=""                               # the layer is there and a hit runs
declare -A WS_ADOPTED=() WS_MEASURED=() # per variant (auto, noopen): warm runs measured, adopted
WS_PT=""                               # --passthrough of the runs (empty: the spec's, auto)
unset LAYERCACHE_WARM_IDLE             # "on" is the default idle time; "off" sets 0 per run
# node require of 30 packages of the fixture (the list of bench-lazy.sh's npm workload)
WS_REQUIRE30="react react-dom lodash express axios typescript eslint @babel/core webpack jest rollup
  terser postcss yargs acorn js-yaml ajv chalk debug semver glob minimatch cross-spawn execa
  prompts esprima graceful-fs browserslist caniuse-lite @jest/core"
WS_REQUIRE30_JS="for (const p of '$(echo $WS_REQUIRE30)'.split(' ')) require(p)"

# ws_script WORKLOAD: COMMAND's script: the workload, timed from inside, in the current dir
# (the workdir, whose node_modules is the cache's view; a mount of the lower for the others).
# shellcheck disable=SC2016 # $EPOCHREALTIME belongs to COMMAND's bash
ws_script() {
  local body
  case $1 in
    walk) body="find node_modules -printf '%s %m\\n' >/dev/null" ;;
    readall) body="tar -cf - node_modules | cat >/dev/null" ;;
    require) body="node -e $(printf %q "$REQUIRE_JS") >/dev/null" ;;
    require30) body="node -e $(printf %q "$WS_REQUIRE30_JS") >/dev/null" ;;
    true) body=":" ;;
  esac
  printf 't0=$EPOCHREALTIME; %s || exit 97; t1=$EPOCHREALTIME; echo "lcbench $t0 $t1"' "$body"
}

# ws_launch IDLE WORKDIR SCRIPT: one `layercache run` of the warmstart spec in WORKDIR running
# `bash -c SCRIPT` (IDLE "" = warm mounts at their default, 0 = off; --passthrough $WS_PT when
# set). Not under timeout: its fork and exec would count in hit -> COMMAND start.
ws_launch() {
  local a=(--store "$WS_STORE" --json run --spec "$WS_DIR/spec.toml" --workdir "$2"
    --mount-root "$WS_DIR/views" ${WS_PT:+--passthrough "$WS_PT"} -- bash -c "$3")
  if [ -n "$1" ]; then LAYERCACHE_WARM_IDLE=$1 "$LC_BIN" "${a[@]}"; else "$LC_BIN" "${a[@]}"; fi
}

# ws_parse FILE…: per output of a run: "FILE RESULTS WARMS MOUNT_MS PREP_MS T0 T1" (results and
# warm flags of the caches in order, comma-separated; "-" where the output lacks it).
ws_parse() {
  python3 - "$@" <<'PY'
import json, sys
for f in sys.argv[1:]:
    res = warm = "-"; mount = prep = 0; t0 = t1 = "-"
    try:
        lines = open(f).read().splitlines()
    except OSError:
        lines = []
    for i, line in enumerate(lines):
        if i == 0:
            try:
                v = json.loads(line)
                cs = v.get("caches", [])
                res = ",".join(c.get("result", "?") for c in cs) or "-"
                warm = ",".join("1" if c.get("warm") else "0" for c in cs) or "-"
                mount = sum(c.get("mount_ms", 0) for c in cs)
                prep = v.get("prep_ms", 0)
            except ValueError:
                pass
        elif line.startswith("lcbench "):
            _, t0, t1 = line.split()[:3]
            t0, t1 = t0.replace(".", ""), t1.replace(".", "")
    print(f, res, warm, mount, prep, t0, t1)
PY
}

# ws_run KIND IDLE WORKDIR SCRIPT: one run; sets WS_R (results), WS_W (warm flags), WS_START (µs
# from launch to COMMAND's first instruction), WS_US (the workload, µs), WS_PREP (prep_ms, µs),
# WS_ERR (empty when the run exited 0, hit in every cache and timed its workload).
ws_run() {
  local out=$WS_DIR/$1.out ts rc=0 f mnt prep t0 t1
  ts=${EPOCHREALTIME/./}
  ws_launch "$2" "$3" "$4" >"$out" 2>"$out.err" || rc=$?
  read -r f WS_R WS_W mnt prep t0 t1 <<<"$(ws_parse "$out")"
  WS_ERR="" WS_START="" WS_US="" WS_PREP=$((prep * 1000))
  if [ "$rc" -ne 0 ]; then WS_ERR="exit $rc: $(grep -v '^$' "$out.err" | tail -1 | head -c 200 || true)"
  elif [[ $WS_R != hit,hit ]]; then WS_ERR="results $WS_R (not a hit)"
  elif [ "$t0" = - ]; then WS_ERR="COMMAND printed no timing"
  else WS_START=$((10#$t0 - 10#$ts)) WS_US=$((10#$t1 - 10#$t0)); fi
  [ -z "$WS_ERR" ]
}

# ws_end_idle: ends every idle warm mount of the warmstart store (gc ends them first; the layers
# were just used, so no limit evicts them) and checks that nothing of it is left mounted.
ws_end_idle() {
  [ -x "$LC_BIN" ] && [ -d "$WS_STORE" ] || return 0
  timeout 120 "$LC_BIN" --store "$WS_STORE" gc --max-size none --max-inodes none --max-age none >/dev/null 2>"$WS_DIR/gc.err" \
    || log "warmstart: gc failed: $(tail -1 "$WS_DIR/gc.err")"
  local m
  for m in $(awk -v d="$WS_DIR/" 'index($2, d) == 1 { print $2 }' /proc/mounts); do
    log "warmstart: $m still mounted, unmounting it"; lc_umount "$m"
  done
}

# ws_layer_tree CACHE: the tree of the layer CACHE's key names (a plain tree of hard links to
# the store's objects: the files the mount's daemon reads).
ws_layer_tree() {
  local d=$WS_STORE/v1/projects/warmstart id
  id=$(cat "$d/caches/$1/keys/"* 2>/dev/null | head -1)
  [ -n "$id" ] && [ -d "$d/layers/$id/tree" ] && echo "$d/layers/$id/tree"
}

# ws_idle_count: idle warm mounts in the warmstart store now; ws_idle_max: the most of one layer.
ws_idle_count() { find "$WS_STORE/v1/projects/warmstart/runs" -mindepth 2 -maxdepth 2 -name idle 2>/dev/null | wc -l || true; }
ws_idle_max() {
  local d
  for d in "$WS_STORE/v1/projects/warmstart/runs"/*/; do
    if [ -e "$d/idle" ]; then grep -o '"lower": *"[^"]*"' "$d/run.json" 2>/dev/null || true; fi
  done | sort | uniq -c | sort -n | awk 'END { print $1 + 0 }'
}

# ws_prepare: the spec, the workdirs (0 for the one-at-a-time runs, 1..N for the bursts) and
# the layers (one miss, once; a store an older binary cannot use is made again).
ws_prepare() {
  local k try
  mkdir -p "$WS_DIR/views"
  for k in $(seq 0 "$WS_N"); do
    mkdir -p "$WS_DIR/ws-$k"
    cp "$LC_LOWER/package.json" "$LC_LOWER/package-lock.json" "$WS_DIR/ws-$k/"
  done
  rm -rf "$WS_DIR/layer-lower" && mkdir -p "$WS_DIR/layer-lower"
  cat >"$WS_DIR/spec.toml" <<EOT
# README's example: the installed tree and npm's download cache; the setups copy the bench's
# npm ci of the same lockfile (no network)
project = "warmstart"

[[cache]]
id = "node_modules"
preset = "node_modules"
setup = "cp -a $LC_LOWER/node_modules/. {mount}/"

[[cache]]
id = "npm"
preset = "npm"
setup = "cp -a $LC_NPM_CACHE/. {mount}/"
EOT
  for try in 1 2; do
    if ws_run prepare 0 "$WS_DIR/ws-0" "$(ws_script true)" || ws_run prepare 0 "$WS_DIR/ws-0" "$(ws_script true)"; then
      WS_TREE=$(ws_layer_tree node_modules) && [ -d "$WS_TREE/react" ] && WS_OK=1 && break
      WS_ERR="no layer tree of node_modules found in the store"
    fi
    log "warmstart: $WS_ERR; making the store again"
    ws_end_idle; rm -rf "$WS_STORE"
  done
  [ -n "$WS_OK" ] || { FAIL["ws layer"]="could not make the layer: $WS_ERR"; return 1; }
  ln -s "$WS_TREE" "$WS_DIR/layer-lower/node_modules"
}

# ws_lower_pass WORKLOAD: the same pass over the layer's own tree in the store (its files are
# the objects the mount's daemon opens), so the lower's page cache is warm as for `first`.
ws_lower_pass() {
  case $1 in
    walk) find "$WS_TREE" -printf '%s %m\n' >/dev/null ;;
    readall) tar -C "$WS_TREE" -cf - . | cat >/dev/null ;;
    require) (cd "$WS_DIR/layer-lower" && node -e "$REQUIRE_JS") >/dev/null ;;
    require30) (cd "$WS_DIR/layer-lower" && node -e "$WS_REQUIRE30_JS") >/dev/null ;;
  esac 2>/dev/null || true
}

# ws_overlay_run WORKLOAD IMPL: the workload's first pass on a fresh mount of IMPL over the
# lower, right after the same pass over the lower, timed by the same script as in a run.
ws_overlay_run() {
  local w=$1 i=$2 script tag t0 t1
  script=$(ws_script "$w")
  (cd "$LC_LOWER" && exec bash -c "$script") >/dev/null 2>&1 || true
  if fresh "$i" "$LC_LOWER"; then
    if (cd "$FRESH_MNT" && exec timeout "$TMO" bash -c "$script") >"$WS_DIR/ovl.out" 2>"$B/cmd.err" \
        && read -r tag t0 t1 <"$WS_DIR/ovl.out" && [ "$tag" = lcbench ]; then
      RES["ws $w $i"]+="$((10#${t1/./} - 10#${t0/./})) "
    else FAIL["ws $w $i"]="failed: $(head -c 200 "$B/cmd.err" | head -1)"; fi
  else FAIL["ws $w $i"]=$FAILED_MOUNT; fi
  done_mount
}

# ws_cold_run WORKLOAD [noopen]: `LAYERCACHE_WARM_IDLE=0 layercache run`, after the pass over
# the layer (noopen: with --passthrough off).
ws_cold_run() {
  local v=${2:-} sfx=${2:+-$2}
  ws_lower_pass "$1"
  WS_PT=${v:+off}
  if ws_run cold 0 "$WS_DIR/ws-0" "$(ws_script "$1")"; then
    RES["ws $1 lc-cold$sfx"]+="$WS_US " RES["wsstart cold$sfx"]+="$WS_START " RES["wsprep cold$sfx"]+="$WS_PREP "
    [[ $WS_W != *1* ]] || NOTE["ws $1 cold$sfx"]="a run with LAYERCACHE_WARM_IDLE=0 said warm ($WS_W)"
  else FAIL["ws $1 lc-cold$sfx"]=$WS_ERR; fi
  WS_PT=""
}

# ws_warm_run WORKLOAD [noopen]: a run of the same workload (warm mounts on), then the measured
# one (noopen: both with --passthrough off).
ws_warm_run() {
  local v=${2:-} sfx=${2:+-$2} script n k=${2:-auto}
  script=$(ws_script "$1")
  WS_PT=${v:+off}
  if ! ws_run prime "" "$WS_DIR/ws-0" "$script"; then FAIL["ws $1 lc-warm$sfx"]="the run before: $WS_ERR"
  elif ! ws_run warm "" "$WS_DIR/ws-0" "$script"; then FAIL["ws $1 lc-warm$sfx"]=$WS_ERR
  else
    n=$((${WS_MEASURED[$k]:-0} + 1)); WS_MEASURED[$k]=$n
    if [ "${WS_W%%,*}" = 1 ]; then
      WS_ADOPTED[$k]=$((${WS_ADOPTED[$k]:-0} + 1))
      RES["ws $1 lc-warm$sfx"]+="$WS_US " RES["wsstart warm$sfx"]+="$WS_START " RES["wsprep warm$sfx"]+="$WS_PREP "
    else
      RES["ws $1 lc-notwarm$sfx"]+="$WS_US "
      NOTE["ws $1 not adopted$sfx $n"]="warm flags $WS_W; idle mounts now $(ws_idle_count); $(grep -v '^$' "$WS_DIR/warm.out.err" | tail -1 | head -c 200 || true)"
    fi
    [ "$WS_W" = 1,1 ] || WS_NPM_NOTWARM=$((${WS_NPM_NOTWARM:-0} + 1))
  fi
  WS_PT=""
}

# ws_sampler: python program sampling the processes of layercache's binary and their
# descendants every 50 ms until its stop file appears; prints their peak count (all, and of the
# binary alone) and peak total RSS and PSS (KiB).
WS_SAMPLER='
import os, sys, time
exe, stop = os.path.realpath(sys.argv[1]), sys.argv[2]
page = os.sysconf("SC_PAGE_SIZE") // 1024
peak = [0, 0, 0, 0]
def kib(pid, name):
    try:
        with open("/proc/%d/%s" % (pid, name)) as f:
            if name == "statm":
                return int(f.read().split()[1]) * page
            for line in f:
                if line.startswith("Pss:"):
                    return int(line.split()[1])
    except OSError:
        pass
    return 0
while True:
    done = os.path.exists(stop)
    parent, own = {}, set()
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        pid = int(d)
        try:
            with open("/proc/%d/stat" % pid) as f:
                st = f.read()
            parent[pid] = int(st[st.rindex(")") + 2:].split()[1])
            if os.readlink("/proc/%d/exe" % pid) == exe:
                own.add(pid)
        except (OSError, ValueError):
            pass
    kids = {}
    for pid, pp in parent.items():
        kids.setdefault(pp, []).append(pid)
    tree, todo = set(own), list(own)
    while todo:
        for c in kids.get(todo.pop(), []):
            if c not in tree:
                tree.add(c)
                todo.append(c)
    now = [len(tree), len(own), sum(kib(p, "statm") for p in tree), sum(kib(p, "smaps_rollup") for p in tree)]
    peak = [max(a, b) for a, b in zip(peak, now)]
    if done:
        break
    time.sleep(0.05)
print(*peak)
'

# ws_burst LABEL IDLE WORKLOAD: WS_N concurrent runs (workdirs 1..N); results into RES["conc
# LABEL …"]: failures, slowest run and the whole burst (µs), runs that adopted a warm mount,
# peak processes / of layercache's binary / RSS / PSS, idle mounts before and after.
ws_burst() {
  local label=$1 idle=$2 script k spid t0 t1 fails=0 slow=0 adopted=0 rc s e f r w m p x y pids=()
  script=$(ws_script "$3")
  rm -f "$WS_DIR"/burst-* "$WS_DIR/sampler.stop"
  RES["conc $label idle-before"]+="$(ws_idle_count) "
  python3 -c "$WS_SAMPLER" "$LC_BIN" "$WS_DIR/sampler.stop" >"$WS_DIR/sampler.out" &
  spid=$!
  sleep 0.2
  t0=${EPOCHREALTIME/./}
  for k in $(seq "$WS_N"); do
    (
      s=${EPOCHREALTIME/./} rc=0
      ws_launch "$idle" "$WS_DIR/ws-$k" "$script" >"$WS_DIR/burst-$k.out" 2>"$WS_DIR/burst-$k.err" || rc=$?
      echo "$rc $s ${EPOCHREALTIME/./}" >"$WS_DIR/burst-$k.rc"
    ) &
    pids+=($!)
  done
  for k in "${pids[@]}"; do wait "$k" || true; done
  t1=${EPOCHREALTIME/./}
  touch "$WS_DIR/sampler.stop"
  wait "$spid" || true
  for k in $(seq "$WS_N"); do
    read -r rc s e <"$WS_DIR/burst-$k.rc" || rc=255
    read -r f r w m p x y <<<"$(ws_parse "$WS_DIR/burst-$k.out")"
    if [ "$rc" -ne 0 ] || [ "$r" != hit,hit ] || [ "$x" = - ]; then
      fails=$((fails + 1))
      NOTE["conc $label failed $k"]="exit $rc, results $r: $(grep -v '^$' "$WS_DIR/burst-$k.err" | tail -1 | head -c 200 || true)"
    fi
    [ "$((${e:-0} - ${s:-0}))" -le "$slow" ] || slow=$((e - s))
    [ "${w%%,*}" != 1 ] || adopted=$((adopted + 1))
  done
  read -r k f m p <"$WS_DIR/sampler.out" || k=""
  RES["conc $label fail"]+="$fails " RES["conc $label slow"]+="$slow " RES["conc $label wall"]+="$((t1 - t0)) "
  RES["conc $label adopted"]+="$adopted " RES["conc $label idle-after"]+="$(ws_idle_count) " RES["conc $label idle-max"]+="$(ws_idle_max) "
  [ -z "$k" ] || RES["conc $label procs"]+="$k " RES["conc $label lcprocs"]+="$f " RES["conc $label rss"]+="$m " RES["conc $label pss"]+="$p "
  rm -f "$WS_DIR"/burst-*
}

# ws_med KEY [us|kib]: the median of RES[KEY] (a duration, MiB), "?" when there is none.
ws_med() {
  local m
  # shellcheck disable=SC2086
  [ -n "${RES[$1]:-}" ] && m=$(lc_median ${RES[$1]}) || { echo "?"; return; }
  case ${2:-} in
    us) lc_fmt_us "$m" ;;
    kib) echo "$((m / 1024)) MiB" ;;
    *) echo "$m" ;;
  esac
}

# ws_round: one round of the concurrency bursts, COMMAND `true` then node require: warm mounts
# off (nothing idle), on (nothing idle: the burst before kept none), on again (what it left).
ws_round() {
  local c
  for c in true require; do
    ws_end_idle
    ws_burst "off $c" 0 "$c"
    ws_burst "on0 $c" "" "$c"
    ws_burst "on4 $c" "" "$c"
  done
  ws_end_idle
}

# --- the runs --------------------------------------------------------------------------------
log "implementations: ${IMPLS[*]}; workloads: $WORKLOADS; $RUNS runs each"
if want density || want kinds; then mapfile -t D_SETS < <(d_sets); fi
if want warmstart && has_impl layercache; then
  log "warmstart: preparing its store in $WS_DIR"
  # idle warm mounts end with the script (they would end by themselves after 2 min)
  trap 'ws_end_idle; lc_cleanup' EXIT
  ws_prepare || log "warmstart: layercache left out: ${FAIL["ws layer"]}"
fi
START=$(date +%s)
for run in $(seq "$RUNS"); do
  for w in walk readall require seqread; do
    want "$w" || continue
    log "run $run/$RUNS: $w"
    for i in "${IMPLS[@]}"; do read_run "$w" "$i"; done
  done
  if want pagecache; then log "run $run/$RUNS: page cache of 4 mounts"; for i in "${IMPLS[@]}"; do [ "$i" = native ] || pagecache_run "$i"; done; fi
  if want copyup; then log "run $run/$RUNS: copy-up"; for i in "${IMPLS[@]}"; do copyup_run "$i"; done; fi
  if want mount; then
    log "run $run/$RUNS: mount latency"
    for i in "${IMPLS[@]}"; do
      [ "$i" = native ] || mount_run "mount $i" "$i" "$LC_LOWER" node_modules/react/package.json
    done
  fi
  if want fill; then log "run $run/$RUNS: fill"; for i in "${IMPLS[@]}"; do fill_run "$i"; done; fi
  if want store && has_impl layercache; then log "run $run/$RUNS: layercache store"; store_run "$run"; fi
  if want warmstart; then
    for w in walk readall require require30; do
      log "run $run/$RUNS: warm start, $w"
      for i in "${IMPLS[@]}"; do
        case $i in
          kernel | fuse-overlayfs) ws_overlay_run "$w" "$i" ;;
          layercache) [ -z "$WS_OK" ] || { ws_cold_run "$w"; ws_warm_run "$w"; ws_cold_run "$w" noopen; ws_warm_run "$w" noopen; } ;;
        esac
      done
    done
    if [ -n "$WS_OK" ]; then log "run $run/$RUNS: $WS_N concurrent hits"; ws_round; fi
  fi
  if want kinds; then
    for set in "${D_SETS[@]}"; do
      log "run $run/$RUNS: first passes over the $set layer"
      for i in "${IMPLS[@]}"; do kinds_run "$set" "$i"; done
    done
  fi
done
if want density; then
  # Twice (LAYERCACHE_DENSITY_ROUNDS), the larger kept: a page another cgroup brought in (not
  # dropped, or read meanwhile) is not charged to ours, so a sample can only come out low.
  for rep in $(seq "${LAYERCACHE_DENSITY_ROUNDS:-2}"); do
    for set in "${D_SETS[@]}"; do
      for n in ${LAYERCACHE_DENSITY_N:-1 4 8}; do
        log "density (round $rep): $set, $n runs"
        for i in "${IMPLS[@]}"; do
          big=""; [ "$set $n" = "npmbig 4" ] && big=1
          density_run "$i" "$set" "$n" $big
        done
      done
    done
  done
fi
if want tree; then
  T=$(lc_tree "$TREE_N")
  for i in "${IMPLS[@]}"; do log "tree ($TREE_N entries): $i"; tree_run "$i" "$T"; done
fi
ELAPSED=$(($(date +%s) - START))

# --- the report ------------------------------------------------------------------------------
STAMP=$(date +%Y%m%d-%H%M%S)
OUT=$B/results/bench-$STAMP${QUICK:+-quick}.md
declare -A LABEL=([native]="native" [kernel]="kernel overlayfs" [fuse-overlayfs]="fuse-overlayfs" [layercache]="layercache" [layercache-pt]="layercache passthrough"
  [layercache-user]="layercache as a user" [layercache-user-nouring]="layercache as a user, no io_uring")
d_max() { if [ -n "${RES[$1]:-}" ]; then printf '%s\n' ${RES[$1]} | sort -n | tail -1; fi; } # KEY -> largest sample
cell() { # KEY-PREFIX IMPL -> "median (ratio)"
  local k="$1 $2" kk="$1 kernel" m mk
  if [ -n "${RES[$k]:-}" ]; then
    # shellcheck disable=SC2086
    m=$(lc_median ${RES[$k]})
    printf '%s' "$(lc_fmt_us "$m")"
    if [ -n "${RES[$kk]:-}" ] && [ "$2" != kernel ]; then
      # shellcheck disable=SC2086
      mk=$(lc_median ${RES[$kk]}); printf ' (%s)' "$(lc_ratio "$m" "$mk")"
    fi
  elif [ -n "${FAIL[$k]:-}" ]; then printf 'FAIL'
  else printf '—'; fi
}
row() { # LABEL KEY-PREFIX TARGET
  local line="| $1 |" i
  for i in "${IMPLS[@]}"; do line+=" $(cell "$2" "$i") |"; done
  has_impl layercache && line+=" $3 |"
  echo "$line"
}
{
  echo "# layercache benchmark $STAMP${QUICK:+ (quick)}"
  echo
  lc_machine
  echo "layercache: $LC_STATUS"
  echo "runs: median of $RUNS (implementations interleaved in each run), $(find "$LC_LOWER/node_modules" | wc -l) entries in node_modules, total time ${ELAPSED}s"
  echo "node require: $REQUIRE_PKGS"
  echo
  hdr="| workload |" sep="|---|"
  for i in "${IMPLS[@]}"; do hdr+=" ${LABEL[$i]} |"; sep+="---|"; done
  if has_impl layercache; then hdr+=" layercache target |"; sep+="---|"; fi
  for w in walk readall require seqread pagecache copyup fill mount tree; do want "$w" && { echo "$hdr"; echo "$sep"; break; }; done
  for w in walk readall require seqread; do
    want "$w" || continue
    case $w in
      walk) name="stat walk (find -printf)" ;;
      readall) name="read all files (tar)" ;;
      require) name="node require (5 largest)" ;;
      seqread) name="512 MiB sequential read" ;;
    esac
    for p in first warm cold; do
      # targets of issues 4 and 15
      case "$w $p" in
        "walk first" | "seqread first" | "seqread warm") t="≤ 1.2×" ;;
        "readall first" | "readall cold" | "walk warm" | "readall warm") t="≤ 1.3×" ;;
        "seqread cold") t="≤ 1.5×" ;;
        *) t="" ;;
      esac
      row "$name, $p" "$w $p" "$t"
    done
  done
  if want pagecache; then
    line="| page cache after 4 mounts each read fully |"
    for i in "${IMPLS[@]}"; do
      if [ -n "${RES["pagecache $i"]:-}" ]; then
        # shellcheck disable=SC2086
        m=$(lc_median ${RES["pagecache $i"]}); line+=" $((m / 1024)) MiB"
        if [ -n "${RES["pagecache kernel"]:-}" ] && [ "$i" != kernel ]; then
          # shellcheck disable=SC2086
          line+=" ($(lc_ratio "$m" "$(lc_median ${RES["pagecache kernel"]})"))"
        fi
        line+=" |"
      elif [ -n "${FAIL["pagecache $i"]:-}" ]; then line+=" FAIL |"; else line+=" — |"; fi
    done
    has_impl layercache && line+=" ≤ 1.2× |"
    echo "$line"
  fi
  if want density; then
    echo
    echo "page cache held by N runs of one layer, each read fully (MiB, larger of ${LAYERCACHE_DENSITY_ROUNDS:-2} samples; ratio to native, then to kernel overlayfs):"
    echo
    hdr="| layer | N |" sep="|---|---|"
    for i in "${IMPLS[@]}"; do hdr+=" ${LABEL[$i]} |"; sep+="---|"; done
    echo "$hdr"; echo "$sep"
    for set in "${D_SETS[@]}"; do
      sn=$(d_name "$set")
      for n in ${LAYERCACHE_DENSITY_N:-1 4 8}; do
        line="| $sn | $n |"
        nat=$(d_max "density $set 1 native")
        ker=$(d_max "density $set $n kernel")
        for i in "${IMPLS[@]}"; do
          v=$(d_max "density $set $n $i")
          if [ -n "$v" ]; then
            line+=" $((v / 1024))"
            [ -n "$nat" ] && [ "$i" != native ] && line+=" ($(lc_ratio "$v" "$nat")"
            [ -n "$nat" ] && [ -n "$ker" ] && [ "$i" != native ] && [ "$i" != kernel ] && line+=", $(lc_ratio "$v" "$ker")"
            [ -n "$nat" ] && [ "$i" != native ] && line+=")"
            line+=" |"
          elif [ -n "${FAIL["density $set $n $i"]:-}" ]; then line+=" FAIL |"; else line+=" — |"; fi
        done
        echo "$line"
      done
    done
    if [[ " ${D_SETS[*]} " == *" npmbig "* ]]; then
      echo
      echo "512 MiB file in a fresh run while 4 runs hold the npm tree + 512 MiB layer (median of 3 per round; ratio to kernel overlayfs):"
      echo
      hdr="| read |" sep="|---|"
      for i in "${IMPLS[@]}"; do hdr+=" ${LABEL[$i]} |"; sep+="---|"; done
      echo "$hdr"; echo "$sep"
      for p in first warm; do
        line="| 512 MiB, $p |"
        for i in "${IMPLS[@]}"; do line+=" $(cell "dbig $p" "$i") |"; done
        echo "$line"
      done
    fi
    echo
  fi
  if want kinds; then
    echo
    echo "first passes over each layer kind on a fresh mount, the lower's page cache warm (median of $RUNS, implementations interleaved; ratio to kernel overlayfs):"
    echo
    hdr="| layer | files | bytes in files ≥ 1 MiB | pass |" sep="|---|---|---|---|"
    for i in "${IMPLS[@]}"; do hdr+=" ${LABEL[$i]} |"; sep+="---|"; done
    echo "$hdr"; echo "$sep"
    for set in "${D_SETS[@]}"; do
      read -r files large <<<"$(d_counts "$set")"
      for p in walk read; do
        line="| $(d_name "$set") | $files | $((large >> 20)) MiB | first $p |"
        for i in "${IMPLS[@]}"; do line+=" $(cell "kinds $p $set" "$i") |"; done
        echo "$line"
      done
    done
    echo
  fi
  if want warmstart; then
    echo
    echo "warm start: the first pass of a run, timed inside COMMAND (median of $RUNS, implementations interleaved; ratio to kernel overlayfs). kernel overlayfs, fuse-overlayfs: a fresh mount, right after the same pass over the lower. layercache cold: \`LAYERCACHE_WARM_IDLE=0 layercache run\`, right after the same pass over the layer's own tree. layercache warm: the run right after a run of the same layer and workload that left its mount idle; ${WS_ADOPTED[auto]:-0} of ${WS_MEASURED[auto]:-0} measured warm runs adopted a warm mount (only those are counted). Both as \`run\` mounts a layer by default as root (passthrough auto: FUSE passthrough for a layer with files); no-open: the same runs with \`--passthrough off\` (${WS_ADOPTED[noopen]:-0} of ${WS_MEASURED[noopen]:-0} warm runs adopted)${WS_NPM_NOTWARM:+; the npm cache was not warm in $WS_NPM_NOTWARM of the warm runs}."
    echo
    echo "| first pass | kernel overlayfs | fuse-overlayfs | layercache cold | layercache warm | warm / cold | no-open cold | no-open warm | target (warm) |"
    echo "|---|---|---|---|---|---|---|---|---|"
    for w in walk readall require require30; do
      case $w in
        walk) name="walk (find node_modules -printf)" ;;
        readall) name="read-all (tar of node_modules)" ;;
        require) name="node require ($REQUIRE_PKGS)" ;;
        require30) name="node require, 30 packages (bench-lazy.sh's list)" ;;
      esac
      wc="—"
      if [ -n "${RES["ws $w lc-warm"]:-}" ] && [ -n "${RES["ws $w lc-cold"]:-}" ]; then
        # shellcheck disable=SC2086
        wc=$(lc_ratio "$(lc_median ${RES["ws $w lc-warm"]})" "$(lc_median ${RES["ws $w lc-cold"]})")
      fi
      echo "| $name | $(cell "ws $w" kernel) | $(cell "ws $w" fuse-overlayfs) | $(cell "ws $w" lc-cold) | $(cell "ws $w" lc-warm) | $wc | $(cell "ws $w" lc-cold-noopen) | $(cell "ws $w" lc-warm-noopen) | ≤ 1.0× |"
    done
    echo
    echo "hit → COMMAND start (from launching \`layercache run\` to the first instruction of COMMAND's bash; the README example's two caches, node_modules and npm, both hits; median of the $(echo ${RES["wsstart warm"]:-} | wc -w) warm and $(echo ${RES["wsstart cold"]:-} | wc -w) cold runs above):"
    echo
    echo "| | layercache cold | layercache warm | no-open cold | no-open warm | target |"
    echo "|---|---|---|---|---|---|"
    echo "| hit → COMMAND start | $(cell wsstart cold) | $(cell wsstart warm) | $(cell wsstart cold-noopen) | $(cell wsstart warm-noopen) | ≤ 20 ms |"
    echo "| prep_ms of the --json line (mounts + npm's maintenance) | $(cell wsprep cold) | $(cell wsprep warm) | $(cell wsprep cold-noopen) | $(cell wsprep warm-noopen) | |"
    if [ -n "${RES["conc off true fail"]:-}" ]; then
      echo
      echo "$WS_N concurrent hits of one layer, each in its own workdir (median of $RUNS bursts; failures summed; peaks sampled every 50 ms over layercache's processes — runs, their pid-namespace inits, overlay daemons, idle ones included — and their descendants, COMMAND's):"
      echo
      echo "| warm mounts | COMMAND | failures | slowest run | whole burst | runs that adopted | idle before → after (most of one layer) | processes at peak (layercache's) | RSS at peak | PSS at peak |"
      echo "|---|---|---|---|---|---|---|---|---|---|"
      for c in true require; do
        for m in off on0 on4; do
          k="conc $m $c"
          case $m in
            off) ml="off (LAYERCACHE_WARM_IDLE=0)" ;;
            on0) ml="on, none idle before" ;;
            on4) ml="on, right after the burst above" ;;
          esac
          fails=$(printf '%s\n' ${RES["$k fail"]:-} | awk '{ s += $1 } END { print s + 0 }')
          echo "| $ml | ${c/require/node require} | $fails | $(ws_med "$k slow" us) | $(ws_med "$k wall" us) | $(ws_med "$k adopted") | $(ws_med "$k idle-before") → $(ws_med "$k idle-after") ($(ws_med "$k idle-max")) | $(ws_med "$k procs") ($(ws_med "$k lcprocs")) | $(ws_med "$k rss" kib) | $(ws_med "$k pss" kib) |"
        done
      done
      echo
      echo "idle counts are of both caches' mounts (node_modules and npm; at most 4 per layer are meant to be kept); a run that finds none idle mounts the layer with a daemon of its own. runs that adopted: of node_modules' mounts. The maximum over the bursts of idle mounts of one layer after a burst: $(printf '%s\n' ${RES["conc on0 true idle-max"]:-} ${RES["conc on4 true idle-max"]:-} ${RES["conc on0 require idle-max"]:-} ${RES["conc on4 require idle-max"]:-} | sort -n | tail -1)."

    fi
    echo
  fi
  if want pagecache || want density; then
    line="daemon executables and their libraries, read into the page cache before each count outside the counted cgroup:"
    for f in "${DAEMON_BINS[@]}"; do
      [ -f "$f" ] || continue
      line+=" $(basename "$f") $(stat -c %s "$f" | awk '{ printf "%.1f", $1 / 1048576 }') MiB"
    done
    echo "$line"
    echo
  fi
  want copyup && row "copy-up (append 1 byte to 512 MiB)" copyup ""
  want fill && row "fill (npm ci --offline into empty overlay)" fill ""
  want mount && row "mount → first stat" mount "< 50 ms"
  if want tree; then
    row "mount → first stat, $TREE_N-entry lower (1 run)" tree-mount "< 50 ms"
    row "walk $TREE_N-entry tree, first pass (1 run)" tree-walk ""
    line="| daemon peak RSS after that walk |"
    for i in "${IMPLS[@]}"; do
      if [ -n "${RES["tree-rss $i"]:-}" ]; then line+=" $((RES["tree-rss $i"] / 1024)) MiB |"; else line+=" — |"; fi
    done
    has_impl layercache && line+=" ≤ 200 MB |"
    echo "$line"
  fi
  if has_impl layercache && has_impl layercache-user; then
    echo
    echo "rootless / root: median of layercache mounted by $LC_USER through fusermount3 over layercache mounted as root (target ≤ 1.10×):"
    echo
    hdr="| workload |" sep="|---|"
    for i in layercache-user layercache-user-nouring; do
      has_impl "$i" && { hdr+=" ${LABEL[$i]} first | warm | cold |"; sep+="---|---|---|"; }
    done
    echo "$hdr"; echo "$sep"
    for w in walk readall require seqread; do
      want "$w" || continue
      line="| $w |"
      for i in layercache-user layercache-user-nouring; do
        has_impl "$i" || continue
        for p in first warm cold; do
          if [ -n "${RES["$w $p $i"]:-}" ] && [ -n "${RES["$w $p layercache"]:-}" ]; then
            # shellcheck disable=SC2086
            line+=" $(lc_ratio "$(lc_median ${RES["$w $p $i"]})" "$(lc_median ${RES["$w $p layercache"]})") |"
          else line+=" — |"; fi
        done
      done
      echo "$line"
    done
  fi
  if want store && has_impl layercache; then
    echo
    echo "layercache store (node_modules of the fixture, fresh store each run; median of $RUNS):"
    echo
    echo "| step | time | target |"
    echo "|---|---|---|"
    for k in "store miss|mount (miss)|" "store fill|fill (npm ci --offline)|" "store promote|promote (commit) of the fill|≤ 1 s" \
             "store hit|hit lookup (mount command, hit)|" "store hit-ready|hit: mount → first stat|< 50 ms"; do
      IFS='|' read -r key name tgt <<<"$k"
      if [ -n "${RES[$key]:-}" ]; then
        # shellcheck disable=SC2086
        v=$(lc_fmt_us "$(lc_median ${RES[$key]})")
      else v="—"; fi
      echo "| $name | $v | $tgt |"
    done
  fi
  if [ ${#FAIL[@]} -gt 0 ] || [ ${#NOTE[@]} -gt 0 ]; then
    echo
    echo "failures and notes:"
    for k in "${!FAIL[@]}"; do echo "- $k: ${FAIL[$k]}"; done | sort
    for k in "${!NOTE[@]}"; do echo "- $k: ${NOTE[$k]}"; done | sort
  fi
  echo
  echo "cells: median (ratio to kernel overlayfs in the same run); FAIL = see failures; — = not measured"
} | tee "$OUT"
for k in "${!RES[@]}"; do printf '%s\t%s\n' "$k" "${RES[$k]}"; done | sort >"${OUT%.md}.tsv"
log "report: $OUT (raw samples in ${OUT%.md}.tsv)"
