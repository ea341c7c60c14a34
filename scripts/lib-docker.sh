# A real Docker engine and a test image for the tests, sourced by scripts/test.sh (bash).
#
#   lc_docker_start   uses the engine DOCKER_HOST (or the default socket) names when one answers;
#                     else installs Debian's docker.io when dockerd is missing and starts
#                     `dockerd --bridge=none --iptables=false` with its own exec root, pid file
#                     and unix socket under a temp dir and its own data root
#                     ($LC_TEST_CACHE/docker, kept between runs under a lock; a temp one when
#                     another engine holds it); exports DOCKER_HOST. Readiness is `docker info`
#                     answering, polled until a deadline while dockerd lives.
#   lc_docker_image   exports LAYERCACHE_TEST_IMAGE=layercache-test:<key>, a Debian bookworm image
#                     holding nodejs, npm, python3 and python3-venv, and users user1000 and
#                     user1001 (uid = gid = 1000, 1001) (no image registry is
#                     reachable here: mmdebstrap builds the rootfs from Debian's packages and
#                     `docker import` makes the image). <key> hashes the suite, the package list
#                     and the build function, and the rootfs tarball is kept in
#                     $LC_TEST_CACHE/rootfs-<key>.tar: only the first run on a machine builds it
#                     (minutes), a fresh data root imports it (~30 s), and the kept data root
#                     already has the image. Images and tarballs of other keys are removed.
#   lc_docker_stop    stops the dockerd lc_docker_start started (SIGTERM by pid, SIGKILL after
#                     30 s), unmounts what it left (netns, data root, overlay2), removes its temp
#                     dir; does nothing for an engine it did not start. Safe to call twice.
#
# Needs root (dockerd, apt-get, mmdebstrap). Outside references: dockerd(8) options,
# mmdebstrap(1), docker-import(1).

