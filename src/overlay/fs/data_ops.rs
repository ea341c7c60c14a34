//! The engine's operations on a node's data: where the names part locates it, opened through
//! the data part (`node_data.rs`: the fd cache, the copy-up locks, passthrough) — OPEN (passthrough
//! or cached, `passthrough.rs`), READ's file, WRITE, and the inode-flags check of an OPEN for
//! writing.

use std::fs::File;
use std::io;
use std::os::unix::fs::FileExt;
use std::sync::Arc;

use fuser::Errno;

use super::{OpResult, OverlayFs, errno};
use crate::overlay::fdcache::DataFile;
use crate::overlay::passthrough::{FileKey, OpenMode};
use crate::overlay::stack::Tree;

impl OverlayFs {
    /// A cached fd for node `id`'s data, writable if asked (the caller copied it up first),
    /// from the data part ([`Data::fd`](crate::overlay::node_data::Data::fd)), which opens it where
    /// the names part locates it when none is cached. A lower file is opened with `O_NOATIME`
    /// ([`crate::overlay::stack::Stack::open`]): reading through the mount never writes the
    /// read-only layer's inodes.
    ///
    /// Errors: `ENOENT` for a node that is gone, `EIO` for a writable fd of a lower file, or
    /// the open's errno.
    pub(super) fn data_fd(&self, id: u64, writable: bool) -> OpResult<Arc<DataFile>> {
        let open = || {
            let l = self.names.locate(id)?;
            let lower = matches!(l.tree, Tree::Lower(_));
            if writable && lower {
                return Err(Errno::EIO);
            }
            let flags = if writable {
                libc::O_RDWR
            } else {
                libc::O_RDONLY
            };
            let data = self
                .stack
                .open_data(l.tree, &l.path, flags)
                .map_err(errno)?;
            if lower && let Some(t) = &self.trace {
                t.record(&l.path);
            }
            Ok((DataFile::new(data), lower))
        };
        let still_lower = || self.names.is_upper(id) == Some(false);
        self.data.fd(id, writable, open, still_lower)
    }

    /// Answers an OPEN (or the open half of a CREATE) of node `id`: copies the file up first
    /// when it is opened for writing (`write`), then decides passthrough, DIRECT_IO or cached
    /// (see `passthrough.rs`; always cached for a lower file whose bytes are still arriving);
    /// `register` registers an fd as a backing file. `check` is the open(2) flags of an OPEN
    /// for writing whose upper file must allow it ([`Self::check_open_for_write`]): the file
    /// opened for that check is the one registered, so the upper file is opened once.
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
        let _g = self.names.shared();
        let checked = match check {
            Some(flags) => self.open_upper_as(id, flags)?,
            None => None,
        };
        if write {
            self.copy_up(id, None)?;
        }
        if self.names.successor(id).is_some() {
            // Superseded by a copy (copy-up by re-lookup, `passthrough.rs`): the kernel
            // retries the open once with LOOKUP_REVAL, and its LOOKUP finds the copy.
            return Err(Errno::ESTALE);
        }
        // A lower file: no copy-up may change its data between here and the answer (it
        // would give the node another backing file while the kernel gets this one).
        let _c = match self.names.is_upper(id) {
            Some(false) => Some(self.data.copy_lock(id)),
            _ => None,
        };
        let cached;
        let f: &File = match &checked {
            Some(f) => f,
            None => {
                cached = self.data_fd(id, false)?;
                if !cached.complete() {
                    // Bytes still arriving: READs must come here to wait for theirs (a
                    // backing file would show the kernel the holes).
                    return Ok(OpenMode::Cached);
                }
                &cached
            }
        };
        let st = crate::sys::fstat(f).map_err(errno)?;
        let key: FileKey = (st.st_dev, st.st_ino);
        Ok(self.data.open(id, key, write, || register(f)))
    }

    /// The file READs of node `id` are served from (upper copy or lower file; a lower file
    /// still arriving comes with its gate, [`DataFile::ready`]).
    pub(super) fn read_fd(&self, id: u64) -> OpResult<Arc<DataFile>> {
        let _g = self.names.shared();
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
            let _g = self.names.shared();
            self.copy_up(id, None)?;
            match self.data_fd(id, true) {
                Err(e) if e == Errno::EPERM => {
                    let l = self.names.locate(id)?;
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
        let _g = self.names.shared();
        self.open_upper_as(id, flags).map(drop)
    }

    /// The check of [`Self::check_open_for_write`]: node `id`'s upper file opened with the
    /// access mode and `O_APPEND` bit of `flags`, `None` when the node has no upper file.
    /// Caller holds the namespace (`Names::shared`).
    ///
    /// Errors: `ENOENT` for a node that is gone, or the open's errno.
    fn open_upper_as(&self, id: u64, flags: i32) -> OpResult<Option<File>> {
        let l = self.names.locate(id)?;
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
