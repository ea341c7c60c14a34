//! The names part of the overlay engine: which node a name is and where each node is — the
//! node table (`inode.rs`: node ids, kernel lookup counts, where each node's name and data
//! are), the directory listings of the stateless readdir (`dir.rs`), what the kernel still
//! holds of removed names (`removed.rs`: orphans, removed directories held open) and the
//! namespace lock that keeps all of them still for one operation.
//!
//! Private fields; the engine (`fs/`) asks it to resolve, remember, forget, move and detach
//! names and reads where a node is ([`Names::locate`]). It knows no layer: what the layers hold
//! at a name comes in as a [`Entry`] the engine read from the stack, and how lowers show hard
//! links from the [`MountPolicy`].

use std::ffi::{CStr, CString, OsStr, OsString};
use std::io;
use std::sync::Arc;

use fuser::{Errno, FileAttr};
use parking_lot::{Mutex, RwLock, RwLockReadGuard, RwLockWriteGuard};

use super::dir::{Listing, Listings};
use super::errno::{OpResult, errno};
use super::inode::{Backing, Loc, Nodes, Parked, ROOT};
use super::links::{LinkGroups, Links};
use super::policy::MountPolicy;
use super::removed::Removed;
use super::stack::{Entry, Kind, top_lower};

/// What a name resolves to: the layer stack's [`Entry`] and the node id it has.
#[derive(Clone, Debug)]
pub struct Resolved {
    /// The node id (= st_ino).
    pub id: u64,
    /// What the layers hold at the name.
    pub entry: Entry,
    /// The inode number and link count the name shows ([`Names::shown`]).
    pub shown: (u64, u32),
}

impl std::ops::Deref for Resolved {
    type Target = Entry;
    fn deref(&self) -> &Entry {
        &self.entry
    }
}

/// What [`Names::relookup`] found of a node the kernel asks for by id.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Relookup {
    /// In the table and attached below `parent`: one more lookup recorded. `pin` is the parent
    /// lookup the node holds itself (0: none, see [`Names::pin`]).
    Attached {
        /// The parent node id.
        parent: u64,
        /// The parent the node holds a lookup of, or 0.
        pin: u64,
    },
    /// In the table with no name (unlinked, removed): nothing recorded.
    Detached,
    /// Not in the table (the kernel forgot it): nothing recorded.
    Absent,
}

/// What [`Names::copy_up_state`] reads of a node before a copy-up: in the upper dir already,
/// its kind, whether it is a removed directory, and its parent while attached.
#[derive(Clone, Copy, Debug)]
pub struct CopyState {
    /// Present in the upper dir.
    pub upper: bool,
    /// File type.
    pub kind: Kind,
    /// A removed directory ([`Loc::Gone`]).
    pub gone: bool,
    /// The parent node id while attached; `None` for an unlinked node.
    pub parent: Option<u64>,
}

/// What the engine still has to do after [`Names::moved`]: the node that moved (the copy, for
/// a node superseded by one), the parent lookup it no longer holds (for the engine to forget),
/// and the nodes below a moved directory (their data now in the upper dir).
#[derive(Debug)]
pub struct Moved {
    /// The node that moved.
    pub id: u64,
    /// The directory node whose lookup the moved node held and gave up (0: none).
    pub unpinned: u64,
    /// Every node below a moved directory.
    pub below: Vec<u64>,
}

/// The inode number shown for link group `group` of store layer `layer` (see `links.rs`):
/// top byte 0x7f, which no node id has (lower ids use 0x01..=0x40, path ids set the top bit,
/// counter ids stay below 2^56).
fn group_ino(layer: u8, group: u32) -> u64 {
    (0x7f << 56) | ((layer as u64) << 48) | group as u64
}

/// What a multiply-linked file at `path` of store layer `layer` (link groups `g`), node `id`,
/// shows: its group's inode and size, or its node id and one link when it is in no group.
fn shown_recorded(id: u64, layer: u8, g: &LinkGroups, path: &CStr) -> (u64, u32) {
    match g.group(path) {
        Some((group, size)) => (group_ino(layer, group), size),
        None => (id, 1),
    }
}

/// The names of a mount (see the module docs).
pub struct Names {
    nodes: Nodes,
    listings: Listings,
    removed: Removed,
    /// Serialises namespace changes that move existing paths (rename, unlink, rmdir) against
    /// path-based operations. Taken once per operation at its top; never nested.
    ns: RwLock<()>,
}

