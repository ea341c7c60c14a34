//! Copy-up: bringing a lower entry into the upper dir before it is changed, preserving data
//! (sparse holes kept, copy_file_range so the kernel moves the bytes), mode, owner, nanosecond
//! timestamps and xattrs (overlay-private ones excepted) — as kernel overlayfs does
//! (Documentation/filesystems/overlayfs.rst, "Non-directories"/"Directories").
//!
//! Every copy is staged under a temporary name in the workdir and renamed into place, so the
//! upper dir never holds a partial copy. The upper parent's timestamps are restored afterwards.

use std::ffi::{CStr, CString};
use std::fs::File;
use std::io;
use std::os::fd::AsFd;
use std::os::unix::ffi::OsStrExt;
use std::path::Path;

use fuser::Errno;

use super::OverlayFs;
use crate::overlay::errno::{OpResult, errno};
use crate::overlay::inode::{Backing, orphan_name};
use crate::overlay::names::CopyState;
use crate::overlay::stack::{Kind, Stack, Tree, top_lower};
use crate::overlay::whiteout;
use crate::sys::{self, Xattrs, child, cstr};

/// Where copy-up reads the xattrs it copies: an open file or directory ([`Xattrs`]), or a
/// symlink or special file of a layer, read through the stack ([`LayerXattrs`]).
trait XattrSource {
    /// Every name. Errors: as [`Xattrs::names`].
    fn names(&self) -> io::Result<Vec<Vec<u8>>>;
    /// The value of `name`. Errors: as [`Xattrs::value`].
    fn value(&self, name: &CStr) -> io::Result<Vec<u8>>;
}

impl XattrSource for Xattrs<'_> {
    fn names(&self) -> io::Result<Vec<Vec<u8>>> {
        Xattrs::names(*self)
    }
    fn value(&self, name: &CStr) -> io::Result<Vec<u8>> {
        Xattrs::value(*self, name)
    }
}

/// The xattrs of `.2` in layer `.1` of the stack `.0` ([`Stack::xattr`]).
struct LayerXattrs<'a>(&'a Stack, Tree, &'a CStr);

impl XattrSource for LayerXattrs<'_> {
    fn names(&self) -> io::Result<Vec<Vec<u8>>> {
        self.0.xattr_names(self.1, self.2)
    }
    fn value(&self, name: &CStr) -> io::Result<Vec<u8>> {
        sys::whole_value(|buf| self.0.xattr(self.1, self.2, name, buf))
    }
}

/// Copies xattrs from `src` to `dst` (fds, or paths for symlinks and special files), skipping
/// overlay-private names. Errors on `user.*` names propagate; other namespaces are best effort
/// (they may need privileges the daemon lacks).
fn copy_xattrs(src: &dyn XattrSource, dst: Xattrs<'_>) -> io::Result<()> {
    for name in src.names()? {
        if whiteout::is_private_xattr(&name) {
            continue;
        }
        let cname = CString::new(name).expect("split at NUL");
        let value = src.value(&cname)?;
        if let Err(e) = dst.set(&cname, &value, 0) {
            if cname.to_bytes().starts_with(b"user.") {
                return Err(e);
            }
            tracing::debug!(name = %cname.to_string_lossy(), error = %e, "xattr not copied up");
        }
    }
    Ok(())
}

/// Copies bytes `[0, len)` of `src` to `dst`, keeping holes (SEEK_DATA/SEEK_HOLE) and letting
/// the kernel move data (copy_file_range, falling back to pread/pwrite across filesystems).
pub fn copy_data(src: &File, dst: &File, len: u64) -> io::Result<()> {
    let mut off: i64 = 0;
    while (off as u64) < len {
        let data = match sys::lseek(src, off, libc::SEEK_DATA) {
            Ok(data) => data,
            Err(e) if e.raw_os_error() == Some(libc::ENXIO) => break,
            Err(e) => return Err(e),
        };
        if data as u64 >= len {
            break;
        }
        let end = match sys::lseek(src, data, libc::SEEK_HOLE) {
            Err(_) => len as i64,
            Ok(hole) => (hole as u64).min(len) as i64,
        };
        copy_range(src, dst, data, end)?;
        off = end;
    }
    dst.set_len(len)
}

