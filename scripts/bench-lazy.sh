#!/usr/bin/env bash
# Lazy remote layers against a full pull, over a modelled network link.
#
# SeaweedFS (scripts/seaweedfs.sh) holds the layers; scripts/linkproxy.py sits in front of it as
# the link (one token bucket shared by all connections + a delay before each response's first
# byte). Store A fills each workload's layer and pushes it with the remote's endpoint = SeaweedFS
# directly; then every cell runs `layercache run` on an EMPTY store B whose endpoint is the proxy.
#
# Workloads (a layer in the remote + a COMMAND):
#   npm    the npm fixture's installed node_modules (~114 MiB, ~10k files); node requires 30 of
#          its top-level packages
#   venv   a venv with numpy, pandas, requests from PyPI (venv preset, pip); python imports them
#   cargo  the cargo fixture's target dir (cargo-target preset); `cargo build --offline` (a no-op
#          build that stats and reads nearly everything); crates come from a CARGO_HOME outside
#          layercache, filled once by store A's setup
#   ls     `ls -lR` of the npm layer's view
#   big    the npm tree copied 10x under one cache dir (each copy made distinct: one line
#          appended to every file, so content addressing does not fold the copies into one);
#          COMMAND `true`, time to COMMAND start only, full against lazy
# Variants, interleaved within each iteration (the order rotates from one iteration to the next):
#   full        LAYERCACHE_LAZY=0: the whole layer is pulled before COMMAND starts
#   lazy        LAYERCACHE_LAZY=1, the remote trace object deleted before the run
#   lazy+trace  LAYERCACHE_LAZY=1 with the trace an earlier lazy run (on another empty store)
#               recorded for the same workload, put back before each such cell
# Links: 200 Mbit/s + 20 ms (the headline) and 1 Gbit/s + 5 ms.
# Per cell, from starting `layercache run` (ms): mount (the run's --json mount_ms), COMMAND start
# and end (COMMAND writes `date +%s%N` markers), layer complete (the key listed by `layercache ls
# --json` of store B as a local layer that is not partial; polled, capped by --cap), and the
# bytes and GETs that went through the proxy (its log). Medians over the runs.
# Writes benches/results/<date>-lazy-<commit>.md (+ .tsv with every sample) and prints it.
#
#   bash scripts/bench-lazy.sh [--runs N] [--quick|--start] [--bin PATH] [--cap SECONDS]
#                              [--workloads "W…"] [--links "RATE:DELAY…"] [--compare PATH]  (root)
#     --runs N    iterations (default 5)
#     --quick     npm + ls only, the 200 Mbit/s link, 1 run unless --runs says (a smoke
#                 check); the report is <date>-lazy-quick-<commit>.md
#     --start     time to COMMAND start only: npm (all variants) and big (lazy only; its full
#                 pull takes ~50 s a run), the 200 Mbit/s link; <date>-lazy-start-<commit>.md
#     --bin PATH  use this binary instead of building one (`cargo build --release`)
#     --cap S     give up waiting for a layer to be complete after S seconds (default 300)
#     --workloads only these of npm venv cargo ls big (e.g. "cargo npm"); the report is
#                 <date>-lazy-<workloads>-<commit>.md
#     --links     only these links (e.g. "1000:5"), Mbit/s:ms
#     --compare P also run the lazy and lazy+trace cells with binary P (variants "lazy@before",
#                 "lazy+trace@before", interleaved with the others, the same trace replayed):
#                 a change measured against the binary before it in one run
# The binary used is copied to /var/tmp/lc-bin-bench first, so a rebuild by someone else cannot
# swap it mid-run. Everything else lives in a temp dir under /var/tmp, removed on exit with every
# mount, proxy and server, also on error or interrupt. Exit status: 0, 1 when a cell failed,
# 2 bad arguments or setup failure.
set -euo pipefail
cd "$(dirname "$0")/.."
REPO=$PWD

# Where a lazy runner's recorded access trace lives, relative to the remote URL's prefix
# (arguments: project, cache, key). Adjust here if the lazy-remote code puts it elsewhere.
trace_object() { echo "v1/projects/$1/caches/$2/traces/$3"; }

