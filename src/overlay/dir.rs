//! Merged readdir: the union of the upper dir and the lower dirs merged into a directory,
//! upper entries first, each name once, whiteouts hidden, lower layers below an opaque
//! directory ignored (overlayfs.rst, "readdir").
//!
//! The kernel is told not to open directories (opendir answers ENOSYS), so readdir is
//! stateless: offsets index a per-directory listing kept while the kernel holds the directory.
//! The listing only grows at its end and deleted names become tombstones, so offsets stay
//! valid and no entry is returned twice or skipped while entries are deleted during iteration.

use std::collections::{HashMap, HashSet};
use std::ffi::{CStr, OsStr, OsString};
use std::io;
use std::os::unix::ffi::OsStrExt;
use std::sync::Arc;

use dashmap::DashMap;
use parking_lot::Mutex;

use super::fs::OverlayFs;
use super::inode::{Kind, Located};
use super::layers::Layer;
use super::whiteout;
use crate::sys::child;

/// One slot of a listing: where its name sits in the name buffer, its type, and whether it
/// is still there. 8 bytes, so a walk of a million-entry tree keeps listings small.
#[derive(Clone, Copy, Debug)]
struct Slot {
    start: u32,
    len: u8,
    kind: Kind,
    live: bool,
}

/// A directory's listing: names in offset order, packed into one buffer, plus a name index
/// built on the first change (a read-only walk of a large tree never pays for it).
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
                .filter(|&i| self.slots[i].live)
                .map(|i| (self.name(&self.slots[i]).into(), i))
                .collect();
            self.index = Some(idx);
        }
        self.index.as_mut().expect("just built")
    }

    fn add(&mut self, name: &OsStr, kind: Kind) {
        if let Some(&i) = self.index().get(name.as_bytes()) {
            self.slots[i].kind = kind;
            return;
        }
        let next = self.slots.len();
        self.index().insert(name.as_bytes().into(), next);
        self.push(name, kind);
    }

    fn remove(&mut self, name: &OsStr) {
        if let Some(i) = self.index().remove(name.as_bytes()) {
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
}

fn kind_of_dtype(t: u8) -> Option<Kind> {
    match t {
        libc::DT_DIR => Some(Kind::Dir),
        libc::DT_REG => Some(Kind::File),
        libc::DT_LNK => Some(Kind::Symlink),
        libc::DT_UNKNOWN | libc::DT_CHR => None,
        _ => Some(Kind::Special),
    }
}

impl OverlayFs {
    /// The merged names of the directory at `rel`, in the upper dir when `upper` and merged
    /// from the lower layers `lowers`, with their kinds, upper first.
    ///
    /// Errors: the `openat`/`getdents`/`fstatat` errno of a layer.
    pub(super) fn merged_names(
        &self,
        upper: bool,
        lowers: u64,
        rel: &CStr,
    ) -> io::Result<Vec<(OsString, Kind)>> {
        let mut seen: HashSet<OsString> = HashSet::new();
        let mut out = Vec::new();
        let mut layers: Vec<Layer> = Vec::new();
        if upper {
            layers.push(Layer::Upper);
        }
        let mut mask = lowers;
        while mask != 0 {
            layers.push(Layer::Lower(mask.trailing_zeros() as u8));
            mask &= mask - 1;
        }
        let multi = layers.len() > 1;
        for layer in layers {
            let names = match self.roots.read_dir(layer, rel) {
                Ok(n) => n,
                Err(e) if matches!(e.raw_os_error(), Some(libc::ENOENT) | Some(libc::ENOTDIR)) => {
                    continue;
                }
                Err(e) => return Err(e),
            };
            for (name, dtype) in names {
                if multi && seen.contains(&name) {
                    continue;
                }
                let kind = match kind_of_dtype(dtype) {
                    Some(k) => k,
                    None => {
                        let st = self.roots.stat(layer, &child(rel, &name)?)?;
                        if whiteout::is_whiteout_stat(&st) {
                            if multi {
                                seen.insert(name);
                            }
                            continue;
                        }
                        Kind::from_mode(st.st_mode)
                    }
                };
                if multi {
                    seen.insert(name.clone());
                }
                out.push((name, kind));
            }
        }
        Ok(out)
    }

    /// The listing of directory node `dir` (as [`OverlayFs::dir`] found it: `d`), built from
    /// the layers on first use.
    pub(super) fn listing(
        &self,
        dir: u64,
        d: &Located,
    ) -> super::fs::OpResult<Arc<Mutex<Listing>>> {
        if let Some(l) = self.listings.get(dir) {
            return Ok(l);
        }
        let names = self
            .merged_names(d.upper, d.lowers, &d.path)
            .map_err(super::fs::errno)?;
        Ok(self.listings.insert(dir, names))
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
        l.add(OsStr::new("a"), Kind::Dir);
        assert_eq!(l.get(2), Some(Some(("a".into(), Kind::Dir))));
        assert_eq!(l.get(3), None);
        l.add(OsStr::new("b"), Kind::Symlink);
        assert_eq!(l.get(1), Some(Some(("b".into(), Kind::Symlink))));
        assert_eq!(l.get(3), None);
    }
}
