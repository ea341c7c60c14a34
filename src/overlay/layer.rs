//! What a layer of the stack must answer, and today's kind of layer, a directory tree.
//!
//! [`Layer`] is the read side of one layer, addressed by paths relative to its root (`.` for
//! the root): what a name is (`stat`), whether it is whited out or an opaque directory (the
//! markers of [`super::whiteout`], read in the layer's own encoding), the data of a file
//! (`open` for reading), a symlink's target, xattrs, a directory's names, and a directory
//! opened for a run of lookups in it ([`LayerDir`], what a READDIRPLUS resolves its names
//! through). The merge rules ([`super::stack`]) and everything above them read lower layers
//! only through it, so another kind of lower layer — one served from a manifest whose file
//! content arrives on first open — is a new implementation, not a change to the engine.
//! Writes (the upper dir and the workdir) stay with [`DirTree`] itself.
//!
//! Compare fuse-backend-rs's overlay `Layer` trait (src/overlayfs/layer.rs), where each layer
//! is a whole FUSE filesystem addressed by inode and the whiteout and opaque tests are default
//! methods over its lookup and getxattr; here a layer is addressed by path, as the engine's
//! node table is, and says itself how its markers are encoded.
//!
//! [`DirTree`] is a directory of the host opened once (`O_DIRECTORY`), read with the `*at`
//! syscalls relative to it; [`FdDir`] is one of its directories opened for a run of lookups.
//! One virtual call per layer and request, no allocation on the LOOKUP/GETATTR/READ paths.

use std::ffi::{CStr, CString, OsStr, OsString};
use std::fs::File;
use std::io;
use std::os::fd::{AsFd, AsRawFd, OwnedFd, RawFd};
use std::os::unix::ffi::OsStrExt;
use std::sync::OnceLock;
use std::sync::atomic::{AtomicBool, Ordering::Relaxed};

use super::whiteout;
use crate::sys::{self, Xattrs};

/// The read side of one layer of the stack (see the module docs). Paths are relative to the
/// layer's root and never start with `/`; no call follows a last symlink.
pub trait Layer: Send + Sync {
    /// The `stat` of `rel` (`fstatat(…, AT_SYMLINK_NOFOLLOW)`'s fields).
    ///
    /// Errors: `ENOENT`/`ENOTDIR` when absent, or the layer's errno.
    fn stat(&self, rel: &CStr) -> io::Result<libc::stat>;

    /// Whether the layer records a whiteout of `rel` ([`whiteout::whited_out`]'s rule): `st`
    /// is `rel`'s own `stat` when it exists (a 0/0 device is a whiteout), `None` to ask for a
    /// `.wh.` marker beside the absent name.
    ///
    /// Errors: the layer's errno other than `ENOENT`/`ENOTDIR` (which mean no).
    fn whited_out(&self, rel: &CStr, st: Option<&libc::stat>) -> io::Result<bool>;

    /// Whether the directory `rel` is opaque ([`whiteout::dir_is_opaque_at`]'s rule).
    ///
    /// Errors: as [`whiteout::dir_is_opaque_at`].
    fn is_opaque(&self, rel: &CStr) -> io::Result<bool>;

    /// Opens `rel` with open(2) `flags` (plus `O_CLOEXEC | O_NOFOLLOW`): the data of a file
    /// for reading, or a directory. A layer that fetches content does it here, before it
    /// returns.
    ///
    /// Errors: the `openat` errno (`ENOENT`, `ELOOP` for a symlink, `EROFS`…).
    fn open(&self, rel: &CStr, flags: libc::c_int) -> io::Result<File>;

    /// Opens the file `rel` for READs (`flags` as [`Layer::open`]'s): the file those READs
    /// are served from, which may still be arriving — then with the [`ReadGate`] every read
    /// of it waits on first. A copy-up never reads through this: it uses [`Layer::open`], which
    /// returns only once every byte is there. The default is [`Layer::open`]'s file, complete,
    /// its `fstat` the file's metadata.
    ///
    /// Errors: as [`Layer::open`].
    fn open_data(&self, rel: &CStr, flags: libc::c_int) -> io::Result<LowerData> {
        Ok(LowerData {
            file: self.open(rel, flags)?,
            gate: None,
            fstat_is_meta: true,
        })
    }

