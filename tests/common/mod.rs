//! Harness for the mount-based overlay semantics tests.
//!
//! A [`Fixture`] owns temporary lower/upper/work/mountpoint directories, populates the lower
//! layer(s), mounts the implementation under test and holds the mount in a [`MountGuard`]
//! whose `Drop` unmounts it (`umount`, then `umount -l` as a last resort) before the temporary
//! directories are removed, so no test leaves a mount behind even when it panics. The lower
//! layers are fingerprinted (paths, metadata, xattrs, contents) after population and checked
//! again after every unmount: the lower is never modified, whatever a test does.
//!
//! The implementation under test comes from `LAYERCACHE_TEST_IMPL`:
//! * `layercache` (default) — this crate's binary, `layercache overlay -o … MNT`;
//! * `kernel` — `mount -t overlay overlay -o … MNT` (used to prove the tests themselves right);
//! * `fuse-overlayfs` — the Debian package (scripts/test.sh installs it).
//!
//! Readiness is checked by stat-ing the mountpoint (its `st_dev` must differ from its parent's),
//! never by sleeping.

#![allow(dead_code)] // every test binary uses a different subset of the helpers

use std::collections::BTreeMap;
use std::ffi::{CString, OsStr, OsString};
use std::fs;
use std::io::{self, Read};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

mod mounts;
#[allow(unused_imports)] // each test binary uses a different subset
pub use mounts::{
    BIN, can_mount_with, docker_test_image, is_mounted, lazy_umount, names, run_ok, skip_or_fail,
    write,
};

/// The overlay implementation the tests run against.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Impl {
    Layercache,
    Kernel,
    FuseOverlayfs,
}

impl Impl {
    /// From `LAYERCACHE_TEST_IMPL` (default: layercache). Panics on an unknown value.
    pub fn current() -> Impl {
        match std::env::var("LAYERCACHE_TEST_IMPL").as_deref() {
            Err(_) | Ok("") | Ok("layercache") => Impl::Layercache,
            Ok("kernel") => Impl::Kernel,
            Ok("fuse-overlayfs") => Impl::FuseOverlayfs,
            Ok(other) => {
                panic!("LAYERCACHE_TEST_IMPL={other:?}: want layercache, kernel or fuse-overlayfs")
            }
        }
    }

    /// Whether mounting it needs `/dev/fuse`.
    pub fn uses_fuse(self) -> bool {
        self != Impl::Kernel
    }
}

/// Whether the layercache under test runs in FUSE passthrough mode (`LAYERCACHE_PASSTHROUGH=1`
/// in the tests' environment, which the mount command inherits), where fds opened before a
/// copy-up keep reading the lower content (the one rule passthrough mode changes).
pub fn passthrough_mode() -> bool {
    Impl::current() == Impl::Layercache
        && matches!(
            std::env::var("LAYERCACHE_PASSTHROUGH").as_deref(),
            Ok("1") | Ok("on") | Ok("yes")
        )
}

/// `require_root!()` at the top of a test: returns early (a pass) when it cannot run here
/// ([`can_mount_with`]: root, and `/dev/fuse` unless the implementation is kernel overlayfs).
#[allow(unused_macros)]
macro_rules! require_root {
    () => {
        if !$crate::common::can_mount_with($crate::common::Impl::current().uses_fuse()) {
            return;
        }
    };
}

/// Skips the rest of a test for one implementation, printing why.
#[allow(unused_macros)]
macro_rules! skip_for {
    ($imp:expr, $why:expr) => {
        if $crate::common::Impl::current() == $imp {
            eprintln!("SKIP for {:?}: {}", $imp, $why);
            return;
        }
    };
}

/// Skips the rest of a test unless the implementation under test is layercache.
#[allow(unused_macros)]
macro_rules! only_layercache {
    ($why:expr) => {
        if $crate::common::Impl::current() != $crate::common::Impl::Layercache {
            eprintln!("SKIP for {:?}: {}", $crate::common::Impl::current(), $why);
            return;
        }
    };
}

/// Builder for a [`Fixture`].
pub struct FixtureBuilder {
    lowers: usize,
    mount: bool,
    kernel_opts: Vec<String>,
}

