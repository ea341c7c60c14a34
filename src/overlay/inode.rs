//! The node table: FUSE node ids, their lookup counts and where each node lives in the layers.
//! Inside the names part (`names.rs`), which alone uses it ([`Backing`], what it locates, goes
//! out to the engine).
//!
//! Node ids are the `st_ino` a name shows except for lower files with several links (which show
//! the lower inode's identity or their recorded link group's, `Names::shown`), so they must
//! be stable for the life of the mount and survive copy-up. They are derived from the identity
//! of what a name refers to ([`IdKey`]):
//! * a lower directory, or a lower non-directory with one link: `(lower layer + 1) << 56 | ino`
//!   (deterministic, no memory needed; the same after the kernel forgets the node);
//! * a lower non-directory with several links (each name a node of its own, as each dentry
//!   is an inode of its own in kernel overlayfs without `index=on`, so copying one name up
//!   breaks it from the others): a hash of (parent, name) with the top bit set ([`Nodes::path_id`]), so nothing is kept for it once the kernel forgets the
//!   node; a hash that clashes with a live node of another path gets a counter id kept per
//!   path instead;
//! * anything that lives only in the upper dir: a counter id kept per upper inode number.
//!
//! Copy-up registers the new upper inode under the node's existing id, so `st_ino` does not
//! change — except for a lower file the kernel holds open through FUSE passthrough, whose
//! kernel inode keeps the lower file as its backing while it is open: its copy gets a **new**
//! node id (a counter id) that shows the old one as `st_ino` ([`Nodes::supersede`]), and the
//! old node follows the copy for everything the daemon serves (see `passthrough.rs`). Counter
//! ids start at 2 (1 is the root) and stay below 2^56.
//!
//! No id is given to two files in one mount, so a node id plus the mount's generation
//! ([`Nodes::generation`], random for every mount that does not continue an earlier one from
//! its node index, `node_index.rs` and [`Nodes::restore`], since counter ids start again at 2)
//! names one file for the life of the mount: the kernel's file handle (fs/fuse/inode.c,
//! `fuse_encode_fh`). To open a handle whose inode the kernel forgot, it sends LOOKUP(id, ".")
//! (and LOOKUP(id, "..") to connect a directory), so a node the kernel forgets is not
//! forgotten here: its name, (parent id, name), is parked ([`Nodes::parked`]) — up to
//! [`PARKED_MAX`] of them, the least recently parked dropped first — and found again from there
//! (`OverlayFs::revive` in `fs/mod.rs`), which checks that the name still resolves to the same id.

use std::collections::HashMap;
use std::ffi::{CString, OsStr, OsString};
use std::os::unix::ffi::OsStrExt;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use parking_lot::{Condvar, Mutex, RwLock};

use super::stack::{Kind, Tree, top_lower};

/// The root's node id (FUSE_ROOT_ID).
pub const ROOT: u64 = 1;
const LOWER_SHIFT: u32 = 56;
/// Directory under the workdir holding data of unlinked-but-open files.
pub const ORPHANS: &str = "orphans";
/// Bytes reserved for a node's path: one allocation covers a path of up to 255 bytes.
const PATH_CAPACITY: usize = 256;

/// Where the upper data of unlinked node `id` is kept, relative to the workdir.
pub fn orphan_name(id: u64) -> CString {
    CString::new(format!("{ORPHANS}/{id:x}")).expect("no NUL")
}

/// Where a node's name is.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Loc {
    /// Reachable as `name` in directory node `parent`.
    Attached {
        /// Parent node id.
        parent: u64,
        /// The entry name.
        name: Box<OsStr>,
    },
    /// Unlinked while the kernel still referenced it; its data lives on at
    /// `<workdir>/orphans/<id>` (upper data) or stays in a lower layer at `lower_path`.
    Orphan {
        /// Path of the lower copy relative to the lower root, when the node was lower-only.
        lower_path: Option<CString>,
    },
    /// A removed directory (the kernel marks it dead; only getattr may still arrive).
    Gone,
}

impl Loc {
    /// The parent node id while attached.
    pub fn parent(&self) -> Option<u64> {
        match self {
            Loc::Attached { parent, .. } => Some(*parent),
            _ => None,
        }
    }
}

/// One node the kernel holds a reference to.
#[derive(Debug)]
pub struct Node {
    /// Where the node is.
    pub loc: Loc,
    /// Its file type.
    pub kind: Kind,
    /// True when the node exists in the upper dir (data and metadata come from there).
    pub upper: bool,
    /// Bit i set: lower layer i holds the node (for directories: every lower dir merged into
    /// it; for other files: the one lower that provides it when `upper` is false).
    pub lowers: u64,
    /// Kernel lookup count (FUSE "nlookup"); the node is dropped when it reaches 0.
    pub lookups: u64,
    /// The node that took over this one's name at a copy-up by re-lookup
    /// ([`Nodes::supersede`]); 0 for none.
    pub succ: u64,
    /// The directory node this one holds a lookup of (0: none). The kernel pins a dentry's
    /// parent, so the parents of a node it looked up are in the table; a node found again for
    /// a file handle has a dentry with no parent, so it holds its parent itself (which holds
    /// its own, and so on), or its path could not be built ([`Nodes::path`]).
    pub pin: u64,
}

