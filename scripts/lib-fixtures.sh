# The package managers tests/presets.rs proves the presets on, sourced by scripts/test.sh (bash).
#
#   lc_fixture_tools  installs what is missing and puts it on PATH:
#     * Debian: golang-go, the golang-*-dev packages scripts/goproxy.py serves as a file://
#       GOPROXY (`goproxy.py --packages`), maven, gradle, and the Maven plugins and libraries
#       examples/maven-app and gradle-app resolve from /usr/share/maven-repo (no other Maven
#       repository is reachable here);
#     * pnpm and yarn (classic) from the npm registry, uv and poetry from PyPI, at pinned
#       versions, into $LC_TEST_CACHE/tools (kept between runs; reinstalled when the pin changes), linked into
#       $LC_TEST_CACHE/tools/bin, which goes first on PATH.
# Needs root for apt-get. Outside references: the go module proxy protocol (go help goproxy).

LC_TEST_CACHE=${LC_TEST_CACHE:-/var/cache/layercache-test}
LC_PNPM_VERSION=9.15.9
LC_YARN_VERSION=1.22.22
LC_UV_VERSION=0.13.9
LC_POETRY_VERSION=2.2.1
# What examples/maven-app's pom.xml pins (dependency:go-offline resolves every lifecycle plugin)
# and the libraries both JVM fixtures use.
LC_MAVEN_PACKAGES="maven gradle libmaven-dependency-plugin-java libmaven-compiler-plugin-java
  libmaven-resources-plugin-java libmaven-jar-plugin-java libsurefire-java
  libmaven-clean-plugin-java libmaven-install-plugin-java libmaven-deploy-plugin-java
  libmaven-site-plugin-java libcommons-lang3-java libcommons-io-java"

lc_fixture_log() { echo "lib-fixtures: $*" >&2; }

lc_deb_installed() {
  dpkg-query -W -f '${Status}' "$1" 2>/dev/null | grep -q '^install ok installed'
}

lc_fixture_tools() {
  local here need=() p
  here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
  # iproute2: the offline runs bring loopback up in their fresh network namespace (`ip link`).
  for p in iproute2 golang-go $(python3 "$here/goproxy.py" --packages) $LC_MAVEN_PACKAGES; do
    lc_deb_installed "$p" || need+=("$p")
  done
  if [ ${#need[@]} -gt 0 ]; then
    lc_fixture_log "installing ${need[*]}"
    DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout=300 install -y -qq \
      --no-install-recommends "${need[@]}" >/dev/null || return 1
  fi

  local t=$LC_TEST_CACHE/tools
  mkdir -p "$t/bin"
  if [ "$("$t/bin/pnpm" --version 2>/dev/null)" != "$LC_PNPM_VERSION" ] ||
    [ "$("$t/bin/yarn" --version 2>/dev/null)" != "$LC_YARN_VERSION" ]; then
    lc_fixture_log "installing pnpm@$LC_PNPM_VERSION yarn@$LC_YARN_VERSION (npm)"
    rm -rf "$t/npm"
    npm install --prefix "$t/npm" --no-audit --no-fund --loglevel=error \
      "pnpm@$LC_PNPM_VERSION" "yarn@$LC_YARN_VERSION" >/dev/null || return 1
    ln -sfn ../npm/node_modules/.bin/pnpm "$t/bin/pnpm"
    ln -sfn ../npm/node_modules/.bin/yarn "$t/bin/yarn"
  fi
  if ! "$t/bin/uv" --version 2>/dev/null | grep -q "^uv $LC_UV_VERSION\b"; then
    lc_fixture_log "installing uv==$LC_UV_VERSION (PyPI)"
    rm -rf "$t/uv"
    # a venv of its own, linked into bin/: only the uv binary goes on PATH, not its python3
    python3 -m venv "$t/uv" && "$t/uv/bin/pip" install -q "uv==$LC_UV_VERSION" || return 1
    ln -sfn ../uv/bin/uv "$t/bin/uv"
  fi
  if ! "$t/bin/poetry" --version 2>/dev/null | grep -q "(version $LC_POETRY_VERSION)"; then
    lc_fixture_log "installing poetry==$LC_POETRY_VERSION (PyPI)"
    rm -rf "$t/poetry"
    # likewise: poetry runs from a venv of its own; the projects' venvs use the machine's python3
    python3 -m venv "$t/poetry" && "$t/poetry/bin/pip" install -q "poetry==$LC_POETRY_VERSION" ||
      return 1
    ln -sfn ../poetry/bin/poetry "$t/bin/poetry"
  fi
  export PATH="$t/bin:$PATH"
}