impl FixtureBuilder {
    /// Number of lower layers (default 1); `populate` receives one directory per lower,
    /// topmost first.
    pub fn lowers(mut self, n: usize) -> Self {
        assert!(n >= 1);
        self.lowers = n;
        self
    }

    /// Do not mount: the test mounts itself (see [`Fixture::adopt_mount`]).
    pub fn unmounted(mut self) -> Self {
        self.mount = false;
        self
    }

    /// Extra mount options for kernel overlayfs only (e.g. `redirect_dir=on`).
    pub fn kernel_opt(mut self, opt: &str) -> Self {
        self.kernel_opts.push(opt.to_string());
        self
    }

    /// Creates the directories, runs `populate` on the lower(s), fingerprints them and mounts.
    pub fn build(self, populate: impl FnOnce(&[PathBuf])) -> Fixture {
        let tmp = tempfile::Builder::new()
            .prefix("lc-test-")
            .tempdir()
            .expect("tempdir");
        // Other uids (setpriv tests) must be able to reach the mountpoint.
        fs::set_permissions(tmp.path(), fs::Permissions::from_mode(0o755)).unwrap();
        let root = tmp.path().to_path_buf();
        let lowers: Vec<PathBuf> = (0..self.lowers)
            .map(|i| {
                if self.lowers == 1 {
                    root.join("lower")
                } else {
                    root.join(format!("lower{i}"))
                }
            })
            .collect();
        for d in
            lowers
                .iter()
                .cloned()
                .chain([root.join("upper"), root.join("work"), root.join("mnt")])
        {
            fs::create_dir(&d).unwrap();
            fs::set_permissions(&d, fs::Permissions::from_mode(0o755)).unwrap();
        }
        populate(&lowers);
        let lower_print = lowers.iter().map(|l| tree_fingerprint(l)).collect();
        let mut fx = Fixture {
            mount: None,
            upper: root.join("upper"),
            work: root.join("work"),
            mnt: root.join("mnt"),
            lowers,
            lower_print,
            kernel_opts: self.kernel_opts,
            _tmp: tmp,
        };
        if self.mount {
            fx.mount();
        }
        fx
    }
}

/// Temp lower/upper/work/mnt directories plus (usually) a live mount of them.
pub struct Fixture {
    // Field order matters only for documentation: Drop below unmounts explicitly first.
    mount: Option<MountGuard>,
    pub lowers: Vec<PathBuf>,
    pub upper: PathBuf,
    pub work: PathBuf,
    pub mnt: PathBuf,
    lower_print: Vec<Fingerprint>,
    kernel_opts: Vec<String>,
    _tmp: tempfile::TempDir,
}

impl Fixture {
    pub fn builder() -> FixtureBuilder {
        FixtureBuilder {
            lowers: 1,
            mount: true,
            kernel_opts: Vec::new(),
        }
    }

    /// One lower populated by `populate`, mounted.
    pub fn new(populate: impl FnOnce(&Path)) -> Fixture {
        Fixture::builder().build(|l| populate(&l[0]))
    }

    /// The (topmost) lower directory.
    pub fn lower(&self) -> &Path {
        &self.lowers[0]
    }

    /// A path inside the mount.
    pub fn p(&self, rel: &str) -> PathBuf {
        self.mnt.join(rel)
    }

    /// The `-o` option string for this fixture.
    pub fn options(&self) -> String {
        self.options_with_work(&self.work)
    }

    /// The `-o` option string for this fixture's lower(s) and upper with workdir `work`.
    fn options_with_work(&self, work: &Path) -> String {
        let lowers: Vec<String> = self
            .lowers
            .iter()
            .map(|l| l.display().to_string())
            .collect();
        format!(
            "lowerdir={},upperdir={},workdir={}",
            lowers.join(":"),
            self.upper.display(),
            work.display()
        )
    }

