#!/usr/bin/env python3
"""Builds a local Go module proxy directory from Debian's golang-*-dev packages.

The result is served with GOPROXY=file://OUT (and GOSUMDB=off: the checksum database is not
reachable here). It follows the module proxy protocol (https://go.dev/ref/mod#goproxy-protocol):

    OUT/<escaped module>/@v/list            released versions, one a line
    OUT/<escaped module>/@v/<ver>.info      {"Version": ..., "Time": ...}
    OUT/<escaped module>/@v/<ver>.mod       the module's go.mod
    OUT/<escaped module>/@v/<ver>.zip       files under "<module>@<ver>/", laid out as
                                            golang.org/x/mod/zip's CreateFromDir does

A package's module is the directory of its files below /usr/share/gocode/src (its go.mod names the
module path; without one the path is the directory's, as the go command assumes for pre-module
code), its version the package's upstream version (epoch, Debian revision and +dfsg/+ds suffixes
dropped). Versions that packaged go.mod files require but no package provides get a ".mod" with
only a module line and no zip: MVS needs every required version's go.mod to read the graph and
then selects the packaged (higher) version; a required version above the packaged one is reported
on stderr, since the go command would select a version that has no zip.

Usage: goproxy.py OUT [PACKAGE...]      (default packages: those of examples/go-app, and go-cmp)
       goproxy.py --packages            prints the default packages (for apt-get install)
Exit status: 0 ok, 2 bad input (a package that is not installed or holds no Go module).
"""

import hashlib
import json
import os
import re
import subprocess
import sys
import zipfile
from datetime import datetime, timezone

SRC = "/usr/share/gocode/src"

# The modules examples/go-app uses, directly or through another module.
DEFAULT_PACKAGES = [
    "golang-github-google-uuid-dev",
    "golang-github-pkg-errors-dev",
    "golang-github-fatih-color-dev",
    "golang-github-mattn-go-colorable-dev",
    "golang-github-mattn-go-isatty-dev",
    "golang-golang-x-sys-dev",
    # not used by go-app: the module scripts/ready.sh's restore row adds (`go get`)
    "golang-github-google-go-cmp-dev",
]

# golang.org/x/mod/zip limits.
MAX_ZIP_FILE = 500 << 20
MAX_GO_MOD = 16 << 20
# Version-control metadata that CreateFromDir leaves out.
VCS_DIRS = {".bzr", ".git", ".hg", ".svn"}


def die(msg):
    print(f"goproxy.py: {msg}", file=sys.stderr)
    sys.exit(2)


def escape(path):
    """Module path or version escaped for the file system (uppercase -> '!' + lowercase)."""
    return re.sub(r"[A-Z]", lambda m: "!" + m.group(0).lower(), path)


def upstream_version(pkg):
    """'v' + the package's upstream version, or a bad-input exit naming the package."""
    out = subprocess.run(
        ["dpkg-query", "-W", "-f", "${Status} ${Version}", pkg],
        capture_output=True,
        text=True,
    )
    if out.returncode != 0 or not out.stdout.startswith("install ok installed"):
        die(f"package {pkg} is not installed (apt-get install {pkg})")
    deb = out.stdout.split()[-1]
    up = deb.split(":", 1)[-1].rsplit("-", 1)[0]
    up = re.sub(r"\+(dfsg|ds)[0-9.]*$", "", up)
    if not re.fullmatch(r"[0-9]+\.[0-9]+\.[0-9]+", up):
        die(
            f"package {pkg} has version {deb}, whose upstream part {up!r} is no release "
            "version (MAJOR.MINOR.PATCH); snapshots (~git) are not supported"
        )
    return "v" + up


def module_dir(pkg):
    """The directory of the package's module below SRC."""
    files = subprocess.run(
        ["dpkg-query", "-L", pkg], capture_output=True, text=True, check=True
    ).stdout.split("\n")
    dirs = [
        os.path.dirname(f)
        for f in files
        if f.startswith(SRC + "/") and os.path.isfile(f) and not os.path.islink(f)
    ]
    if not dirs:
        die(f"package {pkg} installs no Go source below {SRC}")
    common = os.path.commonpath(dirs)
    d = common
    while d.startswith(SRC + "/"):
        if os.path.isfile(os.path.join(d, "go.mod")):
            return d
        d = os.path.dirname(d)
    return common


def module_path(d, gomod):
    if gomod is None:
        return os.path.relpath(d, SRC)
    m = re.search(r"^module\s+\"?([^\s\"]+)\"?", gomod, re.M)
    if not m:
        die(f"{d}/go.mod has no module line")
    return m.group(1)


def requirements(gomod):
    """(module, version) pairs of the require directives of a go.mod text."""
    reqs = []
    block = False
    for line in gomod.splitlines():
        line = line.split("//", 1)[0].strip()
        if block:
            if line == ")":
                block = False
            elif line:
                reqs.append(tuple(line.split()[:2]))
        elif line.startswith("require"):
            rest = line[len("require") :].strip()
            if rest == "(":
                block = True
            elif rest:
                reqs.append(tuple(rest.split()[:2]))
    return [(m.strip('"'), v) for m, v in reqs]


