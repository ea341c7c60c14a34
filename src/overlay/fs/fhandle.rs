//! File handles that survive a remount, the mount's side: reading the node index
//! (`node_index.rs`) back into the node table at mount, and the records the handlers append to
//! its journal while mounted. The format, the journal and why it is written while mounted and
//! never after are `node_index.rs`'s.

use std::collections::HashMap;
use std::ffi::{CStr, OsStr};
use std::io;
use std::sync::Arc;
use std::time::Instant;

use super::OverlayFs;
use crate::overlay::inode::ROOT;
use crate::overlay::node_index::*;
use crate::overlay::stack::Tree;

impl OverlayFs {
    /// The identity of this mount's upper root and lower roots ([`Roots`]).
    ///
    /// Errors: the `fstat` errno.
    fn roots(&self) -> io::Result<Roots> {
        let upper = dir_identity(self.stack.fd(Tree::Upper))?;
        let mut lowers = Vec::new();
        // A lower root's identity is its own `stat` (the `fstat` of the upper root's fd).
        while let Ok(l) = self.stack.layer(Tree::Lower(lowers.len() as u8)) {
            let st = l.stat(c".")?;
            lowers.push((st.st_dev, st.st_ino));
        }
        Ok(Roots { upper, lowers })
    }

    /// At mount (before serving): takes the workdir's index lock and reads its node index,
    /// continues the mount that wrote it when it was of these layers, with the entries still
    /// true (`Nodes::restore`), and writes the journal of this
    /// mount (those entries, a new reservation). Without the lock (another daemon holds it
    /// past [`LOCK_WAIT`]) the mount keeps no index; when its journal cannot be written, the
    /// old one is removed and the mount starts afresh (new generation) without one. Never
    /// fails the mount.
    pub(super) fn load_handles(&mut self) {
        let work = self.stack.fd(Tree::Work);
        let lock = match IndexLock::acquire(work, LOCK_WAIT) {
            Ok(Some(l)) => l,
            Ok(None) => {
                tracing::warn!(
                    "another daemon still holds this workdir's node index: file handles of \
                     this mount will not survive a remount"
                );
                return;
            }
            Err(e) => {
                tracing::warn!("node index lock: {e}: file handles will not survive a remount");
                return;
            }
        };
        let roots = match self.roots() {
            Ok(r) => r,
            Err(e) => {
                tracing::warn!("node index: {e}: file handles will not survive a remount");
                return;
            }
        };
        let old = read(work).unwrap_or_else(|e| {
            tracing::warn!("node index: {e}: earlier file handles are stale");
            None
        });
        let old = old.filter(|i| {
            let same = i.roots == roots;
            if !same {
                tracing::info!("the node index is of other layers: earlier file handles are stale");
            }
            same
        });
        let (generation, next, kept) = match &old {
            Some(index) => (index.generation, index.next, self.still_true(index)),
            None => (self.names.index_generation(), 2, Vec::new()),
        };
        let mine = Index {
            generation,
            next: next.saturating_add(RESERVE_BLOCK),
            roots,
            entries: kept,
        };
        let journal = match Journal::create(work, lock, &mine) {
            Ok(j) => j,
            Err(e) => {
                if let Err(e2) = remove(work) {
                    tracing::error!(
                        "node index: {e2}: remove {INDEX:?} from the workdir before the next \
                         mount"
                    );
                }
                tracing::warn!(
                    "node index not written: {e}: file handles will not survive a remount"
                );
                return;
            }
        };
        self.kernel.keep_index(journal);
        if old.is_none() {
            return;
        }
        let parked = mine
            .entries
            .iter()
            .map(|e| (e.id, e.parent, e.name.clone()));
        let uppers = mine
            .entries
            .iter()
            .filter_map(|e| Some((e.upper.as_ref()?.ino, e.id, e.shown)));
        tracing::debug!(
            names = mine.entries.len(),
            "node index of the last mount restored"
        );
        Arc::get_mut(&mut self.names)
            .expect("the names are shared only once the session runs")
            .restore(generation, next, parked, uppers);
    }

    /// The entries of `index` that are still true: an upper entry whose path holds the
    /// recorded inode (with the identity read now), an entry of an id derived from a lower
    /// inode (resolving its name tells later). Counter ids with no upper inode are dropped.
    fn still_true(&self, index: &Index) -> Vec<Entry> {
        let names: HashMap<u64, (u64, &OsStr)> = index
            .entries
            .iter()
            .map(|e| (e.id, (e.parent, &*e.name)))
            .collect();
        let mut memo = root_memo();
        let mut kept = Vec::new();
        for e in &index.entries {
            let upper = match &e.upper {
                // A counter id is this index's only if it was given before it was written.
                Some(_) if e.id < COUNTER_END && e.id >= index.next => continue,
                Some(u) => {
                    let Some(path) = path_via(&names, &mut memo, e.id) else {
                        continue;
                    };
                    let Ok(st) = self.stack.stat(Tree::Upper, &path) else {
                        continue;
                    };
                    let now = upper_identity(self.stack.fd(Tree::Upper), &path, &st);
                    if !u.same_inode(&now) {
                        continue;
                    }
                    Some(now)
                }
                // Derived from a lower inode: resolving the name gives it again, or not.
                None if e.id >= COUNTER_END => None,
                None => continue,
            };
            kept.push(Entry { upper, ..e.clone() });
        }
        kept
    }