/// A node as [`Nodes::snapshot`] read it.
#[derive(Clone, Debug)]
pub struct NodeView {
    /// Node id.
    pub id: u64,
    /// Where it is.
    pub loc: Loc,
    /// In the upper dir.
    pub upper: bool,
    /// Lower layers holding it ([`Node::lowers`]).
    pub lowers: u64,
}

/// Where a node's data is, as [`Nodes::locate`] found it (a snapshot taken under the table's
/// lock).
#[derive(Clone, Debug)]
pub struct Backing {
    /// File type.
    pub kind: Kind,
    /// Present in the upper dir (or, for an unlinked file, in the workdir).
    pub upper: bool,
    /// Lower layers holding it (see [`Node::lowers`]).
    pub lowers: u64,
    /// The tree [`Self::path`] is relative to: the upper dir, the top lower layer, or the
    /// workdir for the kept upper data of an unlinked file ([`orphan_name`]).
    pub tree: Tree,
    /// The path of its data relative to the root of `tree`.
    pub path: CString,
    /// The parent node id while attached (0 for the root and for unlinked nodes).
    pub parent: u64,
    /// True while the node has a name in the merged view (false once unlinked).
    pub attached: bool,
}

impl Backing {
    /// A directory present in the upper dir at `path` below `parent` and merged from the
    /// lower layers `lowers`: what resolving its names needs (see
    /// [`OverlayFs::resolve`](super::fs::OverlayFs::resolve)) for one that is not in the table.
    pub fn upper_dir(lowers: u64, parent: u64, path: CString) -> Backing {
        Backing {
            kind: Kind::Dir,
            upper: true,
            lowers,
            tree: Tree::Upper,
            path,
            parent,
            attached: true,
        }
    }

    /// True for an unlinked file whose data is still in a lower layer (it has no upper copy).
    pub fn unlinked_lower(&self) -> bool {
        !self.attached && !self.upper
    }
}

/// The path of `id` relative to the layer roots (`.` for the root), or `None` when the node is
/// not attached to the tree: built straight into the C string the `*at` syscalls take, in one
/// allocation (for paths up to [`PATH_CAPACITY`]). The walk goes from the node up, so each
/// name is appended reversed and the whole is reversed at the end.
///
/// Every name in the table was resolved (turned into a C string) before it was remembered, so
/// none holds a NUL byte; were one to, the node would read as detached.
fn path_in(map: &HashMap<u64, Box<Node>>, id: u64) -> Option<CString> {
    let mut buf: Vec<u8> = Vec::with_capacity(PATH_CAPACITY);
    let mut cur = id;
    let mut depth = 0;
    while cur != ROOT {
        let Loc::Attached { parent, name } = &map.get(&cur)?.loc else {
            return None;
        };
        if !buf.is_empty() {
            buf.push(b'/');
        }
        let start = buf.len();
        buf.extend_from_slice(name.as_bytes());
        buf[start..].reverse();
        cur = *parent;
        depth += 1;
        if depth > 4096 {
            return None;
        }
    }
    if buf.is_empty() {
        buf.push(b'.');
    }
    buf.reverse();
    CString::new(buf).ok()
}

/// Forgotten nodes whose name is kept for file handles: about 110 bytes each with a 16-byte
/// name (the LRU entry, its bucket, the name), so at most ~14 MiB; nothing is allocated before
/// the kernel forgets a node. A handle of a node dropped from there opens ESTALE.
pub const PARKED_MAX: usize = 1 << 17;

/// Where a forgotten node was last seen: its parent node id and its name there.
pub type Parked = (u64, Box<OsStr>);

/// Set in the ids of multiply-linked lower files ([`Nodes::path_id`]).
const PATH_ID_BIT: u64 = 1 << 63;

/// The identity a counter id is kept for (see the module docs).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum IdKey {
    /// An upper inode number.
    Upper(u64),
    /// A multiply-linked lower file, by parent node id and name.
    LowerPath(u64, OsString),
    /// A lower inode number too large for the deterministic encoding.
    LowerBig(u8, u64),
}

