#!/usr/bin/env bash
# Remote-tier benchmark (issue 14): the npm fixture's node_modules layer (~114 MiB, ~10k files)
# over loopback through a real S3 server (SeaweedFS, scripts/seaweedfs.sh):
#   1. store A fills it (`layercache run`, a miss: npm ci) and pushes it;
#   2. pull into an empty store, RUNS times: wall time of `layercache remote pull` (targets: <= 3 s)
#      next to a tar restore of the same tree (`tar -xf` of the layer tree, the baseline the issue
#      names) in the same iteration, and a `layercache run` on an empty store until its COMMAND
#      starts (time to ready); the pull's phases (LAYERCACHE_LOG=info) of the last iteration;
#   3. a second version sharing 95 % of the objects (every 20th file changed, committed on top of
#      the first as a restore) pulled into a store that has the first: bytes pulled / layer bytes
#      (target: <= 10 %).
# Writes benches/results/<date>-remote-<commit>.md (and prints it).
#
#   bash scripts/bench-remote.sh [--runs N] [--bin PATH]     (root; default binary: a release
#                                                             build of this checkout)
set -euo pipefail
cd "$(dirname "$0")/.."
REPO=$PWD
RUNS=3 BIN=${LAYERCACHE_BIN:-}
while [ $# -gt 0 ]; do
  case $1 in
    --runs) RUNS=$2; shift ;;
    --bin) BIN=$2; shift ;;
    -h | --help) sed -n '2,14p' "$0"; exit 0 ;;
    *) echo "bench-remote.sh: unknown argument $1" >&2; exit 2 ;;
  esac
  shift
done
[ "$(id -u)" -eq 0 ] || { echo "bench-remote.sh: run as root (runs mount overlays)" >&2; exit 2; }
if [ -z "$BIN" ]; then
  cargo build --release --quiet --bin layercache
  BIN=$REPO/target/release/layercache