RUNS=5 RUNS_SET=0 QUICK=0 START=0 BIN_IN="" CAP_S=300 ONLY_W="" ONLY_L="" CMP_IN=""
while [ $# -gt 0 ]; do
  case $1 in
    --runs) RUNS=$2 RUNS_SET=1; shift ;;
    --quick) QUICK=1 ;;
    --start) START=1 ;;
    --bin) BIN_IN=$2; shift ;;
    --cap) CAP_S=$2; shift ;;
    --workloads) ONLY_W=$2; shift ;;
    --links) ONLY_L=$2; shift ;;
    --compare) CMP_IN=$2; shift ;;
    -h | --help) sed -n '2,50p' "$0"; exit 0 ;;
    *) echo "bench-lazy.sh: unknown argument $1" >&2; exit 2 ;;
  esac
  shift
done
[ "$(id -u)" -eq 0 ] || { echo "bench-lazy.sh: run as root (runs mount overlays)" >&2; exit 2; }
# shellcheck source=scripts/lib-bench.sh
source scripts/lib-bench.sh # log, die, lc_median

# BIG: the ten-times layer is measured (on the first link); BIG_VARIANTS: how.
BIG=1 BIG_VARIANTS="full lazy"
if [ "$QUICK" = 1 ]; then
  [ "$RUNS_SET" = 1 ] || RUNS=1
  WORKLOADS="npm ls" LINKS="200:20" BIG=0
elif [ "$START" = 1 ]; then
  WORKLOADS="npm" LINKS="200:20" BIG_VARIANTS="lazy"
else
  WORKLOADS="npm venv cargo ls" LINKS="200:20 1000:5"
fi
if [ -n "$ONLY_W" ]; then
  for w in $ONLY_W; do
    case $w in npm | venv | cargo | ls | big) ;; *) echo "bench-lazy.sh: unknown workload $w" >&2; exit 2 ;; esac
  done
  case " $ONLY_W " in *" big "*) BIG=1 ;; *) BIG=0 ;; esac
  WORKLOADS=$(for w in $ONLY_W; do [ "$w" = big ] || echo "$w"; done | tr '\n' ' ')
fi
[ -z "$ONLY_L" ] || LINKS=$ONLY_L
VARIANTS=(full lazy lazy+trace)
[ -z "$CMP_IN" ] || VARIANTS+=(lazy@before lazy+trace@before)
PROJECT=lazybench
CELL_BIN="" # the binary of one cell (lc), when not $BIN

# --- the binary -------------------------------------------------------------------------------
BIN=/var/tmp/lc-bin-bench
DIRTY=""
if [ -n "$BIN_IN" ]; then
  cp "$BIN_IN" "$BIN.tmp"
  BUILT="given binary $BIN_IN"
else
  export CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-$REPO/target}
  log "building layercache (release) into $CARGO_TARGET_DIR"
  cargo build --release --quiet --bin layercache || die "release build failed"
  cp "$CARGO_TARGET_DIR/release/layercache" "$BIN.tmp"
  [ -z "$(git status --porcelain -- src Cargo.toml Cargo.lock)" ] || DIRTY=" + uncommitted changes in src/"
  BUILT="release build of the working tree"
fi
mv "$BIN.tmp" "$BIN"
BIN_BEFORE=/var/tmp/lc-bin-bench-before CMP_NOTE=""
if [ -n "$CMP_IN" ]; then
  cp "$CMP_IN" "$BIN_BEFORE"
  CMP_NOTE=" Variants @before: the binary $CMP_IN (copied to $BIN_BEFORE)."
fi
COMMIT=$(git rev-parse --short HEAD)
# Lazy remote layers are chosen by LAYERCACHE_LAZY (or a --lazy flag): a binary that knows
# neither pulls whole in every cell. Each cell also records whether its run mounted lazily.
if "$BIN" run --help 2>/dev/null | grep -q -- '--lazy' || grep -qa LAYERCACHE_LAZY "$BIN"; then
  LAZY_NOTE=""
else
  LAZY_NOTE="**This binary has no lazy remote layers (\`layercache run --help\` has no \`--lazy\` flag and it does not read LAYERCACHE_LAZY): the lazy and lazy+trace cells ran today's full pull; they measure the same thing as full.**"
fi

# --- work dir, cleanup ------------------------------------------------------------------------
W=$(mktemp -d /var/tmp/lc-bench-lazy.XXXXXX)
PIDS=() # proxies and pollers we started
cleanup() {
  local rc=$? m p
  trap - EXIT INT TERM HUP ERR
  set +e # every step below runs, whatever the one before it did
  for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done
  for p in "${PIDS[@]}"; do wait "$p" 2>/dev/null || true; done
  for m in $(awk -v w="$W" 'index($2, w) == 1 {print $2}' /proc/mounts | sort -r); do
    "$BIN" umount "$m" >/dev/null 2>&1 || umount "$m" 2>/dev/null || umount -l "$m" || true
  done
  bash scripts/seaweedfs.sh stop "$W/weed" || true
  # a server that is still writing its last files can make one pass fail (directory not empty)
  for _ in 1 2 3 4 5; do rm -rf "$W" 2>/dev/null && break; sleep 1; done
  [ ! -e "$W" ] || log "warning: could not remove $W"
  exit "$rc"
}
trap cleanup EXIT
trap 'log "interrupted"; exit 130' INT TERM HUP
set -E
trap 'log "error: line $LINENO: $BASH_COMMAND (exit $?)"' ERR

