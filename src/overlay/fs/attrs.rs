//! Attribute and extended-attribute operations of the overlay engine: SETATTR (chmod, chown,
//! truncate, utimes; kept attributes of a removed directory held open), READLINK, the inode
//! flags ioctls (FS_IOC_GETFLAGS/SETFLAGS, FS_IOC_FSGETXATTR/FSSETXATTR) and the xattr calls,
//! each returning `Result<_, Errno>`. A change copies the node up first (`copy_up.rs`); reads
//! are served from the layer that holds the node's data.

use std::ffi::{CStr, CString, OsStr};

use fuser::{Errno, FileAttr, TimeOrNow};

use super::ops::timespec;
use super::{OpResult, OverlayFs, errno};
use crate::overlay::inode::Backing;
use crate::overlay::stack::{Kind, Tree};
use crate::overlay::whiteout;
use crate::sys::{FS_IOC_GETFLAGS, FS_IOC_SETFLAGS, Xattrs, cstr};

/// What a SETATTR changes (each `None` is left alone): permission bits and file type bits as
/// chmod(2) takes them, owner ids, size in bytes, access and modification times.
#[derive(Clone, Copy, Debug, Default)]
pub struct AttrChange {
    /// New mode (only the 0o7777 bits are applied).
    pub mode: Option<u32>,
    /// New owner uid.
    pub uid: Option<u32>,
    /// New owner gid.
    pub gid: Option<u32>,
    /// New size in bytes (truncate or extend).
    pub size: Option<u64>,
    /// New access time.
    pub atime: Option<TimeOrNow>,
    /// New modification time.
    pub mtime: Option<TimeOrNow>,
}

/// An xattr answer: a size probe or the bytes.
pub enum XattrReply {
    /// Length in bytes the caller must provide.
    Size(u32),
    /// The value or the NUL-separated name list.
    Data(Vec<u8>),
}

impl OverlayFs {
    /// chmod/chown/truncate/utimes on node `id`, copying it up first (a truncate copies only
    /// the bytes it keeps). Returns the new attributes.
    ///
    /// Errors: `EISDIR` for a directory truncate, or the upper dir's errno.
    pub fn setattr(&self, id: u64, change: &AttrChange) -> OpResult<FileAttr> {
        match self.setattr_on_disk(id, change) {
            // Only a node with no place on disk can be a removed directory held open.
            Err(e) if e == Errno::ENOENT && self.names.gone_dir_attr(id).is_some() => {
                self.setattr_gone_dir(id, change)
            }
            r => r,
        }
    }

    /// [`Self::setattr`] of a node that has a place in a layer.
    fn setattr_on_disk(&self, id: u64, change: &AttrChange) -> OpResult<FileAttr> {
        {
            let _g = self.names.shared();
            self.copy_up(id, change.size)?;
            let n = self.names.locate(id)?;
            let (layer, p) = (n.tree, &n.path);
            if let Some(m) = change.mode
                && n.kind != Kind::Symlink
            {
                self.stack.chmod(layer, p, m & 0o7777).map_err(errno)?;
            }
            // With squash_to_uid/gid every entry is the mapped owner's: no chown reaches disk.
            if (change.uid.is_some() || change.gid.is_some()) && !self.policy.squashes() {
                self.stack
                    .chown(
                        layer,
                        p,
                        change.uid.unwrap_or(u32::MAX),
                        change.gid.unwrap_or(u32::MAX),
                    )
                    .map_err(errno)?;
            }
            if let Some(sz) = change.size {
                if n.kind == Kind::Dir {
                    return Err(Errno::EISDIR);
                }
                let f = self.data_fd(id, true)?;
                f.set_len(sz).map_err(errno)?;
            }
            if change.atime.is_some() || change.mtime.is_some() {
                self.stack
                    .utimens(layer, p, &[timespec(change.atime), timespec(change.mtime)])
                    .map_err(errno)?;
            }
            self.attr_at(id, &n)
        }
    }