impl Names {
    /// The names of a new mount: only the root, merged from the lower layers in the bit set
    /// `lowers` (bit i: lower i).
    pub fn new(lowers: u64) -> Names {
        Names {
            nodes: Nodes::new(lowers),
            listings: Listings::default(),
            removed: Removed::default(),
            ns: RwLock::new(()),
        }
    }

    /// Marks the root as having no upper dir (a lowerdir-only mount).
    pub fn root_without_upper(&self) {
        self.nodes.update(ROOT, |n| n.upper = false);
    }

    /// Holds the namespace for an operation that reads names or changes data: no rename,
    /// unlink or rmdir moves a path meanwhile. Taken once at the top of an operation, never
    /// nested.
    pub fn shared(&self) -> RwLockReadGuard<'_, ()> {
        self.ns.read()
    }

    /// Holds the namespace alone, for an operation that moves or removes existing paths
    /// (rename, unlink, rmdir, removing forgotten orphans).
    pub fn exclusive(&self) -> RwLockWriteGuard<'_, ()> {
        self.ns.write()
    }

    /// The generation sent with every entry of this mount (see `inode.rs`).
    pub fn generation(&self) -> fuser::Generation {
        fuser::Generation(self.nodes.generation().into())
    }

    /// Where node `id` keeps its data now.
    ///
    /// Errors: `ENOENT` for a node that is gone.
    pub fn locate(&self, id: u64) -> OpResult<Backing> {
        self.nodes.locate(id).ok_or(Errno::ENOENT)
    }

    /// Directory node `id` as one read of the node table finds it: the layers it is merged
    /// from, its path and its parent. The caller holds the namespace ([`Self::shared`]), so
    /// the snapshot stays true for the rest of its operation.
    ///
    /// Errors: `ENOTDIR` for another kind of node, `ENOENT` for one that is absent, removed or
    /// detached.
    pub fn dir(&self, id: u64) -> OpResult<Backing> {
        match self.nodes.locate(id) {
            Some(l) if l.kind != Kind::Dir => Err(Errno::ENOTDIR),
            Some(l) if l.attached => Ok(l),
            Some(_) => Err(Errno::ENOENT),
            // Removed, or below a detached node: the kind still decides first.
            None if self.nodes.peek(id, |n| n.kind != Kind::Dir) == Some(true) => {
                Err(Errno::ENOTDIR)
            }
            None => Err(Errno::ENOENT),
        }
    }

    /// The path of attached node `id` relative to the layer roots.
    ///
    /// Errors: `ENOENT` for a detached node.
    pub fn path(&self, id: u64) -> OpResult<CString> {
        self.nodes.path(id).ok_or(Errno::ENOENT)
    }

    /// The kind of node `id`; `None` when it is not in the table.
    pub fn kind(&self, id: u64) -> Option<Kind> {
        self.nodes.peek(id, |n| n.kind)
    }

    /// Whether node `id` is in the upper dir; `None` when it is not in the table.
    pub fn is_upper(&self, id: u64) -> Option<bool> {
        self.nodes.peek(id, |n| n.upper)
    }

    /// Whether the kernel holds node `id` (its lookup count is not 0).
    pub fn is_held(&self, id: u64) -> bool {
        self.nodes.peek(id, |n| n.lookups > 0) == Some(true)
    }

    /// Where node `id` is attached: (parent id, name); `None` when it is not in the table or
    /// has no name.
    pub fn attached_name(&self, id: u64) -> Option<(u64, Box<OsStr>)> {
        self.nodes
            .peek(id, |n| match &n.loc {
                Loc::Attached { parent, name } => Some((*parent, name.clone())),
                _ => None,
            })
            .flatten()
    }

    /// Where node `id` is attached or, when the kernel forgot it, where it was parked.
    pub fn last_name(&self, id: u64) -> Option<Parked> {
        self.attached_name(id).or_else(|| self.nodes.parked(id))
    }

    /// The parent of directory node `id` as LOOKUP(`id`, "..") needs it: its parent while
    /// attached, or where the kernel forgot it; the root is its own parent.
    ///
    /// Errors: `ENOENT` for a node with no name and none parked.
    pub fn parent(&self, id: u64) -> OpResult<u64> {
        if id == ROOT {
            return Ok(ROOT);
        }
        match self.nodes.peek(id, |n| n.loc.parent()) {
            Some(p) => p.ok_or(Errno::ENOENT),
            None => Ok(self.nodes.parked(id).ok_or(Errno::ENOENT)?.0),
        }
    }

    /// Where the kernel forgot node `id`, if its name is still kept.
    pub fn parked(&self, id: u64) -> Option<Parked> {
        self.nodes.parked(id)
    }

    /// The node that superseded `id` at a copy-up by re-lookup, if any.
    pub fn successor(&self, id: u64) -> Option<u64> {
        self.nodes.successor(id)
    }

    /// The node that superseded `id`, or `id` when none did (nothing to pay until a first
    /// supersede).
    pub fn successor_or_self(&self, id: u64) -> u64 {
        self.nodes.successor_if_any(id)
    }

    /// Gives the entry `e` found at `name` in directory node `parent` its node id (see
    /// `inode.rs`) and the identity it shows (`policy`: how lowers show hard links); `path`
    /// builds its path relative to the layer roots, needed only for a multiply-linked lower
    /// file.
    ///
    /// Errors: those of `path`.
    pub fn identify(
        &self,
        parent: u64,
        name: &OsStr,
        e: Entry,
        policy: &MountPolicy,
        path: impl FnOnce() -> OpResult<CString>,
    ) -> OpResult<Resolved> {
        let id = match (e.upper, top_lower(e.lowers), e.lower_ino) {
            // A merged directory: identity from the top lower dir.
            (true, Some(l), Some(ino)) => self.nodes.lower_id(l, ino),
            (true, _, _) => self.nodes.upper_id(e.st.st_ino),
            (false, Some(l), _) if e.kind == Kind::Dir || e.st.st_nlink <= 1 => {
                self.nodes.lower_id(l, e.st.st_ino)
            }
            (false, _, _) => self.nodes.path_id(parent, name),
        };
        // Only a lower non-directory with several links shows something read from its path.
        let needs_path = e.kind != Kind::Dir && !e.upper && e.st.st_nlink > 1 && e.lowers != 0;
        let shown = if needs_path {
            self.shown(id, &e, &path()?, policy)
        } else {
            self.shown(id, &e, c"", policy)
        };
        Ok(Resolved {
            id,
            entry: e,
            shown,
        })
    }

    /// The inode number and link count that entry `e` at `path` (relative to the layer roots),
    /// node `id`, shows: its node id and own link count, except
    /// * a merged directory shows nlink 1 (its link count is not known without reading every
    ///   layer; `find` and `fts` take 1 as "unknown");
    /// * a lower non-directory with several links shows, as kernel overlayfs does, the lower
    ///   inode's identity (one `st_ino` for all its names) and its link count — while each
    ///   name stays a node of its own, so a name that is copied up breaks from the group
    ///   (kernel overlayfs without `index=on`);
    /// * in a store layer ([`Links::Recorded`] in `policy`) such a file shows its recorded
    ///   link group's inode and size, and a file in no group shows its node id and nlink 1.
    pub fn shown(&self, id: u64, e: &Entry, path: &CStr, policy: &MountPolicy) -> (u64, u32) {
        // The copy made by a copy-up by re-lookup shows the node it superseded.
        let id = self.nodes.shown_id(id);
        let nlink = e.st.st_nlink as u32;
        if e.kind == Kind::Dir {
            return (id, if e.lowers != 0 { 1 } else { nlink });
        }
        let top = top_lower(e.lowers).filter(|_| !e.upper && nlink > 1);
        let Some(l) = top else {
            return (id, nlink);
        };
        match policy.links(l) {
            Some(Links::Recorded(g)) => shown_recorded(id, l, g, path),
            _ => (self.nodes.lower_id(l, e.st.st_ino), nlink),
        }
    }

    /// Records one more kernel reference to the resolved entry `r` at `name` in directory
    /// node `parent`. Returns whether that is a new name for the node (for the node index).
    pub fn remember(&self, parent: u64, name: &OsStr, r: &Resolved) -> bool {
        self.nodes
            .remember(r.id, parent, name, r.kind, r.upper, r.lowers)
    }

    /// Records one kernel reference to node `id`, which has no name (an `O_TMPFILE` file kept
    /// as an orphan).
    pub fn remember_unnamed(&self, id: u64, kind: Kind) {
        self.nodes.remember_unnamed(id, kind);
    }

    /// Undoes one [`Self::remember`] that the kernel did not receive.
    pub fn unremember(&self, id: u64) {
        self.nodes.unremember(id);
    }

    /// For LOOKUP(`id`, "."): records one more lookup of node `id` if it is in the table and
    /// attached (see [`Relookup`]).
    pub fn relookup(&self, id: u64) -> Relookup {
        let live = self.nodes.update(id, |n| match n.loc {
            Loc::Attached { parent, .. } => {
                n.lookups += 1;
                Some((parent, n.pin))
            }
            _ => None,
        });
        match live {
            Some(Some((parent, pin))) => Relookup::Attached { parent, pin },
            Some(None) => Relookup::Detached,
            None => Relookup::Absent,
        }
    }

    /// Makes node `id` hold the lookup of its parent `parent` that the caller took (a node
    /// found for a file handle has a dentry with no parent to hold it); false (the caller
    /// gives it back) when `id` is gone or holds one already.
    pub fn pin(&self, id: u64, parent: u64) -> bool {
        self.nodes.pin(id, parent)
    }

    /// Drops `n` kernel references to node `id`. Each node this frees — `id`, and the nodes
    /// whose lookup it held (its pinned parent, the copy that superseded it), in turn — leaves
    /// the table (its name parked), with its listing and kept directory attributes; a freed
    /// orphan becomes due for removal ([`Self::take_due_orphans`]). `freed` is called with
    /// each freed node id, with no lock held.
    pub fn forget(&self, id: u64, n: u64, mut freed: impl FnMut(u64)) {
        // Nodes still to forget (a pinned parent, a copy): allocated only when there are any,
        // so a plain FORGET allocates nothing.
        let mut more = Vec::new();
        let mut next = Some((id, n));
        while let Some((id, n)) = next.take().or_else(|| more.pop()) {
            let Some(node) = self.nodes.forget(id, n) else {
                continue;
            };
            if node.pin != 0 {
                more.push((node.pin, 1));
            }
            if node.succ != 0 {
                // The daemon's own reference to the copy that superseded it.
                more.push((node.succ, 1));
            }
            self.nodes.shrink_if_sparse();
            if node.loc == Loc::Gone {
                self.removed.drop_dir(id);
            }
            self.listings.forget(id);
            // An orphan's data is not removed here: a FORGET holds no mount busy, so `umount`
            // may have returned by now, and nothing may change the workdir after that. The
            // next request a process waits for removes it (`reap_orphans`).
            self.removed.forgot(id);
            freed(id);
        }
    }

    /// The node id of upper inode `ino` (a counter id kept per inode; see `inode.rs`).
    pub fn upper_id(&self, ino: u64) -> u64 {
        self.nodes.upper_id(ino)
    }

    /// Makes upper inode `ino` resolve to node `id` (a copy-up keeps `st_ino`).
    pub fn register_upper(&self, ino: u64, id: u64) {
        self.nodes.register_upper(ino, id);
    }

    /// Forgets the id of upper inode `ino` (the inode was deleted; its number may be reused).
    pub fn drop_upper(&self, ino: u64) {
        self.nodes.drop_upper(ino);
    }

    /// A new node id for the copy made by a copy-up by re-lookup of node `old`, showing `old`
    /// as its `st_ino` (registered before the copy becomes visible).
    pub fn copy_id(&self, old: u64) -> u64 {
        let copy = self.nodes.fresh_id();
        self.nodes.show_as(copy, old);
        copy
    }

    /// Copy-up by re-lookup: node `old` (a lower file at `lower_path`) is superseded by `copy`
    /// ([`Nodes::supersede`]); false (nothing changed) when `old` is not attached.
    pub fn supersede(&self, old: u64, copy: u64, lower_path: CString) -> bool {
        self.nodes.supersede(old, copy, lower_path)
    }

    /// What a copy-up of node `id` needs to know first (see [`CopyState`]).
    ///
    /// Errors: `ENOENT` when the node is not in the table.
    pub fn copy_up_state(&self, id: u64) -> OpResult<CopyState> {
        self.nodes
            .peek(id, |n| CopyState {
                upper: n.upper,
                kind: n.kind,
                gone: n.loc == Loc::Gone,
                parent: n.loc.parent(),
            })
            .ok_or(Errno::ENOENT)
    }

    /// Directory node `id` and its ancestors that are not in the upper dir yet, the topmost
    /// first: what must be copied up, in that order, before `id` is in the upper dir.
    ///
    /// Errors: `ENOENT` when one of them is not in the table or has no name.
    pub fn missing_upper_dirs(&self, id: u64) -> OpResult<Vec<u64>> {
        let mut chain = Vec::new();
        let mut cur = id;
        loop {
            let (upper, parent) = self
                .nodes
                .peek(cur, |n| (n.upper, n.loc.parent()))
                .ok_or(Errno::ENOENT)?;
            if upper {
                break;
            }
            chain.push(cur);
            cur = parent.ok_or(Errno::ENOENT)?;
        }
        chain.reverse();
        Ok(chain)
    }

    /// Directory node `id` is in the upper dir now (still merged with its lowers).
    pub fn dir_copied_up(&self, id: u64) {
        self.nodes.update(id, |n| n.upper = true);
    }

    /// Node `id` was copied up: its data is the upper copy's alone.
    pub fn copied_up(&self, id: u64) {
        self.nodes.update(id, |n| {
            n.upper = true;
            n.lowers = 0;
        });
    }

    /// Node `id` moved to (`newparent`, `newname`): it and everything below it now live only in
    /// the upper dir, and the listings of a moved directory and below it are dropped. A node
    /// superseded by a copy moves the copy. Returns what the engine does next ([`Moved`]).
    pub fn moved(&self, id: u64, kind: Kind, newparent: u64, newname: &OsStr) -> Moved {
        // A file superseded while it was brought up: its copy is what moved.
        let id = self.nodes.successor(id).unwrap_or(id);
        let pinned = self.nodes.update(id, |n| {
            n.loc = Loc::Attached {
                parent: newparent,
                name: newname.into(),
            };
            n.upper = true;
            n.lowers = 0;
            let held = n.pin;
            if held != 0 {
                n.pin = newparent;
            }
            held
        });
        let mut unpinned = 0;
        if let Some(old) = pinned.filter(|&p| p != 0 && p != newparent) {
            // The held parent lookup moves along (the kernel holds both parents here).
            self.nodes.update(newparent, |n| n.lookups += 1);
            unpinned = old;
        }
        let mut below = Vec::new();
        if kind == Kind::Dir {
            below = self.nodes.descendants(id);
            for &d in &below {
                self.nodes.update(d, |n| {
                    n.upper = true;
                    n.lowers = 0;
                });
                self.listings.forget(d);
            }
            self.listings.forget(id);
        }
        Moved {
            id,
            unpinned,
            below,
        }
    }

    /// Attached node `id` lost its name in `parent` but keeps another link of its inode there,
    /// `name`: it is attached at that name now.
    pub fn relinked(&self, id: u64, parent: u64, name: &OsStr) {
        self.nodes.update(id, |n| {
            n.loc = Loc::Attached {
                parent,
                name: name.into(),
            }
        });
    }

    /// Directory node `id`, which the kernel still holds, was removed: it keeps `attr` (nlink
    /// 0) as its attributes ([`Self::gone_dir_attr`]) until the kernel forgets it.
    pub fn dir_removed(&self, id: u64, attr: FileAttr) {
        self.removed.keep_dir(id, attr);
        self.nodes.update(id, |n| n.loc = Loc::Gone);
    }

    /// Lower-only file node `id`, which the kernel still holds, was unlinked: its data stays
    /// where it is, at `lower_path` of its lower layer.
    pub fn lower_unlinked(&self, id: u64, lower_path: CString) {
        self.nodes.update(id, |n| {
            n.loc = Loc::Orphan {
                lower_path: Some(lower_path),
            }
        });
    }

    /// Unlinked node `id`'s upper data is now kept at `orphan_name(id)` in the workdir (until
    /// the kernel forgets it).
    pub fn kept_as_orphan(&self, id: u64) {
        self.removed.keep_orphan(id);
        self.nodes
            .update(id, |n| n.loc = Loc::Orphan { lower_path: None });
    }

    /// Whether node `id`'s upper data is kept as an orphan in the workdir.
    pub fn is_orphan(&self, id: u64) -> bool {
        self.removed.is_orphan(id)
    }

    /// Whether orphans the kernel forgot wait for removal (one atomic load).
    pub fn orphans_due(&self) -> bool {
        self.removed.due()
    }

    /// The orphans the kernel forgot, no longer counted as orphans: their kept data is the
    /// caller's to remove now. The caller holds the namespace alone ([`Self::exclusive`]).
    pub fn take_due_orphans(&self) -> Vec<u64> {
        let mut due = self.removed.take_due();
        due.retain(|&id| self.removed.release_orphan(id));
        due
    }

    /// The kept attributes of `id` when it is a removed directory the kernel still holds.
    pub fn gone_dir_attr(&self, id: u64) -> Option<FileAttr> {
        if self.nodes.peek(id, |n| n.loc == Loc::Gone) != Some(true) {
            return None;
        }
        self.removed.dir_attr(id)
    }

    /// Changes the kept attributes of removed directory node `id` with `f`; the new ones, or
    /// `None` when none are kept.
    pub fn change_gone_dir(&self, id: u64, f: impl FnOnce(&mut FileAttr)) -> Option<FileAttr> {
        self.removed.change_dir(id, f)
    }

    /// The listing of directory node `dir`, built from `names` (the layers' merged names) on
    /// first use and kept while the kernel holds the directory.
    ///
    /// Errors: the errno of `names`.
    pub fn listing(
        &self,
        dir: u64,
        names: impl FnOnce() -> io::Result<Vec<(OsString, Kind)>>,
    ) -> OpResult<Arc<Mutex<Listing>>> {
        if let Some(l) = self.listings.get(dir) {
            return Ok(l);
        }
        let names = names().map_err(errno)?;
        Ok(self.listings.insert(dir, names))
    }

    /// `name` (of kind `kind`) now exists in directory `dir`.
    pub fn entry_added(&self, dir: u64, name: &OsStr, kind: Kind) {
        self.listings.added(dir, name, kind);
    }

    /// `name` no longer exists in directory `dir`.
    pub fn entry_removed(&self, dir: u64, name: &OsStr) {
        self.listings.removed(dir, name);
    }

    /// Drops the listing of directory `dir` (it was removed or replaced).
    pub fn drop_listing(&self, dir: u64) {
        self.listings.forget(dir);
    }

    /// The first node for which `f` holds ([`Nodes::find`]).
    pub fn find_node(&self, f: impl Fn(u64, &super::inode::Node) -> bool) -> Option<u64> {
        self.nodes.find(f)
    }

    /// Every node in the table ([`Nodes::snapshot`]).
    pub fn snapshot(&self) -> Vec<super::inode::NodeView> {
        self.nodes.snapshot()
    }

    /// A warm mount's reset, its upper dir emptied: node `id` (a directory that was copied up)
    /// is merged from `lowers` alone again; false when it is not in the table.
    pub fn back_to_lowers(&self, id: u64, lowers: u64) -> bool {
        self.nodes.set_layers(id, false, lowers)
    }

    /// A warm mount's reset, its upper and work dirs emptied and no upper, unlinked or removed
    /// node left in the table: drops every listing, the orphans and removed directories, and
    /// what is known of upper inodes and forgotten nodes ([`Nodes::forget_upper_identities`]).
    pub fn forget_upper(&self) {
        self.listings.clear();
        self.removed.clear();
        self.nodes.forget_upper_identities();
    }

    /// Continues the mount whose node index was read ([`Nodes::restore`]): its `generation`,
    /// counter ids from `next`, the names `parked` (node id, parent id, name) and the upper
    /// inodes `uppers` (inode number, node id, id shown). Before the mount serves requests.
    pub fn restore(
        &mut self,
        generation: u32,
        next: u64,
        parked: impl IntoIterator<Item = (u64, u64, Box<OsStr>)>,
        uppers: impl IntoIterator<Item = (u64, u64, u64)>,
    ) {
        self.nodes.restore(generation, next, parked, uppers);
    }

    /// The generation as the node index records it.
    pub fn index_generation(&self) -> u32 {
        self.nodes.generation()
    }

    /// What a node index records of this mount ([`Nodes::index_names`]): at most `max` names
    /// (node id, parent id, name), least recently used first, and the next counter id.
    pub fn index_names(&self, max: usize) -> (Vec<(u64, u64, Box<OsStr>)>, u64) {
        self.nodes.index_names(max)
    }

    /// The next counter id to be given (every counter id given so far is below it).
    pub fn next_counter(&self) -> u64 {
        self.nodes.next_counter()
    }

    /// The node id upper inode `ino` has and the id it shows as `st_ino`, if it has one.
    pub fn upper_known(&self, ino: u64) -> Option<(u64, u64)> {
        self.nodes.upper_known(ino)
    }

    /// The node id node `id` shows as `st_ino` (another for the copy of a superseded node).
    pub fn shown_id(&self, id: u64) -> u64 {
        self.nodes.shown_id(id)
    }
}