    /// The target of the symlink `rel`, in bytes.
    ///
    /// Errors: the `readlinkat` errno (`EINVAL` for a non-symlink).
    fn readlink(&self, rel: &CStr) -> io::Result<Vec<u8>>;

    /// The value of xattr `name` of `rel` into `buf`, its length returned; an empty `buf` asks
    /// only the length.
    ///
    /// Errors: as [`Xattrs::get_into`] (`ENODATA` when absent, `ERANGE` when `buf` is short).
    fn xattr(&self, rel: &CStr, name: &CStr, buf: &mut [u8]) -> io::Result<usize>;

    /// The xattr names of `rel`, in the order the layer lists them.
    ///
    /// Errors: as [`Xattrs::names`].
    fn xattr_names(&self, rel: &CStr) -> io::Result<Vec<Vec<u8>>>;

    /// `statx(2)` of `rel` for the fields of `mask` (what a STATX asks beyond `stat`: the
    /// birth time).
    ///
    /// Errors: the `statx` errno.
    fn statx(&self, rel: &CStr, mask: u32) -> io::Result<libc::statx>;

    /// `fstatvfs(2)` of the filesystem the layer is on (what STATFS answers without an upper).
    ///
    /// Errors: the `fstatvfs` errno.
    fn statvfs(&self) -> io::Result<libc::statvfs>;

    /// The directory `rel` opened for a run of lookups and one listing in it; `None` when
    /// `rel` is absent or not a directory.
    ///
    /// Errors: the layer's errno other than `ENOENT`/`ENOTDIR`.
    fn open_dir(&self, rel: &CStr) -> io::Result<Option<Box<dyn LayerDir>>>;

    /// This layer read through a private noatime view of it ([`crate::sys::noatime_view`]),
    /// so that files opened there — FUSE passthrough backing files included, which the kernel
    /// opens with the reader's flags — never write an atime; with the view's mount fd, to be
    /// kept for the life of the layer. `None` where the layer has no mount to view (it then
    /// never writes atimes itself).
    ///
    /// Errors: the errno of making the view.
    fn noatime_view(&self) -> io::Result<Option<(OwnedFd, Box<dyn Layer>)>>;
}

/// A lower file opened for READs ([`Layer::open_data`]).
pub struct LowerData {
    /// The file READs are served from (`pread` at the file's own offsets).
    pub file: File,
    /// What every read of `file` waits on first while its bytes are still arriving; `None`
    /// when the file is complete.
    pub gate: Option<std::sync::Arc<dyn ReadGate>>,
    /// Whether `fstat` of `file` gives the layer file's metadata (mode, owner, times): true for
    /// a directory tree's own file; false where the bytes are kept in a file of another shape
    /// (a lazily fetched object), whose metadata then comes from [`Layer::stat`].
    pub fstat_is_meta: bool,
}

/// The readiness of a lower file whose bytes arrive while it is read ([`LowerData::gate`]):
/// the file has its final size from the start; a byte range is readable once the layer has
/// written and verified it there.
pub trait ReadGate: Send + Sync {
    /// Blocks until bytes `offset..offset + len` of the file (clipped at its size; nothing past
    /// it) are in place and verified.
    ///
    /// Errors: `EIO` when they cannot be had within the layer's bound (the layer logs why).
    fn ready(&self, offset: u64, len: u64) -> io::Result<()>;

    /// Whether every byte of the file is in place (a passthrough open may then be given).
    fn complete(&self) -> bool;
}

/// Makes a lower layer from its description ([`super::options::MadeLower::spec`]): the
/// remote tier's lazily fetched layer is one. Set once per process with [`set_layer_maker`].
///
/// Errors: the maker's, as an errno-carrying `io::Error` (the mount then fails).
pub type LayerMaker = fn(&serde_json::Value) -> io::Result<Box<dyn Layer>>;