mkdir -p "$W/weed" "$W/mnt" "$W/m" "$W/traces"
log "starting SeaweedFS"
bash scripts/seaweedfs.sh start "$W/weed" >/dev/null
set -a; . "$W/weed/env"; set +a
PREFIX=bench
URL="s3://$S3_BUCKET/$PREFIX"

# s3 METHOD OBJECT [OUTFILE [curl args…]]: one signed request (curl's SigV4; SeaweedFS wants the
# payload hash header) straight to SeaweedFS, or to $S3_VIA when set; prints the HTTP status.
# OBJECT is relative to the remote URL's prefix; the response body goes to OUTFILE (/dev/null).
s3() {
  local method=$1 obj=$2 out=${3:-/dev/null}
  shift $(($# < 3 ? $# : 3))
  curl -sS -o "$out" -w '%{http_code}' -X "$method" --aws-sigv4 "aws:amz:us-east-1:s3" \
    --user "$AWS_ACCESS_KEY_ID:$AWS_SECRET_ACCESS_KEY" -H "x-amz-content-sha256: UNSIGNED-PAYLOAD" \
    "$@" "${S3_VIA:-$S3_ENDPOINT}/$S3_BUCKET/$PREFIX/$obj"
}

# --- the links --------------------------------------------------------------------------------
declare -A PROXY_PORT=()
start_proxy() { # start_proxy RATE DELAY: a proxy for link RATE:DELAY, its log $W/proxy-RATE.log
  local rate=$1 delay=$2 pf=$W/proxy-$1.port
  python3 scripts/linkproxy.py --upstream "$S3_ENDPOINT" --rate "$rate" --delay-ms "$delay" \
    --port-file "$pf" --log "$W/proxy-$rate.log" >/dev/null 2>"$W/proxy-$rate.err" &
  PIDS+=($!)
  for _ in $(seq 1 100); do [ -s "$pf" ] && break; sleep 0.05; done
  [ -s "$pf" ] || die "linkproxy did not start: $(cat "$W/proxy-$rate.err")"
  PROXY_PORT[$rate]=$(cat "$pf")
  touch "$W/proxy-$rate.log"
}
for l in $LINKS; do start_proxy "${l%%:*}" "${l##*:}"; done

# What each link delivers: two parallel GETs of a 32 MiB object through the proxy (the proxy is
# Python: on a busy 2-core machine it may fall short of a fast link's rate; the report says so).
head -c $((32 << 20)) /dev/urandom >"$W/calib.bin"
[ "$(s3 PUT calib/blob "" --data-binary "@$W/calib.bin")" = 200 ] || die "could not store the calibration object"
declare -A LINK_MEASURED=()
for l in $LINKS; do
  t0=${EPOCHREALTIME/./}
  gets=()
  for _ in 1 2; do
    S3_VIA=http://127.0.0.1:${PROXY_PORT[${l%%:*}]} s3 GET calib/blob >/dev/null &
    gets+=($!)
  done
  wait "${gets[@]}"
  LINK_MEASURED[$l]=$(awk -v us=$((${EPOCHREALTIME/./} - t0)) 'BEGIN { printf "%.0f", 2 * 32 * 1048576 * 8 / us }')
  log "link ${l%%:*} Mbit/s + ${l##*:} ms delivers ${LINK_MEASURED[$l]} Mbit/s to two parallel GETs"
done
s3 DELETE calib/blob >/dev/null
rm -f "$W/calib.bin"

# wait_quiet PORT: until no client holds a connection to the proxy (a finished cell's process,
# or a background completion it left, would otherwise spill bytes into the next cell).
wait_quiet() {
  local i
  for i in $(seq 1 600); do
    [ -z "$(ss -Htn state established "( sport = :$1 )")" ] && return 0
    sleep 0.1
  done
  log "warning: connections to the proxy on port $1 still open after 60 s"
}

# --- stores and workloads ---------------------------------------------------------------------
store() { # store NAME ENDPOINT: a store dir whose [remote] endpoint is ENDPOINT
  mkdir -p "$W/$1/v1"
  printf '[remote]\nendpoint = "%s"\nallow_http = true\n' "$2" >"$W/$1/v1/config.toml"
  echo "$W/$1"
}
lc() { local s=$1; shift; "${CELL_BIN:-$BIN}" --store "$s" --remote "$URL" "$@"; }

# Per workload: its spec, workdir, cache id and COMMAND.
declare -A SPEC=() WORKDIR=() CACHE=() CMD=() KEY=() LBYTES=() LFILES=() TRACE=()
NPM_PKGS="react react-dom lodash express axios typescript eslint @babel/core webpack jest rollup
  terser postcss yargs acorn js-yaml ajv chalk debug semver glob minimatch cross-spawn execa
  prompts esprima graceful-fs browserslist caniuse-lite @jest/core"
spec() { # spec WORKLOAD CACHE-TOML-LINE…: writes the workload's spec (one cache)
  local w=$1; shift
  printf 'project = "%s"\n[[cache]]\n' "$PROJECT" >"$W/spec-$w.toml"
  printf '%s\n' "$@" >>"$W/spec-$w.toml"
  SPEC[$w]=$W/spec-$w.toml
}

setup_npm() {
  mkdir -p "$W/npm"
  cp examples/npm-app/package.json examples/npm-app/package-lock.json "$W/npm/"
  spec npm 'id = "node_modules"' 'preset = "node_modules"'
  WORKDIR[npm]=$W/npm CACHE[npm]=node_modules
  CMD[npm]="node -e \"for (const p of '$(echo $NPM_PKGS)'.split(' ')) require(p)\""
}
setup_ls() {
  SPEC[ls]=${SPEC[npm]} WORKDIR[ls]=$W/npm CACHE[ls]=node_modules
  CMD[ls]="ls -lR node_modules >/dev/null"
}
setup_venv() {
  mkdir -p "$W/venv"
  printf 'numpy==2.4.6\npandas==3.1.1\nrequests==2.34.2\n' >"$W/venv/requirements.txt"
  spec venv 'id = "venv"' 'preset = "venv"'
  WORKDIR[venv]=$W/venv CACHE[venv]=venv
  CMD[venv]="python -c 'import numpy, pandas, requests'"
}
setup_cargo() {
  mkdir -p "$W/cargo" "$W/cargo-home"
  cp -r examples/cargo-app/. "$W/cargo/"
  spec cargo 'id = "target"' 'preset = "cargo-target"'
  WORKDIR[cargo]=$W/cargo CACHE[cargo]=target
  CMD[cargo]="cargo build --offline --locked --quiet"
}
# big: the npm layer's tree copied 10x by its setup (after npm's layer exists in store A).
setup_big() {
  local src
  # the key file names the layer
  src=$A/v1/projects/$PROJECT/layers/$(cat "$A/v1/projects/$PROJECT/caches/node_modules/keys/${KEY[npm]}")/tree
  [ -d "$src" ] || die "no tree of the npm layer at $src"
  mkdir -p "$W/big"
  echo "copies of the npm tree, 10" >"$W/big/big.key"
  cat >"$W/big-setup.py" <<'EOF'
import os, shutil, subprocess, sys
src, dst = sys.argv[1], sys.argv[2]
for i in range(10):
    d = os.path.join(dst, "copy%d" % i)
    subprocess.run(["cp", "-a", src, d], check=True)
    if i == 0:
        continue
    for root, _, files in os.walk(d):
        for f in files:
            p = os.path.join(root, f)
            if os.path.isfile(p) and not os.path.islink(p):
                with open(p, "ab") as fh:
                    fh.write(b"\n/* copy %d */\n" % i)
EOF
  spec big 'id = "big"' 'key_files = ["big.key"]' \
    "setup = \"python3 $W/big-setup.py $src \$LAYERCACHE_MOUNT\""
  WORKDIR[big]=$W/big CACHE[big]=big CMD[big]=true
}

export CARGO_HOME=$W/cargo-home # the cargo workload's crates, outside layercache
A=$(store a "$S3_ENDPOINT")
fill() { # fill WORKLOAD: store A runs it (a miss: setup fills the layer) and pushes it
  local w=$1 out
  log "store A: filling and pushing the $w layer"
  if ! out=$(lc "$A" --json run --spec "${SPEC[$w]}" --workdir "${WORKDIR[$w]}" \
    --mount-root "$W/mnt" -- true 2>"$W/a-$w.log"); then
    tail -20 "$W/a-$w.log" >&2
    die "store A could not fill the $w layer"
  fi
  grep -q 'pushed key' "$W/a-$w.log" || { tail -5 "$W/a-$w.log" >&2; die "store A did not push the $w layer"; }
  KEY[$w]=$(ls "$A/v1/projects/$PROJECT/caches/${CACHE[$w]}/keys/")
  out=$(echo "$out" | grep -m1 '^{.*"caches"')
  LBYTES[$w]=$(echo "$out" | python3 -c 'import json,sys; print(json.load(sys.stdin)["caches"][0]["bytes"])')
  LFILES[$w]=$(echo "$out" | python3 -c 'import json,sys; print(json.load(sys.stdin)["caches"][0]["files"])')
  log "A: $(grep -m1 'pushed key' "$W/a-$w.log")"
}

ALL_FILLS="npm"
[ "$QUICK" = 1 ] || ALL_FILLS="npm venv cargo big"
[ "$START" = 0 ] || ALL_FILLS="npm big"
if [ -n "$ONLY_W" ]; then # npm too when a workload needs its layer (ls and big do)
  ALL_FILLS=""
  for w in $WORKLOADS $([ "$BIG" = 0 ] || echo npm big); do
    [ "$w" = ls ] && w=npm
    case " $ALL_FILLS " in *" $w "*) ;; *) ALL_FILLS="$ALL_FILLS $w" ;; esac
  done