    /// The command that mounts this fixture with the implementation under test.
    pub fn mount_command(&self) -> Command {
        let opts = self.options();
        match Impl::current() {
            Impl::Layercache => {
                let mut c = Command::new(BIN);
                c.arg("overlay").arg("-o").arg(&opts).arg(&self.mnt);
                c
            }
            Impl::Kernel => {
                let mut all = opts;
                for o in &self.kernel_opts {
                    all.push(',');
                    all.push_str(o);
                }
                let mut c = Command::new("mount");
                c.args(["-t", "overlay", "overlay", "-o", &all])
                    .arg(&self.mnt);
                c
            }
            Impl::FuseOverlayfs => {
                let mut c = Command::new("fuse-overlayfs");
                c.arg("-o")
                    .arg(format!("{opts},allow_other,default_permissions"))
                    .arg(&self.mnt);
                c
            }
        }
    }

    /// Mounts (panics if already mounted or if the mount does not come up).
    pub fn mount(&mut self) {
        self.mount_with(|_| {});
    }

    /// Mounts with the mount command changed by `tweak` first (an environment variable, a
    /// `pre_exec` hook); panics like [`Fixture::mount`].
    pub fn mount_with(&mut self, tweak: impl FnOnce(&mut Command)) {
        assert!(self.mount.is_none(), "already mounted");
        let mut cmd = self.mount_command();
        tweak(&mut cmd);
        run_ok(&mut cmd);
        self.adopt_mount();
    }

    /// Takes ownership of a mount the test made at `self.mnt` (asserts it is ready).
    pub fn adopt_mount(&mut self) {
        assert!(self.mount.is_none(), "already mounted");
        // Guard first, so a readiness failure still unmounts whatever is there.
        self.mount = Some(MountGuard {
            mnt: self.mnt.clone(),
        });
        assert!(
            is_mounted(&self.mnt),
            "mount command returned but {} is not a mountpoint (st_dev equals its parent's)",
            self.mnt.display()
        );
    }

    /// Unmounts, waits for the serving daemon (if any) to exit, and checks the lower layers
    /// are unchanged. Waiting makes a following mount at the same place independent of the old
    /// daemon's shutdown (see the overlay_cli test on that).
    pub fn unmount(&mut self) {
        let guard = self.mount.take().expect("not mounted");
        let pids = daemon_pids(&self.mnt);
        guard.unmount_checked();
        for pid in pids {
            assert!(
                wait_exit(pid, 10_000),
                "daemon {pid} still running 10 s after umount"
            );
        }
        self.assert_lower_unchanged();
    }

    /// Unmounts and mounts again at once, without waiting for the old daemon to exit, as
    /// xfstests' `_test_cycle_mount` does.
    pub fn cycle_mount(&mut self) {
        let guard = self.mount.take().expect("not mounted");
        guard.unmount_checked();
        self.mount();
    }

    /// Unmount and mount again on the same upper (persistence checks).
    pub fn remount(&mut self) {
        self.unmount();
        self.mount();
    }

    /// Unmounts the implementation under test, mounts kernel overlayfs over the same lower and
    /// upper dirs (with a fresh workdir) at the same mountpoint, runs `check` on it, then
    /// mounts the implementation under test again. Proves the upper dir uses the kernel's
    /// encoding of whiteouts, opaque directories and renames.
    pub fn with_kernel_view(&mut self, check: impl FnOnce(&Fixture)) {
        self.unmount();
        let kwork = self.work.with_file_name("kernel-work");
        fs::create_dir_all(&kwork).unwrap();
        let opts = self.options_with_work(&kwork);
        // Fails here when kernel overlayfs refuses the upper dir (not in its encoding).
        run_ok(
            Command::new("mount")
                .args(["-t", "overlay", "overlay", "-o", &opts])
                .arg(&self.mnt),
        );
        self.adopt_mount();
        check(self);
        self.unmount();
        // Kernel overlayfs leaves its own scratch dirs in the workdir only.
        fs::remove_dir_all(&kwork).unwrap();
        self.mount();
    }

    /// Drops the guard of a mount the test already ended itself (e.g. with fusermount3 -u).
    pub fn forget_mount(&mut self) {
        if let Some(g) = self.mount.take() {
            drop(g); // unmounts if it is still there
        }
        self.assert_lower_unchanged();
    }

    pub fn is_mounted(&self) -> bool {
        self.mount.is_some()
    }

    /// Panics if a lower layer differs from its fingerprint taken before mounting.
    pub fn assert_lower_unchanged(&self) {
        for (l, before) in self.lowers.iter().zip(&self.lower_print) {
            let now = tree_fingerprint(l);
            if let Some(diff) = first_difference(before, &now) {
                panic!("lower {} was modified: {diff}", l.display());
            }
        }
    }
}