static MAKER: OnceLock<LayerMaker> = OnceLock::new();

/// Sets the maker of this process's made lowers (the daemon's entry sets it before mounting);
/// a second call is ignored.
pub fn set_layer_maker(maker: LayerMaker) {
    let _ = MAKER.set(maker);
}

/// What made layers must do before the daemon exits (write what they recorded); run by
/// [`run_exit_hooks`].
type ExitHook = Box<dyn Fn() + Send + Sync>;

static EXIT_HOOKS: parking_lot::Mutex<Vec<ExitHook>> = parking_lot::Mutex::new(Vec::new());

/// Registers `hook` to run once before the daemon exits, by any of its ways out (the session
/// ended, a signal, the owner's exit).
pub fn on_daemon_exit(hook: Box<dyn Fn() + Send + Sync>) {
    EXIT_HOOKS.lock().push(hook);
}

/// Held while [`run_exit_hooks`] runs them.
static EXIT_HOOKS_RUNNING: parking_lot::Mutex<()> = parking_lot::Mutex::new(());

/// Runs (and forgets) the hooks of [`on_daemon_exit`]. A second caller waits until the first
/// has run them all: the daemon's ways out race (the session ends on the main thread as the
/// signal thread gets SIGUSR1, `EXIT_NOW` in daemon.rs), and the one that finds no hook left exits
/// the process, which must not cut the other's hooks short.
pub(super) fn run_exit_hooks() {
    let _running = EXIT_HOOKS_RUNNING.lock();
    let hooks = std::mem::take(&mut *EXIT_HOOKS.lock());
    for h in hooks {
        h();
    }
}

/// The layer `spec` describes, made by the process's [`LayerMaker`].
///
/// Errors: `EOPNOTSUPP` when no maker is set; the maker's error.
pub(super) fn make_layer(spec: &serde_json::Value) -> io::Result<Box<dyn Layer>> {
    match MAKER.get() {
        Some(make) => make(spec),
        None => Err(io::Error::new(
            io::ErrorKind::Unsupported,
            "this process cannot make a lower layer from a description",
        )),
    }
}

/// One directory of a layer, opened for a run of lookups of its names and one listing (see
/// [`Layer::open_dir`]); names are single components.
pub trait LayerDir {
    /// The `stat` of `name` in this directory; `None` when absent.
    ///
    /// Errors: the layer's errno other than `ENOENT`/`ENOTDIR`.
    fn stat(&self, name: &CStr) -> io::Result<Option<libc::stat>>;

    /// Whether this directory holds a `.wh.` marker of the absent `name`.
    ///
    /// Errors: as [`Layer::whited_out`].
    fn marked(&self, name: &CStr) -> io::Result<bool>;

    /// Whether `name`, a directory in this directory, is opaque.
    ///
    /// Errors: as [`Layer::is_opaque`].
    fn is_opaque(&self, name: &CStr) -> io::Result<bool>;

    /// Every name of this directory with its `d_type` (`DT_UNKNOWN` possible), without `.`
    /// and `..`; `again` when it was listed before (the listing starts over).
    ///
    /// Errors: the layer's errno of reading the directory.
    fn names(&self, again: bool) -> io::Result<Vec<(OsString, u8)>>;
}

/// A layer that is a directory tree of the host, opened once: the upper dir, the workdir and
/// every lower dir of a mount today.
pub struct DirTree {
    fd: OwnedFd,
    /// A lower layer: read-only opens add `O_NOATIME` (reading it never writes its atimes, as
    /// on kernel overlayfs).
    lower: bool,
    /// Set once an `O_NOATIME` open was refused (`EPERM`: the daemon neither owns the file nor
    /// has `CAP_FOWNER`, as a non-root daemon over a store layer's 0:0 files): later opens go
    /// without it instead of paying a refused `openat` each.
    noatime_refused: AtomicBool,
}

impl DirTree {
    /// The tree whose root is open at `fd`; a `lower` one opens its files `O_NOATIME`.
    pub fn new(fd: OwnedFd, lower: bool) -> DirTree {
        DirTree {
            fd,
            lower,
            noatime_refused: AtomicBool::new(false),
        }
    }