def semver_key(v):
    """Sort key for a semantic version 'vX.Y.Z[-pre][+build]' (pre-releases sort lower)."""
    m = re.fullmatch(r"v(\d+)\.(\d+)\.(\d+)(?:-([^+]*))?(?:\+.*)?", v)
    if not m:
        return (0, 0, 0, 0, ())
    pre = m.group(4)
    pre_key = (1, ()) if pre is None else (0, tuple(
        (0, int(p), "") if p.isdigit() else (1, 0, p) for p in pre.split(".")
    ))
    return (int(m.group(1)), int(m.group(2)), int(m.group(3))) + pre_key


def zip_files(root):
    """Files of the module at root, relative paths, as CreateFromDir selects them: no nested
    modules (subdirectories with a go.mod), no vendor/ or VCS directories, regular files only."""
    out = []
    for d, subdirs, files in os.walk(root):
        rel_d = os.path.relpath(d, root)
        keep = []
        for s in sorted(subdirs):
            p = os.path.join(d, s)
            if s in VCS_DIRS or s == "vendor" or os.path.islink(p):
                continue
            if os.path.isfile(os.path.join(p, "go.mod")):
                continue  # a nested module
            keep.append(s)
        subdirs[:] = keep
        for f in sorted(files):
            p = os.path.join(d, f)
            if os.path.islink(p) or not os.path.isfile(p):
                continue
            rel = f if rel_d == "." else os.path.join(rel_d, f)
            size = os.path.getsize(p)
            if size > MAX_ZIP_FILE or (rel == "go.mod" and size > MAX_GO_MOD):
                die(f"{p}: {size} bytes, over the module zip limit")
            out.append(rel)
    lower = {}
    for rel in out:
        if rel.lower() in lower:
            die(f"{root}: {rel} and {lower[rel.lower()]} differ only in case")
        lower[rel.lower()] = rel
    return sorted(out)


def write(path, data):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "wb") as f:
        f.write(data)


def build(out, packages):
    mods = {}  # module -> (version, dir, go.mod text or None)
    for pkg in packages:
        d = module_dir(pkg)
        gomod_path = os.path.join(d, "go.mod")
        gomod = open(gomod_path).read() if os.path.isfile(gomod_path) else None
        path = module_path(d, gomod)
        ver = upstream_version(pkg)
        major = int(ver[1:].split(".")[0])
        if major >= 2 and gomod is None:
            ver += "+incompatible"
        mods[path] = (ver, d, gomod)

    for path, (ver, d, gomod) in sorted(mods.items()):
        base = os.path.join(out, escape(path), "@v")
        files = zip_files(d)
        mtime = max(os.path.getmtime(os.path.join(d, f)) for f in files)
        stamp = datetime.fromtimestamp(int(mtime), timezone.utc)
        info = {"Version": ver, "Time": stamp.strftime("%Y-%m-%dT%H:%M:%SZ")}
        write(os.path.join(base, escape(ver) + ".info"), json.dumps(info).encode())
        mod_text = gomod if gomod is not None else f"module {path}\n"
        write(os.path.join(base, escape(ver) + ".mod"), mod_text.encode())
        zpath = os.path.join(base, escape(ver) + ".zip")
        os.makedirs(base, exist_ok=True)
        with zipfile.ZipFile(zpath + ".tmp", "w", zipfile.ZIP_DEFLATED) as z:
            for rel in files:
                zi = zipfile.ZipInfo(f"{path}@{ver}/{rel}", stamp.timetuple()[:6])
                zi.compress_type = zipfile.ZIP_DEFLATED
                zi.external_attr = 0o644 << 16
                with open(os.path.join(d, rel), "rb") as f:
                    z.writestr(zi, f.read())
        os.replace(zpath + ".tmp", zpath)
        write(os.path.join(base, "list"), (ver + "\n").encode())
        digest = hashlib.sha256(open(zpath, "rb").read()).hexdigest()[:12]
        print(f"{path} {ver} ({len(files)} files, zip sha256 {digest}…)")

    # go.mod-only versions for the requirements no package provides.
    for path, (ver, d, gomod) in sorted(mods.items()):
        for rmod, rver in requirements(gomod or ""):
            base = os.path.join(out, escape(rmod), "@v")
            if os.path.exists(os.path.join(base, escape(rver) + ".mod")):
                continue
            write(os.path.join(base, escape(rver) + ".mod"), f"module {rmod}\n".encode())
            write(
                os.path.join(base, escape(rver) + ".info"),
                json.dumps({"Version": rver, "Time": "2000-01-01T00:00:00Z"}).encode(),
            )
            have = mods.get(rmod)
            if have is None:
                note = "no package provides this module"
            elif semver_key(rver) > semver_key(have[0]):
                note = f"above the packaged {have[0]}: MVS would select a version with no zip"
            else:
                continue
            print(f"goproxy.py: warning: {path} requires {rmod} {rver}: {note}", file=sys.stderr)


def main(argv):
    if argv[1:] == ["--packages"]:
        print(" ".join(DEFAULT_PACKAGES))
        return
    if len(argv) < 2 or argv[1].startswith("-"):
        die("usage: goproxy.py OUT [PACKAGE...] | goproxy.py --packages")
    build(os.path.abspath(argv[1]), argv[2:] or DEFAULT_PACKAGES)


if __name__ == "__main__":
    main(sys.argv)