/// Node table plus id allocation.
pub struct Nodes {
    /// Boxed values keep the table's buckets small (16 bytes): a million-entry walk then
    /// costs tens of MB of table, not the ~150 MB of power-of-two buckets of whole nodes.
    map: RwLock<HashMap<u64, Box<Node>>>,
    ids: Mutex<HashMap<IdKey, u64>>,
    next: AtomicU64,
    /// Whether [`Nodes::path_id`] ever fell back to a counter id (then it looks those up).
    clashes: std::sync::atomic::AtomicBool,
    /// Gives the memory of forgotten nodes back to the system once forgets stop.
    trim: Arc<HeapTrim>,
    /// Copies made by [`Nodes::supersede`]: new node id → the node id it shows as `st_ino`.
    shown_as: RwLock<HashMap<u64, u64>>,
    /// Whether `shown_as` was ever used (the hot path then skips its lock).
    any_shown_as: std::sync::atomic::AtomicBool,
    /// Names of attached nodes the kernel forgot (see the module docs), by node id.
    parked: Mutex<lru::LruCache<u64, Parked>>,
    /// Upper inodes given their id again from an earlier mount's node index (`node_index.rs`):
    /// upper inode number → (node id, the id it shows as `st_ino`), taken by
    /// [`Nodes::upper_id`] when the inode is first resolved.
    restored: Mutex<HashMap<u64, (u64, u64)>>,
    /// Whether `restored` was ever filled (the hot path then skips its lock).
    any_restored: std::sync::atomic::AtomicBool,
    /// The generation every node of this mount is given.
    generation: u32,
}

/// A generation no earlier [`Nodes`] table of this process had and, by the clock and pid it is
/// mixed from, most likely none of another: never 0.
fn new_generation() -> u32 {
    use std::hash::{BuildHasher, Hasher};
    static SEQ: AtomicU64 = AtomicU64::new(0);
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64);
    // RandomState's keys are random per process.
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u64(now);
    h.write_u32(std::process::id());
    h.write_u64(SEQ.fetch_add(1, Ordering::Relaxed));
    (h.finish() as u32).max(1)
}

/// Nodes freed before a heap trim is worth it.
const TRIM_AFTER_FREED: u64 = 4096;
/// How long forgets must have stopped before the heap is trimmed: the kernel forgets a large
/// tree in batches, and a trim in the middle of them leaves the pages of the nodes still held
/// at that moment resident after they go (measured: 45 MB of a 1M-entry walk's 180 MB).
const TRIM_QUIET: Duration = Duration::from_millis(500);

/// Returns freed heap memory to the system ([`trim_heap`]) once at least
/// [`TRIM_AFTER_FREED`] nodes were freed and no node was freed for [`TRIM_QUIET`], from a
/// thread of its own started at the first such burst (FORGET handlers never wait for it).
#[derive(Default)]
struct HeapTrim {
    state: Mutex<TrimState>,
    wake: Condvar,
    started: std::sync::OnceLock<()>,
}

#[derive(Default)]
struct TrimState {
    /// Nodes freed since the last trim.
    freed: u64,
    /// When the last was freed.
    last: Option<Instant>,
}

impl HeapTrim {
    /// One more node was freed.
    fn freed(self: &Arc<HeapTrim>) {
        let due = {
            let mut st = self.state.lock();
            st.freed += 1;
            st.last = Some(Instant::now());
            st.freed >= TRIM_AFTER_FREED
        };
        if due {
            self.started.get_or_init(|| {
                let me = self.clone();
                let spawned = std::thread::Builder::new()
                    .name("heap-trim".into())
                    .spawn(move || me.run());
                if let Err(e) = spawned {
                    tracing::warn!("no heap-trim thread: {e}");
                }
            });
            self.wake.notify_one();
        }
    }

    /// The trim thread: waits for a burst of frees to end, then trims.
    fn run(&self) {
        let mut st = self.state.lock();
        loop {
            if st.freed < TRIM_AFTER_FREED {
                self.wake.wait(&mut st);
                continue;
            }
            let quiet_at = st.last.map_or_else(Instant::now, |t| t + TRIM_QUIET);
            if Instant::now() < quiet_at {
                let _ = self.wake.wait_until(&mut st, quiet_at);
                continue;
            }
            st.freed = 0;
            drop(st);
            trim_heap();
            tracing::debug!("heap trimmed after forgets");
            st = self.state.lock();
        }
    }
}

/// Returns freed heap memory to the system (glibc keeps the freed blocks of a million small
/// node allocations otherwise, and the daemon's RSS would not fall after a walk of a large
/// tree).
fn trim_heap() {
    crate::sys::malloc_trim();
}

impl Nodes {
    /// A table holding only the root (upper dir present, merged with every lower in `lowers`).
    pub fn new(lowers: u64) -> Nodes {
        let mut map = HashMap::new();
        map.insert(
            ROOT,
            Box::new(Node {
                loc: Loc::Attached {
                    parent: 0,
                    name: OsStr::new("").into(),
                },
                kind: Kind::Dir,
                upper: true,
                lowers,
                lookups: 1,
                succ: 0,
                pin: 0,
            }),
        );
        Nodes {
            map: RwLock::new(map),
            ids: Mutex::new(HashMap::new()),
            next: AtomicU64::new(2),
            clashes: Default::default(),
            trim: Default::default(),
            shown_as: Default::default(),
            any_shown_as: Default::default(),
            // Unbounded in type, bounded by `forget` (a bounded LruCache allocates its whole
            // table up front).
            parked: Mutex::new(lru::LruCache::unbounded()),
            restored: Default::default(),
            any_restored: Default::default(),
            generation: new_generation(),
        }
    }