fi
setup_npm
setup_ls
for w in $ALL_FILLS; do
  [ "$w" = npm ] || "setup_$w"
  fill "$w"
done
KEY[ls]=${KEY[npm]:-} LBYTES[ls]=${LBYTES[npm]:-} LFILES[ls]=${LFILES[npm]:-}

# --- one cell ---------------------------------------------------------------------------------
# The completion poller: prints the ms (since T0_US) when store B lists KEY as a complete local
# layer; "exit" when the run ended (STOPFILE appeared) and it still was not (a lazy run publishes
# the layer at its end only when every object arrived while it lasted; else the next run goes
# on), or "cap" after CAP_S seconds. A lazy layer is not listed while partial (it lives under
# partial/ until published); a row is still taken as incomplete if it says so ("partial": true,
# "lazy": true, "complete": false, or "state" partial/lazy/incomplete/filling).
poll_complete() { # poll_complete STORE KEY T0_US STOPFILE
  python3 - "$BIN" "$1" "$2" "$3" "$CAP_S" "$4" <<'EOF'
import json, os, subprocess, sys, time
bin_, store, key, t0, cap, stop = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4]), float(sys.argv[5]), sys.argv[6]
def complete(rows):
    for r in rows:
        if key in (r.get("keys") or []):
            state = str(r.get("state", "")).lower()
            return not (r.get("partial") is True or r.get("lazy") is True
                        or r.get("complete") is False
                        or state in ("partial", "lazy", "incomplete", "filling"))
    return False