    /// SETATTR of a removed directory the kernel still holds: changes its kept attributes
    /// (nothing is left on disk to change), as fchmod/fchown/futimens of a removed directory
    /// succeed on a disk filesystem.
    ///
    /// Errors: `EISDIR` for a truncate, `ENOENT` once the node is forgotten.
    fn setattr_gone_dir(&self, id: u64, change: &AttrChange) -> OpResult<FileAttr> {
        if change.size.is_some() {
            return Err(Errno::EISDIR);
        }
        let now = std::time::SystemTime::now();
        let at = |t: TimeOrNow| match t {
            TimeOrNow::Now => now,
            TimeOrNow::SpecificTime(t) => t,
        };
        self.names
            .change_gone_dir(id, |a| {
                if let Some(m) = change.mode {
                    a.perm = (m & 0o7777) as u16;
                }
                if let Some(u) = change.uid {
                    a.uid = u;
                }
                if let Some(g) = change.gid {
                    a.gid = g;
                }
                if let Some(t) = change.atime {
                    a.atime = at(t);
                }
                if let Some(t) = change.mtime {
                    a.mtime = at(t);
                }
                a.ctime = now;
            })
            .ok_or(Errno::ENOENT)
    }

    /// The target of symlink node `id`. Errors: `EINVAL` for a non-symlink, or the layer's errno.
    pub fn readlink(&self, id: u64) -> OpResult<Vec<u8>> {
        let _g = self.names.shared();
        let l = self.names.locate(id)?;
        self.stack.readlink(l.tree, &l.path).map_err(errno)
    }

    /// Whether upper directory `rel` has a default POSIX ACL (`system.posix_acl_default`).
    pub(super) fn has_default_acl(&self, rel: &CStr) -> bool {
        let p = self.stack.proc_path(Tree::Upper, rel);
        let mut probe = [0u8; 0];
        Xattrs::Path(&p)
            .get_into(c"system.posix_acl_default", &mut probe)
            .is_ok()
    }

    /// The inode flags ioctls the kernel sends a FUSE daemon for `chattr`, `lsattr` and
    /// `xfs_io chattr` (its fileattr calls, fs/fuse/ioctl.c `fuse_fileattr_get`/`_set`):
    /// Refuses the removal of node `victim` from directory node `parent` as fs/namei.c
    /// `may_delete` does, before the filesystem sees it: `EACCES` for an immutable parent
    /// (its `inode_permission` for writing), `EPERM` for an append-only parent or an immutable
    /// or append-only victim. The upper filesystem applies the same rules when the daemon
    /// removes there, but an RMDIR's merged emptiness check comes first and would answer
    /// `ENOTEMPTY` instead (xfstests generic/079). Inode flags live only on upper files (a
    /// flags change copies up), so nodes without one pass. Caller holds the namespace
    /// (`Names::shared`).
    ///
    /// Errors: `EACCES`, `EPERM`, `ENOENT` for a node that is gone, or the errno of opening
    /// an upper file.
    pub(super) fn check_may_delete(&self, parent: u64, victim: u64) -> OpResult<()> {
        const FS_IMMUTABLE_FL: u32 = 0x10; // include/uapi/linux/fs.h
        const FS_APPEND_FL: u32 = 0x20;
        let p = self.upper_inode_flags(parent)?;
        if p & FS_IMMUTABLE_FL != 0 {
            return Err(Errno::EACCES);
        }
        if p & FS_APPEND_FL != 0
            || self.upper_inode_flags(victim)? & (FS_IMMUTABLE_FL | FS_APPEND_FL) != 0
        {
            return Err(Errno::EPERM);
        }
        Ok(())
    }

