#!/usr/bin/env bash
# Speed of concurrent runs (issue 10): how long a hit takes to be ready per cache (mount_ms of the
# --json summary), and how long 8 runs that all hit take together, each in its own workdir.
# Targets: a hit under 20 ms to ready per cache; 8 concurrent hits under 0.5 s wall clock.
# Needs root and /dev/fuse; builds the release binary. Usage: bash scripts/bench-runs.sh [ROUNDS]
set -euo pipefail
cd "$(dirname "$0")/.."
rounds=${1:-5}
cargo build --release --quiet
bin=$PWD/target/release/layercache
dir=$(mktemp -d /tmp/layercache-bench-runs.XXXXXX)
trap 'rm -rf "$dir"' EXIT
mkdir -p "$dir/cache"
cat > "$dir/spec.toml" <<'EOF'
project = "bench"
[[cache]]
id = "deps"
key_files = ["deps.lock"]
relocatable = true
setup = "mkdir -p {mount}/pkg && for i in $(seq 1 200); do echo $i > {mount}/pkg/f$i; done"
[[cache]]
id = "nm"
preset = "node_modules"
key_files = ["deps.lock"]
setup = "echo x > {mount}/x"
EOF
for i in $(seq 0 8); do
  mkdir -p "$dir/ws-$i"
  echo "a=1" > "$dir/ws-$i/deps.lock"
done
run() { # run WORKDIR: one run, --json summary on stdout
  "$bin" --store "$dir/store" --json run --spec "$dir/spec.toml" --workdir "$1" \
    --mount-root "$dir/cache" -- true
}
run "$dir/ws-8" >/dev/null 2>&1 # the fill
ms_of() { python3 -c 'import json,sys; print(" ".join(str(c["mount_ms"]) for c in json.loads(sys.stdin.readline())["caches"]))'; }
echo "one hit at a time (mount_ms per cache, ms):"
for r in $(seq 1 "$rounds"); do
  printf '  %s\n' "$(run "$dir/ws-0" 2>/dev/null | ms_of)"
done
echo "8 concurrent hits (wall clock):"
for r in $(seq 1 "$rounds"); do
  start=$(date +%s%N)
  pids=()
  for i in $(seq 0 7); do run "$dir/ws-$i" >"$dir/out-$i" 2>&1 & pids+=($!); done
  for p in "${pids[@]}"; do wait "$p"; done
  end=$(date +%s%N)
  worst=$(for i in $(seq 0 7); do ms_of < "$dir/out-$i"; done | tr ' ' '\n' | sort -n | tail -1)
  printf '  %d ms (slowest mount %s ms)\n' "$(( (end - start) / 1000000 ))" "$worst"
done
if grep -q "$dir" /proc/mounts; then
  echo "bench-runs.sh: mounts left under $dir" >&2
  exit 1
fi