while True:
    stopped = os.path.exists(stop)  # before the look: a run that ended may have published
    p = subprocess.run([bin_, "--store", store, "--json", "ls"], capture_output=True, text=True)
    now = time.time() * 1e6
    try:
        if p.returncode == 0 and complete(json.loads(p.stdout)):
            print(round((now - t0) / 1000))
            break
    except ValueError:
        pass
    if stopped:
        print("exit")
        break
    if now - t0 > cap * 1e6:
        print("cap")
        break
    time.sleep(0.1)
EOF
}

# proxy_sums LOG FROM_LINE: "bytes gets requests" of the log lines after FROM_LINE.
proxy_sums() {
  tail -n "+$(($2 + 1))" "$1" | python3 -c '
import json, sys
b = g = n = 0
for line in sys.stdin:
    e = json.loads(line)
    n += 1
    b += e.get("bytes", 0)
    g += e.get("method") == "GET"
print(b, g, n)'
}

TSV=$W/samples.tsv
printf 'link\titer\tworkload\tvariant\trc\tlazy\tmount_ms\tstart_ms\tend_ms\tcomplete_ms\texit_ms\tbytes\tgets\trequests\n' >"$TSV"
FAILED=0
CELLN=0
declare -A NOTES=() # "LINK|WORKLOAD|VARIANT" -> the run's "fetched lazily" line (last iteration)
# cell LINK ITER WORKLOAD VARIANT [nopoll]: one run on an empty store through the link.
cell() {
  local link=$1 iter=$2 w=$3 v=$4 nopoll=${5:-} rate=${1%%:*} lazy=1 B t0 rc out poller=""
  local port=${PROXY_PORT[$rate]} plog=$W/proxy-$rate.log from mount start end complete t_exit
  local bin=$BIN tag=$v
  case $v in *@before) bin=$BIN_BEFORE v=${v%@before} ;; esac
  CELLN=$((CELLN + 1))
  B=$(store "b$CELLN" "http://127.0.0.1:$port")
  local obj
  obj=$(trace_object "$PROJECT" "${CACHE[$w]}" "${KEY[$w]}")
  case $v in
    full) lazy=0 ;;
    lazy) s3 DELETE "$obj" >/dev/null ;;
    lazy+trace)
      if [ -n "${TRACE[$w]:-}" ]; then
        s3 PUT "$obj" "" --data-binary "@${TRACE[$w]}" >/dev/null
      else
        s3 DELETE "$obj" >/dev/null
      fi ;;
  esac
  rm -f "$W/m/start" "$W/m/end" "$W/m/exited"
  printf 'date +%%s%%N > %s\n%s\nrc=$?\ndate +%%s%%N > %s\nexit $rc\n' \
    "$W/m/start" "${CMD[$w]}" "$W/m/end" >"$W/cell.sh"
  wait_quiet "$port"
  from=$(wc -l <"$plog")
  sync
  t0=${EPOCHREALTIME/./}
  if [ -z "$nopoll" ]; then
    poll_complete "$B" "${KEY[$w]}" "$t0" "$W/m/exited" >"$W/m/complete" &
    poller=$!
    PIDS+=("$poller")
  fi
  rc=0
  out=$(CELL_BIN=$bin LAYERCACHE_LAZY=$lazy lc "$B" --json run --spec "${SPEC[$w]}" --workdir "${WORKDIR[$w]}" \
    --mount-root "$W/mnt" -- sh "$W/cell.sh" 2>"$W/m/err") || rc=$?
  t_exit=$(((${EPOCHREALTIME/./} - t0) / 1000))
  touch "$W/m/exited"
  if [ -n "$poller" ]; then
    wait "$poller" 2>/dev/null || true
    complete=$(cat "$W/m/complete" 2>/dev/null || true)
  fi
  read -r mount lazied < <(echo "$out" | grep -m1 '^{.*"caches"' | python3 -c '
import json, sys
c = json.loads(sys.stdin.read())["caches"][0]
print(c["mount_ms"], "yes" if c.get("remote_lazy") else "no")' 2>/dev/null || echo "- -")
  NOTES["$link|$w|$tag"]=$(grep -m1 'fetched lazily' "$W/m/err" | sed 's/^layercache: //' || true)
  start=- end=-
  [ -s "$W/m/start" ] && start=$((($(cat "$W/m/start") / 1000 - t0) / 1000))
  [ -s "$W/m/end" ] && end=$((($(cat "$W/m/end") / 1000 - t0) / 1000))
  wait_quiet "$port"
  read -r bytes gets reqs < <(proxy_sums "$plog" "$from")
  if [ "$rc" -ne 0 ]; then
    FAILED=1
    NOTES["$link|$w|$tag"]="failed (exit $rc): $(grep -m1 -i error "$W/m/err" || tail -1 "$W/m/err")"
    log "cell $w/$tag failed (exit $rc): $(tail -3 "$W/m/err" | tr '\n' ' ')"
  fi
  printf '%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n' "$link" "$iter" "$w" "$tag" \
    "$rc" "$lazied" "$mount" "$start" "$end" "${complete:--}" "$t_exit" "$bytes" "$gets" "$reqs" >>"$TSV"
  log "$link #$iter $w $tag (lazy: $lazied): mount $mount, start $start, end $end, complete ${complete:--}, exit $t_exit ms; $bytes bytes, $gets GETs"
  rm -rf "$B"
}

