//! Layer roots (directory fds opened before mounting) and checks of the upper filesystem.

use crate::sys::check;
use std::path::Path;

use crate::error::{Error, Result};

/// Checks that the upper/work filesystem supports what the overlay needs: d_type, xattrs
/// (`trusted.*` as root), whiteouts (mknod of a 0/0 character device) and rename.
///
/// Errors: [`Error::Invalid`] naming the upperdir and the missing feature.
pub fn probe_upper(upper: &Path, work: &Path) -> Result<()> {
    let _ = upper;
    let probe = work.join(".layercache-probe");
    let _ = std::fs::remove_dir_all(&probe);
    std::fs::create_dir(&probe)
        .map_err(|e| Error::invalid(format!("workdir {}: not writable: {e}", work.display())))?;
    let result = (|| -> std::result::Result<(), String> {
        let dir = std::fs::File::open(&probe).map_err(|e| e.to_string())?;
        use std::os::fd::AsFd;
        crate::overlay::whiteout::set_opaque(dir.as_fd())
            .map_err(|e| format!("no xattr support ({e})"))?;
        crate::overlay::whiteout::create_whiteout(dir.as_fd(), std::ffi::OsStr::new("wh"))
            .map_err(|e| format!("cannot create whiteouts ({e}); run as root"))?;
        let mut saw_dtype = false;
        for ent in std::fs::read_dir(&probe).map_err(|e| e.to_string())? {
            let ent = ent.map_err(|e| e.to_string())?;
            saw_dtype |= ent
                .file_type()
                .map(|t| {
                    use std::os::unix::fs::FileTypeExt;
                    t.is_char_device()
                })
                .unwrap_or(false);
        }
        if !saw_dtype {
            return Err("no d_type support".into());
        }
        std::fs::rename(probe.join("wh"), probe.join("wh2"))
            .map_err(|e| format!("rename fails ({e})"))?;
        Ok(())
    })();
    let _ = std::fs::remove_dir_all(&probe);
    result.map_err(|why| {
        Error::invalid(format!(
            "upperdir {}: its filesystem cannot hold an overlay upper layer: {why}",
            upper.display()
        ))
    })
}

use std::ffi::{CStr, CString, OsStr, OsString};
use std::fs::File;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::ffi::OsStrExt;

/// Which directory tree a relative path is resolved in.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Layer {
    /// The writable upper dir.
    Upper,
    /// Lower dir number `i` (0 = topmost).
    Lower(u8),
    /// The workdir (copy-up staging, orphans).
    Work,
}

/// Directory fds of every layer, opened before mounting so the daemon never resolves paths
/// through its own mountpoint.
pub struct Roots {
    upper: OwnedFd,
    work: OwnedFd,
    lowers: Vec<OwnedFd>,
}

