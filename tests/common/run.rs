//! Helpers for the end-to-end tests of `layercache run` (tests/run_e2e.rs,
//! tests/run_fixtures.rs), included with `#[path = "common/run.rs"] mod run_common;` so the
//! overlay suites that use `tests/common/mod.rs` do not compile them.
//!
//! A [`Sandbox`] is a temp dir with its own store, mount root and workdir; its Drop unmounts every
//! mount left below it (deepest first; lazy as a last resort) before the directory is removed,
//! so a panicking test never leaves a mount behind.

#![allow(dead_code)] // each test binary uses a different subset of the helpers

use std::ffi::OsStr;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

#[path = "mounts.rs"]
mod mounts;
#[allow(unused_imports)] // each test binary uses a different subset
pub use mounts::{
    BIN, assert_not_in_tree, can_mount, docker_test_image, have_tool, run_ok, skip_or_fail,
};

/// A temp dir with `store/`, `cache/` (mount root) and `work/`; Drop unmounts every mount below
/// it (deepest first; lazy as a last resort) before the directory is removed.
pub struct Sandbox {
    dir: tempfile::TempDir,
}

impl Default for Sandbox {
    fn default() -> Self {
        Self::new()
    }
}

impl Sandbox {
    pub fn new() -> Sandbox {
        Sandbox::new_in(&std::env::temp_dir())
    }

    /// A sandbox whose directories are in `parent` (a test that needs them outside `/tmp`,
    /// which bubblewrap covers with its own tmpfs).
    pub fn new_in(parent: &Path) -> Sandbox {
        let dir = tempfile::Builder::new()
            .prefix("layercache-run-")
            .tempdir_in(parent)
            .unwrap();
        for d in ["store", "cache", "work"] {
            std::fs::create_dir_all(dir.path().join(d)).unwrap();
        }
        Sandbox { dir }
    }

    pub fn path(&self, p: &str) -> PathBuf {
        self.dir.path().join(p)
    }

    pub fn work(&self) -> PathBuf {
        self.path("work")
    }

    pub fn write_spec(&self, name: &str, text: &str) -> PathBuf {
        let p = self.path(name);
        std::fs::write(&p, text).unwrap();
        p
    }

    /// Copies the regular files of a read-only fixture tree (e.g. /work/shared/fixtures/npm-app)
    /// into the workdir, writable.
    pub fn copy_into_work(&self, from: &Path) {
        copy_tree(from, &self.work());
    }

    /// `layercache --store STORE [GLOBAL…] run --spec SPEC --workdir work --mount-root cache
    /// [-- COMMAND…]` with extra environment; prints its output.
    pub fn run_cmd<S: AsRef<OsStr>>(
        &self,
        global: &[&str],
        spec: &Path,
        command: &[S],
        envs: &[(&str, &str)],
    ) -> Output {
        let mut cmd = Command::new(BIN);
        cmd.arg("--store")
            .arg(self.path("store"))
            .args(global)
            .arg("run")
            .arg("--spec")
            .arg(spec)
            .arg("--workdir")
            .arg(self.work())
            .arg("--mount-root")
            .arg(self.path("cache"))
            .envs(envs.iter().copied());
        if !command.is_empty() {
            cmd.arg("--").args(command);
        }
        let out = cmd.output().unwrap();
        eprintln!(
            "run: {}\n--stdout--\n{}\n--stderr--\n{}",
            out.status,
            String::from_utf8_lossy(&out.stdout),
            tail(&String::from_utf8_lossy(&out.stderr), 40)
        );
        out
    }

    /// `layercache --store STORE --json run --spec SPEC --workdir WORK --mount-root cache
    /// FLAGS… -- COMMAND…` (run flags such as `--sandbox`, `--user`); prints its output.
    pub fn run_flags(&self, spec: &Path, work: &Path, flags: &[&str], command: &[&str]) -> Output {
        let out = self.command(spec, work, flags, command).output().unwrap();
        eprintln!("run {flags:?}: {}", show(&out));
        out
    }