    /// Continues the mount whose node index (`node_index.rs`) was read: its `generation`, counter
    /// ids from `next` on (none of its ids goes to another file), the names of its nodes
    /// `parked` (least recently used first; each (node id, parent id, name)) and the upper
    /// inodes `uppers` (each (upper inode number, node id, id shown as `st_ino`)) given their
    /// old ids when resolved. Called before the mount serves requests.
    pub fn restore(
        &mut self,
        generation: u32,
        next: u64,
        parked: impl IntoIterator<Item = (u64, u64, Box<OsStr>)>,
        uppers: impl IntoIterator<Item = (u64, u64, u64)>,
    ) {
        self.generation = generation.max(1);
        *self.next.get_mut() = next.clamp(2, 1 << LOWER_SHIFT);
        let lru = self.parked.get_mut();
        for (id, parent, name) in parked {
            if lru.len() >= PARKED_MAX {
                lru.pop_lru();
            }
            lru.put(id, (parent, name));
        }
        let restored = self.restored.get_mut();
        restored.extend(
            uppers
                .into_iter()
                .map(|(ino, id, shown)| (ino, (id, shown))),
        );
        *self.any_restored.get_mut() = !restored.is_empty();
    }

    /// What a node index (`node_index.rs`) records of this mount: the names of the nodes the
    /// kernel may hold a handle of, least recently used first — the parked ones, then the
    /// live attached ones (the root excepted) — at most `max` (the most recent), each (node
    /// id, parent id, name); and the next counter id.
    pub fn index_names(&self, max: usize) -> (Vec<(u64, u64, Box<OsStr>)>, u64) {
        let mut out: Vec<(u64, u64, Box<OsStr>)> = {
            let parked = self.parked.lock();
            parked
                .iter()
                .map(|(&id, (p, n))| (id, *p, n.clone()))
                .collect()
        };
        // LruCache iterates most recent first.
        out.reverse();
        for (&id, n) in self.map.read().iter() {
            if let Loc::Attached { parent, name } = &n.loc
                && id != ROOT
            {
                out.push((id, *parent, name.clone()));
            }
        }
        let cut = out.len().saturating_sub(max);
        out.drain(..cut);
        (out, self.next.load(Ordering::Relaxed))
    }

    /// The node id of upper inode `ino` and the id it shows as `st_ino`, if it has one: the
    /// one registered for it (by resolving it, or at copy-up), or the one an earlier mount
    /// gave it that is not taken yet ([`Nodes::restore`]).
    pub fn upper_known(&self, ino: u64) -> Option<(u64, u64)> {
        let registered = self.ids.lock().get(&IdKey::Upper(ino)).copied();
        match registered {
            Some(id) => Some((id, self.shown_id(id))),
            None if self.any_restored.load(Ordering::Relaxed) => {
                self.restored.lock().get(&ino).copied()
            }
            None => None,
        }
    }

    /// The node id of upper inode `ino`: the one registered for it, else the one an earlier
    /// mount gave it ([`Nodes::restore`]), else a new counter id, registered.
    pub fn upper_id(&self, ino: u64) -> u64 {
        if !self.any_restored.load(Ordering::Relaxed) {
            return self.keyed(IdKey::Upper(ino));
        }
        let mut ids = self.ids.lock();
        if let Some(&id) = ids.get(&IdKey::Upper(ino)) {
            return id;
        }
        let id = match self.restored.lock().remove(&ino) {
            Some((id, shown)) => {
                if shown != id {
                    // Under the ids lock: nobody resolves the inode to `id` before it shows
                    // `shown`.
                    self.show_as(id, shown);
                }
                id
            }
            None => self.next.fetch_add(1, Ordering::Relaxed),
        };
        ids.insert(IdKey::Upper(ino), id);
        id
    }

    /// The generation of every node id of this table (FUSE `fuse_entry_out.generation`; the
    /// kernel puts it in file handles and compares it when one is opened).
    pub fn generation(&self) -> u32 {
        self.generation
    }

    /// Where forgotten node `id` was last attached, if it was and is still kept.
    pub fn parked(&self, id: u64) -> Option<Parked> {
        self.parked.lock().peek(&id).cloned()
    }

    /// Reads node `id` through `f` under the table's read lock (no copy); `None` if absent.
    pub fn peek<R>(&self, id: u64, f: impl FnOnce(&Node) -> R) -> Option<R> {
        self.map.read().get(&id).map(|n| f(n))
    }

    /// Applies `f` to node `id` under the table lock; `None` if absent.
    pub fn update<R>(&self, id: u64, f: impl FnOnce(&mut Node) -> R) -> Option<R> {
        self.map.write().get_mut(&id).map(|n| f(n))
    }