    /// After `Nodes::remember` gave the kernel node `id` the
    /// name `name` in directory `parent` (whose path relative to the layer roots is `ppath`):
    /// reserves counter ids, and records the node when the name is new to it. `upper_st` is
    /// the `stat` of its upper inode when it is kept in the upper dir (the one the lookup just
    /// made), so nothing is resolved or stat'ed again.
    pub(super) fn index_remembered(
        &self,
        id: u64,
        ppath: &CStr,
        name: &OsStr,
        upper_st: Option<&libc::stat>,
        new_name: bool,
    ) {
        if !self.kernel.keeps_index() {
            return;
        }
        if !new_name {
            self.kernel.reserve(self.names.next_counter());
            return;
        }
        match upper_st {
            Some(st) => match crate::sys::child(ppath, name) {
                Ok(path) => self.index_node_at(id, Some((&path, Some(st)))),
                Err(_) => self.index_node_at(id, None),
            },
            None => self.index_node_at(id, None),
        }
    }

    /// Runs `f` with the node index records it makes written in one go at its end
    /// ([`Journal::batch`]); the caller replies after this returns.
    pub(super) fn index_batch<R>(&self, f: impl FnOnce() -> R) -> R {
        self.kernel.batch(f, || self.index_snapshot())
    }

    /// Records node `id` in the node index, when this mount keeps one: where it is attached
    /// (in the table or parked) and, when `upper` names its path in the upper dir, the upper
    /// inode's identity if that inode is the node's. Reserves counter ids first. Call after
    /// the change and before the reply that gives the kernel the id or the new name.
    pub(super) fn index_node(&self, id: u64, upper: Option<&CStr>) {
        self.index_node_at(id, upper.map(|p| (p, None)));
    }

    /// [`Self::index_node`] with the upper inode's `stat` when the caller has it (`upper`:
    /// its path and maybe its `stat`; without one it is read here).
    fn index_node_at(&self, id: u64, upper: Option<(&CStr, Option<&libc::stat>)>) {
        if !self.kernel.keeps_index() {
            return;
        }
        self.kernel.reserve(self.names.next_counter());
        let Some((parent, name)) = self.names.last_name(id) else {
            return;
        };
        if id == ROOT || parent == 0 {
            return;
        }
        let upper = upper.and_then(|(path, st)| {
            let st = match st {
                Some(st) => *st,
                None => self.stack.stat_opt(Tree::Upper, path).ok().flatten()?,
            };
            Some((path, st))
        });
        let Some(rec) = self.index_entry(id, parent, name, upper) else {
            return;
        };
        self.kernel.append(&rec.record(), || self.index_snapshot());
    }

    /// The node index entry of node `id`, named `name` in `parent`, with the inode at `upper`
    /// (its path in the upper dir and `stat`) when that inode is the node's; `None` when the
    /// node cannot be found again after a remount (a counter id with no upper inode of its
    /// own). What both a journal record and a snapshot entry are made from.
    fn index_entry(
        &self,
        id: u64,
        parent: u64,
        name: Box<OsStr>,
        upper: Option<(&CStr, libc::stat)>,
    ) -> Option<Entry> {
        let kept = upper.and_then(|(path, st)| {
            let (known, shown) = self.names.upper_known(st.st_ino)?;
            (known == id).then(|| (upper_identity(self.stack.fd(Tree::Upper), path, &st), shown))
        });
        let (upper, shown) = match kept {
            Some((u, shown)) => (Some(u), shown),
            // Only ids derived from a lower inode are found again without one.
            None if id >= COUNTER_END => (None, self.names.shown_id(id)),
            None => return None,
        };
        Some(Entry {
            id,
            parent,
            name,
            shown,
            upper,
        })
    }

    /// The node index of this mount as it stands (for compaction): every node the kernel
    /// may hold a handle of (`Nodes::index_names`), upper ones with their inode's identity.
    ///
    /// Errors: the `fstat` errno of a layer root.
    fn index_snapshot(&self) -> io::Result<Index> {
        let t = Instant::now();
        let (list, next) = self.names.index_names(PARKED_MAX);
        let names: HashMap<u64, (u64, &OsStr)> =
            list.iter().map(|(id, p, n)| (*id, (*p, &**n))).collect();
        let mut memo = root_memo();
        let mut entries = Vec::with_capacity(list.len());
        for (id, parent, name) in &list {
            let Some(path) = path_via(&names, &mut memo, *id) else {
                continue;
            };
            let at = self.stack.stat_opt(Tree::Upper, &path).ok().flatten();
            let upper = at.map(|st| (&*path, st));
            entries.extend(self.index_entry(*id, *parent, name.clone(), upper));
        }
        let index = Index {
            generation: self.names.index_generation(),
            next,
            roots: self.roots()?,
            entries,
        };
        tracing::debug!(
            entries = index.entries.len(),
            ms = t.elapsed().as_millis() as u64,
            "node index snapshot"
        );
        Ok(index)
    }
}