    /// The command `layercache --store STORE --json run --spec SPEC --workdir WORK --mount-root
    /// cache [FLAGS…] [-- ARGV…]` (no `--` when `argv` is empty), not started.
    pub fn command(&self, spec: &Path, work: &Path, flags: &[&str], argv: &[&str]) -> Command {
        let mut cmd = Command::new(BIN);
        cmd.arg("--store")
            .arg(self.path("store"))
            .args(["--json", "run", "--spec"])
            .arg(spec)
            .arg("--workdir")
            .arg(work)
            .arg("--mount-root")
            .arg(self.path("cache"))
            .args(flags);
        if !argv.is_empty() {
            cmd.arg("--").args(argv);
        }
        cmd
    }

    /// `layercache run --spec SPEC --workdir work --mount-root cache -- sh -c SCRIPT`.
    pub fn run(&self, spec: &Path, script: Option<&str>) -> Output {
        match script {
            Some(s) => self.run_cmd(&[], spec, &["sh", "-c", s], &[]),
            None => self.run_cmd::<&str>(&[], spec, &[], &[]),
        }
    }

    /// The events of `<store>/events.jsonl`, oldest first.
    pub fn events(&self) -> Vec<serde_json::Value> {
        let text =
            std::fs::read_to_string(self.path("store").join("events.jsonl")).unwrap_or_default();
        text.lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect()
    }

    /// `layercache --store STORE --json ls`: one object per layer.
    pub fn ls(&self) -> Vec<serde_json::Value> {
        let out = run_ok(
            Command::new(BIN)
                .arg("--store")
                .arg(self.path("store"))
                .args(["--json", "ls"]),
        );
        match serde_json::from_slice(&out.stdout).unwrap() {
            serde_json::Value::Array(v) => v,
            other => panic!("ls --json: not an array: {other}"),
        }
    }

    /// Mountpoints below the sandbox, deepest first, except the store's idle warm mounts
    /// (`runs/<run>/mnt` of a run directory holding `idle`: a mount kept for the next run of
    /// its layer, which the store owns and ends by itself): what a run left behind.
    pub fn mounts_below(&self) -> Vec<String> {
        let mut v = self.all_mounts_below();
        v.retain(|mp| !Path::new(mp).with_file_name("idle").exists());
        v
    }

    /// The store's idle warm mounts below the sandbox.
    pub fn warm_mounts(&self) -> Vec<String> {
        let mut v = self.all_mounts_below();
        v.retain(|mp| Path::new(mp).with_file_name("idle").exists());
        v
    }

    /// Every mountpoint below the sandbox, deepest first.
    pub fn all_mounts_below(&self) -> Vec<String> {
        let root = self.dir.path().to_string_lossy().to_string();
        let text = std::fs::read_to_string("/proc/mounts").unwrap_or_default();
        let mut v: Vec<String> = text
            .lines()
            .filter_map(|l| l.split(' ').nth(1))
            .filter(|mp| mp.starts_with(&root))
            .map(String::from)
            .collect();
        v.sort_by_key(|m| std::cmp::Reverse(m.len()));
        v
    }
}

impl Drop for Sandbox {
    fn drop(&mut self) {
        for mp in self.all_mounts_below() {
            let ok = Command::new(BIN)
                .args(["umount", &mp])
                .output()
                .is_ok_and(|o| o.status.success());
            if !ok {
                let _ = Command::new("fusermount3").args(["-u", "-z", &mp]).status();
                mounts::lazy_umount(Path::new(&mp));
            }
        }
    }
}

/// A fixture project: the copies bundled in the repo's `examples/` (npm-app, pip-app,
/// cargo-app, go-app, pnpm-app, yarn-app, uv-app, maven-app), or `$LAYERCACHE_FIXTURES/<name>`;
/// `None` (a skip; a failure when `CI` is set) when it is not there.
pub fn fixture(name: &str) -> Option<PathBuf> {
    let root = std::env::var_os("LAYERCACHE_FIXTURES")
        .map(PathBuf::from)
        .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("examples"));
    let dir = root.join(name);
    if !dir.is_dir() {
        skip_or_fail(&format!("fixture {} not found", dir.display()));
        return None;
    }
    Some(dir)
}

