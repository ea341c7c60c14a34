//! FUSE passthrough of regular files (Linux 6.9+; fs/fuse/passthrough.c, backing.c,
//! iomode.c): an OPEN is answered with a backing file, and the kernel then reads, writes and
//! maps the file against that file's own inode — no READ/WRITE round trips, and one page cache
//! shared by every mount of a lower layer (kernel overlayfs's property). Without it OPEN
//! answers ENOSYS ("no-open" mode, see `handlers.rs`); which mode a mount uses is its
//! [`super::OverlayConfig`]'s choice.
//!
//! The kernel's rules decide the design. While files are open, a FUSE inode is in one I/O
//! mode: passthrough opens, all with the same backing file, or cached opens; an open in the
//! other mode (or with another backing file) fails with EIO, and no request replaces the
//! backing of an open file. So, per node:
//! * the backing id of its current data file is registered once and reused by every open
//!   until the data file changes (copy-up) or the kernel forgets the node;
//! * an open while passthrough opens of the same file are outstanding gets that backing;
//! * **copy-up by re-lookup**: a copy-up of a lower file that has passthrough opens
//!   outstanding (a write-open, truncate, chmod, chown, utimes, setxattr, removexattr, link or
//!   rename) gives the copy a **new node id**, which the name resolves to from then on and
//!   which shows the old node id as `st_ino` (`copy_up.rs` `supersede`). The old node's
//!   kernel inode keeps its lower backing; an OPEN of it is answered `ESTALE`, on which the
//!   kernel retries the open once with `LOOKUP_REVAL` (fs/namei.c `do_filp_open`), whose
//!   LOOKUP finds the copy (fs/fuse/dir.c `fuse_dentry_revalidate` drops a dentry whose node id
//!   changed). Metadata requests on the old node (GETATTR, SETATTR, xattrs — path-based or from
//!   an fd: FUSE cannot tell `fchmod(fd)` from `chmod(path)`, and only the path-based calls
//!   retry on ESTALE) are served from the copy and succeed; its attributes are sent with no
//!   TTL, so an old fd's fstat always shows the copy's metadata;
//! * the one rule this changes: fds opened before the copy-up keep reading the lower content
//!   (kernel overlayfs until 4.19, fuse-overlayfs 2.0 likewise); new opens read the copy;
//! * if registering a backing file ever fails (no CAP_SYS_ADMIN, a backing filesystem stacked
//!   too deep), passthrough is off for the rest of the mount and opens are cached as in no-open
//!   mode, except on nodes with passthrough opens outstanding (as above).
//!
//! No sequence of opens, writes and copy-ups puts an inode into two modes, so none gets EIO.
//! (`OpenMode::Busy` is what an open for writing would get were a node's data file to change
//! while its passthrough opens are outstanding; copy-up by re-lookup keeps that from
//! happening.)

use std::collections::HashMap;
use std::io;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};

use fuser::BackingId;
use parking_lot::{Condvar, Mutex};

/// How long an open for writing waits for the RELEASE of passthrough readers of the file it
/// was copied up from before it is refused: the kernel sends RELEASE asynchronously after the
/// last close, so a writer that opens right after a reader closed can arrive first.
const RELEASE_WAIT: std::time::Duration = std::time::Duration::from_millis(200);

/// File handle of a passthrough open.
pub const FH_PASSTHROUGH: u64 = 1;
/// File handle of a cached open (served by the daemon, pages kept by the kernel).
pub const FH_CACHED: u64 = 3;

/// The identity of a data file: `(st_dev, st_ino)`.
pub type FileKey = (u64, u64);

/// How an open is answered.
#[derive(Debug)]
pub enum OpenMode {
    /// Passthrough to this backing file.
    Passthrough(Arc<BackingId>),
    /// Cached: reads and writes come to the daemon, the kernel keeps pages.
    Cached,
    /// Refused with `ETXTBSY`: an open for writing while readers of the lower file it was
    /// copied up from are open through passthrough.
    Busy,
}

/// Passthrough opens of a node that the kernel has (answered, not yet released).
struct Active {
    /// Their data file and its backing (the kernel inode holds that backing meanwhile).
    key: FileKey,
    backing: Arc<BackingId>,
    count: u32,
    /// How many of them are open for writing (see [`Passthrough::has_writer`]).
    writers: u32,
}

#[derive(Default)]
struct NodeIo {
    /// The registered backing of the node's data file as it was last opened.
    backing: Option<(FileKey, Arc<BackingId>)>,
    active: Option<Active>,
}

impl NodeIo {
    /// The answer while passthrough opens are outstanding: their backing, or `Busy` for a
    /// writer when the data file has changed since. `None` when no open is outstanding.
    fn join_active(&mut self, key: FileKey, write: bool) -> Option<OpenMode> {
        let a = self.active.as_mut()?;
        if a.key != key && write {
            return Some(OpenMode::Busy);
        }
        a.count += 1;
        a.writers += u32::from(write);
        Some(OpenMode::Passthrough(a.backing.clone()))
    }

    /// Starts passthrough opens of `key` with `backing` (the first one for writing when
    /// `write`).
    fn start(&mut self, key: FileKey, backing: Arc<BackingId>, write: bool) -> OpenMode {
        self.backing = Some((key, backing.clone()));
        self.active = Some(Active {
            key,
            backing: backing.clone(),
            count: 1,
            writers: u32::from(write),
        });
        OpenMode::Passthrough(backing)
    }
}