# --- the traces lazy+trace replays --------------------------------------------------------------
# One lazy run per workload on another empty store (straight to SeaweedFS) records it; its copy
# is put back before each lazy+trace cell (a later lazy run may replace or delete the object).
for w in $WORKLOADS; do
  obj=$(trace_object "$PROJECT" "${CACHE[$w]}" "${KEY[$w]}")
  s3 DELETE "$obj" >/dev/null
  R=$(store "rec-$w" "$S3_ENDPOINT")
  printf '%s\n' "${CMD[$w]}" >"$W/cell.sh"
  if ! LAYERCACHE_LAZY=1 lc "$R" --json run --spec "${SPEC[$w]}" --workdir "${WORKDIR[$w]}" \
    --mount-root "$W/mnt" -- sh "$W/cell.sh" >/dev/null 2>"$W/rec-$w.log"; then
    # its lazy cells will fail the same way and say so in the report
    log "warning: the recording run of $w failed: $(grep -m1 -i error "$W/rec-$w.log" || tail -1 "$W/rec-$w.log")"
  fi
  tries=1
  [ -n "$LAZY_NOTE" ] || tries=10 # a lazy run stores its trace before it exits
  for _ in $(seq 1 "$tries"); do
    code=$(s3 GET "$obj" "$W/traces/$w")
    [ "$code" = 200 ] && break
    rm -f "$W/traces/$w"
    sleep 0.1
  done
  if [ -s "$W/traces/$w" ]; then
    TRACE[$w]=$W/traces/$w
    log "recorded the $w trace: $(stat -c %s "$W/traces/$w") bytes"
  else
    log "no trace recorded for $w (no object at $obj: a run that opens no file stores none)"
  fi
  rm -rf "$R"