impl Drop for Fixture {
    fn drop(&mut self) {
        if let Some(g) = self.mount.take() {
            drop(g);
        }
        if std::thread::panicking() {
            return;
        }
        self.assert_lower_unchanged();
    }
}

/// A live mount; dropping it unmounts (`umount`, then `umount -l`).
pub struct MountGuard {
    mnt: PathBuf,
}

impl MountGuard {
    fn unmount_checked(self) {
        let mnt = self.mnt.clone();
        std::mem::forget(self);
        let mut out = Command::new("umount").arg(&mnt).output().expect("umount");
        // A forked child of a concurrent test may briefly hold an inherited fd: retry a few
        // times before giving up.
        for _ in 0..5 {
            if out.status.success() {
                break;
            }
            std::thread::sleep(std::time::Duration::from_millis(100));
            out = Command::new("umount").arg(&mnt).output().expect("umount");
        }
        if !out.status.success() {
            lazy_umount(&mnt);
            panic!(
                "umount {} failed: {} (lazily unmounted)",
                mnt.display(),
                String::from_utf8_lossy(&out.stderr).trim()
            );
        }
        assert!(
            !is_mounted(&mnt),
            "{} still mounted after umount",
            mnt.display()
        );
    }
}

impl Drop for MountGuard {
    fn drop(&mut self) {
        let ok = Command::new("umount")
            .arg(&self.mnt)
            .output()
            .map(|o| o.status.success())
            .unwrap_or(false);
        if !ok || is_mounted(&self.mnt) {
            lazy_umount(&self.mnt);
        }
    }
}

/// Lines of /proc/mounts whose mountpoint is exactly `p`.
pub fn mounts_at(p: &Path) -> usize {
    let text = fs::read_to_string("/proc/mounts").unwrap();
    let want = p.display().to_string();
    text.lines()
        .filter(|l| l.split(' ').nth(1) == Some(want.as_str()))
        .count()
}

// ---------------------------------------------------------------------------------------------
// Tree fingerprints (lower never modified)

/// Per path: type, mode, owner, size, mtime/ctime (ns), inode, rdev, symlink target, xattrs,
/// and a blake3 of regular file contents.
pub type Fingerprint = BTreeMap<PathBuf, String>;

pub fn tree_fingerprint(root: &Path) -> Fingerprint {
    let mut out = BTreeMap::new();
    walk(root, root, &mut out);
    out
}

fn walk(root: &Path, p: &Path, out: &mut Fingerprint) {
    let m = fs::symlink_metadata(p).unwrap_or_else(|e| panic!("lstat {}: {e}", p.display()));
    let ft = m.file_type();
    let mut desc = format!(
        "mode={:o} uid={} gid={} size={} mtime={}.{} ctime={}.{} ino={} rdev={} nlink={}",
        m.mode(),
        m.uid(),
        m.gid(),
        m.size(),
        m.mtime(),
        m.mtime_nsec(),
        m.ctime(),
        m.ctime_nsec(),
        m.ino(),
        m.rdev(),
        m.nlink()
    );
    if ft.is_symlink() {
        desc += &format!(" target={:?}", fs::read_link(p).unwrap());
    }
    for (k, v) in list_xattrs(p) {
        desc += &format!(" xattr:{}={:?}", k.to_string_lossy(), v);
    }
    if ft.is_file() {
        // O_NOATIME (we are root, or own the fixture): fingerprinting leaves atimes alone, so
        // a test can tell whether the overlay's own reads touched them.
        let mut f = fs::OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_NOATIME)
            .open(p)
            .or_else(|_| fs::File::open(p))
            .unwrap();
        let mut h = blake3::Hasher::new();
        let mut buf = vec![0u8; 1 << 20];
        loop {
            let n = f.read(&mut buf).unwrap();
            if n == 0 {
                break;
            }
            h.update(&buf[..n]);
        }
        desc += &format!(" blake3={}", h.finalize().to_hex());
    }
    out.insert(p.strip_prefix(root).unwrap().to_path_buf(), desc);
    if ft.is_dir() {
        // Listed through an O_NOATIME fd too, so the directory's atime stays.
        let d = fs::OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_NOATIME | libc::O_DIRECTORY)
            .open(p)
            .or_else(|_| fs::File::open(p))
            .unwrap();
        let mut names: Vec<std::ffi::OsString> = rustix::fs::Dir::read_from(&d)
            .unwrap()
            .map(|e| std::ffi::OsStr::from_bytes(e.unwrap().file_name().to_bytes()).to_owned())
            .filter(|n| n != "." && n != "..")
            .collect();
        names.sort();
        for n in names {
            walk(root, &p.join(n), out);
        }
    }
}

