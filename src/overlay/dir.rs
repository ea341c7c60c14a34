//! Directory listings for the stateless readdir: a directory's merged names (from
//! [`Stack::merged_names`](super::stack::Stack::merged_names)) kept while the kernel holds it.
//! Inside the names part (`names.rs`), which alone uses them.
//!
//! Readdir is stateless (opendir answers ENOSYS, or in passthrough mode a handle that names
//! nothing): offsets index a per-directory listing kept while the kernel holds the directory.
//! The listing only grows at its end and deleted names become tombstones that keep their
//! name: a name created again takes its old slot back. So offsets stay valid, and no entry
//! is returned twice or skipped while entries are deleted, created or renamed during
//! iteration — a reader that renames every entry it reads (away and back, xfstests
//! generic/736) sees each once instead of chasing names re-added at the end.

use std::collections::HashMap;
use std::ffi::{OsStr, OsString};
use std::os::unix::ffi::OsStrExt;
use std::sync::Arc;

use dashmap::DashMap;
use parking_lot::Mutex;

use super::stack::Kind;

/// One slot of a listing: where its name sits in the name buffer, its type, and whether it
/// is still there. 8 bytes, so a walk of a million-entry tree keeps listings small.
#[derive(Clone, Copy, Debug)]
struct Slot {
    start: u32,
    len: u8,
    kind: Kind,
    live: bool,
}

const _: () = assert!(std::mem::size_of::<Slot>() == 8);

/// A directory's listing: names in offset order, packed into one buffer, plus a name index
/// (live and removed names) built on the first change (a read-only walk of a large tree never
/// pays for it).
#[derive(Default, Debug)]
pub struct Listing {
    names: Vec<u8>,
    slots: Vec<Slot>,
    index: Option<HashMap<Box<[u8]>, usize>>,
}

impl Listing {
    fn new(entries: Vec<(OsString, Kind)>) -> Listing {
        let mut l = Listing::default();
        l.slots.reserve_exact(entries.len());
        for (name, kind) in entries {
            l.push(&name, kind);
        }
        l.names.shrink_to_fit();
        l
    }

    fn push(&mut self, name: &OsStr, kind: Kind) {
        let b = name.as_bytes();
        // Names are at most 255 bytes (NAME_MAX); a listing never exceeds 4 GiB of names.
        let len = b.len().min(255) as u8;
        self.slots.push(Slot {
            start: self.names.len() as u32,
            len,
            kind,
            live: true,
        });
        self.names.extend_from_slice(&b[..len as usize]);
    }

    fn name(&self, s: &Slot) -> &[u8] {
        &self.names[s.start as usize..s.start as usize + s.len as usize]
    }

    /// Entry `i` (offset order): its name and kind, `Some(None)` for a removed entry, `None`
    /// past the end.
    pub fn get(&self, i: usize) -> Option<Option<(OsString, Kind)>> {
        let s = self.slots.get(i)?;
        Some(
            s.live
                .then(|| (OsStr::from_bytes(self.name(s)).to_os_string(), s.kind)),
        )
    }

    fn index(&mut self) -> &mut HashMap<Box<[u8]>, usize> {
        if self.index.is_none() {
            let idx = (0..self.slots.len())
                .map(|i| (self.name(&self.slots[i]).into(), i))
                .collect();
            self.index = Some(idx);
        }
        self.index.as_mut().expect("just built")
    }

    /// `name` exists (again): a removed name gets its old slot back, a new one goes at the end.
    fn add(&mut self, name: &OsStr, kind: Kind) {
        if let Some(&i) = self.index().get(name.as_bytes()) {
            self.slots[i].kind = kind;
            self.slots[i].live = true;
            return;
        }
        let next = self.slots.len();
        self.index().insert(name.as_bytes().into(), next);
        self.push(name, kind);
    }

    /// `name` is gone: its slot becomes a tombstone that keeps the name (see [`Self::add`]).
    fn remove(&mut self, name: &OsStr) {
        if let Some(&i) = self.index().get(name.as_bytes()) {
            self.slots[i].live = false;
        }
    }
}

/// Listings of directories the kernel is reading, by node id.
#[derive(Default)]
pub struct Listings {
    map: DashMap<u64, Arc<Mutex<Listing>>>,
}

impl Listings {
    /// The cached listing of `dir`, if any.
    pub fn get(&self, dir: u64) -> Option<Arc<Mutex<Listing>>> {
        self.map.get(&dir).map(|l| l.clone())
    }

    /// Caches `entries` as the listing of `dir` unless one appeared meanwhile; returns the cached one.
    pub fn insert(&self, dir: u64, entries: Vec<(OsString, Kind)>) -> Arc<Mutex<Listing>> {
        self.map
            .entry(dir)
            .or_insert_with(|| Arc::new(Mutex::new(Listing::new(entries))))
            .clone()
    }

    /// Records that `name` now exists in `dir`.
    pub fn added(&self, dir: u64, name: &OsStr, kind: Kind) {
        if let Some(l) = self.get(dir) {
            l.lock().add(name, kind);
        }
    }

    /// Records that `name` no longer exists in `dir`.
    pub fn removed(&self, dir: u64, name: &OsStr) {
        if let Some(l) = self.get(dir) {
            l.lock().remove(name);
        }
    }

    /// Drops the listing of `dir` (the kernel forgot it).
    pub fn forget(&self, dir: u64) {
        self.map.remove(&dir);
    }

    /// Drops every listing (a warm mount's reset: the upper's part of each is gone).
    pub fn clear(&self) {
        self.map.clear();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tombstones_keep_offsets_and_readds_go_to_the_end() {
        let mut l = Listing::new(vec![("a".into(), Kind::File), ("b".into(), Kind::File)]);
        l.remove(OsStr::new("a"));
        assert_eq!(l.get(0), Some(None));
        assert_eq!(l.get(1), Some(Some(("b".into(), Kind::File))));
        l.add(OsStr::new("c"), Kind::Dir);
        assert_eq!(l.get(2), Some(Some(("c".into(), Kind::Dir))));
        assert_eq!(l.get(3), None);
        l.add(OsStr::new("b"), Kind::Symlink);
        assert_eq!(l.get(1), Some(Some(("b".into(), Kind::Symlink))));
        assert_eq!(l.get(3), None);
    }

    #[test]
    fn a_name_created_again_takes_its_old_slot_back() {
        // rename("a", "T"); rename("T", "a"), as xfstests generic/736 does for every entry it
        // reads: "a" stays at offset 0 and "T" leaves one tombstone, reused by the next such
        // rename, instead of the listing growing by two entries per rename.
        let mut l = Listing::new(vec![("a".into(), Kind::File), ("b".into(), Kind::File)]);
        for name in ["a", "b", "a"] {
            l.remove(OsStr::new(name));
            l.add(OsStr::new("T"), Kind::File);
            l.remove(OsStr::new("T"));
            l.add(OsStr::new(name), Kind::File);
        }
        assert_eq!(l.get(0), Some(Some(("a".into(), Kind::File))));
        assert_eq!(l.get(1), Some(Some(("b".into(), Kind::File))));
        assert_eq!(l.get(2), Some(None));
        assert_eq!(l.get(3), None);
    }
}