LC_TEST_CACHE=${LC_TEST_CACHE:-/var/cache/layercache-test}
LC_IMAGE_SUITE=bookworm
LC_IMAGE_MIRROR=${LC_IMAGE_MIRROR:-http://deb.debian.org/debian}
LC_IMAGE_PACKAGES="nodejs,npm,python3,python3-venv,ca-certificates"
lc_dockerd_pid=
lc_dockerd_dir=
lc_docker_lock=
lc_dockerd_data=

lc_log() { echo "lib-docker: $*" >&2; }

lc_apt_install() {
  DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout=300 install -y -qq \
    --no-install-recommends "$@" >/dev/null
}

lc_docker_start() {
  if docker info >/dev/null 2>&1; then
    lc_log "using the running engine (${DOCKER_HOST:-default socket})"
    return 0
  fi
  if ! command -v dockerd >/dev/null 2>&1; then
    lc_log "installing docker.io (dockerd)"
    lc_apt_install docker.io
  fi
  # /tmp: the containerd socket path below the exec root must stay under 108 bytes.
  lc_dockerd_dir=$(mktemp -d /tmp/layercache-dockerd.XXXXXX)
  local d=$lc_dockerd_dir data
  # The data root persists in $LC_TEST_CACHE/docker, so the test image is there from the last
  # run; a second concurrent engine (another test.sh) gets a fresh one and imports the image.
  mkdir -p "$LC_TEST_CACHE"
  exec {lc_docker_lock}>"$LC_TEST_CACHE/docker.lock"
  # (dockerd inherits the lock: it is held while dockerd lives.)
  if flock -n "$lc_docker_lock"; then data=$LC_TEST_CACHE/docker; else data=$d/data; fi
  lc_dockerd_data=$data
  dockerd --bridge=none --iptables=false --ip6tables=false \
    --data-root "$data" --exec-root "$d/exec" --pidfile "$d/dockerd.pid" \
    -H "unix://$d/docker.sock" >"$d/dockerd.log" 2>&1 &
  lc_dockerd_pid=$!
  export DOCKER_HOST="unix://$d/docker.sock"
  local deadline=$((SECONDS + 60))
  until docker info >/dev/null 2>&1; do
    if ! kill -0 "$lc_dockerd_pid" 2>/dev/null; then
      lc_log "dockerd exited before it answered:"; tail -20 "$d/dockerd.log" >&2
      lc_dockerd_pid=; lc_docker_stop; return 1
    fi
    if [ "$SECONDS" -ge "$deadline" ]; then
      lc_log "dockerd did not answer within 60 s:"; tail -20 "$d/dockerd.log" >&2
      lc_docker_stop; return 1
    fi
    sleep 0.1
  done
  lc_log "dockerd $lc_dockerd_pid ready at $DOCKER_HOST"
}

lc_docker_stop() {
  # Also runs from an EXIT trap under `set -e`: no command here may fail the caller.
  if [ -n "$lc_dockerd_pid" ]; then
    kill -TERM "$lc_dockerd_pid" 2>/dev/null || true
    local deadline=$((SECONDS + 30))
    while kill -0 "$lc_dockerd_pid" 2>/dev/null && [ "$SECONDS" -lt "$deadline" ]; do
      sleep 0.1
    done
    if kill -0 "$lc_dockerd_pid" 2>/dev/null; then
      lc_log "dockerd $lc_dockerd_pid ignored SIGTERM for 30 s: SIGKILL"
      kill -KILL "$lc_dockerd_pid" 2>/dev/null || true
    fi
    wait "$lc_dockerd_pid" 2>/dev/null || true
    lc_dockerd_pid=
  fi
  if [ -n "$lc_dockerd_dir" ]; then
    # dockerd leaves its netns bind mount (exec/netns/default) even after a clean stop, and
    # its data root's bind mount onto itself and overlay2 mounts when it was killed: unmount
    # them all, deepest first.
    awk -v d="$lc_dockerd_dir/" -v r="$lc_dockerd_data" \
      'index($2, d) == 1 || $2 == r || index($2, r "/") == 1 {print $2}' /proc/mounts | sort -r |
      while read -r m; do umount "$m" 2>/dev/null || umount -l "$m" 2>/dev/null || true; done
    rm -rf "$lc_dockerd_dir" || true
    lc_dockerd_dir=
    unset DOCKER_HOST
  fi
  if [ -n "$lc_docker_lock" ]; then
    exec {lc_docker_lock}>&- || true
    lc_docker_lock=
  fi
}

# The rootfs tarball of the test image, written to "$1" (mmdebstrap, Debian packages only).
lc_image_rootfs() {
  command -v mmdebstrap >/dev/null 2>&1 || { lc_log "installing mmdebstrap"; lc_apt_install mmdebstrap; }
  # Documentation and locales are left out: smaller tarball, faster import.
  mmdebstrap --quiet --variant=apt --format=tar --include="$LC_IMAGE_PACKAGES" \
    --dpkgopt='path-exclude=/usr/share/man/*' \
    --dpkgopt='path-exclude=/usr/share/doc/*' \
    --dpkgopt='path-include=/usr/share/doc/*/copyright' \
    --dpkgopt='path-exclude=/usr/share/locale/*' \
    "$LC_IMAGE_SUITE" "$1" "$LC_IMAGE_MIRROR"
}

# The test image from the imported rootfs "$1": the host's extra CA certificates
# (/usr/local/share/ca-certificates: the registries are reached through a TLS proxy the host
# trusts) added to the system bundle, node/pip/requests pointed at that bundle, and two users
# for `--user` tests: user1000 (1000:1000) and user1001 (1001:1001), with homes in /home.
lc_image_finish() {
  local base=$1 name=lc-image-finish-$$ status
  docker run --name "$name" -v /usr/local/share/ca-certificates:/host-ca:ro "$base" \
    sh -c 'cp /host-ca/*.crt /usr/local/share/ca-certificates/ 2>/dev/null; update-ca-certificates &&
      useradd -m -u 1000 -U -s /bin/sh user1000 && useradd -m -u 1001 -U -s /bin/sh user1001' \
    >/dev/null 2>&1 || { docker rm -f "$name" >/dev/null 2>&1; return 1; }
  local b=/etc/ssl/certs/ca-certificates.crt
  docker commit --change "ENV NODE_EXTRA_CA_CERTS=$b" --change "ENV SSL_CERT_FILE=$b" \
    --change "ENV PIP_CERT=$b" --change "ENV REQUESTS_CA_BUNDLE=$b" \
    "$name" "$LAYERCACHE_TEST_IMAGE" >/dev/null && status=0 || status=1
  docker rm -f "$name" >/dev/null 2>&1 || true
  return $status
}

lc_docker_image() {
  local base_key key
  base_key=$( { echo "$LC_IMAGE_SUITE $LC_IMAGE_PACKAGES"; declare -f lc_image_rootfs; } |
    sha256sum | cut -c1-16)
  key=$( { echo "$base_key"; declare -f lc_image_finish;
    cat /usr/local/share/ca-certificates/*.crt 2>/dev/null; } | sha256sum | cut -c1-16)
  export LAYERCACHE_TEST_IMAGE="layercache-test:$key"
  if docker image inspect "$LAYERCACHE_TEST_IMAGE" >/dev/null 2>&1; then
    return 0
  fi
  local tar="$LC_TEST_CACHE/rootfs-$base_key.tar" base="layercache-test-base:$base_key"
  local tmp="$LC_TEST_CACHE/.rootfs-$base_key.$$.tar" t0=$SECONDS
  if [ ! -f "$tar" ]; then
    mkdir -p "$LC_TEST_CACHE"
    lc_log "building the test image's rootfs (first run on this machine; cached as $tar)"
    lc_image_rootfs "$tmp" && [ -f "$tmp" ] || { rm -rf "$tmp"; return 1; }
    mv "$tmp" "$tar"
    lc_log "rootfs built in $((SECONDS - t0)) s"
  fi
  t0=$SECONDS
  if ! docker image inspect "$base" >/dev/null 2>&1; then
    docker import --change 'CMD ["/bin/sh"]' "$tar" "$base" >/dev/null || return 1
  fi
  lc_image_finish "$base" || { lc_log "could not finish $LAYERCACHE_TEST_IMAGE"; return 1; }
  lc_log "imported $LAYERCACHE_TEST_IMAGE in $((SECONDS - t0)) s"
  # Images and tarballs of older keys only fill the kept data root and the cache dir.
  local old
  for old in $(docker images --format '{{.Repository}}:{{.Tag}}' 'layercache-test*'); do
    [ "$old" = "$LAYERCACHE_TEST_IMAGE" ] || [ "$old" = "$base" ] ||
      docker rmi "$old" >/dev/null 2>&1 || true
  done
  for old in "$LC_TEST_CACHE"/rootfs-*.tar; do
    [ "$old" = "$tar" ] || rm -f "$old"
  done
}
