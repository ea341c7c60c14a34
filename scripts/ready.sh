#!/usr/bin/env bash
# Time-to-ready for the fixtures in examples/: how long until a run's command can start, with
#   no cache       the setup run directly in a fresh project (what every run pays today);
#   layercache miss `layercache run` on an empty store: mount + setup + promote;
#   layercache restore  after one package is added to the lockfile (BUMP below): mount of the
#                  previous layer + the preset's restore setup (an incremental install over the
#                  restored tree, issue 11) + promote, with the share of the tree stored as
#                  new objects; after each run its key is unpublished and gc removes its layer
#                  and objects, so every run restores from the same store;
#   layercache hit  `layercache run` again: mount + maintenance;
#   tar restore    actions/cache style: extract a tar.zst of the same installed tree (the
#                  archive is local and in the page cache: the download actions/cache adds is
#                  not counted).
#
#   bash scripts/ready.sh [--quick] [--runs-miss N] [--runs-hit N]
#                         [--fixtures npm,pnpm,yarn,pip,uv,go,cargo] [--worktree] [--no-build]
#
# Presets: npm, pnpm, yarn → node_modules (npm ci / pnpm / yarn install, mounted at
# <workdir>/node_modules), pip → venv (<workdir>/.venv), uv → uv (UV_CACHE_DIR; setup and
# maintenance `uv sync` make .venv), go → go (GOMODCACHE/GOCACHE, from a file:// GOPROXY that
# scripts/goproxy.py builds; the restore adds go-cmp, which the proxy holds too), cargo →
# cargo-target (CARGO_TARGET_DIR, setup `cargo build`). "Ready" is the
# moment the command given after `--` starts (it writes a timestamp, then checks that the
# dependencies load from the cache). Package managers' own download caches are warm (npm: the
# bench's npm cache, pip: ~/.cache/pip, cargo: ~/.cargo), so no cell measures the network.
# Medians of 3 runs for no-cache and miss, 5 for hit and restore (--quick: 1 and 3).
set -euo pipefail
# shellcheck source=scripts/lib-bench.sh
. "$(dirname "$0")/lib-bench.sh"

RUNS_MISS=3 RUNS_HIT=5 FIXTURES=(npm pnpm yarn pip uv go cargo) BUILD=1 BUILD_FROM="" QUICK=""
while [ $# -gt 0 ]; do
  case $1 in
    --quick) QUICK=1 RUNS_MISS=1 RUNS_HIT=3 ;;
    --runs-miss) RUNS_MISS=$2; shift ;;
    --runs-hit) RUNS_HIT=$2; shift ;;
    --fixtures) IFS=, read -r -a FIXTURES <<<"$2"; shift ;;
    --worktree) BUILD_FROM=--worktree ;;
    --no-build) BUILD="" ;;
    -h | --help) sed -n '2,27p' "$0"; exit 0 ;;
    *) die "unknown argument $1 (see --help)" ;;
  esac
  shift
done

lc_init ready.sh
# The fixtures are the repository's own (examples/) unless LAYERCACHE_FIXTURES names others.
[ -n "${LAYERCACHE_FIXTURES:-}" ] || LC_FIXTURES=$LC_REPO/examples
lc_need fusermount3:fuse3 node:nodejs npm:npm python3:python3 cargo:cargo zstd:zstd
B=$LC_BENCH_DIR
RB=$B/ready
mkdir -p "$RB" "$B/results" "$LC_NPM_CACHE"
export npm_config_cache=$LC_NPM_CACHE
unset CARGO_TARGET_DIR VIRTUAL_ENV || true
# pnpm, yarn and uv as scripts/lib-fixtures.sh installs them for the tests; Go modules from a
# local file:// proxy (no module proxy is reachable here).
export PATH=/var/cache/layercache-test/tools/bin:$PATH UV_PYTHON_DOWNLOADS=never
GOPROXY_DIR=$B/goproxy
if [[ " ${FIXTURES[*]} " == *" go "* ]]; then
  rm -rf "$GOPROXY_DIR" && python3 "$(dirname "$0")/goproxy.py" "$GOPROXY_DIR" >/dev/null
  export GOPROXY=file://$GOPROXY_DIR GOSUMDB=off GOFLAGS="" GOTOOLCHAIN=local
fi

LC_STATUS="ok"
if [ -n "$BUILD" ] && ! lc_build $BUILD_FROM; then
  LC_STATUS="release build failed ($(grep -m1 -E '^error' "$B/build.log" || echo "see $B/build.log"))"
elif [ ! -x "$LC_BIN" ]; then
  LC_STATUS="no binary at $LC_BIN"
fi
[ -n "$LC_COMMIT" ] || LC_COMMIT=$(lc_prebuilt_commit)
log "layercache: $LC_STATUS ($LC_COMMIT)"

