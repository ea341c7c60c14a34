//! Helpers shared by every test binary: the one place that decides whether a test whose
//! environment is incomplete (not root, no /dev/fuse, a tool or fixture missing) is skipped or
//! fails ([`skip_or_fail`]), the checks that use it, the layercache binary ([`BIN`]), running a
//! command that must succeed ([`run_ok`]) and the mount and file helpers (is a path a mount, a
//! lazy unmount as the last resort of every guard, a guard that unmounts a store mount on Drop,
//! writing a file with its parents, a directory's names).
//!
//! Included as `mod mounts;` by tests/common/mod.rs, as `#[path = "mounts.rs"] mod mounts;` by
//! tests/common/run.rs and as `#[path = "common/mounts.rs"] mod mounts;` by the store tests.

#![allow(dead_code)] // each test binary uses a different subset of the helpers

use std::fs;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

/// Call where a test cannot run here, with the reason (e.g. "needs root and /dev/fuse").
/// Without `CI` in the environment: prints `skipped <test>: <reason>` and returns true (the
/// caller returns early, so the test counts as passed). With `CI` set: panics, because CI runs
/// as root with everything installed, and a skip there would hide a missing install step.
pub fn skip_or_fail(reason: &str) -> bool {
    let test = std::thread::current().name().unwrap_or("?").to_string();
    if std::env::var_os("CI").is_some() {
        panic!("{test}: {reason} (CI is set, so this is a failure, not a skip)");
    }
    eprintln!("skipped {test}: {reason}");
    true
}

/// The Docker test image (`LAYERCACHE_TEST_IMAGE`, built by scripts/lib-docker.sh), when an
/// engine answers (`DOCKER_HOST`) and holds it; otherwise [`skip_or_fail`] and `None`.
pub fn docker_test_image() -> Option<String> {
    let Ok(image) = std::env::var("LAYERCACHE_TEST_IMAGE") else {
        skip_or_fail("LAYERCACHE_TEST_IMAGE is not set (scripts/lib-docker.sh sets it)");
        return None;
    };
    let ok = std::process::Command::new("docker")
        .args(["image", "inspect", &image])
        .output()
        .is_ok_and(|o| o.status.success());
    if !ok {
        skip_or_fail(&format!(
            "no Docker engine with image {image} (DOCKER_HOST={:?})",
            std::env::var("DOCKER_HOST").unwrap_or_default()
        ));
        return None;
    }
    Some(image)
}

/// The layercache binary built by cargo for these tests.
pub const BIN: &str = env!("CARGO_BIN_EXE_layercache");

/// Runs `cmd` to completion and returns its output; panics (at the caller's line) naming the
/// command (with its directory and environment changes), its exit status, stdout and stderr
/// unless it exits 0, or naming the program when it cannot be started.
#[track_caller]
pub fn run_ok(cmd: &mut Command) -> Output {
    let out = match cmd.output() {
        Ok(out) => out,
        Err(e) => panic!(
            "cannot run {:?}: {e} (scripts/test.sh installs the tools the tests need)",
            cmd.get_program()
        ),
    };
    assert!(
        out.status.success(),
        "{cmd:?} failed ({})\n--stdout--\n{}\n--stderr--\n{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

/// Whether mount-based tests can run here: root, and `/dev/fuse` when `fuse` (every test but
/// the overlay suites run against kernel overlayfs); otherwise [`skip_or_fail`] naming what is
/// missing.
pub fn can_mount_with(fuse: bool) -> bool {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        return !skip_or_fail("mount-based tests need root");
    }
    if fuse && !Path::new("/dev/fuse").exists() {
        return !skip_or_fail("/dev/fuse is missing (running as root)");
    }
    true
}

/// [`can_mount_with`] for a test that mounts FUSE filesystems (the store and run tests).
pub fn can_mount() -> bool {
    can_mount_with(true)
}

/// Whether `tool --version` runs; otherwise [`skip_or_fail`] naming the tool.
pub fn have_tool(tool: &str) -> bool {
    let ok = Command::new(tool)
        .arg("--version")
        .output()
        .is_ok_and(|o| o.status.success());
    ok || !skip_or_fail(&format!("needs {tool}"))
}

/// True when `p` is a mountpoint: its `st_dev` differs from its parent's.
pub fn is_mounted(p: &Path) -> bool {
    let (Ok(m), Ok(parent)) = (fs::metadata(p), fs::metadata(p.join(".."))) else {
        // An unreachable (ENOTCONN) mountpoint is still a mount.
        return fs::symlink_metadata(p).is_err() || fs::metadata(p).is_err();
    };
    m.dev() != parent.dev()
}

/// A `layercache mount` of `store` at `mnt`; Drop unmounts it: `layercache umount`, then
/// `umount -l` as a last resort.
pub struct Mounted {
    pub store: PathBuf,
    pub mnt: PathBuf,
}

impl Drop for Mounted {
    fn drop(&mut self) {
        if !is_mounted(&self.mnt) {
            return;
        }
        let _ = Command::new(BIN)
            .arg("--store")
            .arg(&self.store)
            .arg("umount")
            .arg(&self.mnt)
            .output();
        if is_mounted(&self.mnt) {
            lazy_umount(&self.mnt);
        }
    }
}

/// `umount -l MNT`, ignoring the outcome: the last resort of the guards' Drop.
pub fn lazy_umount(mnt: &Path) {
    let _ = Command::new("umount").arg("-l").arg(mnt).output();
}

/// Sorted names in a directory (via std's readdir).
pub fn names(p: &Path) -> Vec<String> {
    let mut v: Vec<String> = fs::read_dir(p)
        .unwrap_or_else(|e| panic!("read_dir {}: {e}", p.display()))
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    v.sort();
    v
}

/// Writes `data` to `p`, creating its parent directories.
pub fn write(p: &Path, data: impl AsRef<[u8]>) {
    if let Some(parent) = p.parent() {
        fs::create_dir_all(parent).unwrap();
    }
    fs::write(p, data).unwrap_or_else(|e| panic!("write {}: {e}", p.display()));
}

/// Asserts that no file under `dir` contains `needle` (`grep -r` finds none: exit status 1, not
/// an error such as a missing `dir`).
#[allow(dead_code)]
pub fn assert_not_in_tree(dir: &std::path::Path, needle: &str) {
    let grep = std::process::Command::new("grep")
        .args(["-r", "-l", needle])
        .arg(dir)
        .output()
        .unwrap();
    assert_eq!(
        grep.status.code(),
        Some(1),
        "grep -r {needle} {}: {}{}",
        dir.display(),
        String::from_utf8_lossy(&grep.stdout),
        String::from_utf8_lossy(&grep.stderr)
    );
}