fn first_difference(a: &Fingerprint, b: &Fingerprint) -> Option<String> {
    for (k, v) in a {
        match b.get(k) {
            None => return Some(format!("{} disappeared", k.display())),
            Some(w) if w != v => return Some(format!("{} changed: {v} -> {w}", k.display())),
            _ => {}
        }
    }
    b.keys()
        .find(|k| !a.contains_key(*k))
        .map(|k| format!("{} appeared", k.display()))
}

// ---------------------------------------------------------------------------------------------
// Small syscall helpers

pub fn cstr(p: &Path) -> CString {
    CString::new(p.as_os_str().as_bytes()).unwrap()
}

/// The errno of the last failed libc call.
pub fn errno() -> i32 {
    io::Error::last_os_error().raw_os_error().unwrap_or(0)
}

/// `lstat` errno, or 0 when it exists.
pub fn lstat_errno(p: &Path) -> i32 {
    match fs::symlink_metadata(p) {
        Ok(_) => 0,
        Err(e) => e.raw_os_error().unwrap_or(-1),
    }
}

pub fn assert_enoent(p: &Path) {
    let e = lstat_errno(p);
    assert_eq!(
        e,
        libc::ENOENT,
        "{}: want ENOENT, got errno {e}",
        p.display()
    );
}

pub fn list_xattrs(p: &Path) -> Vec<(OsString, Vec<u8>)> {
    let c = cstr(p);
    // SAFETY: c is a valid C string; a null buffer with size 0 asks for the needed size.
    let n = unsafe { libc::llistxattr(c.as_ptr(), std::ptr::null_mut(), 0) };
    if n <= 0 {
        return Vec::new();
    }
    let mut buf = vec![0u8; n as usize];
    // SAFETY: buf is writable for buf.len() bytes.
    let n = unsafe { libc::llistxattr(c.as_ptr(), buf.as_mut_ptr().cast(), buf.len()) };
    assert!(
        n >= 0,
        "llistxattr {}: {}",
        p.display(),
        io::Error::last_os_error()
    );
    let mut out = Vec::new();
    for name in buf[..n as usize]
        .split(|b| *b == 0)
        .filter(|s| !s.is_empty())
    {
        let v = get_xattr(p, OsStr::from_bytes(name)).unwrap_or_default();
        out.push((OsStr::from_bytes(name).to_owned(), v));
    }
    out.sort();
    out
}

pub fn get_xattr(p: &Path, name: impl AsRef<OsStr>) -> Option<Vec<u8>> {
    let c = cstr(p);
    let n = CString::new(name.as_ref().as_bytes()).unwrap();
    let mut buf = vec![0u8; 65536];
    // SAFETY: valid C strings; buf is writable for its length.
    let r = unsafe { libc::lgetxattr(c.as_ptr(), n.as_ptr(), buf.as_mut_ptr().cast(), buf.len()) };
    if r < 0 {
        return None;
    }
    buf.truncate(r as usize);
    Some(buf)
}

pub fn set_xattr(p: &Path, name: &str, value: &[u8]) -> io::Result<()> {
    let c = cstr(p);
    let n = CString::new(name).unwrap();
    // SAFETY: valid C strings and a readable value buffer.
    let r = unsafe {
        libc::lsetxattr(
            c.as_ptr(),
            n.as_ptr(),
            value.as_ptr().cast(),
            value.len(),
            0,
        )
    };
    if r < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(())
    }
}