fi
log() { printf '[%s] %s\n' "$(date +%H:%M:%S)" "$*" >&2; }
now_ms() { local t=${EPOCHREALTIME/./}; echo $(( 10#$t / 1000 )); }

W=$(mktemp -d /var/tmp/lc-bench-remote.XXXXXX)
cleanup() {
  for m in $(awk -v w="$W" 'index($2, w) == 1 {print $2}' /proc/mounts | sort -r); do
    "$BIN" umount "$m" >/dev/null 2>&1 || umount -l "$m" || true
  done
  bash scripts/seaweedfs.sh stop "$W/weed" || true
  rm -rf "$W"
}
trap cleanup EXIT
mkdir -p "$W/weed"
log "starting SeaweedFS"
bash scripts/seaweedfs.sh start "$W/weed" >/dev/null
set -a; . "$W/weed/env"; set +a
URL="s3://$S3_BUCKET/bench"

store() {  # store NAME: a store dir with [remote] pointing at the server
  mkdir -p "$W/$1/v1"
  printf '[remote]\nendpoint = "%s"\nallow_http = true\n' "$S3_ENDPOINT" >"$W/$1/v1/config.toml"
  echo "$W/$1"
}
lc() { local s=$1; shift; "$BIN" --store "$s" --remote "$URL" "$@"; }

mkdir -p "$W/work" "$W/cache"
cp examples/npm-app/package.json examples/npm-app/package-lock.json "$W/work/"
printf 'project = "bench"\n[[cache]]\nid = "node_modules"\npreset = "node_modules"\n' >"$W/spec.toml"
run_in() {  # run_in STORE COMMAND…: layercache run of the fixture
  local s=$1; shift
  lc "$s" --json run --spec "$W/spec.toml" --workdir "$W/work" --mount-root "$W/cache" -- "$@"
}

A=$(store a)
log "store A: npm ci (a miss) and push"
run_in "$A" true 2>"$W/a.log" || { tail -20 "$W/a.log"; exit 1; }
PUSH=$(grep -m1 'pushed key' "$W/a.log" || true)
log "A: $PUSH"
KEY=$(ls "$A/v1/projects/bench/caches/node_modules/keys/")
LAYER_BYTES=$(grep -o '"bytes":[0-9]*' "$A/events.jsonl" | head -1 | cut -d: -f2)
FILES=$(grep -o '"files":[0-9]*' "$A/events.jsonl" | head -1 | cut -d: -f2)

# The tar baseline: the same tree as one archive on local disk, extracted without fsync.
LAYER_DIR=$(ls -d "$A"/v1/projects/bench/layers/*/ | head -1)
tar -C "$LAYER_DIR/tree" -cf "$W/layer.tar" .
LOAD_START=$(cut -d' ' -f1-3 /proc/loadavg)
pulls=() readies=() tars=()
for i in $(seq 1 "$RUNS"); do
  B=$(store "b$i")
  sync
  t0=$(now_ms)
  out=$(LAYERCACHE_LOG=layercache::remote::pull=info lc "$B" --json remote pull --project bench \
    --cache node_modules "$KEY" 2>"$W/pull$i.log")
  t1=$(now_ms)
  pulls+=($((t1 - t0)))
  PULLED_BYTES=$(echo "$out" | grep -o '"pulled_bytes":[0-9]*' | cut -d: -f2)
  log "pull $i into an empty store: $((t1 - t0)) ms, $PULLED_BYTES bytes"
  mkdir "$W/tar$i"
  sync
  t0=$(now_ms)
  tar -C "$W/tar$i" -xf "$W/layer.tar"
  t1=$(now_ms)
  tars+=($((t1 - t0)))
  log "tar restore $i: $((t1 - t0)) ms"
  R=$(store "r$i")
  sync
  t0=$(now_ms)
  run_in "$R" sh -c "date +%s%3N > $W/ready$i" 2>"$W/r$i.log" || { tail -20 "$W/r$i.log"; exit 1; }
  readies+=($(( $(cat "$W/ready$i") - t0 )))
  log "run $i on an empty store: COMMAND started after ${readies[-1]} ms"
done
median() { printf '%s\n' "$@" | sort -n | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}'; }

# Version 2: every 20th regular file changed, on top of version 1.
log "version 2: 5 % of the files changed, committed on top of version 1, pushed"
M=$W/mnt2; mkdir -p "$M"
lc "$A" mount --project bench --cache node_modules --key "$KEY-v2" --restore-key "$KEY" "$M" >/dev/null
find "$M" -type f | sort | awk 'NR % 20 == 0' | while read -r f; do printf 'x' >>"$f"; done
lc "$A" commit "$M" >/dev/null 2>"$W/v2.log"
lc "$A" umount "$M"
PUSH2=$(grep -m1 'pushed key' "$W/v2.log" || true)
log "A: $PUSH2"
out=$(lc "$W/b1" --json remote pull --project bench --cache node_modules "$KEY-v2")
V2_PULLED=$(echo "$out" | grep -o '"pulled_bytes":[0-9]*' | cut -d: -f2)
V2_OBJECTS=$(echo "$out" | grep -o '"pulled_objects":[0-9]*' | cut -d: -f2)
V2_TOTAL=$(echo "$out" | grep -o '"objects":[0-9]*' | cut -d: -f2)
PCT=$(awk -v a="$V2_PULLED" -v b="$LAYER_BYTES" 'BEGIN {printf "%.1f", 100 * a / b}')

COMMIT=$(git -C "$REPO" rev-parse --short HEAD)
OUT=benches/results/$(date -u +%Y-%m-%d)-remote-$COMMIT.md
mkdir -p benches/results
{
  echo "# Remote tier over loopback SeaweedFS ($(date -u +%Y-%m-%dT%H:%MZ), commit $COMMIT)"
  echo
  echo "Machine: $(nproc) cores, load average before the pulls: $LOAD_START, at the end: $(cut -d' ' -f1-3 /proc/loadavg)."
  echo "Layer: npm fixture node_modules, $LAYER_BYTES bytes in $FILES files."
  echo
  echo "| what | result | target |"
  echo "|---|---|---|"
  echo "| \`remote pull\` into an empty store (median of $RUNS: ${pulls[*]} ms) | $(median "${pulls[@]}") ms | <= 3000 ms |"
  echo "| tar restore of the same tree, same iterations (median of $RUNS: ${tars[*]} ms) | $(median "${tars[@]}") ms | |"
  echo "| pull / tar restore (medians) | $(awk -v a="$(median "${pulls[@]}")" -v b="$(median "${tars[@]}")" 'BEGIN {printf "%.2f", a / b}') | |"
  echo "| \`run\` on an empty store until COMMAND starts (median of $RUNS: ${readies[*]} ms) | $(median "${readies[@]}") ms | |"
  echo "| version sharing 95 % of files: bytes pulled / layer bytes | $PCT % ($V2_PULLED of $LAYER_BYTES bytes, $V2_OBJECTS of $V2_TOTAL objects) | <= 10 % |"
  echo
  echo "Phases of each pull (ms, from its log: manifest fetched, planned, downloaded + objects"
  echo "in place + files linked, tree finished, published = manifest + syncfs + rename + key):"
  echo
  for i in $(seq 1 "$RUNS"); do
    echo "    pull $i: $(sed -n 's/.*remote::pull: pull: \([a-z]*\).* ms=\([0-9]*\).*/\1 \2/p' "$W/pull$i.log" | tr '\n' ' ')"
  done
  echo
  echo "Push of version 1: $PUSH"
  echo
  echo "Push of version 2: $PUSH2"
} | tee "$OUT"
log "wrote $OUT"