declare -A RES=() NOTE=() SIZE=()
LAST_KEY=-

# fixture NAME: sets DEP (the installed tree, relative to the workdir), PRESET, SETUP (the native
# equivalent of the preset's setup), CHECK (proves the tree works, run from the workdir) and
# BUMP (adds one small package to the key files; run in a scratch copy without the installed
# tree, whose key files are then copied back; empty: no restore row).
fixture() {
  local node="node -e \"require('react'); require('express'); require('chalk')\""
  case $1 in
    npm) DEP=node_modules PRESET=node_modules SETUP="npm ci --no-audit --no-fund --loglevel=error"
      CHECK="node -e \"require('react'); require('express')\""
      BUMP="npm install dayjs@1.11.13 --package-lock-only --no-audit --no-fund --loglevel=error" ;;
    pnpm) DEP=node_modules PRESET=node_modules SETUP="pnpm install --frozen-lockfile --reporter silent"
      CHECK=$node
      BUMP="pnpm add dayjs@1.11.13 --lockfile-only --reporter silent" ;;
    yarn) DEP=node_modules PRESET=node_modules SETUP="yarn install --frozen-lockfile --silent"
      CHECK=$node BUMP="yarn add dayjs@1.11.13 --silent" ;;
    pip) DEP=.venv PRESET=venv SETUP="python3 -m venv .venv && .venv/bin/pip install -q -r requirements.txt"
      CHECK=".venv/bin/python -c 'import flask, pydantic, requests'"
      BUMP="echo six==1.16.0 >>requirements.txt" ;;
    uv) DEP=.venv PRESET=uv SETUP="uv sync --frozen -q"
      CHECK=".venv/bin/python -c 'import requests, attrs'" BUMP="uv add -q six==1.16.0" ;;
    go) DEP=gomod PRESET=go SETUP="GOMODCACHE=\$PWD/gomod go mod download"
      CHECK="GOMODCACHE=\${GOMODCACHE:-\$PWD/gomod} GOFLAGS=-mod=mod GOPROXY=off go build -o /dev/null ."
      BUMP="go get github.com/google/go-cmp@v0.5.9" ;;
    cargo) DEP=target PRESET=cargo-target SETUP="CARGO_TARGET_DIR=target cargo build -q"
      CHECK="cargo build -q --offline" BUMP="cargo add -q itoa@1.0.11" ;;
    *) die "unknown fixture $1 (npm, pnpm, yarn, pip, uv, go, cargo)" ;;
  esac
}

# bump R: applies BUMP to the key files of R/work (in a scratch copy, so the installed tree is
# not touched).
bump() {
  local s=$1/bump
  rm -rf "$s" && mkdir -p "$s"
  (cd "$1/work" && find . -maxdepth 1 -type f -exec cp {} "$s/" \;) && cp -r "$1/work/src" "$s/" 2>/dev/null || true
  (cd "$s" && eval "$BUMP" >/dev/null 2>&1) || return 1
  (cd "$s" && find . -maxdepth 1 -type f -newer "$1/spec.toml" -exec cp {} "$1/work/" \;)
}

# unpublish F R KEY: takes the restore's key back (its key file; keys are immutable for users,
# this is the bench resetting its own store) and lets gc remove the now unpublished layer and
# its objects, so the next restore run starts from the same store.
unpublish() {
  rm -f "$2/store/v1/projects/bench-ready-$1/caches/$1/keys/$3" "$2/store/v1/projects/bench-ready-$1/caches/$1/inputs/$3.json"
  "$LC_BIN" --store "$2/store" gc >/dev/null 2>&1 || NOTE["$1 restore gc"]="gc after unpublishing $3 failed"
}

# time_cmd KEY CMD…: wall time of CMD (µs) into RES[KEY]; returns CMD's status.
time_cmd() {
  local key=$1 t0 t1 rc=0
  shift
  t0=${EPOCHREALTIME/./}
  "$@" || rc=$?
  t1=${EPOCHREALTIME/./}
  [ "$rc" -ne 0 ] || RES[$key]+="$((10#$t1 - 10#$t0)) "
  return "$rc"
}