    /// The root's directory fd, for the `*at` syscalls that write (upper dir and workdir).
    pub fn fd(&self) -> RawFd {
        self.fd.as_raw_fd()
    }

    /// The root's directory fd, borrowed (to make a view of its mount).
    pub fn root(&self) -> std::os::fd::BorrowedFd<'_> {
        self.fd.as_fd()
    }

    /// `/proc/self/fd/<root>/<rel>`: a path for the xattr syscalls that have no `*at` form.
    pub fn proc_path(&self, rel: &CStr) -> CString {
        proc_path(self.fd(), rel)
    }
}

/// `/proc/self/fd/<fd>/<rel>`.
pub(super) fn proc_path(fd: RawFd, rel: &CStr) -> CString {
    let mut s = format!("/proc/self/fd/{fd}/").into_bytes();
    s.extend_from_slice(rel.to_bytes());
    CString::new(s).expect("no interior NUL")
}

impl Layer for DirTree {
    fn stat(&self, rel: &CStr) -> io::Result<libc::stat> {
        fstatat(self.fd(), rel)
    }

    fn whited_out(&self, rel: &CStr, st: Option<&libc::stat>) -> io::Result<bool> {
        whiteout::whited_out(self.fd(), rel, st)
    }

    fn is_opaque(&self, rel: &CStr) -> io::Result<bool> {
        whiteout::dir_is_opaque_at(self.fd(), rel)
    }

    fn open(&self, rel: &CStr, flags: libc::c_int) -> io::Result<File> {
        self.open_mode(rel, flags, 0)
    }

    fn readlink(&self, rel: &CStr) -> io::Result<Vec<u8>> {
        sys::readlinkat(self.fd(), rel)
    }

    fn xattr(&self, rel: &CStr, name: &CStr, buf: &mut [u8]) -> io::Result<usize> {
        Xattrs::Path(&self.proc_path(rel)).get_into(name, buf)
    }

    fn xattr_names(&self, rel: &CStr) -> io::Result<Vec<Vec<u8>>> {
        Xattrs::Path(&self.proc_path(rel)).names()
    }

    fn statx(&self, rel: &CStr, mask: u32) -> io::Result<libc::statx> {
        let flags = libc::AT_SYMLINK_NOFOLLOW | libc::AT_STATX_SYNC_AS_STAT;
        sys::statx(self.fd(), rel, flags, mask)
    }

    fn statvfs(&self) -> io::Result<libc::statvfs> {
        sys::fstatvfs(&self.fd())
    }

    fn open_dir(&self, rel: &CStr) -> io::Result<Option<Box<dyn LayerDir>>> {
        match self.open_mode(rel, libc::O_RDONLY | libc::O_DIRECTORY, 0) {
            Ok(f) => Ok(Some(Box::new(FdDir(OwnedFd::from(f))))),
            Err(e) if matches!(e.raw_os_error(), Some(libc::ENOENT) | Some(libc::ENOTDIR)) => {
                Ok(None)
            }
            Err(e) => Err(e),
        }
    }

    fn noatime_view(&self) -> io::Result<Option<(OwnedFd, Box<dyn Layer>)>> {
        let (view, dir) = sys::noatime_view(self.fd.as_fd())?;
        let tree = DirTree {
            fd: dir,
            lower: self.lower,
            noatime_refused: AtomicBool::new(self.noatime_refused.load(Relaxed)),
        };
        Ok(Some((view, Box::new(tree))))
    }
}