    /// Records one more kernel reference to `id` at (`parent`, `name`) with the given state,
    /// creating the node if needed. Returns whether that is a new name for `id`: neither where
    /// the node was attached nor, for a node the kernel had forgotten, where it was parked.
    pub fn remember(
        &self,
        id: u64,
        parent: u64,
        name: &OsStr,
        kind: Kind,
        upper: bool,
        lowers: u64,
    ) -> bool {
        let mut map = self.map.write();
        let node = map.entry(id).or_insert_with(|| {
            Box::new(Node {
                loc: Loc::Gone,
                kind,
                upper,
                lowers,
                lookups: 0,
                succ: 0,
                pin: 0,
            })
        });
        let same = matches!(&node.loc, Loc::Attached { parent: p, name: n } if *p == parent && **n == *name);
        if !same {
            node.loc = Loc::Attached {
                parent,
                name: name.into(),
            };
        }
        node.kind = kind;
        node.upper = upper;
        node.lowers = lowers;
        let mut new_name = !same;
        if node.lookups == 0 {
            // Live again: its name is the node's now.
            let mut parked = self.parked.lock();
            if !parked.is_empty()
                && let Some((p, n)) = parked.pop(&id)
                && p == parent
                && *n == *name
            {
                new_name = false;
            }
        }
        node.lookups += 1;
        new_name
    }

    /// The next counter id to be given (every counter id given so far is below it).
    pub fn next_counter(&self) -> u64 {
        self.next.load(Ordering::Relaxed)
    }

    /// Records one kernel reference to node `id`, which has no name: an `O_TMPFILE` file whose
    /// upper data is kept at [`orphan_name`] until a LINK names it (`Nodes::remember` then
    /// attaches it) or the kernel forgets it. Creates the node if needed.
    pub fn remember_unnamed(&self, id: u64, kind: Kind) {
        let mut map = self.map.write();
        let node = map.entry(id).or_insert_with(|| {
            Box::new(Node {
                loc: Loc::Orphan { lower_path: None },
                kind,
                upper: true,
                lowers: 0,
                lookups: 0,
                succ: 0,
                pin: 0,
            })
        });
        node.lookups += 1;
    }

    /// Makes node `id` hold the lookup of its parent `parent` that the caller took (see
    /// [`Node::pin`]); false (the caller gives it back) when `id` is gone or holds one already.
    pub fn pin(&self, id: u64, parent: u64) -> bool {
        self.update(id, |n| {
            let free = n.pin == 0;
            if free {
                n.pin = parent;
            }
            free
        }) == Some(true)
    }

    /// Undoes one [`Nodes::remember`] that the kernel did not receive.
    pub fn unremember(&self, id: u64) {
        let _ = self.forget(id, 1);
    }

    /// Drops `n` kernel references; returns the node when it was removed (count reached 0).
    pub fn forget(&self, id: u64, n: u64) -> Option<Node> {
        if id == ROOT {
            return None;
        }
        let mut map = self.map.write();
        let node = map.get_mut(&id)?;
        node.lookups = node.lookups.saturating_sub(n);
        if node.lookups == 0 {
            let gone = map.remove(&id).map(|b| *b);
            if let Some(Node {
                loc: Loc::Attached { parent, name },
                ..
            }) = &gone
            {
                let mut parked = self.parked.lock();
                if parked.len() >= PARKED_MAX {
                    parked.pop_lru();
                }
                parked.put(id, (*parent, name.clone()));
            }
            drop(map);
            self.trim.freed();
            gone
        } else {
            None
        }
    }

    /// Gives memory back after the kernel forgot most nodes (a walk of a large tree ends): when
    /// the table holds less than an eighth of its capacity (and more than 16k slots), the
    /// table is rebuilt at twice its size. Returns whether it was. Cheap otherwise (a read lock).
    pub fn shrink_if_sparse(&self) -> bool {
        let sparse =
            |m: &HashMap<u64, Box<Node>>| m.capacity() > 16384 && m.len() * 8 < m.capacity();
        if !sparse(&self.map.read()) {
            return false;
        }
        let mut map = self.map.write();
        if !sparse(&map) {
            return false;
        }
        let keep = map.len() * 2;
        map.shrink_to(keep);
        tracing::debug!(nodes = map.len(), "node table shrunk");
        true
    }

    /// Every node in the table: its id, where it is, whether it is in the upper dir and its
    /// lowers (a warm mount's reset reads the table once, `fs/reset.rs`).
    pub fn snapshot(&self) -> Vec<NodeView> {
        let map = self.map.read();
        map.iter()
            .map(|(&id, n)| NodeView {
                id,
                loc: n.loc.clone(),
                upper: n.upper,
                lowers: n.lowers,
            })
            .collect()
    }

    /// The first node (id) for which `f` holds, if any; read under the table's lock, nothing
    /// copied.
    pub fn find(&self, f: impl Fn(u64, &Node) -> bool) -> Option<u64> {
        self.map
            .read()
            .iter()
            .find(|(id, n)| f(**id, n))
            .map(|(id, _)| *id)
    }