fn copy_range(src: &File, dst: &File, start: i64, end: i64) -> io::Result<()> {
    use std::os::unix::fs::FileExt;
    let mut pos = start;
    while pos < end {
        let mut off_in = pos;
        let mut off_out = pos;
        let e =
            match sys::copy_file_range(src, &mut off_in, dst, &mut off_out, (end - pos) as usize) {
                Ok(0) => break, // source shrank
                Ok(n) => {
                    pos += n as i64;
                    continue;
                }
                Err(e) => e,
            };
        match e.raw_os_error() {
            Some(libc::EINTR) => continue,
            Some(libc::EXDEV)
            | Some(libc::ENOSYS)
            | Some(libc::EINVAL)
            | Some(libc::EOPNOTSUPP) => {
                let mut buf = vec![0u8; (1 << 20).min((end - pos) as usize)];
                while pos < end {
                    let want = buf.len().min((end - pos) as usize);
                    let r = src.read_at(&mut buf[..want], pos as u64)?;
                    if r == 0 {
                        break;
                    }
                    dst.write_all_at(&buf[..r], pos as u64)?;
                    pos += r as i64;
                }
                return Ok(());
            }
            _ => return Err(e),
        }
    }
    Ok(())
}

fn times_of(st: &libc::stat) -> [libc::timespec; 2] {
    [
        libc::timespec {
            tv_sec: st.st_atime,
            tv_nsec: st.st_atime_nsec,
        },
        libc::timespec {
            tv_sec: st.st_mtime,
            tv_nsec: st.st_mtime_nsec,
        },
    ]
}

impl OverlayFs {
    /// Stages a copy of `src` (layer `sl`, relative path `srel`, stat `st`) under a temporary
    /// name in the workdir with all metadata, and returns that name. Regular files get bytes
    /// `[0, min(size, limit))`; directories are created empty.
    pub(super) fn stage_copy(
        &self,
        sl: Tree,
        srel: &CStr,
        st: &libc::stat,
        limit: Option<u64>,
    ) -> io::Result<CString> {
        let tmp = self.tmp_name();
        let mode = st.st_mode & 0o7777;
        let result = (|| -> io::Result<()> {
            match Kind::from_mode(st.st_mode) {
                Kind::File => {
                    let src = self.stack.open(sl, srel, libc::O_RDONLY, 0)?;
                    let dst = self.stack.open(
                        Tree::Work,
                        &tmp,
                        libc::O_WRONLY | libc::O_CREAT | libc::O_EXCL,
                        0o600,
                    )?;
                    let len = limit.map_or(st.st_size as u64, |l| l.min(st.st_size as u64));
                    copy_data(&src, &dst, len)?;
                    // Through the layer, not the opened file: a layer served from a manifest
                    // keeps a file's xattrs there, not on its data file.
                    copy_xattrs(&LayerXattrs(&self.stack, sl, srel), Xattrs::Fd(dst.as_fd()))?;
                    self.stack.chown(Tree::Work, &tmp, st.st_uid, st.st_gid)?;
                    self.stack.chmod(Tree::Work, &tmp, mode)?;
                }
                Kind::Dir => {
                    self.stack.mkdir(Tree::Work, &tmp, 0o700)?;
                    let dst =
                        self.stack
                            .open(Tree::Work, &tmp, libc::O_RDONLY | libc::O_DIRECTORY, 0)?;
                    copy_xattrs(&LayerXattrs(&self.stack, sl, srel), Xattrs::Fd(dst.as_fd()))?;
                    self.stack.chown(Tree::Work, &tmp, st.st_uid, st.st_gid)?;
                    self.stack.chmod(Tree::Work, &tmp, mode)?;
                }
                Kind::Symlink => {
                    let target = self.stack.readlink(sl, srel)?;
                    let target = CString::new(target)
                        .map_err(|_| io::Error::from_raw_os_error(libc::EINVAL))?;
                    self.stack.symlink(&target, Tree::Work, &tmp)?;
                    let dp = self.stack.proc_path(Tree::Work, &tmp);
                    copy_xattrs(&LayerXattrs(&self.stack, sl, srel), Xattrs::Path(&dp))?;
                    self.stack.chown(Tree::Work, &tmp, st.st_uid, st.st_gid)?;
                }
                Kind::Special(_) => {
                    self.stack.mknod(Tree::Work, &tmp, st.st_mode, st.st_rdev)?;
                    let dp = self.stack.proc_path(Tree::Work, &tmp);
                    copy_xattrs(&LayerXattrs(&self.stack, sl, srel), Xattrs::Path(&dp))?;
                    self.stack.chown(Tree::Work, &tmp, st.st_uid, st.st_gid)?;
                    self.stack.chmod(Tree::Work, &tmp, mode)?;
                }
            }
            Ok(())
        })();
        if let Err(e) = result {
            let _ = self
                .stack
                .unlink(Tree::Work, &tmp, Kind::from_mode(st.st_mode) == Kind::Dir);
            return Err(e);
        }
        Ok(tmp)
    }