impl DirTree {
    /// `openat(root, rel, flags | O_CLOEXEC | O_NOFOLLOW, mode)` as a `File`; a read-only
    /// open in a lower layer adds `O_NOATIME` where allowed (the owner or `CAP_FOWNER`; after
    /// one refusal the tree stops asking).
    ///
    /// Errors: the `openat` errno.
    pub fn open_mode(
        &self,
        rel: &CStr,
        flags: libc::c_int,
        mode: libc::mode_t,
    ) -> io::Result<File> {
        let at = |flags: libc::c_int| {
            sys::openat(
                self.fd(),
                rel,
                flags | libc::O_CLOEXEC | libc::O_NOFOLLOW,
                mode,
            )
        };
        // A lower layer is read-only: reading it (data, listings, copy-up) never writes its
        // atimes, as on kernel overlayfs. O_NOATIME needs the file's owner or CAP_FOWNER.
        let noatime = self.lower
            && flags & libc::O_ACCMODE == libc::O_RDONLY
            && !self.noatime_refused.load(Relaxed);
        let fd = if noatime {
            match at(flags | libc::O_NOATIME) {
                Err(e) if e.raw_os_error() == Some(libc::EPERM) => {
                    self.noatime_refused.store(true, Relaxed);
                    at(flags)
                }
                r => r,
            }
        } else {
            at(flags)
        }?;
        Ok(File::from(fd))
    }
}

/// A directory of a [`DirTree`] opened for a run of lookups: one `fstatat` (or marker test)
/// per name relative to it, one `getdents64` pass for its listing.
pub struct FdDir(OwnedFd);

impl LayerDir for FdDir {
    fn stat(&self, name: &CStr) -> io::Result<Option<libc::stat>> {
        stat_at(self.0.as_raw_fd(), name)
    }

    fn marked(&self, name: &CStr) -> io::Result<bool> {
        whiteout::whited_out(self.0.as_raw_fd(), name, None)
    }

    fn is_opaque(&self, name: &CStr) -> io::Result<bool> {
        whiteout::dir_is_opaque_at(self.0.as_raw_fd(), name)
    }

    fn names(&self, again: bool) -> io::Result<Vec<(OsString, u8)>> {
        read_dir_fd(self.0.as_raw_fd(), again)
    }
}

/// `fstatat(dir, name, AT_SYMLINK_NOFOLLOW)`. Errors: its errno.
pub(super) fn fstatat(dir: RawFd, name: &CStr) -> io::Result<libc::stat> {
    sys::fstatat(dir, name, libc::AT_SYMLINK_NOFOLLOW)
}

/// [`fstatat`], `Ok(None)` for `ENOENT`/`ENOTDIR`.
pub(super) fn stat_at(dir: RawFd, name: &CStr) -> io::Result<Option<libc::stat>> {
    match fstatat(dir, name) {
        Ok(st) => Ok(Some(st)),
        Err(e) if matches!(e.raw_os_error(), Some(libc::ENOENT) | Some(libc::ENOTDIR)) => Ok(None),
        Err(e) => Err(e),
    }
}

/// Bytes of one `getdents64` call's buffer (on the stack).
const DENTS_BUF: usize = 16 << 10;

/// Every name of the directory open at `fd`, read from its start with `getdents64(2)`, with its
/// `d_type` (`DT_UNKNOWN` possible), without `.` and `..`.
///
/// Errors: the `lseek`/`getdents64` errno.
fn read_dir_fd(fd: RawFd, rewind: bool) -> io::Result<Vec<(OsString, u8)>> {
    if rewind {
        sys::lseek(&fd, 0, libc::SEEK_SET)?;
    }
    let mut buf = [0u8; DENTS_BUF];
    let mut out = Vec::new();
    loop {
        let n = sys::getdents64(fd, &mut buf)?;
        if n == 0 {
            return Ok(out);
        }
        let mut off = 0usize;
        // struct linux_dirent64 { u64 d_ino; i64 d_off; u16 d_reclen; u8 d_type; char d_name[]; }
        while off + 19 <= n {
            let reclen = u16::from_ne_bytes([buf[off + 16], buf[off + 17]]) as usize;
            if reclen == 0 || off + reclen > n {
                return Err(io::Error::from_raw_os_error(libc::EIO));
            }
            let dtype = buf[off + 18];
            let name = &buf[off + 19..off + reclen];
            let name = &name[..name.iter().position(|&b| b == 0).unwrap_or(name.len())];
            if name != b"." && name != b".." {
                out.push((OsStr::from_bytes(name).to_os_string(), dtype));
            }
            off += reclen;
        }
    }
}