    /// Sets where node `id`'s data is (`upper`, `lowers`); false when it is not in the table.
    pub fn set_layers(&self, id: u64, upper: bool, lowers: u64) -> bool {
        self.update(id, |n| {
            n.upper = upper;
            n.lowers = lowers;
        })
        .is_some()
    }

    /// Forgets everything known of upper inodes and of nodes the kernel no longer holds: the
    /// ids kept for upper inode numbers, the copies' shown ids, the parked names of forgotten
    /// nodes and the restored upper ids. For a warm mount's reset, once its upper dir is empty
    /// and no node in the table is upper (`fs/reset.rs`): nothing of them can be reached again.
    pub fn forget_upper_identities(&self) {
        self.ids.lock().retain(|k, _| !matches!(k, IdKey::Upper(_)));
        self.shown_as.write().clear();
        self.parked.lock().clear();
        self.restored.lock().clear();
    }

    /// The path of `id` relative to the layer roots (`.` for the root), or `None` when the
    /// node is not attached to the tree.
    pub fn path(&self, id: u64) -> Option<CString> {
        path_in(&self.map.read(), id)
    }

    /// Everything needed to reach node `id`'s data, read in one pass under the table lock (no
    /// copy of the node, no second lookup for its path): the hot path of GETATTR/READ/WRITE.
    ///
    /// A node superseded by a copy ([`Nodes::supersede`]) is located where its copy is.
    pub fn locate(&self, id: u64) -> Option<Backing> {
        let map = self.map.read();
        let mut n = map.get(&id)?;
        let mut id = id;
        if n.succ != 0
            && let Some(s) = map.get(&n.succ)
        {
            (id, n) = (n.succ, s);
        }
        let top = || top_lower(n.lowers).map(Tree::Lower);
        let (tree, path, attached) = match &n.loc {
            Loc::Attached { .. } if n.upper => (Tree::Upper, path_in(&map, id)?, true),
            Loc::Attached { .. } => (top()?, path_in(&map, id)?, true),
            Loc::Orphan { lower_path: None } => (Tree::Work, orphan_name(id), false),
            Loc::Orphan {
                lower_path: Some(p),
            } => (top()?, p.clone(), false),
            Loc::Gone => return None,
        };
        Some(Backing {
            kind: n.kind,
            upper: n.upper,
            lowers: n.lowers,
            tree,
            path,
            parent: n.loc.parent().unwrap_or(0),
            attached,
        })
    }

    /// Ids of every node below directory `dir` (not `dir` itself).
    pub fn descendants(&self, dir: u64) -> Vec<u64> {
        let map = self.map.read();
        map.keys()
            .copied()
            .filter(|&id| {
                let mut cur = id;
                let mut depth = 0;
                while let Some(Loc::Attached { parent, .. }) = map.get(&cur).map(|n| &n.loc) {
                    if *parent == dir {
                        return true;
                    }
                    cur = *parent;
                    depth += 1;
                    if cur == 0 || depth > 4096 {
                        break;
                    }
                }
                false
            })
            .collect()
    }

    /// The deterministic id of lower inode `ino` in layer `layer`.
    pub fn lower_id(&self, layer: u8, ino: u64) -> u64 {
        if ino < (1 << LOWER_SHIFT) {
            ((layer as u64 + 1) << LOWER_SHIFT) | ino
        } else {
            self.keyed(IdKey::LowerBig(layer, ino))
        }
    }

    /// The id of the multiply-linked lower file `name` in directory `parent`: a hash of
    /// both, unless a live node of another path has it (then a counter id kept per path).
    pub fn path_id(&self, parent: u64, name: &OsStr) -> u64 {
        use std::hash::{Hash, Hasher};
        let key = || IdKey::LowerPath(parent, name.to_os_string());
        {
            let ids = self.ids.lock();
            if self.clashes.load(Ordering::Relaxed)
                && let Some(&id) = ids.get(&key())
            {
                return id;
            }
        }
        // DefaultHasher::new() has fixed keys: the same id for the same path every time.
        let mut h = std::collections::hash_map::DefaultHasher::new();
        (parent, name.as_bytes()).hash(&mut h);
        let id = h.finish() | PATH_ID_BIT;
        let clash = self.peek(id, |n| match &n.loc {
            Loc::Attached {
                parent: p,
                name: nm,
            } => *p != parent || **nm != *name,
            _ => true,
        });
        if clash == Some(true) {
            self.clashes.store(true, Ordering::Relaxed);
            return self.keyed(key());
        }
        id
    }

    /// The counter id kept for `key`, allocated on first use.
    pub fn keyed(&self, key: IdKey) -> u64 {
        let mut ids = self.ids.lock();
        *ids.entry(key)
            .or_insert_with(|| self.next.fetch_add(1, Ordering::Relaxed))
    }

    /// Makes upper inode `ino` resolve to node id `id` (copy-up keeps `st_ino`).
    pub fn register_upper(&self, ino: u64, id: u64) {
        self.ids.lock().insert(IdKey::Upper(ino), id);
    }