    /// Moves a staged entry from the workdir to `dst` in the upper dir as node `id`, then sets
    /// its timestamps from `st` and restores the upper parent's timestamps. The staged inode is
    /// registered under `id` before it appears in the upper dir, so a concurrent lookup of
    /// `dst` never gives it another node id (`st_ino`).
    pub(super) fn publish_staged(
        &self,
        tmp: &CStr,
        dst: &CStr,
        st: &libc::stat,
        id: u64,
    ) -> io::Result<()> {
        let parent = Path::new(std::ffi::OsStr::from_bytes(dst.to_bytes()))
            .parent()
            .map(|p| {
                if p.as_os_str().is_empty() {
                    Path::new(".")
                } else {
                    p
                }
            })
            .unwrap_or(Path::new("."));
        let cparent = cstr(parent.as_os_str())?;
        // Copy-ups into one parent must not interleave here: each restores the parent's
        // timestamps as it saw them before its rename.
        let _p = self.data.publish_lock();
        let ino = self.stack.stat(Tree::Work, tmp)?.st_ino;
        self.names.register_upper(ino, id);
        let pst = self.stack.stat(Tree::Upper, &cparent)?;
        if let Err(e) = self.stack.rename(Tree::Work, tmp, Tree::Upper, dst, 0) {
            self.names.drop_upper(ino);
            let _ = self
                .stack
                .unlink(Tree::Work, tmp, Kind::from_mode(st.st_mode) == Kind::Dir);
            return Err(e);
        }
        self.stack.utimens(Tree::Upper, dst, &times_of(st))?;
        let _ = self.stack.utimens(Tree::Upper, &cparent, &times_of(&pst));
        // A node the kernel knows (or knew) now has an upper inode under its id.
        self.index_node(id, Some(dst));
        Ok(())
    }

    /// Makes sure directory node `id` and all its ancestors exist in the upper dir (metadata
    /// copy-up of lower directories). Caller holds the namespace (`Names::shared`).
    pub(super) fn ensure_upper_dir(&self, id: u64) -> OpResult<()> {
        for d in self.names.missing_upper_dirs(id)? {
            let _c = self.data.copy_lock(d);
            if self.names.is_upper(d).ok_or(Errno::ENOENT)? {
                continue;
            }
            let dir = self
                .names
                .locate(d)
                .ok()
                .filter(|l| l.attached)
                .ok_or(Errno::ENOENT)?;
            let (l, rel) = (top_lower(dir.lowers).ok_or(Errno::ENOENT)?, &dir.path);
            let st = self.stack.stat(Tree::Lower(l), rel).map_err(errno)?;
            let tmp = self
                .stage_copy(Tree::Lower(l), rel, &st, None)
                .map_err(errno)?;
            self.publish_staged(&tmp, rel, &st, d).map_err(errno)?;
            self.names.dir_copied_up(d);
        }
        Ok(())
    }