    /// Node `id`'s inode flags as its upper file has them (`FS_IOC_GETFLAGS`); 0 for a node
    /// without an upper file, a node that is neither a file nor a directory, or an upper
    /// filesystem without inode flags. Caller holds the namespace (`Names::shared`).
    ///
    /// Errors: `ENOENT` for a node that is gone, or the errno of opening the upper file.
    fn upper_inode_flags(&self, id: u64) -> OpResult<u32> {
        let n = self.names.locate(id)?;
        let dir = match n.kind {
            _ if !n.upper => return Ok(0),
            Kind::Dir => libc::O_DIRECTORY,
            Kind::File => 0,
            _ => return Ok(0),
        };
        let f = self
            .stack
            .open(n.tree, &n.path, libc::O_RDONLY | libc::O_NONBLOCK | dir, 0)
            .map_err(errno)?;
        let mut buf = [0u8; 28];
        match crate::sys::ioctl_fileattr(std::os::fd::AsFd::as_fd(&f), FS_IOC_GETFLAGS, &mut buf) {
            Ok(()) => Ok(u32::from_ne_bytes([buf[0], buf[1], buf[2], buf[3]])),
            Err(e)
                if matches!(
                    e.raw_os_error(),
                    Some(libc::ENOTTY | libc::EOPNOTSUPP | libc::EINVAL)
                ) =>
            {
                Ok(0)
            }
            Err(e) => Err(errno(e)),
        }
    }

    /// `FS_IOC_GETFLAGS`/`FS_IOC_FSGETXATTR` read node `id`'s file (its upper copy, or its lower
    /// one) and answer the flags (`in_data` unused, a 4-byte int or a 28-byte `struct fsxattr`),
    /// `FS_IOC_SETFLAGS`/`FS_IOC_FSSETXATTR` copy the node up and set `in_data` on its upper
    /// file, whose filesystem then keeps and enforces the flags: an immutable or append-only
    /// upper file refuses the daemon's changes with `EPERM`, as kernel overlayfs's upper does
    /// (it copies the flags to its own inode; fs/overlayfs/inode.c `ovl_fileattr_set`). The
    /// kernel has already checked the caller (owner or CAP_FOWNER, CAP_LINUX_IMMUTABLE to
    /// change `i`/`a`: fs/file_attr.c `fileattr_set_prepare`). A cached writable fd of the node
    /// is dropped after a set, so the next write opens the file again and meets the new flags.
    /// Append-only files therefore refuse appends through the mount too (the daemon writes
    /// through an fd opened without `O_APPEND`).
    ///
    /// Errors: `ENOTTY` for any other ioctl or another kind of node (as the kernel answers for
    /// those itself), `EINVAL` for `in_data` of the wrong size, the upper filesystem's errno
    /// (`EOPNOTSUPP`, `EPERM`…), `ENOENT` for a node that is gone.
    pub fn fileattr_ioctl(&self, id: u64, cmd: u32, in_data: &[u8]) -> OpResult<Vec<u8>> {
        // include/uapi/linux/fs.h: _IOR('X', 31, struct fsxattr), _IOW('X', 32, struct
        // fsxattr); FS_IOC_GETFLAGS/SETFLAGS (the kernel passes an int) are sys's.
        const FS_IOC_FSGETXATTR: u32 = 0x801c_581f;
        const FS_IOC_FSSETXATTR: u32 = 0x401c_5820;
        const FSXATTR_SIZE: usize = 28;
        let (set, size) = match cmd {
            FS_IOC_GETFLAGS => (false, 4),
            FS_IOC_SETFLAGS => (true, 4),
            FS_IOC_FSGETXATTR => (false, FSXATTR_SIZE),
            FS_IOC_FSSETXATTR => (true, FSXATTR_SIZE),
            _ => return Err(Errno::ENOTTY),
        };
        if set && in_data.len() < size {
            return Err(Errno::EINVAL);
        }
        if set && self.policy.read_only() {
            return Err(Errno::EROFS);
        }
        let _g = self.names.shared();
        if set {
            self.copy_up(id, None)?;
        }
        let n = self.names.locate(id)?;
        let dir = match n.kind {
            Kind::Dir => libc::O_DIRECTORY,
            Kind::File => 0,
            _ => return Err(Errno::ENOTTY),
        };
        let f = self
            .stack
            .open(n.tree, &n.path, libc::O_RDONLY | libc::O_NONBLOCK | dir, 0)
            .map_err(errno)?;
        let mut buf = [0u8; FSXATTR_SIZE];
        if set {
            buf[..size].copy_from_slice(&in_data[..size]);
        }
        crate::sys::ioctl_fileattr(std::os::fd::AsFd::as_fd(&f), cmd, &mut buf).map_err(errno)?;
        if set {
            self.data.drop_fd(id);
            // The flags change moved the upper file's ctime (generic/277); no FUSE reply
            // carries attributes after an ioctl, and fs/fuse/ioctl.c keeps the cached ones.
            self.kernel.invalidate_attrs(id);
            return Ok(Vec::new());
        }
        Ok(buf[..size].to_vec())
    }

