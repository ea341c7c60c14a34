//! Merged readdir: the union of the upper dir and the lower dirs merged into a directory,
//! upper entries first, each name once, whiteouts hidden, lower layers below an opaque
//! directory ignored (overlayfs.rst, "readdir").
//!
//! The kernel is told not to open directories (opendir answers ENOSYS), so readdir is
//! stateless: offsets index a per-directory listing kept while the kernel holds the directory.
//! The listing only grows at its end and deleted names become tombstones, so offsets stay
//! valid and no entry is returned twice or skipped while entries are deleted during iteration.

use std::collections::{HashMap, HashSet};
use std::ffi::{OsStr, OsString};
use std::io;
use std::path::Path;
use std::sync::Arc;

use dashmap::DashMap;
use parking_lot::Mutex;

use super::fs::OverlayFs;
use super::inode::{Kind, Node};
use super::layers::{Layer, cstr};
use super::whiteout;

/// One entry of a listing.
#[derive(Clone, Debug)]
pub struct DirEntry {
    /// Entry name.
    pub name: OsString,
    /// File type as far as known from d_type (the authoritative type comes from lookup).
    pub kind: Kind,
    /// False once the name was removed (a tombstone keeps later offsets stable).
    pub live: bool,
}

/// A directory's listing: entries in offset order plus a name index, built on the first
/// change (a read-only walk of a large tree never pays for it).
#[derive(Default, Debug)]
pub struct Listing {
    /// Entries; offset of entry i is i + 1 (after "." and "..", see handlers).
    pub entries: Vec<DirEntry>,
    index: Option<HashMap<OsString, usize>>,
}

impl Listing {
    fn new(entries: Vec<DirEntry>) -> Listing {
        Listing {
            entries,
            index: None,
        }
    }

    fn index(&mut self) -> &mut HashMap<OsString, usize> {
        let entries = &self.entries;
        self.index.get_or_insert_with(|| {
            entries
                .iter()
                .enumerate()
                .filter(|(_, e)| e.live)
                .map(|(i, e)| (e.name.clone(), i))
                .collect()
        })
    }

    fn add(&mut self, name: &OsStr, kind: Kind) {
        if let Some(&i) = self.index().get(name)
            && self.entries[i].live
        {
            self.entries[i].kind = kind;
            return;
        }
        let next = self.entries.len();
        self.index().insert(name.to_os_string(), next);
        self.entries.push(DirEntry {
            name: name.to_os_string(),
            kind,
            live: true,
        });
    }

    fn remove(&mut self, name: &OsStr) {
        if let Some(i) = self.index().remove(name) {
            self.entries[i].live = false;
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
    pub fn insert(&self, dir: u64, entries: Vec<DirEntry>) -> Arc<Mutex<Listing>> {
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
    /// The merged names of directory `dnode` at `rel` with their kinds, upper first.
    ///
    /// Errors: the `openat`/`getdents`/`fstatat` errno of a layer.
    pub(super) fn merged_names(
        &self,
        dnode: &Node,
        rel: &Path,
    ) -> io::Result<Vec<(OsString, Kind)>> {
        let crel = cstr(rel.as_os_str())?;
        let mut seen: HashSet<OsString> = HashSet::new();
        let mut out = Vec::new();
        let mut layers: Vec<Layer> = Vec::new();
        if dnode.upper {
            layers.push(Layer::Upper);
        }
        let mut mask = dnode.lowers;
        while mask != 0 {
            layers.push(Layer::Lower(mask.trailing_zeros() as u8));
            mask &= mask - 1;
        }
        let multi = layers.len() > 1;
        for layer in layers {
            let names = match self.roots.read_dir(layer, &crel) {
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
                        let st = self
                            .roots
                            .stat(layer, &cstr(rel.join(&name).as_os_str())?)?;
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

    /// The listing of directory node `dir`, built from the layers on first use.
    pub(super) fn listing(&self, dir: u64) -> super::fs::OpResult<Arc<Mutex<Listing>>> {
        if let Some(l) = self.listings.get(dir) {
            return Ok(l);
        }
        let n = self.node(dir)?;
        if n.kind != Kind::Dir {
            return Err(fuser::Errno::ENOTDIR);
        }
        let rel = self.path_of(dir)?;
        let names = self.merged_names(&n, &rel).map_err(super::fs::errno)?;
        let entries = names
            .into_iter()
            .map(|(name, kind)| DirEntry {
                name,
                kind,
                live: true,
            })
            .collect();
        Ok(self.listings.insert(dir, entries))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tombstones_keep_offsets_and_readds_go_to_the_end() {
        let mut l = Listing::new(vec![
            DirEntry {
                name: "a".into(),
                kind: Kind::File,
                live: true,
            },
            DirEntry {
                name: "b".into(),
                kind: Kind::File,
                live: true,
            },
        ]);
        l.remove(OsStr::new("a"));
        assert!(!l.entries[0].live);
        assert_eq!(l.entries[1].name, "b");
        l.add(OsStr::new("a"), Kind::Dir);
        assert_eq!(l.entries.len(), 3);
        assert_eq!(l.entries[2].kind, Kind::Dir);
        l.add(OsStr::new("b"), Kind::File);
        assert_eq!(l.entries.len(), 3);
    }
}