    /// Copies node `id` up if it is not in the upper dir yet (regular files: bytes up to
    /// `limit`, for a truncate that would discard the rest). Caller holds the namespace
    /// (`Names::shared`).
    ///
    /// Errors: `ENOENT` for a node that is gone; the errno of a failed copy (nothing is left
    /// half-copied in the upper dir).
    pub(super) fn copy_up(&self, id: u64, limit: Option<u64>) -> OpResult<()> {
        // Every WRITE comes through here: answer the common case from one read of the node.
        let CopyState {
            upper,
            kind,
            gone,
            parent,
        } = self.names.copy_up_state(id)?;
        if upper {
            return Ok(());
        }
        if kind == Kind::Dir {
            return self.ensure_upper_dir(id);
        }
        if gone {
            return Err(Errno::ENOENT);
        }
        // `parent` is `None` for an unlinked file.
        if let Some(p) = parent {
            self.ensure_upper_dir(p)?;
        }
        let _c = self.data.copy_lock(id);
        if self.names.is_upper(id).ok_or(Errno::ENOENT)? {
            return Ok(());
        }
        let src = self.names.locate(id)?;
        let sl = src.tree;
        let st = self.stack.stat(sl, &src.path).map_err(errno)?;
        let tmp = self.stage_copy(sl, &src.path, &st, limit).map_err(errno)?;
        if parent.is_some() && self.data.has_passthrough_open(id) {
            return self.supersede(id, &tmp, &src.path, &st);
        }
        if parent.is_some() {
            self.publish_staged(&tmp, &src.path, &st, id)
                .map_err(errno)?;
        } else {
            let dst = orphan_name(id);
            self.stack
                .rename(Tree::Work, &tmp, Tree::Work, &dst, 0)
                .map_err(errno)?;
            self.names.kept_as_orphan(id);
            let ino = self.stack.stat(Tree::Work, &dst).map_err(errno)?.st_ino;
            self.names.register_upper(ino, id);
        }
        self.names.copied_up(id);
        self.data.drop_fd(id);
        Ok(())
    }

    /// Copy-up by re-lookup (`passthrough.rs`): lower file `id`, held open by the kernel
    /// through passthrough to the lower file, gets its copy (staged at `tmp` from `path`, stat
    /// `st`) under a **new** node id, which its name now resolves to and which shows `id` as
    /// its `st_ino`; `id` follows the copy from now on (`Nodes::supersede`).
    /// The kernel inode of `id` keeps its lower backing: no backing ever changes under an
    /// open file. An OPEN of `id` is answered `ESTALE` from now on, so the kernel looks the
    /// name up again and opens the copy. Caller holds the namespace (`Names::shared`) and `id`'s
    /// copy-up lock.
    ///
    /// Errors: the errno of publishing the copy (then nothing changed).
    fn supersede(&self, id: u64, tmp: &CStr, path: &CStr, st: &libc::stat) -> OpResult<()> {
        let copy = self.names.copy_id(id);
        self.publish_staged(tmp, path, st, copy).map_err(errno)?;
        if !self.names.supersede(id, copy, path.to_owned()) {
            return Err(Errno::ENOENT);
        }
        self.index_node(copy, Some(path));
        self.data.drop_fd(id);
        tracing::debug!(node = id, copy, "copy-up by re-lookup");
        Ok(())
    }

    /// Copies the merged contents of directory `dir` (as `d`, already present in the upper
    /// dir) into the upper dir, recursively — used before renaming a directory that has lower
    /// contents. Every copied entry is registered under the id it had, so `st_ino` values do
    /// not change. Caller holds the namespace (shared is enough: each entry is copied under its
    /// copy-up lock, and no name can leave the merged view meanwhile).
    pub(super) fn copy_up_tree(&self, dir: u64, d: &Backing) -> OpResult<()> {
        let names = self
            .stack
            .merged_names(d.upper, d.lowers, &d.path)
            .map_err(errno)?;
        for (name, _) in names {
            let Some(r) = self.resolve(dir, d, &name)? else {
                continue;
            };
            let crel = child(&d.path, &name).map_err(errno)?;
            let r = if r.upper {
                r
            } else {
                let _c = self.data.copy_lock(r.id);
                // Another copy-up (a writer of this file) may have run meanwhile.
                match self.resolve(dir, d, &name)? {
                    Some(r) if !r.upper => {
                        let l = top_lower(r.lowers).ok_or(Errno::EIO)?;
                        let tmp = self
                            .stage_copy(Tree::Lower(l), &crel, &r.st, None)
                            .map_err(errno)?;
                        if r.kind != Kind::Dir && self.data.has_passthrough_open(r.id) {
                            self.supersede(r.id, &tmp, &crel, &r.st)?;
                        } else {
                            self.publish_staged(&tmp, &crel, &r.st, r.id)
                                .map_err(errno)?;
                        }
                        r
                    }
                    Some(r) => r,
                    None => continue,
                }
            };
            if r.upper {
                self.names.register_upper(r.st.st_ino, r.id);
            }
            if r.kind == Kind::Dir && r.lowers != 0 {
                self.copy_up_tree(r.id, &Backing::upper_dir(r.lowers, dir, crel))?;
            }
            self.data.drop_fd(r.id);
        }
        Ok(())
    }
}
