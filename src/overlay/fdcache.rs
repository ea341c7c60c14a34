//! The fd cache and the copy-up locks inside the overlay engine's data part (`node_data.rs`, which
//! alone uses them): [`FdCache`], each node's open data file, and [`CopyLocks`], one copy-up of
//! a node at a time. Types with private fields and no knowledge of the engine.

use std::fs::File;
use std::io;
use std::num::NonZeroUsize;
use std::sync::Arc;

use parking_lot::{Condvar, Mutex};

use super::layer::LowerData;

/// A node's open data file as the cache keeps it: the file (what `Deref` gives), and for a
/// lower file still arriving, the gate its reads wait on ([`LowerData`]).
pub struct DataFile(LowerData);

impl DataFile {
    /// The data file `d` as the cache keeps it.
    pub fn new(d: LowerData) -> DataFile {
        DataFile(d)
    }

    /// Blocks until bytes `offset..offset + len` are readable ([`super::layer::ReadGate::ready`]); at once
    /// for a complete file.
    ///
    /// Errors: `EIO` from the gate.
    pub fn ready(&self, offset: u64, len: u64) -> io::Result<()> {
        match &self.0.gate {
            Some(g) => g.ready(offset, len),
            None => Ok(()),
        }
    }

    /// Whether every byte is in place (no gate, or its [`ReadGate::complete`]).
    pub fn complete(&self) -> bool {
        self.0.gate.as_ref().is_none_or(|g| g.complete())
    }
}

impl std::os::fd::AsRawFd for DataFile {
    fn as_raw_fd(&self) -> std::os::fd::RawFd {
        self.0.file.as_raw_fd()
    }
}

impl std::os::fd::AsFd for DataFile {
    fn as_fd(&self) -> std::os::fd::BorrowedFd<'_> {
        self.0.file.as_fd()
    }
}

impl std::ops::Deref for DataFile {
    type Target = File;
    fn deref(&self) -> &File {
        &self.0.file
    }
}

/// The fd cache: the open data file of up to a fixed number of nodes (least recently used
/// ones are closed first), so READs, WRITEs and the GETATTR after a READ of a lower file cost
/// no `openat`.
pub struct FdCache {
    fds: Mutex<lru::LruCache<u64, CachedFd>>,
}

#[derive(Clone)]
struct CachedFd {
    file: Arc<DataFile>,
    writable: bool,
    /// Opened in a lower layer (the node had no upper copy then).
    lower: bool,
}

impl FdCache {
    /// An empty cache of at most `cap` fds.
    pub fn new(cap: NonZeroUsize) -> FdCache {
        FdCache {
            fds: Mutex::new(lru::LruCache::new(cap)),
        }
    }

    /// The cached file of node `id`, if there is one that is writable when `writable` asks.
    pub fn get(&self, id: u64, writable: bool) -> Option<Arc<DataFile>> {
        let mut fds = self.fds.lock();
        let fd = fds.get(&id)?;
        (fd.writable || !writable).then(|| fd.file.clone())
    }

    /// Caches `file` as node `id`'s (opened read-write when `writable`, in a lower layer when
    /// `lower`) if `still()`, asked under the cache's lock, says its data is still there;
    /// returns whether it did. The fd it replaces or evicts is closed after the lock is
    /// released.
    pub fn insert(
        &self,
        id: u64,
        file: Arc<DataFile>,
        writable: bool,
        lower: bool,
        still: impl FnOnce() -> bool,
    ) -> bool {
        let mut fds = self.fds.lock();
        if !still() {
            return false;
        }
        let evicted = fds.push(
            id,
            CachedFd {
                file,
                writable,
                lower,
            },
        );
        drop(fds);
        drop(evicted);
        true
    }

    /// `fstat` of the lower file READs of node `id` were last served from, if its fd is still
    /// cached: the attributes of a lower file at the cost of one `fstat`, without walking its
    /// path again (the GETATTR a reader's `fstat` sends after every first READ, since the
    /// kernel invalidates atime then). Only fds opened in a lower layer whose `fstat` is the
    /// file's metadata count: a lower file never changes through the mount, and a copy-up
    /// drops the node's cached fd. `None` when no such fd is cached.
    ///
    /// Errors: the `fstat` errno.
    pub fn lower_stat(&self, id: u64) -> Option<io::Result<libc::stat>> {
        let f = self
            .fds
            .lock()
            .peek(&id)
            .filter(|c| c.lower && c.file.0.fstat_is_meta)
            .map(|c| c.file.clone())?;
        Some(crate::sys::fstat(&f.0.file))
    }

    /// Drops node `id`'s cached fd (after a copy-up, so the next access opens the upper copy).
    pub fn forget(&self, id: u64) {
        self.fds.lock().pop(&id);
    }

    /// Drops every cached fd (a warm mount's reset).
    pub fn clear(&self) {
        self.fds.lock().clear();
    }
}

/// Per-node copy-up locks: a copy-up holds its node's lock, so two writers never copy the same
/// file twice while copy-ups of different files run side by side.
#[derive(Default)]
pub struct CopyLocks {
    busy: Mutex<std::collections::HashSet<u64>>,
    freed: Condvar,
}

/// A held [`CopyLocks`] entry; released on drop.
pub struct CopyGuard<'a> {
    locks: &'a CopyLocks,
    id: u64,
}

impl CopyLocks {
    /// Waits until no other copy-up of node `id` runs, then holds its lock.
    pub fn lock(&self, id: u64) -> CopyGuard<'_> {
        let mut busy = self.busy.lock();
        while !busy.insert(id) {
            self.freed.wait(&mut busy);
        }
        CopyGuard { locks: self, id }
    }
}

impl Drop for CopyGuard<'_> {
    fn drop(&mut self) {
        self.locks.busy.lock().remove(&self.id);
        self.locks.freed.notify_all();
    }
}