# lc_run_once F KIND: one `layercache run` (KIND is miss or hit); records time-to-ready (the
# command's start) and the total, checks the reported result.
lc_run_once() {
  local f=$1 kind=$2 r=$RB/$1 t0 t1 ready rc=0 result res setup_ms promote_ms mount_ms bytes new_bytes
  rm -f "$r/stamp"
  t0=${EPOCHREALTIME/./}
  # shellcheck disable=SC2016 # $0 and $CHECK belong to the inner sh
  (cd "$r/work" && CHECK=$CHECK timeout 1800 "$LC_BIN" --store "$r/store" --json run --spec "$r/spec.toml" \
    --workdir "$r/work" --mount-root "$r/mnt" -- sh -c 'date +%s%6N >"$0" && eval "$CHECK" >/dev/null' "$r/stamp") \
    >"$r/run.out" 2>"$r/run.err" || rc=$?
  t1=${EPOCHREALTIME/./}
  lc_cleanup_under "$r"
  if [ ! -s "$r/stamp" ]; then
    NOTE["$f $kind"]="layercache run failed (exit $rc): $(grep -v '^{' "$r/run.err" | head -c 300 | head -1)"
    return 1
  fi
  ready=$(cat "$r/stamp")
  RES["$f lc-$kind"]+="$((10#$ready - 10#$t0)) "
  RES["$f lc-$kind-total"]+="$((10#$t1 - 10#$t0)) "
  [ "$rc" -eq 0 ] || NOTE["$f $kind check"]="the command's dependency check failed through the mount (exit $rc): $CHECK"
  result=$(python3 -c '
import json, sys
# the --json summary is on stdout, first; older builds wrote it to stderr
for line in (l for f in sys.argv[1:] for l in open(f)):
    try: v = json.loads(line)
    except ValueError: continue
    for c in v.get("caches", []):
        print(c.get("result"), c.get("setup_ms", 0), c.get("promote_ms", 0), c.get("mount_ms", 0),
              c.get("bytes", 0), c.get("new_bytes", 0), c.get("key", "-"))
' "$r/run.out" "$r/run.err" 2>/dev/null | head -1)
  if [ -z "$result" ]; then NOTE["$f $kind json"]="no JSON summary on stdout or stderr"
  else
    read -r res setup_ms promote_ms mount_ms bytes new_bytes LAST_KEY <<<"$result"
    [ "$res" = "$kind" ] || NOTE["$f $kind result"]="expected $kind, layercache reported $res"
    RES["$f lc-$kind-promote"]+="$((promote_ms * 1000)) "
    RES["$f lc-$kind-mount"]+="$((mount_ms * 1000)) "
    [ "$kind" = hit ] || RES["$f lc-$kind-setup"]+="$((setup_ms * 1000)) "
    [ "$kind" != restore ] || [ "$bytes" -eq 0 ] ||
      SIZE["$f new"]=$(awk -v n="$new_bytes" -v b="$bytes" 'BEGIN { printf "%.1f %%", 100 * n / b }')
  fi
}

# Mounts a `layercache run` left behind (it should leave none): unmount them, and say so.
lc_cleanup_under() {
  local m left
  mapfile -t left < <(awk -v p="$1/" 'index($2, p) == 1 { print $2 }' /proc/mounts)
  for m in "${left[@]}"; do
    NOTE["left-behind $m"]="layercache run left $m mounted"
    LC_MOUNTS+=("$m"); lc_umount "$m"
  done
}

for f in "${FIXTURES[@]}"; do
  fixture "$f"
  src=$LC_FIXTURES/$f-app r=$RB/$f
  [ -d "$src" ] || die "fixture $src is missing"
  log "$f: preparing $r"
  rm -rf "$r" && mkdir -p "$r/mnt"
  cp -a "$src" "$r/work" && chmod -R u+w "$r/work" && rm -f "$r/work/layercache.toml"
  printf 'project = "bench-ready-%s"\n\n[[cache]]\nid = "%s"\npreset = "%s"\n' "$f" "$f" "$PRESET" >"$r/spec.toml"

  # no cache: the setup, natively (the last one's tree makes the archive)
  for i in $(seq "$RUNS_MISS"); do
    rm -rf "${r:?}/work/$DEP"
    log "$f: no-cache setup $i/$RUNS_MISS"
    time_cmd "$f native" bash -c "cd '$r/work' && $SETUP >/dev/null" \
      || NOTE["$f native"]="setup failed: $SETUP"
  done
  # actions/cache-style: tar + zstd of the installed tree, restored into an empty project
  if [ -e "$r/work/$DEP" ]; then
    tar --posix -C "$r/work" -cf - "$DEP" | zstd -q -T0 -3 -o "$r/cache.tar.zst"
    SIZE[$f]=$(du -sh "$r/work/$DEP" | cut -f1)/$(du -h "$r/cache.tar.zst" | cut -f1)
    for i in $(seq "$RUNS_HIT"); do
      rm -rf "${r:?}/work/$DEP"
      time_cmd "$f tar" bash -c "zstd -q -d -c '$r/cache.tar.zst' | tar -C '$r/work' -xf -" \
        || NOTE["$f tar"]="restore failed"
    done
    (cd "$r/work" && eval "$CHECK" >/dev/null 2>&1) || NOTE["$f tar check"]="restored tree failed: $CHECK"
  fi
  rm -rf "${r:?}/work/$DEP" "${r:?}/work/target" "${r:?}/work/.venv"

  # layercache: misses on an empty store, then hits on the last one's layer
  if [ "$LC_STATUS" = ok ]; then
    for i in $(seq "$RUNS_MISS"); do
      rm -rf "$r/store"
      log "$f: layercache miss $i/$RUNS_MISS"
      lc_run_once "$f" miss || break
    done
    if [ -n "${RES["$f lc-miss"]:-}" ]; then
      for i in $(seq "$RUNS_HIT"); do
        log "$f: layercache hit $i/$RUNS_HIT"
        lc_run_once "$f" hit || break
      done
      if [ -n "$BUMP" ]; then
        log "$f: one package more ($BUMP), layercache restore"
        if bump "$r"; then
          for i in $(seq "$RUNS_HIT"); do
            log "$f: layercache restore $i/$RUNS_HIT"
            lc_run_once "$f" restore || break
            [ "$i" -eq "$RUNS_HIT" ] || unpublish "$f" "$r" "$LAST_KEY"
          done
        else NOTE["$f restore"]="the lockfile change failed: $BUMP"; fi
      fi
    fi
  fi
done

# --- the report ------------------------------------------------------------------------------
med() { if [ -n "${RES[$1]:-}" ]; then
  # shellcheck disable=SC2086
  lc_median ${RES[$1]}; fi; }
fmt() { local m; m=$(med "$1"); if [ -n "$m" ]; then lc_fmt_us "$m"; else echo "—"; fi; }
speedup() { local a b; a=$(med "$1") b=$(med "$2"); if [ -n "$a" ] && [ -n "$b" ]; then
  awk -v a="$a" -v b="$b" 'BEGIN { printf "%.1f×", a / b }'; else echo "—"; fi; }
ratio() { local a b; a=$(med "$1") b=$(med "$2"); if [ -n "$a" ] && [ -n "$b" ]; then
  awk -v a="$a" -v b="$b" 'BEGIN { printf "%.2f", a / b }'; else echo "—"; fi; }
STAMP=$(date +%Y%m%d-%H%M%S)
OUT=$B/results/ready-$STAMP${QUICK:+-quick}.md
{
  echo "# time-to-ready $STAMP${QUICK:+ (quick)}"
  echo
  lc_machine
  echo "       python $(python3 --version 2>&1 | cut -d' ' -f2), $(cargo --version)"
  echo "layercache: $LC_STATUS"
  echo "medians: no cache and miss of $RUNS_MISS runs, hit, layercache restore and tar restore of $RUNS_HIT runs; download caches warm"
  echo
  echo "| fixture | no cache (setup) | layercache miss (setup + promote) | layercache restore (+1 package) | layercache hit | tar.zst restore | restore vs miss | new bytes of restore | hit vs miss | hit vs no cache | hit vs tar restore | tree/archive |"
  echo "|---|---|---|---|---|---|---|---|---|---|---|---|"
  for f in "${FIXTURES[@]}"; do
    echo "| $f | $(fmt "$f native") | $(fmt "$f lc-miss") | $(fmt "$f lc-restore") | $(fmt "$f lc-hit") | $(fmt "$f tar") | $(ratio "$f lc-restore" "$f lc-miss") | ${SIZE["$f new"]:-—} | $(speedup "$f lc-miss" "$f lc-hit") | $(speedup "$f native" "$f lc-hit") | $(speedup "$f tar" "$f lc-hit") | ${SIZE[$f]:-—} |"
  done
  if [ -n "$(for k in "${!RES[@]}"; do [[ $k == *lc-miss-setup ]] && echo y; done)" ]; then
    echo
    echo "as reported by layercache (--json): miss = mount + setup + promote; hit = mount"
    echo
    echo "| fixture | miss: mount | miss: setup | miss: promote | miss: total incl. unmount | restore: setup | restore: promote | hit: mount | hit: total incl. unmount |"
    echo "|---|---|---|---|---|---|---|---|---|"
    for f in "${FIXTURES[@]}"; do
      echo "| $f | $(fmt "$f lc-miss-mount") | $(fmt "$f lc-miss-setup") | $(fmt "$f lc-miss-promote") | $(fmt "$f lc-miss-total") | $(fmt "$f lc-restore-setup") | $(fmt "$f lc-restore-promote") | $(fmt "$f lc-hit-mount") | $(fmt "$f lc-hit-total") |"
    done
  fi
  if [ ${#NOTE[@]} -gt 0 ]; then
    echo
    echo "notes:"
    for k in "${!NOTE[@]}"; do echo "- $k: ${NOTE[$k]}"; done | sort
  fi
} | tee "$OUT"
for k in "${!RES[@]}"; do printf '%s\t%s\n' "$k" "${RES[$k]}"; done | sort >"${OUT%.md}.tsv"
log "report: $OUT"