fn open_dir(p: &Path) -> io::Result<OwnedFd> {
    let c = CString::new(p.as_os_str().as_bytes())
        .map_err(|_| io::Error::from_raw_os_error(libc::EINVAL))?;
    // SAFETY: valid C string; the returned fd is owned below.
    let fd = unsafe {
        libc::open(
            c.as_ptr(),
            libc::O_RDONLY | libc::O_DIRECTORY | libc::O_CLOEXEC,
        )
    };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: fd was just returned by open and is owned by nobody else.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

impl Roots {
    /// Opens the layer roots. Errors: the `open(2)` errno of the first directory that fails.
    pub fn new(lowers: &[std::path::PathBuf], upper: &Path, work: &Path) -> io::Result<Roots> {
        Ok(Roots {
            upper: open_dir(upper)?,
            work: open_dir(work)?,
            lowers: lowers
                .iter()
                .map(|p| open_dir(p))
                .collect::<io::Result<_>>()?,
        })
    }

    /// The directory fd of `layer`.
    pub fn fd(&self, layer: Layer) -> RawFd {
        match layer {
            Layer::Upper => self.upper.as_raw_fd(),
            Layer::Work => self.work.as_raw_fd(),
            Layer::Lower(i) => self.lowers[i as usize].as_raw_fd(),
        }
    }

    /// `fstatat(layer, rel, AT_SYMLINK_NOFOLLOW)`. Errors: its errno (`ENOENT`, `ENOTDIR`…).
    pub fn stat(&self, layer: Layer, rel: &CStr) -> io::Result<libc::stat> {
        let mut st = std::mem::MaybeUninit::<libc::stat>::uninit();
        // SAFETY: valid dirfd, C string and out pointer.
        check(unsafe {
            libc::fstatat(
                self.fd(layer),
                rel.as_ptr(),
                st.as_mut_ptr(),
                libc::AT_SYMLINK_NOFOLLOW,
            )
        })?;
        // SAFETY: fstatat succeeded and filled the struct.
        Ok(unsafe { st.assume_init() })
    }

    /// Like [`Roots::stat`] but `Ok(None)` for `ENOENT`/`ENOTDIR`.
    pub fn stat_opt(&self, layer: Layer, rel: &CStr) -> io::Result<Option<libc::stat>> {
        match self.stat(layer, rel) {
            Ok(st) => Ok(Some(st)),
            Err(e) if matches!(e.raw_os_error(), Some(libc::ENOENT) | Some(libc::ENOTDIR)) => {
                Ok(None)
            }
            Err(e) => Err(e),
        }
    }

    /// `openat(layer, rel, flags | O_CLOEXEC | O_NOFOLLOW, mode)` as a `File`.
    pub fn open(
        &self,
        layer: Layer,
        rel: &CStr,
        flags: libc::c_int,
        mode: libc::mode_t,
    ) -> io::Result<File> {
        // SAFETY: valid dirfd and C string.
        let fd = check(unsafe {
            libc::openat(
                self.fd(layer),
                rel.as_ptr(),
                flags | libc::O_CLOEXEC | libc::O_NOFOLLOW,
                mode as libc::c_uint,
            )
        })?;
        // SAFETY: fd is fresh and owned by the File.
        Ok(unsafe { File::from_raw_fd(fd) })
    }

    /// `/proc/self/fd/<root>/<rel>`: a path for the xattr syscalls that have no *at form.
    pub fn proc_path(&self, layer: Layer, rel: &CStr) -> CString {
        let mut s = format!("/proc/self/fd/{}/", self.fd(layer)).into_bytes();
        s.extend_from_slice(rel.to_bytes());
        CString::new(s).expect("no interior NUL")
    }

    /// `mkdirat`. Errors: its errno.
    pub fn mkdir(&self, layer: Layer, rel: &CStr, mode: u32) -> io::Result<()> {
        // SAFETY: valid dirfd and C string.
        check(unsafe { libc::mkdirat(self.fd(layer), rel.as_ptr(), mode as libc::mode_t) })
            .map(drop)
    }

    /// `mknodat`. Errors: its errno.
    pub fn mknod(&self, layer: Layer, rel: &CStr, mode: u32, rdev: u64) -> io::Result<()> {
        // SAFETY: valid dirfd and C string.
        check(unsafe {
            libc::mknodat(
                self.fd(layer),
                rel.as_ptr(),
                mode as libc::mode_t,
                rdev as libc::dev_t,
            )
        })
        .map(drop)
    }

    /// `symlinkat(target, layer, rel)`. Errors: its errno.
    pub fn symlink(&self, target: &CStr, layer: Layer, rel: &CStr) -> io::Result<()> {
        // SAFETY: valid C strings and dirfd.
        check(unsafe { libc::symlinkat(target.as_ptr(), self.fd(layer), rel.as_ptr()) }).map(drop)
    }

    /// `readlinkat`. Errors: its errno.
    pub fn readlink(&self, layer: Layer, rel: &CStr) -> io::Result<Vec<u8>> {
        let mut buf = vec![0u8; libc::PATH_MAX as usize + 1];
        // SAFETY: buffer valid for its length.
        let n = unsafe {
            libc::readlinkat(
                self.fd(layer),
                rel.as_ptr(),
                buf.as_mut_ptr().cast(),
                buf.len(),
            )
        };
        if n < 0 {
            return Err(io::Error::last_os_error());
        }
        buf.truncate(n as usize);
        Ok(buf)
    }

    /// `unlinkat` (with `AT_REMOVEDIR` when `dir`). Errors: its errno.
    pub fn unlink(&self, layer: Layer, rel: &CStr, dir: bool) -> io::Result<()> {
        let flags = if dir { libc::AT_REMOVEDIR } else { 0 };
        // SAFETY: valid dirfd and C string.
        check(unsafe { libc::unlinkat(self.fd(layer), rel.as_ptr(), flags) }).map(drop)
    }

    /// `renameat2(from_layer/from, to_layer/to, flags)`. Errors: its errno.
    pub fn rename(
        &self,
        fl: Layer,
        from: &CStr,
        tl: Layer,
        to: &CStr,
        flags: u32,
    ) -> io::Result<()> {
        // SAFETY: valid dirfds and C strings.
        check(unsafe {
            libc::renameat2(self.fd(fl), from.as_ptr(), self.fd(tl), to.as_ptr(), flags)
        })
        .map(drop)
    }

    /// `linkat(from_layer/from, to_layer/to, 0)`. Errors: its errno (`EMLINK`…).
    pub fn link(&self, fl: Layer, from: &CStr, tl: Layer, to: &CStr) -> io::Result<()> {
        // SAFETY: valid dirfds and C strings.
        check(unsafe { libc::linkat(self.fd(fl), from.as_ptr(), self.fd(tl), to.as_ptr(), 0) })
            .map(drop)
    }

    /// `fchownat(…, AT_SYMLINK_NOFOLLOW)`; `u32::MAX` leaves an id unchanged. Errors: its errno.
    pub fn chown(&self, layer: Layer, rel: &CStr, uid: u32, gid: u32) -> io::Result<()> {
        // SAFETY: valid dirfd and C string.
        check(unsafe {
            libc::fchownat(
                self.fd(layer),
                rel.as_ptr(),
                uid,
                gid,
                libc::AT_SYMLINK_NOFOLLOW,
            )
        })
        .map(drop)
    }

    /// `fchmodat` (never on a symlink). Errors: its errno.
    pub fn chmod(&self, layer: Layer, rel: &CStr, mode: u32) -> io::Result<()> {
        // SAFETY: valid dirfd and C string.
        check(unsafe { libc::fchmodat(self.fd(layer), rel.as_ptr(), mode as libc::mode_t, 0) })
            .map(drop)
    }

    /// `utimensat(…, AT_SYMLINK_NOFOLLOW)` with [atime, mtime]. Errors: its errno.
    pub fn utimens(&self, layer: Layer, rel: &CStr, times: &[libc::timespec; 2]) -> io::Result<()> {
        // SAFETY: valid dirfd, C string and 2-element array.
        check(unsafe {
            libc::utimensat(
                self.fd(layer),
                rel.as_ptr(),
                times.as_ptr(),
                libc::AT_SYMLINK_NOFOLLOW,
            )
        })
        .map(drop)
    }

    /// Names in the directory `rel` of `layer` with their `d_type` (`DT_UNKNOWN` possible),
    /// without `.` and `..`. Errors: the `openat`/`getdents` errno.
    pub fn read_dir(&self, layer: Layer, rel: &CStr) -> io::Result<Vec<(OsString, u8)>> {
        let dir = self.open(layer, rel, libc::O_RDONLY | libc::O_DIRECTORY, 0)?;
        let fd: OwnedFd = dir.into();
        let mut d = nix::dir::Dir::from_fd(fd).map_err(io::Error::from)?;
        let mut out = Vec::new();
        for ent in d.iter() {
            let ent = ent.map_err(io::Error::from)?;
            let name = ent.file_name().to_bytes();
            if name == b"." || name == b".." {
                continue;
            }
            let dtype = match ent.file_type() {
                Some(nix::dir::Type::Directory) => libc::DT_DIR,
                Some(nix::dir::Type::File) => libc::DT_REG,
                Some(nix::dir::Type::Symlink) => libc::DT_LNK,
                Some(nix::dir::Type::CharacterDevice) => libc::DT_CHR,
                Some(nix::dir::Type::BlockDevice) => libc::DT_BLK,
                Some(nix::dir::Type::Fifo) => libc::DT_FIFO,
                Some(nix::dir::Type::Socket) => libc::DT_SOCK,
                None => libc::DT_UNKNOWN,
            };
            out.push((OsStr::from_bytes(name).to_os_string(), dtype));
        }
        Ok(out)
    }
}
