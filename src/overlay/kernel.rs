//! The kernel side of the overlay engine: what the engine tells the kernel outside of replies
//! (the session's notifier: dropping the attributes it caches of a node) and what it keeps so
//! the kernel's file handles survive a remount (the node index's journal, `node_index.rs`).
//! Private fields; the engine (`fs/`, `fs/fhandle.rs` for the records) calls it.

use std::io;
use std::sync::{Arc, OnceLock};

use super::node_index::{Index, Journal};

/// The kernel side of a mount (see the module docs).
#[derive(Default)]
pub struct Kernel {
    /// The session's notifier, set once the session exists (`daemon.rs`).
    notifier: Arc<OnceLock<fuser::Notifier>>,
    /// The node index this mount keeps in its workdir; `None` for mounts that keep none.
    journal: Option<Journal>,
}

impl Kernel {
    /// Where the daemon puts the session's notifier once the session is made (the engine is
    /// moved into the session first).
    pub fn notifier_slot(&self) -> Arc<OnceLock<fuser::Notifier>> {
        self.notifier.clone()
    }

    /// Makes the kernel drop the attributes it caches of node `id` (FUSE_NOTIFY_INVAL_INODE
    /// with a negative offset: attributes and ACLs only, no page cache), so the next stat asks
    /// the daemon. Sent from the handler before its reply: with no page range the kernel's
    /// `fuse_reverse_inval_inode` takes no inode lock and waits for no page, so the request in
    /// flight cannot deadlock it (unlike INVAL_ENTRY or a page range, see
    /// /work/shared/notes/warmstart.md), and the caller's next stat sees the change. Written
    /// to /dev/fuse, also when requests come over io_uring (6.18 takes no notification
    /// there). Best effort: without a session (unit tests), or when the kernel no longer has
    /// the inode (ENOENT), there is nothing cached to drop.
    pub fn invalidate_attrs(&self, id: u64) {
        let Some(n) = self.notifier.get() else {
            return;
        };
        match n.inval_inode(fuser::INodeNo(id), -1, 0) {
            Ok(()) => {}
            Err(e) if e.raw_os_error() == Some(libc::ENOENT) => {}
            Err(e) => tracing::debug!(node = id, "inval_inode: {e}"),
        }
    }

    /// From now on the mount keeps its node index in `journal` (set at mount, before serving).
    pub fn keep_index(&mut self, journal: Journal) {
        self.journal = Some(journal);
    }

    /// Whether this mount keeps a node index.
    pub fn keeps_index(&self) -> bool {
        self.journal.is_some()
    }

    /// Records in the node index that counter ids below `next` may be given
    /// ([`Journal::reserve`]); nothing without an index.
    pub fn reserve(&self, next: u64) {
        if let Some(j) = &self.journal {
            j.reserve(next);
        }
    }

    /// Appends `record` to the node index, compacting it from `snapshot` when it has grown
    /// enough ([`Journal::append`], [`Journal::compact`]); nothing without an index.
    pub fn append(&self, record: &[u8], snapshot: impl FnOnce() -> io::Result<Index>) {
        if let Some(j) = &self.journal
            && j.append(record)
        {
            j.compact(snapshot);
        }
    }

    /// Runs `f` with the node index records it makes written in one go at its end
    /// ([`Journal::batch`]), compacting from `snapshot` after when due; the caller replies
    /// after this returns.
    pub fn batch<R>(
        &self,
        f: impl FnOnce() -> R,
        snapshot: impl FnOnce() -> io::Result<Index>,
    ) -> R {
        let Some(j) = &self.journal else {
            return f();
        };
        let (r, compact) = j.batch(f);
        if compact {
            j.compact(snapshot);
        }
        r
    }
}