done

# --- the matrix -------------------------------------------------------------------------------
LOAD_START=$(cut -d' ' -f1-3 /proc/loadavg)
T_START=$(date +%s)
for link in $LINKS; do
  for i in $(seq 1 "$RUNS"); do
    for w in $WORKLOADS; do
      for k in "${!VARIANTS[@]}"; do
        cell "$link" "$i" "$w" "${VARIANTS[$(((k + i - 1) % ${#VARIANTS[@]}))]}"
      done
    done
    if [ "$BIG" = 1 ] && [ "$link" = "${LINKS%% *}" ]; then
      for k in 0 1; do
        v=$([ $(((k + i) % 2)) = 1 ] && echo full || echo lazy)
        case " $BIG_VARIANTS " in *" $v "*) cell "$link" "$i" big "$v" nopoll ;; esac
      done
    fi
  done
done
MINUTES=$((($(date +%s) - T_START + 59) / 60))

# --- the report -------------------------------------------------------------------------------
DAY=$(date -u +%Y-%m-%d)
if [ "$QUICK" = 1 ]; then NAME=$DAY-lazy-quick-$COMMIT
elif [ "$START" = 1 ]; then NAME=$DAY-lazy-start-$COMMIT
elif [ -n "$ONLY_W$ONLY_L" ]; then NAME=$DAY-lazy-$(echo "$WORKLOADS $([ "$BIG" = 0 ] || echo big) $LINKS" | tr -s ' :' '-' | sed 's/-$//')-$COMMIT
else NAME=$DAY-lazy-$COMMIT; fi
OUT=benches/results/$NAME.md
mkdir -p benches/results
cp "$TSV" "benches/results/$NAME.tsv"
# med LINK WORKLOAD VARIANT COLUMN: the median of a column over the runs ("-" if none), and in
# how many runs the layer was not complete when the run ended ("exit") or within the cap.
med() {
  local vals
  vals=$(awk -F'\t' -v l="$1" -v w="$2" -v v="$3" -v c="$4" '
    NR == 1 { for (i = 1; i <= NF; i++) col[$i] = i; next }
    $1 == l && $3 == w && $4 == v && $col[c] ~ /^[0-9]+$/ { print $col[c] }' "$TSV")
  if [ -z "$vals" ]; then printf -- '-'; else lc_median $vals | tr -d '\n'; fi
  awk -F'\t' -v l="$1" -v w="$2" -v v="$3" -v c="$4" '
    NR == 1 { for (i = 1; i <= NF; i++) col[$i] = i; next }
    $1 == l && $3 == w && $4 == v && $col[c] == "exit" { e++ }
    $1 == l && $3 == w && $4 == v && $col[c] == "cap" { k++ }
    END { if (e) printf " (%d× not at exit)", e; if (k) printf " (%d× capped)", k }' "$TSV"
}
# lazies LINK WORKLOAD VARIANT: in how many runs the layer was mounted lazily ("2/5").
lazies() {
  awk -F'\t' -v l="$1" -v w="$2" -v v="$3" '$1 == l && $3 == w && $4 == v { n++; if ($6 == "yes") y++ }
    END { printf "%d/%d", y, n }' "$TSV"
}
mib() { awk -v b="$1" 'BEGIN { if (b == "-") print "-"; else printf "%.1f", b / 1048576 }'; }
{
  echo "# Lazy remote layers over a modelled link ($(date -u +%Y-%m-%dT%H:%MZ), commit $COMMIT)"
  echo
  [ -z "$LAZY_NOTE" ] || { echo "$LAZY_NOTE"; echo; }
  echo "Binary: $BUILT at $COMMIT$DIRTY.$CMP_NOTE Machine: $(nproc) cores, load average before the"
  echo "matrix: $LOAD_START, at the end: $(cut -d' ' -f1-3 /proc/loadavg); the matrix took $MINUTES min."
  echo "Remote: SeaweedFS on loopback behind scripts/linkproxy.py (one token bucket shared by all"
  echo "connections, a second of the same rate for uploads, the delay added to each response's first"
  echo "byte). Every cell is a \`layercache run\` on an empty store; times are ms from its start,"
  echo "medians of $RUNS run(s); \`layer complete\` is when \`layercache ls --json\` first listed the key"
  echo "as a complete local layer (polled every 100 ms, capped at $CAP_S s; a lazy run publishes the layer"
  echo "at its end only if every object arrived while it lasted: \"not at exit\" counts the runs where"
  echo "it had not); MiB and GETs went through the link. \`mounted lazily\`: runs whose --json event"
  echo "had remote_lazy."
  echo
  echo "Layers:"
  for w in $WORKLOADS $([ "$BIG" = 0 ] || echo big); do
    [ "$w" = ls ] && continue
    echo "* $w: $(mib "${LBYTES[$w]}") MiB in ${LFILES[$w]} files; COMMAND \`${CMD[$w]}\`; trace for lazy+trace: $([ -n "${TRACE[$w]:-}" ] && echo "$(stat -c %s "${TRACE[$w]}") bytes" || echo none recorded)"
  done
  [[ " $WORKLOADS " != *" ls "* ]] || echo "* ls: the npm layer; COMMAND \`${CMD[ls]}\`; trace for lazy+trace: $([ -n "${TRACE[ls]:-}" ] && echo "$(stat -c %s "${TRACE[ls]}") bytes" || echo none recorded)"
  for link in $LINKS; do
    echo
    echo "## ${link%%:*} Mbit/s, ${link##*:} ms"
    echo
    echo "Measured before the matrix: the link delivered ${LINK_MEASURED[$link]} Mbit/s to two parallel GETs of 32 MiB."
    echo
    echo "| workload | variant | mounted lazily | mount | COMMAND start | COMMAND end | layer complete | MiB via link | GETs |"
    echo "|---|---|---|---:|---:|---:|---:|---:|---:|"
    for w in $WORKLOADS; do
      for v in "${VARIANTS[@]}"; do
        echo "| $w | $v | $(lazies "$link" "$w" "$v") | $(med "$link" "$w" "$v" mount_ms) |" \
          "$(med "$link" "$w" "$v" start_ms) | $(med "$link" "$w" "$v" end_ms) |" \
          "$(med "$link" "$w" "$v" complete_ms) | $(mib "$(med "$link" "$w" "$v" bytes)") |" \
          "$(med "$link" "$w" "$v" gets) |"
      done
    done
    echo
    echo "What each run said at its end (the last iteration; full runs only when they failed):"
    echo
    for w in $WORKLOADS; do
      [ -z "${NOTES["$link|$w|full"]:-}" ] || echo "    $w full: ${NOTES["$link|$w|full"]}"
      for v in "${VARIANTS[@]}"; do
        [ "$v" = full ] && continue
        echo "    $w $v: ${NOTES["$link|$w|$v"]:-(nothing: not mounted lazily)}"
      done
    done
    if [ "$BIG" = 1 ] && [ "$link" = "${LINKS%% *}" ]; then
      echo
      echo "Ten times the npm layer ($(mib "${LBYTES[big]}") MiB in ${LFILES[big]} files), COMMAND \`true\`:"
      echo
      echo "| variant | mounted lazily | mount | COMMAND start | MiB via link | GETs |"
      echo "|---|---|---:|---:|---:|---:|"
      for v in full lazy; do
        echo "| $v | $(lazies "$link" big "$v") | $(med "$link" big "$v" mount_ms) |" \
          "$(med "$link" big "$v" start_ms) | $(mib "$(med "$link" big "$v" bytes)") |" \
          "$(med "$link" big "$v" gets) |"
      done
    fi
  done
  echo
  echo "Every sample: $NAME.tsv (ms from the run's start; bytes through the link)."
} | tee "$OUT"
log "wrote $OUT"
[ "$FAILED" = 0 ] || { log "some cells failed (rc column of the .tsv)"; exit 1; }
