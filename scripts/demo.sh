#!/usr/bin/env bash
# The demo: builds layercache and runs the main job twice on the bundled npm project
# (examples/npm-app, node_modules preset) against a temporary store and mount root:
#   run 1 = miss -> `npm ci` -> promote,   run 2 = hit (nothing installed)
# then prints both preparation times and both runs' whole times. Cleans up its mounts and temp
# dirs.
set -euo pipefail
cd "$(dirname "$0")/.."
repo=$PWD

command -v cargo >/dev/null 2>&1 || {
  echo "demo.sh: cargo is missing: install a Rust toolchain with rustup" >&2
  exit 2
}
need=()
command -v cc >/dev/null 2>&1 || need+=(gcc) # cargo's linker; rustup brings none
command -v fusermount3 >/dev/null 2>&1 || need+=(fuse3)
command -v node >/dev/null 2>&1 || need+=(nodejs)
command -v npm >/dev/null 2>&1 || need+=(npm)
if [ ${#need[@]} -gt 0 ]; then
  if [ "$(id -u)" -ne 0 ]; then
    echo "demo.sh: missing ${need[*]}; run as root so they can be installed with apt-get" >&2
    exit 2
  fi
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need[@]}" >/dev/null
fi
[ -e /dev/fuse ] || { echo "demo.sh: /dev/fuse is missing" >&2; exit 2; }

# A debug build: the first one compiles every dependency (10-14 minutes on a 2-core machine),
# later ones take seconds. cargo's own progress lines show what it is doing meanwhile.
# cargo builds into CARGO_TARGET_DIR when it is set (relative to the repository), else target/.
target=${CARGO_TARGET_DIR:-target}
case $target in /*) ;; *) target=$repo/$target ;; esac
bin=$target/debug/layercache
if [ -x "$bin" ]; then
  echo "== building layercache (cargo build: seconds when little changed)"
else
  echo "== building layercache (cargo build, the first time: ~10-14 min on 2 cores; progress below)"
fi
cargo build

tmp=$(mktemp -d /tmp/layercache-demo.XXXXXX)
cleanup() {
  # Unmount anything of ours still mounted (deepest first), then remove the temp dir.
  set +e
  grep -F " $tmp/" /proc/mounts | awk '{print $2}' | sort -r | while read -r mp; do
    "$bin" umount "$mp" 2>/dev/null || fusermount3 -u -z "$mp" 2>/dev/null || umount -l "$mp" || true
  done
  rm -rf "$tmp"
}
trap cleanup EXIT INT TERM

mkdir -p "$tmp/store" "$tmp/cache" "$tmp/work"
cp examples/npm-app/package.json examples/npm-app/package-lock.json \
   examples/npm-app/layercache.toml "$tmp/work/"
export LAYERCACHE_STORE=$tmp/store

check='node -e "require(\"react\"); require(\"express\"); require(\"lodash\"); console.log(\"react\", require(\"react/package.json\").version, \"loads from the mounted node_modules\")"'
# Each run's whole time, launch to exit (preparation, the node check, unmount), in µs.
walls=()
for i in 1 2; do
  echo "== run $i: layercache run --spec layercache.toml -- node -e 'require(\"react\")…'"
  t0=$EPOCHREALTIME
  "$bin" run --spec "$tmp/work/layercache.toml" --workdir "$tmp/work" \
    --mount-root "$tmp/cache" -- sh -c "$check"
  t1=$EPOCHREALTIME
  walls+=($((10#${t1/./} - 10#${t0/./})))
done

echo "== results (from $LAYERCACHE_STORE/events.jsonl)"
node -e '
const fs = require("fs");
const ev = fs.readFileSync(process.argv[1], "utf8").trim().split("\n").map(JSON.parse);
const prep = e => e.mount_ms + e.setup_ms + e.maintenance_ms + e.promote_ms;
const [a, b] = ev;
const [wa, wb] = process.argv.slice(2).map(Number).map(us => us / 1e6);
// A run that finds the mount the run before it left idle adopts it ("warm"): its mount is a
// hand-over of a few ms or less, so its preparation can read 0 ms.
const how = b.warm ? "adopted the mount run 1 left idle (warm)" : "mounted the layer";
console.log(`run 1: ${a.result}, preparation ${(prep(a) / 1000).toFixed(2)} s (setup ${(a.setup_ms / 1000).toFixed(1)} s, promote ${(a.promote_ms / 1000).toFixed(2)} s, ${a.files} files); the whole run ${wa.toFixed(2)} s`);
console.log(`run 2: ${b.result}, preparation ${prep(b)} ms (${how}, nothing installed); the whole run ${wb.toFixed(2)} s`);
console.log(`the whole second run was ${(wa / wb).toFixed(0)}x faster than the first (its node check included)`);
if (a.result !== "miss" || b.result !== "hit") { console.error("unexpected results"); process.exit(1); }
' "$LAYERCACHE_STORE/events.jsonl" "${walls[@]}"
"$bin" stats