/// Sets atime and mtime (seconds, nanoseconds) without following symlinks.
pub fn set_times(p: &Path, atime: (i64, i64), mtime: (i64, i64)) {
    let c = cstr(p);
    let ts = [
        libc::timespec {
            tv_sec: atime.0,
            tv_nsec: atime.1,
        },
        libc::timespec {
            tv_sec: mtime.0,
            tv_nsec: mtime.1,
        },
    ];
    // SAFETY: valid C string and a two-element timespec array.
    let r = unsafe {
        libc::utimensat(
            libc::AT_FDCWD,
            c.as_ptr(),
            ts.as_ptr(),
            libc::AT_SYMLINK_NOFOLLOW,
        )
    };
    assert_eq!(
        r,
        0,
        "utimensat {}: {}",
        p.display(),
        io::Error::last_os_error()
    );
}

pub fn chown(p: &Path, uid: u32, gid: u32) {
    std::os::unix::fs::lchown(p, Some(uid), Some(gid)).unwrap();
}

pub fn chmod(p: &Path, mode: u32) {
    fs::set_permissions(p, fs::Permissions::from_mode(mode)).unwrap();
}

pub fn read(p: &Path) -> String {
    fs::read_to_string(p).unwrap_or_else(|e| panic!("read {}: {e}", p.display()))
}

/// Runs `sh -c script` in `dir`; panics with its output unless it succeeds; returns stdout.
#[track_caller]
pub fn sh(dir: &Path, script: &str) -> String {
    let out = run_ok(&mut sh_command(dir, script));
    String::from_utf8_lossy(&out.stdout).into_owned()
}

pub fn sh_output(dir: &Path, script: &str) -> Output {
    sh_command(dir, script).output().expect("spawn sh")
}

fn sh_command(dir: &Path, script: &str) -> Command {
    let mut c = Command::new("sh");
    c.arg("-c").arg(script).current_dir(dir);
    c
}

/// True when the upper entry at `p` is a whiteout (kernel overlayfs encoding: char dev 0/0).
pub fn is_whiteout(p: &Path) -> bool {
    use std::os::unix::fs::FileTypeExt;
    fs::symlink_metadata(p)
        .map(|m| m.file_type().is_char_device() && m.rdev() == 0)
        .unwrap_or(false)
}

/// True when the upper directory at `p` is marked opaque (`trusted.overlay.opaque=y`).
pub fn is_opaque(p: &Path) -> bool {
    get_xattr(p, "trusted.overlay.opaque").as_deref() == Some(b"y")
        || get_xattr(p, "user.overlay.opaque").as_deref() == Some(b"y")
}

/// Pids of processes whose command line ends with the mountpoint `mnt` and names an overlay
/// (the FUSE daemons serving it: `layercache overlay … MNT`, `fuse-overlayfs … MNT`).
pub fn daemon_pids(mnt: &Path) -> Vec<i32> {
    let want = mnt.as_os_str().as_bytes();
    let mut out = Vec::new();
    for e in fs::read_dir("/proc").unwrap().flatten() {
        let Ok(pid) = e.file_name().to_string_lossy().parse::<i32>() else {
            continue;
        };
        let Ok(cmd) = fs::read(e.path().join("cmdline")) else {
            continue;
        };
        let args: Vec<&[u8]> = cmd.split(|b| *b == 0).filter(|a| !a.is_empty()).collect();
        let overlay = args
            .iter()
            .any(|a| *a == b"overlay" || *a == b"overlay-daemon" || a.ends_with(b"fuse-overlayfs"));
        if overlay && args.last() == Some(&want) {
            out.push(pid);
        }
    }
    out
}

/// Waits (pidfd + poll, no sleeping) up to `ms` for process `pid` to exit; true when it has.
pub fn wait_exit(pid: i32, ms: i32) -> bool {
    // SAFETY: pidfd_open takes a pid and flags and returns a new fd or -1.
    let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid, 0) } as i32;
    if fd < 0 {
        return errno() == libc::ESRCH; // already gone
    }
    let mut p = libc::pollfd {
        fd,
        events: libc::POLLIN,
        revents: 0,
    };
    // SAFETY: one valid pollfd.
    let r = unsafe { libc::poll(&mut p, 1, ms) };
    // SAFETY: fd is ours.
    unsafe { libc::close(fd) };
    r == 1
}
