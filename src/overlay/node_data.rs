//! The data part of the overlay engine: what a node's data is opened through — the fd cache
//! (`fdcache.rs`: each node's open data file), the per-node copy-up locks and the lock of the
//! short publish step of a copy-up, and FUSE passthrough (`passthrough.rs`: which backing file
//! an OPEN gets). Private fields; the engine (`fs/`) finds where a node's data is (the names
//! part) and asks this part for the file, the locks and the answer to an OPEN.

use std::io;
use std::num::NonZeroUsize;
use std::sync::Arc;

use parking_lot::{Mutex, MutexGuard};

use super::errno::OpResult;
use super::fdcache::{CopyGuard, CopyLocks, DataFile, FdCache};
use super::passthrough::{FileKey, OpenMode, Passthrough};

/// How many nodes' data files the fd cache keeps open.
const FD_CACHE_CAP: usize = 4096;

/// The data of a mount's nodes (see the module docs).
pub struct Data {
    fds: FdCache,
    /// Per-node copy-up locks (two writers never copy the same file twice; unrelated files
    /// copy in parallel).
    copy_locks: CopyLocks,
    /// Serialises the short publish step of copy-ups (rename into the upper dir and restoring
    /// the parent's timestamps).
    publish: Mutex<()>,
    pt: Passthrough,
}

impl Data {
    /// The data part of a mount; opens may get passthrough when `passthrough`.
    pub fn new(passthrough: bool) -> Data {
        Data {
            fds: FdCache::new(NonZeroUsize::new(FD_CACHE_CAP).expect("nonzero")),
            copy_locks: CopyLocks::default(),
            publish: Mutex::new(()),
            pt: Passthrough::new(passthrough),
        }
    }

    /// Node `id`'s data file, writable if asked: the cached one, or `open()`'s (the file and
    /// whether it is in a lower layer), then cached. A lower file is cached only if
    /// `still_lower()`, asked under the cache's lock, says the node has no upper copy yet: a
    /// copy-up that completes while a lower file is being opened wins (a later READ or GETATTR
    /// would be served from the lower file, not the copy), and the data is opened again.
    ///
    /// Errors: those of `open`.
    pub fn fd(
        &self,
        id: u64,
        writable: bool,
        mut open: impl FnMut() -> OpResult<(DataFile, bool)>,
        still_lower: impl Fn() -> bool,
    ) -> OpResult<Arc<DataFile>> {
        loop {
            if let Some(f) = self.fds.get(id, writable) {
                return Ok(f);
            }
            let (file, lower) = open()?;
            let file = Arc::new(file);
            // A copy-up marks the node upper, then drops its cached fd under the cache's lock:
            // if it is not upper now, its drop comes after this insert and takes the lower fd
            // out again.
            if self.fds.insert(id, file.clone(), writable, lower, || {
                !lower || still_lower()
            }) {
                return Ok(file);
            }
        }
    }

    /// `fstat` of the lower file node `id`'s data was last read from, if its fd is still
    /// cached ([`FdCache::lower_stat`]).
    ///
    /// Errors: the `fstat` errno.
    pub fn lower_stat(&self, id: u64) -> Option<io::Result<libc::stat>> {
        self.fds.lower_stat(id)
    }

    /// Node `id`'s data moved (copy-up, rename) or its inode flags changed: its cached fd is
    /// closed, so the next access opens the data where it is now.
    pub fn drop_fd(&self, id: u64) {
        self.fds.forget(id);
    }

    /// Closes every cached data file (a warm mount's reset: the upper files are gone, and the
    /// nodes left read their lowers again).
    pub fn drop_all_fds(&self) {
        self.fds.clear();
    }

    /// The kernel forgot node `id`: its cached fd and its registered backing go.
    pub fn forget(&self, id: u64) {
        self.pt.forget(id);
        self.fds.forget(id);
    }

    /// Waits until no other copy-up of node `id` runs, then holds its copy-up lock.
    pub fn copy_lock(&self, id: u64) -> CopyGuard<'_> {
        self.copy_locks.lock(id)
    }

    /// Holds the publish step of copy-ups: each restores the upper parent's timestamps as it
    /// saw them before its rename, so those into one parent must not interleave.
    pub fn publish_lock(&self) -> MutexGuard<'_, ()> {
        self.publish.lock()
    }

    /// Whether opens may get passthrough.
    pub fn passthrough_on(&self) -> bool {
        self.pt.on()
    }

    /// Turns passthrough off for the rest of the mount (at INIT, when the kernel does not
    /// offer it).
    pub fn passthrough_off(&self) {
        self.pt.turn_off();
    }

    /// How an OPEN of node `id` (for writing when `write`) whose data file is `key` is
    /// answered ([`Passthrough::open`]); `register` registers that file as a backing file.
    pub fn open(
        &self,
        id: u64,
        key: FileKey,
        write: bool,
        register: impl FnOnce() -> io::Result<fuser::BackingId>,
    ) -> OpenMode {
        self.pt.open(id, key, write, register)
    }

    /// A passthrough open of node `id` (for writing when `write`) was released.
    pub fn released(&self, id: u64, write: bool) {
        self.pt.released(id, write);
    }

    /// Whether the kernel holds passthrough opens of node `id` (a copy-up of it then gives
    /// the copy a new node id, see `passthrough.rs`).
    pub fn has_passthrough_open(&self, id: u64) -> bool {
        self.pt.has_open(id)
    }

    /// Whether the kernel holds a passthrough open of node `id` for writing (its attributes
    /// then go out with no TTL, [`Passthrough::has_writer`]).
    pub fn has_passthrough_writer(&self, id: u64) -> bool {
        self.pt.has_writer(id)
    }
}