    /// Forgets the id of upper inode `ino` (the inode was deleted; its number may be reused).
    pub fn drop_upper(&self, ino: u64) {
        if self.any_restored.load(Ordering::Relaxed) {
            self.restored.lock().remove(&ino);
        }
        let gone = self.ids.lock().remove(&IdKey::Upper(ino));
        if let Some(id) = gone
            && self.any_shown_as.load(Ordering::Relaxed)
        {
            self.shown_as.write().remove(&id);
        }
    }

    /// A new counter id (for the copy of a superseded node).
    pub fn fresh_id(&self) -> u64 {
        self.next.fetch_add(1, Ordering::Relaxed)
    }

    /// Makes node `copy` show `shown` as its `st_ino` (before the copy becomes visible).
    pub fn show_as(&self, copy: u64, shown: u64) {
        self.shown_as.write().insert(copy, shown);
        self.any_shown_as.store(true, Ordering::Relaxed);
    }

    /// The node id node `id` shows as `st_ino`: its own, or for the copy made by
    /// [`Nodes::supersede`], the superseded node's.
    pub fn shown_id(&self, id: u64) -> u64 {
        if !self.any_shown_as.load(Ordering::Relaxed) {
            return id;
        }
        self.shown_as.read().get(&id).copied().unwrap_or(id)
    }

    /// Copy-up by re-lookup: node `old` (a lower file at `parent`/`name`) is superseded by
    /// node `copy`, now at that name in the upper dir. `old` leaves the namespace (as an
    /// unlinked lower file would, keeping `lower_path` as its fallback) and is located where
    /// `copy` is from now on; `copy` is held by one reference of the daemon's own until `old`
    /// is forgotten (so `old` always has a copy to follow). Returns false (and changes
    /// nothing) when `old` is not attached.
    pub fn supersede(&self, old: u64, copy: u64, lower_path: CString) -> bool {
        let mut map = self.map.write();
        let Some(Loc::Attached { parent, name }) = map.get(&old).map(|n| n.loc.clone()) else {
            return false;
        };
        let c = map.entry(copy).or_insert_with(|| {
            Box::new(Node {
                loc: Loc::Gone,
                kind: Kind::File,
                upper: true,
                lowers: 0,
                lookups: 0,
                succ: 0,
                pin: 0,
            })
        });
        c.loc = Loc::Attached { parent, name };
        c.upper = true;
        c.lowers = 0;
        c.lookups += 1;
        let n = map.get_mut(&old).expect("checked above");
        n.loc = Loc::Orphan {
            lower_path: Some(lower_path),
        };
        n.upper = true;
        n.succ = copy;
        true
    }

    /// The node that superseded `id`, or `id` when none did; costs nothing until a first
    /// [`Nodes::supersede`].
    pub fn successor_if_any(&self, id: u64) -> u64 {
        if !self.any_shown_as.load(Ordering::Relaxed) {
            return id;
        }
        self.successor(id).unwrap_or(id)
    }