/// The passthrough state of a mount.
pub struct Passthrough {
    on: AtomicBool,
    nodes: Mutex<HashMap<u64, NodeIo>>,
    /// Notified when passthrough opens are released.
    released: Condvar,
    /// Outstanding passthrough opens for writing, all nodes: [`Self::has_writer`] answers the
    /// common case (none) without the lock, on every attribute reply.
    writers: AtomicU32,
}

impl Passthrough {
    /// Passthrough state, on when `on` (the kernel granted FUSE_PASSTHROUGH and it was asked).
    pub fn new(on: bool) -> Passthrough {
        Passthrough {
            on: AtomicBool::new(on),
            nodes: Mutex::default(),
            released: Condvar::new(),
            writers: AtomicU32::new(0),
        }
    }

    /// Whether opens may get passthrough.
    pub fn on(&self) -> bool {
        self.on.load(Ordering::Relaxed)
    }

    /// Turns passthrough off (at INIT when the kernel does not offer it).
    pub fn turn_off(&self) {
        self.on.store(false, Ordering::Relaxed);
    }

    /// Decides how to answer an open of node `id` (for writing when `write`) whose current
    /// data file is `key`; `register` registers that file as a backing file (called without a
    /// lock held, at most once). A passthrough answer counts as an outstanding open until
    /// [`Self::released`].
    pub fn open(
        &self,
        id: u64,
        key: FileKey,
        write: bool,
        register: impl FnOnce() -> io::Result<BackingId>,
    ) -> OpenMode {
        let m = self.decide(id, key, write, register);
        if write && matches!(m, OpenMode::Passthrough(_)) {
            self.writers.fetch_add(1, Ordering::Release);
        }
        m
    }

    /// [`Self::open`]'s decision, without counting writers.
    fn decide(
        &self,
        id: u64,
        key: FileKey,
        write: bool,
        register: impl FnOnce() -> io::Result<BackingId>,
    ) -> OpenMode {
        {
            let mut nodes = self.nodes.lock();
            let deadline = std::time::Instant::now() + RELEASE_WAIT;
            loop {
                let n = nodes.entry(id).or_default();
                match n.join_active(key, write) {
                    Some(OpenMode::Busy) if std::time::Instant::now() < deadline => {
                        let _ = self.released.wait_until(&mut nodes, deadline);
                    }
                    Some(m) => return m,
                    None => break,
                }
            }
            let n = nodes.entry(id).or_default();
            if !self.on() {
                return OpenMode::Cached;
            }
            if let Some((bk, b)) = &n.backing
                && *bk == key
            {
                let b = b.clone();
                return n.start(key, b, write);
            }
        }
        let b = match register() {
            Ok(b) => Arc::new(b),
            Err(e) => {
                if self.on.swap(false, Ordering::Relaxed) {
                    tracing::warn!("FUSE passthrough off for this mount: backing file: {e}");
                }
                let mut nodes = self.nodes.lock();
                let n = nodes.entry(id).or_default();
                return n.join_active(key, write).unwrap_or(OpenMode::Cached);
            }
        };
        let mut nodes = self.nodes.lock();
        let n = nodes.entry(id).or_default();
        // Another open of this node may have raced us: join what it set up.
        n.join_active(key, write)
            .unwrap_or_else(|| n.start(key, b, write))
    }

    /// Whether the kernel holds passthrough opens of node `id` (answered, not yet released):
    /// its kernel inode's backing is then fixed, and a copy-up must give the copy a new node
    /// id (copy-up by re-lookup, see the module docs).
    pub fn has_open(&self, id: u64) -> bool {
        self.nodes
            .lock()
            .get(&id)
            .is_some_and(|n| n.active.is_some())
    }

    /// Whether the kernel holds a passthrough open of node `id` for writing. Its data then
    /// changes behind the kernel's cached attributes: a write through a shared mapping of a
    /// passthrough file dirties the backing file's pages and moves the backing inode's mtime
    /// and ctime, and no request tells the FUSE inode (fs/fuse/passthrough.c maps the backing
    /// file; only write(2) invalidates the attributes). Its attributes are then sent with no
    /// TTL (the engine's `attr_ttl`, `fs/ops.rs`), as kernel overlayfs's stat shows the upper
    /// inode's (xfstests generic/080, 215).
    pub fn has_writer(&self, id: u64) -> bool {
        if self.writers.load(Ordering::Acquire) == 0 {
            return false;
        }
        self.nodes
            .lock()
            .get(&id)
            .and_then(|n| n.active.as_ref())
            .is_some_and(|a| a.writers > 0)
    }

    /// A passthrough open of node `id` (for writing when `write`, the access mode of the
    /// RELEASE's flags) was released, or its answer never reached the kernel.
    pub fn released(&self, id: u64, write: bool) {
        let mut nodes = self.nodes.lock();
        if let Some(n) = nodes.get_mut(&id)
            && let Some(a) = &mut n.active
        {
            a.count = a.count.saturating_sub(1);
            if write && a.writers > 0 {
                a.writers -= 1;
                self.writers.fetch_sub(1, Ordering::Release);
            }
            if a.count == 0 {
                n.active = None;
                self.released.notify_all();
            }
        }
    }

    /// The kernel forgot node `id`: its backing id is closed (once no open holds it).
    pub fn forget(&self, id: u64) {
        let gone = self.nodes.lock().remove(&id);
        drop(gone);
    }
}
