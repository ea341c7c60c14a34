//! What the kernel still holds of removed names: unlinked files whose upper data is kept at
//! `<workdir>/orphans/<id>` for their open fds (orphans), the orphans it forgot (removed by
//! the next request a process waits for, `OverlayFs::reap_orphans`), and removed directories
//! it still holds (an open fd, a process's cwd), with the attributes they had at removal.
//! A type with private fields inside the names part (`names.rs`), which alone uses it; the
//! engine's `fs/ops.rs` decides when a name becomes one of these.

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicBool, Ordering};

use fuser::FileAttr;
use parking_lot::Mutex;

/// Removed names the kernel still holds (see the module docs).
#[derive(Default)]
pub struct Removed {
    /// Nodes whose upper inode has a link at `<workdir>/orphans/<id>`.
    orphans: Mutex<HashSet<u64>>,
    /// Orphans whose node the kernel forgot, to be removed; `due` is set while there are any.
    forgotten: Mutex<Vec<u64>>,
    due: AtomicBool,
    /// Removed directories the kernel still holds: their attributes at removal with nlink 0,
    /// which GETATTR answers and SETATTR changes, as a disk filesystem (and kernel overlayfs)
    /// keeps serving fstat/fchmod of a removed directory. Dropped when the kernel forgets the
    /// node.
    gone_dirs: Mutex<HashMap<u64, FileAttr>>,
}

impl Removed {
    /// Forgets every orphan (kept or due) and removed directory: a warm mount's reset, once
    /// the kernel holds none of their nodes and the workdir (their data) is emptied.
    pub fn clear(&self) {
        self.orphans.lock().clear();
        self.forgotten.lock().clear();
        self.due.store(false, Ordering::Release);
        self.gone_dirs.lock().clear();
    }

    /// Whether node `id`'s upper data is kept as an orphan in the workdir.
    pub fn is_orphan(&self, id: u64) -> bool {
        self.orphans.lock().contains(&id)
    }

    /// Records that node `id`'s upper data is now kept as an orphan.
    pub fn keep_orphan(&self, id: u64) {
        self.orphans.lock().insert(id);
    }

    /// The kernel forgot node `id`: if it is an orphan, its kept data becomes due for removal
    /// ([`Self::take_due`]).
    pub fn forgot(&self, id: u64) {
        if self.is_orphan(id) {
            self.forgotten.lock().push(id);
            self.due.store(true, Ordering::Release);
        }
    }

    /// Whether forgotten orphans wait for removal (one atomic load).
    pub fn due(&self) -> bool {
        self.due.load(Ordering::Acquire)
    }

    /// The forgotten orphans to remove now, no longer due; each still to be released with
    /// [`Self::release_orphan`] before its data is removed.
    pub fn take_due(&self) -> Vec<u64> {
        self.due.store(false, Ordering::Release);
        std::mem::take(&mut *self.forgotten.lock())
    }

    /// Stops counting node `id` as an orphan; false when it was not one.
    pub fn release_orphan(&self, id: u64) -> bool {
        self.orphans.lock().remove(&id)
    }

    /// Keeps `attr` (nlink 0) as the attributes of removed directory node `id`.
    pub fn keep_dir(&self, id: u64, attr: FileAttr) {
        self.gone_dirs.lock().insert(id, attr);
    }

    /// The kept attributes of removed directory node `id`, if kept.
    pub fn dir_attr(&self, id: u64) -> Option<FileAttr> {
        self.gone_dirs.lock().get(&id).copied()
    }

    /// Changes the kept attributes of removed directory node `id` with `f`; the new ones, or
    /// `None` when none are kept.
    pub fn change_dir(&self, id: u64, f: impl FnOnce(&mut FileAttr)) -> Option<FileAttr> {
        let mut gone = self.gone_dirs.lock();
        let a = gone.get_mut(&id)?;
        f(a);
        Some(*a)
    }

    /// Drops the kept attributes of node `id` (the kernel forgot it).
    pub fn drop_dir(&self, id: u64) {
        self.gone_dirs.lock().remove(&id);
    }
}