    /// The node that superseded `id` ([`Nodes::supersede`]), if any.
    pub fn successor(&self, id: u64) -> Option<u64> {
        self.peek(id, |n| n.succ).filter(|&s| s != 0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_follow_renames_and_lookup_counts_drop_nodes() {
        let t = Nodes::new(1);
        t.remember(10, ROOT, OsStr::new("a"), Kind::Dir, false, 1);
        t.remember(11, 10, OsStr::new("b"), Kind::File, false, 1);
        assert_eq!(t.path(11).unwrap().as_c_str(), c"a/b");
        assert_eq!(t.path(ROOT).unwrap().as_c_str(), c".");
        t.update(10, |n| {
            n.loc = Loc::Attached {
                parent: ROOT,
                name: OsStr::new("z").into(),
            }
        });
        assert_eq!(t.path(11).unwrap().as_c_str(), c"z/b");
        assert_eq!(t.descendants(10), vec![11]);
        t.remember(12, 10, OsStr::new("sub dir"), Kind::Dir, false, 1);
        t.remember(13, 12, OsStr::new("file.txt"), Kind::File, false, 1);
        let located = t.locate(13).unwrap();
        assert!(located.attached);
        assert_eq!(located.tree, Tree::Lower(0));
        assert_eq!(located.path.as_c_str(), c"z/sub dir/file.txt");
        assert_eq!(located.parent, 12);
        assert_eq!(t.locate(ROOT).unwrap().parent, 0);
        t.update(13, |n| n.loc = Loc::Orphan { lower_path: None });
        assert!(t.path(13).is_none());
        assert_eq!(t.locate(13).unwrap().path, orphan_name(13));
        assert_eq!(t.locate(13).unwrap().tree, Tree::Work);
        t.update(13, |n| {
            n.loc = Loc::Orphan {
                lower_path: Some(c"z/sub dir/file.txt".into()),
            }
        });
        assert!(t.locate(13).unwrap().unlinked_lower());
        t.remember(11, 10, OsStr::new("b"), Kind::File, false, 1);
        assert!(t.forget(11, 1).is_none());
        assert!(t.forget(11, 1).is_some());
        assert!(t.peek(11, |_| ()).is_none());
        assert!(t.forget(ROOT, 5).is_none());
    }

    #[test]
    fn forgotten_attached_nodes_are_parked_until_looked_up_again() {
        let t = Nodes::new(1);
        t.remember(10, ROOT, OsStr::new("d"), Kind::Dir, false, 1);
        t.remember(11, 10, OsStr::new("f"), Kind::File, false, 1);
        t.remember(12, 10, OsStr::new("g"), Kind::File, true, 0);
        t.update(12, |n| n.loc = Loc::Orphan { lower_path: None });
        assert!(t.forget(11, 1).is_some());
        assert!(t.forget(12, 1).is_some());
        assert_eq!(t.parked(11), Some((10, OsStr::new("f").into())));
        assert_eq!(t.parked(12), None, "an unlinked node keeps no name");
        t.remember(11, 10, OsStr::new("f"), Kind::File, false, 1);
        assert_eq!(t.parked(11), None, "live again");
        assert!(t.pin(11, 10));
        assert!(!t.pin(11, 10), "one pin per node");
        assert_eq!(t.forget(11, 1).map(|n| n.pin), Some(10));
        assert_ne!(t.generation(), 0);
        assert_ne!(t.generation(), Nodes::new(1).generation(), "one per table");
    }

    #[test]
    fn a_restored_table_continues_the_indexed_mount() {
        let t = Nodes::new(1);
        t.remember(10, ROOT, OsStr::new("d"), Kind::Dir, false, 1);
        let f = t.upper_id(500);
        t.remember(f, 10, OsStr::new("f"), Kind::File, true, 0);
        t.remember(11, ROOT, OsStr::new("live"), Kind::File, false, 1);
        assert!(t.forget(f, 1).is_some());
        let (names, next) = t.index_names(PARKED_MAX);
        assert_eq!(next, f + 1);
        assert_eq!(
            names.first(),
            Some(&(f, 10, OsStr::new("f").into())),
            "parked first"
        );
        assert_eq!(names.len(), 3, "and the live ones, root excepted");
        assert_eq!(t.index_names(1).0.len(), 1, "bounded, most recent kept");
        let mut n = Nodes::new(1);
        n.restore(
            t.generation(),
            next,
            vec![(f, 10, OsStr::new("f").into())],
            [(500, f, 7)],
        );
        assert_eq!(n.generation(), t.generation());
        assert_eq!(n.parked(f), Some((10, OsStr::new("f").into())));
        assert_eq!(
            n.upper_known(500),
            Some((f, 7)),
            "known before it is resolved"
        );
        assert_eq!(
            n.upper_id(501),
            next,
            "new inodes: counter ids from the old next"
        );
        assert_eq!(n.upper_id(500), f, "the restored inode gets its old id");
        assert_eq!(n.shown_id(f), 7);
        assert_eq!(n.upper_id(500), f);
        n.drop_upper(500);
        assert_ne!(
            n.upper_id(500),
            f,
            "taken once; a deleted inode's number is another file"
        );
    }

    #[test]
    fn ids_are_stable_and_distinct() {
        let t = Nodes::new(1);
        let a = t.lower_id(0, 42);
        assert_eq!(a, t.lower_id(0, 42));
        assert_ne!(a, t.lower_id(1, 42));
        let p = t.keyed(IdKey::LowerPath(1, "x".into()));
        assert_eq!(p, t.keyed(IdKey::LowerPath(1, "x".into())));
        assert_ne!(p, t.keyed(IdKey::LowerPath(1, "y".into())));
        // Path ids: stable, distinct, and a clash with a live node of another path falls back.
        let x = t.path_id(ROOT, OsStr::new("x"));
        assert_eq!(x, t.path_id(ROOT, OsStr::new("x")));
        assert_ne!(x, t.path_id(ROOT, OsStr::new("y")));
        assert!(x >= PATH_ID_BIT);
        t.remember(x, ROOT, OsStr::new("x"), Kind::File, false, 1);
        assert_eq!(x, t.path_id(ROOT, OsStr::new("x")), "its own live node");
        t.update(x, |n| {
            n.loc = Loc::Attached {
                parent: ROOT,
                name: OsStr::new("other").into(),
            }
        });
        let fallback = t.path_id(ROOT, OsStr::new("x"));
        assert!(fallback < (1 << 56), "a clash gets a counter id");
        assert_eq!(fallback, t.path_id(ROOT, OsStr::new("x")));
        t.register_upper(7, a);
        assert_eq!(t.keyed(IdKey::Upper(7)), a);
        t.drop_upper(7);
        assert_ne!(t.keyed(IdKey::Upper(7)), a);
        assert!(p > ROOT && p < (1 << 56));
    }
}
