//! How the hard links of a lower layer are shown in the merged view.
//!
//! Kernel overlayfs (without `index=on`, its default) shows a lower file's own links: every
//! name of a lower inode reports that inode's `st_ino` and `st_nlink`, and a name that is
//! copied up breaks from the group (it reports the upper file's inode and link count, the
//! names left in the lower keep theirs). [`LowerLinks::Real`] does that.
//!
//! A store layer's regular files are all hard links of content objects shared by every
//! identical file of every layer of the project, so their lower link counts mean nothing.
//! [`LowerLinks::Recorded`] shows what the tree that was promoted had instead: the link groups
//! found at promotion (files that were one inode in the filled tree) are written to a file
//! next to the layer's tree ([`LinkGroups::write`]); each group shows one `st_ino` and its
//! size as `st_nlink`, and every other path is a file of its own with one link.
//!
//! File format (binary-safe, paths are bytes): each group is its paths relative to the tree
//! root, each followed by a NUL byte, and the group ends with one more NUL byte.

use std::collections::HashMap;
use std::ffi::CStr;
use std::io;
use std::path::{Path, PathBuf};

/// How a lower dir's hard links are shown (one per lowerdir, in `lowerdir=` order).
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub enum LowerLinks {
    /// The lower's own links, as kernel overlayfs shows them (one `st_ino`, the real nlink).
    #[default]
    Real,
    /// The lower's links are storage deduplication (a store layer): only the groups listed
    /// in the file at this path ([`LinkGroups`]) are shown as links; a missing file lists
    /// none (every path its own file, nlink 1).
    Recorded(PathBuf),
}

/// The link groups of one store layer: group index per path, and each group's size.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct LinkGroups {
    group_of: HashMap<Box<[u8]>, u32>,
    sizes: Vec<u32>,
}

/// `path` relative to the tree root without a leading `./` (the overlay's paths of root
/// entries have one, the node table's do not).
fn normal(path: &[u8]) -> &[u8] {
    path.strip_prefix(b"./").unwrap_or(path)
}

impl LinkGroups {
    /// Groups from lists of paths (relative to the tree root); lists of fewer than two paths
    /// are no groups and are left out.
    pub fn from_groups<P: AsRef<[u8]>>(groups: impl IntoIterator<Item = Vec<P>>) -> LinkGroups {
        let mut g = LinkGroups::default();
        for paths in groups {
            if paths.len() < 2 {
                continue;
            }
            let idx = g.sizes.len() as u32;
            g.sizes.push(paths.len() as u32);
            for p in paths {
                g.group_of.insert(normal(p.as_ref()).into(), idx);
            }
        }
        g
    }

    /// Reads the groups written by [`LinkGroups::write`]; a missing file holds none.
    ///
    /// Errors: the read error (other than `ENOENT`), or `InvalidData` for a file that does not
    /// end with a complete group.
    pub fn read(path: &Path) -> io::Result<LinkGroups> {
        let bytes = match std::fs::read(path) {
            Ok(b) => b,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(LinkGroups::default()),
            Err(e) => return Err(e),
        };
        if !bytes.is_empty() && !bytes.ends_with(b"\0\0") {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                format!("{}: truncated link groups", path.display()),
            ));
        }
        let mut groups = Vec::new();
        let mut cur: Vec<&[u8]> = Vec::new();
        for p in bytes.split(|&b| b == 0) {
            if p.is_empty() {
                if !cur.is_empty() {
                    groups.push(std::mem::take(&mut cur));
                }
            } else {
                cur.push(p);
            }
        }
        Ok(LinkGroups::from_groups(groups))
    }

    /// Writes `groups` (each a list of paths relative to the tree root; lists of fewer than
    /// two are skipped) to `path` in the format [`LinkGroups::read`] reads, and fsyncs it.
    /// Writes nothing and returns false when there is no group.
    ///
    /// Errors: the create/write/fsync error.
    pub fn write<P: AsRef<[u8]>>(path: &Path, groups: &[Vec<P>]) -> io::Result<bool> {
        use std::io::Write;
        let mut out = Vec::new();
        for g in groups.iter().filter(|g| g.len() >= 2) {
            for p in g {
                out.extend_from_slice(normal(p.as_ref()));
                out.push(0);
            }
            out.push(0);
        }
        if out.is_empty() {
            return Ok(false);
        }
        let mut f = std::fs::File::create(path)?;
        f.write_all(&out)?;
        f.sync_all()?;
        Ok(true)
    }

    /// True when there is no group.
    pub fn is_empty(&self) -> bool {
        self.sizes.is_empty()
    }

    /// The group of `path` and its size (number of paths), if it is in one.
    pub fn group(&self, path: &CStr) -> Option<(u32, u32)> {
        if self.is_empty() {
            return None;
        }
        let g = *self.group_of.get(normal(path.to_bytes()))?;
        Some((g, self.sizes[g as usize]))
    }

    /// Every group as its sorted paths, sorted (for tests and promotion of a layer on top).
    pub fn groups(&self) -> Vec<Vec<Vec<u8>>> {
        let mut out = vec![Vec::new(); self.sizes.len()];
        for (p, &g) in &self.group_of {
            out[g as usize].push(p.to_vec());
        }
        for g in &mut out {
            g.sort();
        }
        out.sort();
        out
    }
}

/// How one lower shows its links, loaded at mount.
#[derive(Debug)]
pub enum Links {
    /// See [`LowerLinks::Real`].
    Real,
    /// See [`LowerLinks::Recorded`].
    Recorded(LinkGroups),
}

impl Links {
    /// Loads `l` (reads the groups file of a recorded lower).
    ///
    /// Errors: as [`LinkGroups::read`].
    pub fn load(l: &LowerLinks) -> io::Result<Links> {
        Ok(match l {
            LowerLinks::Real => Links::Real,
            LowerLinks::Recorded(p) => Links::Recorded(LinkGroups::read(p)?),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn groups_round_trip_and_ignore_singletons() {
        let t = tempfile::tempdir().unwrap();
        let f = t.path().join("links");
        let groups: Vec<Vec<&[u8]>> = vec![
            vec![b"a/x", b"./b/y", b"z"],
            vec![b"alone"],
            vec![b"odd \n name", b"d/e\xff"],
        ];
        assert!(LinkGroups::write(&f, &groups).unwrap());
        let g = LinkGroups::read(&f).unwrap();
        assert_eq!(g.group(c"./a/x"), g.group(c"b/y"));
        assert_eq!(g.group(c"z").map(|(_, n)| n), Some(3));
        assert_eq!(g.group(c"./odd \n name").map(|(_, n)| n), Some(2));
        assert_ne!(g.group(c"z"), g.group(c"d/e\xff"));
        assert_eq!(g.group(c"alone"), None);
        assert_eq!(g.group(c"missing"), None);
        assert_eq!(g.groups().len(), 2);
        assert_eq!(g, LinkGroups::from_groups(g.groups()));
        // No group: no file; a missing file holds none.
        let none = t.path().join("none");
        assert!(!LinkGroups::write(&none, &[vec!["only"]]).unwrap());
        assert!(!none.exists());
        assert!(LinkGroups::read(&none).unwrap().is_empty());
        // A truncated file is refused, naming itself.
        std::fs::write(&none, b"a\0b\0").unwrap();
        let e = LinkGroups::read(&none).unwrap_err();
        assert!(e.to_string().contains("truncated"), "{e}");
    }
}