    /// Where the xattrs of node `id` are read (the layer and path of its data), or `None` for a
    /// removed directory held open, which has none left (`ls -l` asks for security.selinux and
    /// POSIX ACLs on it).
    fn xattr_read_at(&self, id: u64) -> OpResult<Option<Backing>> {
        match self.names.locate(id) {
            Ok(l) => Ok(Some(l)),
            Err(e) if e == Errno::ENOENT && self.names.gone_dir_attr(id).is_some() => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// The xattr path of node `id` (after copy-up when `write`).
    fn xattr_path(&self, id: u64, write: bool) -> OpResult<CString> {
        if write {
            self.copy_up(id, None)?;
        }
        let l = self.names.locate(id)?;
        Ok(self.stack.proc_path(l.tree, &l.path))
    }

    /// getxattr: the value of `name` (`size` 0 asks only the length). Overlay-private names
    /// are invisible (`ENODATA`), and so is every name of a removed directory held open.
    pub fn getxattr(&self, id: u64, name: &OsStr, size: u32) -> OpResult<XattrReply> {
        use std::os::unix::ffi::OsStrExt;
        if whiteout::is_private_xattr(name.as_bytes()) {
            return Err(Errno::NO_XATTR);
        }
        let _g = self.names.shared();
        let Some(l) = self.xattr_read_at(id)? else {
            return Err(Errno::NO_XATTR);
        };
        let cname = cstr(name).map_err(errno)?;
        let mut buf = vec![0u8; size as usize];
        let n = self
            .stack
            .xattr(l.tree, &l.path, &cname, &mut buf)
            .map_err(errno)?;
        buf.truncate(n);
        Ok(if size == 0 {
            XattrReply::Size(n as u32)
        } else {
            XattrReply::Data(buf)
        })
    }

    /// listxattr: names without the overlay-private ones (`size` 0 asks only the length); an
    /// empty list for a removed directory held open (see getxattr).
    pub fn listxattr(&self, id: u64, size: u32) -> OpResult<XattrReply> {
        let mut out = Vec::new();
        let _g = self.names.shared();
        if let Some(l) = self.xattr_read_at(id)? {
            for name in self.stack.xattr_names(l.tree, &l.path).map_err(errno)? {
                if !whiteout::is_private_xattr(&name) {
                    out.extend_from_slice(&name);
                    out.push(0);
                }
            }
        }
        if size == 0 {
            Ok(XattrReply::Size(out.len() as u32))
        } else if out.len() > size as usize {
            Err(Errno::ERANGE)
        } else {
            Ok(XattrReply::Data(out))
        }
    }

    /// setxattr (copies up first). Errors: `EPERM` for overlay-private names, `ENOENT` for a
    /// removed directory held open (nothing on disk keeps its xattrs; ext4 would accept it), or
    /// the upper's errno.
    pub fn setxattr(&self, id: u64, name: &OsStr, value: &[u8], flags: i32) -> OpResult<()> {
        use std::os::unix::ffi::OsStrExt;
        if whiteout::is_private_xattr(name.as_bytes()) {
            return Err(Errno::EPERM);
        }
        let _g = self.names.shared();
        let p = self.xattr_path(id, true)?;
        let cname = cstr(name).map_err(errno)?;
        Xattrs::Path(&p).set(&cname, value, flags).map_err(errno)
    }

    /// removexattr (copies up first). Errors: `ENODATA` if absent, `EPERM` for private names.
    pub fn removexattr(&self, id: u64, name: &OsStr) -> OpResult<()> {
        use std::os::unix::ffi::OsStrExt;
        if whiteout::is_private_xattr(name.as_bytes()) {
            return Err(Errno::EPERM);
        }
        let _g = self.names.shared();
        let p = self.xattr_path(id, true)?;
        let cname = cstr(name).map_err(errno)?;
        Xattrs::Path(&p).remove(&cname).map_err(errno)
    }
}