/// A process's status, stdout and stderr, for assertion messages.
pub fn show(o: &Output) -> String {
    format!(
        "{}\n--stdout--\n{}\n--stderr--\n{}",
        o.status,
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

/// A workdir `name` below the sandbox holding the npm fixture (examples/npm-app's
/// package.json and package-lock.json).
pub fn npm_workdir(sb: &Sandbox, name: &str) -> PathBuf {
    let w = sb.path(name);
    std::fs::create_dir_all(&w).unwrap();
    let example = Path::new(env!("CARGO_MANIFEST_DIR")).join("examples/npm-app");
    for f in ["package.json", "package-lock.json"] {
        std::fs::copy(example.join(f), w.join(f)).unwrap();
    }
    w
}

/// `(uid, gid, path)` of every entry below the published layers' trees of the sandbox's store.
pub fn layer_owners(sb: &Sandbox) -> Vec<(u32, u32, PathBuf)> {
    use std::os::unix::fs::MetadataExt;
    let mut out = Vec::new();
    let mut stack = vec![sb.path("store/v1/projects")];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).into_iter().flatten().flatten() {
            let p = e.path();
            let m = std::fs::symlink_metadata(&p).unwrap();
            if p.components().any(|c| c.as_os_str() == "tree") {
                out.push((m.uid(), m.gid(), p.clone()));
            }
            if m.is_dir() {
                stack.push(p);
            }
        }
    }
    out
}

/// A process's stdout as text.
pub fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

/// `layercache --store STORE --json run --spec SPEC --workdir WORK --mount-root ROOT` (as the
/// caller, root in these tests) inside a private mount namespace (`unshare -m`), so a wrong
/// mount can never cover a host path; not started: the caller adds flags and `-- ARGV`.
pub fn unshared_run(store: &Path, spec: &Path, work: &Path, root: &Path) -> Command {
    let mut c = Command::new("unshare");
    c.args(["-m", "--propagation", "private", "--", BIN, "--store"])
        .arg(store)
        .args(["--json", "run", "--spec"])
        .arg(spec)
        .arg("--workdir")
        .arg(work)
        .arg("--mount-root")
        .arg(root);
    c
}

/// The `--json` summary of `run`: the last line of stdout, else of stderr (where it was before
/// it moved to stdout), that parses as JSON with `caches`, from its first `{` (on stderr it
/// follows setup's output, which may end without a newline: mvn prints a bare "\e[0m").
pub fn json_summary(o: &Output) -> serde_json::Value {
    [&o.stdout, &o.stderr]
        .into_iter()
        .find_map(|bytes| {
            String::from_utf8_lossy(bytes)
                .lines()
                .rev()
                .filter_map(|l| serde_json::from_str::<serde_json::Value>(&l[l.find('{')?..]).ok())
                .find(|v| v.get("caches").is_some())
        })
        .expect("a --json summary line on stdout or stderr")
}

/// Preparation time of one event: mount + setup + maintenance + promote, ms.
pub fn prep_ms(e: &serde_json::Value) -> u64 {
    ["mount_ms", "setup_ms", "maintenance_ms", "promote_ms"]
        .iter()
        .map(|k| e[k].as_u64().unwrap_or(0))
        .sum()
}

/// The last `n` lines of `text` (long setup logs).
pub fn tail(text: &str, n: usize) -> String {
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(n)..].join("\n")
}

fn copy_tree(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for e in std::fs::read_dir(from).unwrap() {
        let e = e.unwrap();
        let dst = to.join(e.file_name());
        if e.file_type().unwrap().is_dir() {
            copy_tree(&e.path(), &dst);
        } else {
            std::fs::copy(e.path(), &dst).unwrap();
            let mut perm = std::fs::metadata(&dst).unwrap().permissions();
            std::os::unix::fs::PermissionsExt::set_mode(&mut perm, 0o644);
            std::fs::set_permissions(&dst, perm).unwrap();
        }
    }
}
