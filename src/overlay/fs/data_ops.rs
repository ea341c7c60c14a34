//! The data part of the overlay engine: the operations on a node's data that go through the
//! fd cache and the copy-up locks (`fdcache.rs`) — OPEN (passthrough or cached,
//! `passthrough.rs`), READ's file, WRITE, and the inode-flags check of an OPEN for writing.

use std::fs::File;
use std::io;
use std::os::unix::fs::FileExt;
use std::sync::Arc;

use fuser::Errno;

use super::{OpResult, OverlayFs, errno};
use crate::overlay::passthrough::{FileKey, OpenMode};
use crate::overlay::stack::Tree;

impl OverlayFs {
    /// A cached fd for node `id`'s data, writable if asked (the caller copied it up first).
    /// A lower file is opened with `O_NOATIME` ([`crate::overlay::stack::Stack::open`]): reading
    /// through the mount never writes the read-only layer's inodes.
    ///
    /// A copy-up that completes while a lower file is being opened here wins: the lower fd is
    /// not cached (a later READ or GETATTR would be served from the lower file, not the copy)
    /// and the node's data is opened again where it now is.
    pub(super) fn data_fd(&self, id: u64, writable: bool) -> OpResult<Arc<File>> {
        loop {
            if let Some(f) = self.open_data_fd(id, writable)? {
                return Ok(f);
            }
        }
    }

    /// One attempt of [`Self::data_fd`]: `None` when a copy-up of the node completed while its
    /// lower file was being opened.
    fn open_data_fd(&self, id: u64, writable: bool) -> OpResult<Option<Arc<File>>> {
        if let Some(f) = self.fds.get(id, writable) {
            return Ok(Some(f));
        }
        let l = self.backing(id)?;
        let lower = matches!(l.tree, Tree::Lower(_));
        if writable && lower {
            return Err(Errno::EIO);
        }
        let flags = if writable {
            libc::O_RDWR
        } else {
            libc::O_RDONLY
        };
        let file = Arc::new(self.stack.open(l.tree, &l.path, flags, 0).map_err(errno)?);
        // A copy-up marks the node upper, then drops its cached fd under the cache's lock: if
        // it is not upper now, its drop comes after this insert and takes the lower fd out
        // again.
        let still = || !lower || self.nodes.peek(id, |n| n.upper) == Some(false);
        if !self.fds.insert(id, file.clone(), writable, lower, still) {
            return Ok(None);
        }
        Ok(Some(file))
    }

    /// Answers an OPEN (or the open half of a CREATE) of node `id`: copies the file up first
    /// when it is opened for writing (`write`), then decides passthrough, DIRECT_IO or cached
    /// (see `passthrough.rs`); `register` registers an fd as a backing file. `check` is the
    /// open(2) flags of an OPEN for writing whose upper file must allow it
    /// ([`Self::check_open_for_write`]): the file opened for that check is the one registered,
    /// so the upper file is opened once.
    ///
    /// Errors: `ENOENT` for a node that is gone, the errno of the check (EPERM for an
    /// immutable or append-only file), of the copy-up or of opening the data file.
    pub(super) fn open_node(
        &self,
        id: u64,
        write: bool,
        check: Option<i32>,
        register: impl FnOnce(&File) -> io::Result<fuser::BackingId>,
    ) -> OpResult<OpenMode> {
        let _g = self.ns.read();
        let checked = match check {
            Some(flags) => self.open_upper_as(id, flags)?,
            None => None,
        };
        if write {
            self.copy_up(id, None)?;
        }
        if self.nodes.successor(id).is_some() {
            // Superseded by a copy (copy-up by re-lookup, `passthrough.rs`): the kernel
            // retries the open once with LOOKUP_REVAL, and its LOOKUP finds the copy.
            return Err(Errno::ESTALE);
        }
        // A lower file: no copy-up may change its data between here and the answer (it
        // would give the node another backing file while the kernel gets this one).
        let _c = match self.nodes.peek(id, |n| n.upper) {
            Some(false) => Some(self.copy_locks.lock(id)),
            _ => None,
        };
        let cached;
        let f: &File = match &checked {
            Some(f) => f,
            None => {
                cached = self.data_fd(id, false)?;
                &cached
            }
        };
        let st = crate::sys::fstat(f).map_err(errno)?;
        let key: FileKey = (st.st_dev, st.st_ino);
        Ok(self.pt.open(id, key, write, || register(f)))
    }

    /// The file READs of node `id` are served from (upper copy or lower file).
    pub(super) fn read_fd(&self, id: u64) -> OpResult<Arc<File>> {
        let _g = self.ns.read();
        self.data_fd(id, false)
    }

    /// Writes `data` at `offset`, copying the file up first. Returns bytes written.
    ///
    /// An append-only upper file (`chattr +a`) refuses the read-write descriptor writes go
    /// through (EPERM); its data is appended through an `O_APPEND` one, which is what the
    /// kernel asked for: it only lets a file with the flag be written through an `O_APPEND`
    /// open, and sends those writes at the size it just read (fs/fuse/file.c).
    ///
    /// Errors: the errno of the copy-up, the open (EPERM for an immutable file) or the write.
    pub fn write(&self, id: u64, offset: u64, data: &[u8]) -> OpResult<u32> {
        let f = {
            let _g = self.ns.read();
            self.copy_up(id, None)?;
            match self.data_fd(id, true) {
                Err(e) if e == Errno::EPERM => {
                    let l = self.backing(id)?;
                    let f = self
                        .stack
                        .open(l.tree, &l.path, libc::O_WRONLY | libc::O_APPEND, 0)
                        .map_err(errno)?;
                    drop(_g);
                    std::io::Write::write_all(&mut &f, data).map_err(errno)?;
                    return Ok(data.len() as u32);
                }
                r => r?,
            }
        };
        f.write_all_at(data, offset).map_err(errno)?;
        Ok(data.len() as u32)
    }

    /// For an OPEN for writing (`flags` as open(2) takes them) of node `id`: whether its upper
    /// file, if it has one (inode flags are set only there: a flags change copies up), allows
    /// it, by opening it with the same access mode and
    /// `O_APPEND` bit (no `O_TRUNC`: a truncating open sends its own SETATTR). The upper
    /// filesystem then applies the rules of its inode flags as open(2) does (fs/namei.c
    /// `may_open`): EPERM for an immutable file, and for an append-only one opened without
    /// `O_APPEND` (xfstests generic/079). Only where OPEN reaches the daemon: in no-open
    /// mode the kernel opens without asking, and the first write is refused instead.
    ///
    /// Errors: the open's errno.
    pub(super) fn check_open_for_write(&self, id: u64, flags: i32) -> OpResult<()> {
        let _g = self.ns.read();
        self.open_upper_as(id, flags).map(drop)
    }

    /// The check of [`Self::check_open_for_write`]: node `id`'s upper file opened with the
    /// access mode and `O_APPEND` bit of `flags`, `None` when the node has no upper file.
    /// Caller holds `ns`.
    ///
    /// Errors: `ENOENT` for a node that is gone, or the open's errno.
    fn open_upper_as(&self, id: u64, flags: i32) -> OpResult<Option<File>> {
        let l = self.backing(id)?;
        if !l.upper {
            return Ok(None);
        }
        let mode = (flags & (libc::O_ACCMODE | libc::O_APPEND)) | libc::O_NONBLOCK | libc::O_NOCTTY;
        self.stack
            .open(l.tree, &l.path, mode, 0)
            .map(Some)
            .map_err(errno)
    }
}
