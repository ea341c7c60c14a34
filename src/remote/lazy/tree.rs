//! A layer's tree as its remote manifest describes it: what [`super::LazyLayer`] answers
//! lookups, attributes, listings, symlink targets and xattrs from, with no file content and
//! no request to the remote.
//!
//! Attributes are made from the manifest entry the way the pulled tree would show them:
//! type and mode, owner, size, mtime and atime (ctime = mtime), `st_nlink` 1 for a file in no
//! link group and the group's size otherwise (the overlay then shows the group's inode, as it
//! does for a pulled layer's recorded links), 2 plus the subdirectories for a directory. Inode
//! numbers are the entry's index plus one (unique within the layer; the overlay shows its own
//! node ids).

use std::collections::HashMap;
use std::ffi::{CStr, CString, OsString};
use std::io;
use std::os::unix::ffi::OsStringExt;

use super::super::manifest::{Kind, RemoteManifest};
use crate::error::{Error, Result};

/// One entry of the tree.
pub(super) struct Node {
    /// Path relative to the root, `/`-separated, empty for the root.
    pub path: Box<[u8]>,
    /// `st_mode` (type and permission bits).
    pub mode: u32,
    pub uid: u32,
    pub gid: u32,
    /// Bytes (a file's size, a symlink's target length, 4096 for a directory).
    pub size: u64,
    pub mtime: (i64, i64),
    pub atime: (i64, i64),
    /// `st_nlink` as the pulled tree would show it through the overlay.
    pub nlink: u32,
    /// The index of the file's content in [`Tree::objects`]; `None` for other types.
    pub object: Option<u32>,
    /// A symlink's target.
    pub target: Option<Box<[u8]>>,
    /// Content xattrs (name without NUL, value).
    pub xattrs: Vec<(CString, Vec<u8>)>,
    /// A directory's children (entry indexes, manifest order).
    pub children: Vec<u32>,
}

/// The tree of one manifest.
pub(super) struct Tree {
    pub nodes: Vec<Node>,
    by_path: HashMap<Box<[u8]>, u32>,
    /// The distinct contents of the layer's files: `(blake3 hex, bytes)`, first use first.
    pub objects: Vec<(String, u64)>,
    /// For each content, the entry whose metadata its local object gets (its first file).
    pub object_entry: Vec<u32>,
    /// The `st_dev` every entry shows.
    dev: u64,
}

/// `rel` as the tree's key: `.` and a leading `./` name the root and its children.
fn key(rel: &CStr) -> &[u8] {
    let b = rel.to_bytes();
    match b {
        b"." | b"" => b"",
        _ => b.strip_prefix(b"./").unwrap_or(b),
    }
}

impl Tree {
    /// The tree of `m` (validated: parents before children, root first), showing `dev` as every
    /// entry's device.
    ///
    /// Errors: [`Error::Failed`] for a malformed object id or xattr, or an entry whose parent
    /// is not a directory of the manifest.
    pub fn new(m: &RemoteManifest, dev: u64) -> Result<Tree> {
        let mut group_size: HashMap<&str, u32> = HashMap::new();
        for g in &m.links {
            for p in g {
                group_size.insert(p.as_str(), g.len() as u32);
            }
        }
        let mut t = Tree {
            nodes: Vec::with_capacity(m.entries.len()),
            by_path: HashMap::with_capacity(m.entries.len()),
            objects: Vec::new(),
            object_entry: Vec::new(),
            dev,
        };
        let mut object_of: HashMap<&str, u32> = HashMap::new();
        for (i, e) in m.entries.iter().enumerate() {
            let i = i as u32;
            let (size, object, target) = match &e.kind {
                Kind::Dir => (4096, None, None),
                Kind::File { object, size } => {
                    let next = t.objects.len() as u32;
                    let idx = *object_of.entry(object.as_str()).or_insert(next);
                    if idx == next {
                        t.objects.push((object.clone(), *size));
                        t.object_entry.push(i);
                    }
                    (*size, Some(idx), None)
                }
                Kind::Symlink { target } => (
                    target.len() as u64,
                    None,
                    Some(target.as_bytes().to_vec().into_boxed_slice()),
                ),
                Kind::Fifo => (0, None, None),
            };
            let xattrs = e
                .xattr_bytes()?
                .into_iter()
                .filter_map(|(n, v)| CString::new(n).ok().map(|n| (n, v)))
                .collect();
            let nlink = match &e.kind {
                Kind::Dir => 2,
                Kind::File { .. } => group_size.get(e.path.as_str()).copied().unwrap_or(1),
                _ => 1,
            };
            let path: Box<[u8]> = e.path.as_bytes().into();
            if i > 0 {
                let parent = match path.iter().rposition(|&b| b == b'/') {
                    Some(n) => &path[..n],
                    None => &b""[..],
                };
                let p = t
                    .by_path
                    .get(parent)
                    .copied()
                    .filter(|&p| t.nodes[p as usize].mode & libc::S_IFMT == libc::S_IFDIR)
                    .ok_or_else(|| {
                        Error::Failed(format!(
                            "remote manifest entry {:?}: its parent is not a directory before it",
                            e.path
                        ))
                    })?;
                let pn = &mut t.nodes[p as usize];
                pn.children.push(i);
                if matches!(e.kind, Kind::Dir) {
                    pn.nlink += 1;
                }
            }
            t.by_path.insert(path.clone(), i);
            t.nodes.push(Node {
                path,
                mode: e.mode,
                uid: e.uid,
                gid: e.gid,
                size,
                mtime: e.mtime,
                atime: e.atime,
                nlink,
                object,
                target,
                xattrs,
                children: Vec::new(),
            });
        }
        Ok(t)
    }

    /// The entry at `rel` (`.` for the root).
    ///
    /// Errors: `ENOENT` when the tree has none.
    pub fn find(&self, rel: &CStr) -> io::Result<u32> {
        self.by_path
            .get(key(rel))
            .copied()
            .ok_or_else(|| io::Error::from_raw_os_error(libc::ENOENT))
    }

    /// The child `name` of directory entry `dir`, if any.
    pub fn child(&self, dir: u32, name: &CStr) -> Option<u32> {
        let d = &self.nodes[dir as usize];
        let mut p = d.path.to_vec();
        if !p.is_empty() {
            p.push(b'/');
        }
        p.extend_from_slice(name.to_bytes());
        self.by_path.get(p.as_slice()).copied()
    }

    /// Whether entry `i` is a directory.
    pub fn is_dir(&self, i: u32) -> bool {
        self.nodes[i as usize].mode & libc::S_IFMT == libc::S_IFDIR
    }

    /// The `stat` of entry `i` (see the module docs).
    pub fn stat(&self, i: u32) -> libc::stat {
        let n = &self.nodes[i as usize];
        let mut st = crate::sys::empty_stat();
        st.st_dev = self.dev;
        st.st_ino = i as u64 + 1;
        st.st_mode = n.mode;
        st.st_nlink = n.nlink as _;
        st.st_uid = n.uid;
        st.st_gid = n.gid;
        st.st_size = n.size as i64;
        st.st_blksize = 4096;
        st.st_blocks = n.size.div_ceil(512) as i64;
        st.st_atime = n.atime.0;
        st.st_atime_nsec = n.atime.1;
        st.st_mtime = n.mtime.0;
        st.st_mtime_nsec = n.mtime.1;
        st.st_ctime = n.mtime.0;
        st.st_ctime_nsec = n.mtime.1;
        st
    }

    /// The `statx` of entry `i`: [`Tree::stat`]'s fields (`STATX_BASIC_STATS`; no birth time).
    pub fn statx(&self, i: u32) -> libc::statx {
        let st = self.stat(i);
        let mut x = crate::sys::empty_statx();
        x.stx_mask = libc::STATX_BASIC_STATS;
        x.stx_blksize = st.st_blksize as u32;
        x.stx_nlink = st.st_nlink as u32;
        x.stx_uid = st.st_uid;
        x.stx_gid = st.st_gid;
        x.stx_mode = st.st_mode as u16;
        x.stx_ino = st.st_ino;
        x.stx_size = st.st_size as u64;
        x.stx_blocks = st.st_blocks as u64;
        let ts = |t: &mut libc::statx_timestamp, s: i64, ns: i64| {
            t.tv_sec = s;
            t.tv_nsec = ns as u32;
        };
        ts(&mut x.stx_atime, st.st_atime, st.st_atime_nsec);
        ts(&mut x.stx_mtime, st.st_mtime, st.st_mtime_nsec);
        ts(&mut x.stx_ctime, st.st_ctime, st.st_ctime_nsec);
        x.stx_dev_major = libc::major(st.st_dev);
        x.stx_dev_minor = libc::minor(st.st_dev);
        x
    }

    /// The names of directory entry `dir` with their `d_type`.
    pub fn names(&self, dir: u32) -> Vec<(OsString, u8)> {
        let d = &self.nodes[dir as usize];
        d.children
            .iter()
            .map(|&c| {
                let n = &self.nodes[c as usize];
                let name = match n.path.iter().rposition(|&b| b == b'/') {
                    Some(k) => &n.path[k + 1..],
                    None => &n.path[..],
                };
                (OsString::from_vec(name.to_vec()), d_type(n.mode))
            })
            .collect()
    }
}

/// The `d_type` of a file of mode `mode`.
fn d_type(mode: u32) -> u8 {
    match mode & libc::S_IFMT {
        libc::S_IFDIR => libc::DT_DIR,
        libc::S_IFREG => libc::DT_REG,
        libc::S_IFLNK => libc::DT_LNK,
        libc::S_IFIFO => libc::DT_FIFO,
        _ => libc::DT_UNKNOWN,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::remote::manifest::tests::{sample_entry as entry, sample_manifest as manifest};

    /// Every attribute a pulled tree would show through the overlay comes from the manifest:
    /// type, mode, owner, size, times (ctime = mtime), link counts (a link group's size; a
    /// directory's 2 + subdirectories), listings, symlink targets, xattrs; files share their
    /// content's object.
    #[test]
    fn the_tree_answers_what_a_pulled_tree_shows() {
        let m = manifest();
        let t = Tree::new(&m, 42).unwrap();
        let st = |p: &CStr| t.stat(t.find(p).unwrap());
        let root = st(c".");
        assert_eq!((root.st_mode, root.st_nlink, root.st_dev), (0o40755, 3, 42));
        assert_eq!(st(c"./d").st_nlink, 3, "d has one subdirectory");
        let a = st(c"d/a");
        assert_eq!(
            (
                a.st_mode,
                a.st_uid,
                a.st_gid,
                a.st_size,
                a.st_nlink,
                a.st_blocks
            ),
            (0o100644, 7, 8, 10, 2, 1)
        );
        assert_eq!(
            (a.st_mtime, a.st_mtime_nsec, a.st_ctime, a.st_atime),
            (100, 5, 100, 200)
        );
        assert_eq!(st(c"b").st_nlink, 1, "a file in no link group");
        assert_eq!(
            st(c"l").st_size,
            3,
            "a symlink's size is its target's length"
        );
        assert_eq!(
            t.find(c"d/missing").unwrap_err().raw_os_error(),
            Some(libc::ENOENT)
        );
        let names = |p: &CStr| -> Vec<(String, u8)> {
            (t.names(t.find(p).unwrap()).into_iter())
                .map(|(n, d)| (n.into_string().unwrap(), d))
                .collect()
        };
        assert_eq!(
            names(c"."),
            vec![
                ("d".into(), libc::DT_DIR),
                ("b".into(), libc::DT_REG),
                ("l".into(), libc::DT_LNK)
            ]
        );
        assert_eq!(names(c"d").len(), 3);
        let d = t.find(c"d").unwrap();
        assert_eq!(t.child(d, c"a"), t.find(c"d/a").ok());
        assert_eq!(t.child(d, c"zz"), None);
        let l = &t.nodes[t.find(c"l").unwrap() as usize];
        assert_eq!(l.target.as_deref(), Some(&b"d/a"[..]));
        assert_eq!(l.xattrs, vec![(c"user.a".to_owned(), b"v1".to_vec())]);
        // One content, one object: d/a and d/hard share it; b has its own.
        assert_eq!(t.objects.len(), 2);
        let obj = |p: &CStr| t.nodes[t.find(p).unwrap() as usize].object;
        assert_eq!(obj(c"d/a"), obj(c"d/hard"));
        assert_ne!(obj(c"d/a"), obj(c"b"));
        assert_eq!(obj(c"d"), None);
        let x = t.statx(t.find(c"b").unwrap());
        assert_eq!(
            (x.stx_size, x.stx_mode, x.stx_mtime.tv_sec),
            (3, 0o100755, 100)
        );
    }

    /// A manifest whose entry comes before its parent (or under a file) is refused, not served.
    #[test]
    fn an_entry_without_its_directory_before_it_is_refused() {
        let mut m = manifest();
        m.entries.swap(1, 3); // d/a before d
        let e = Tree::new(&m, 1).err().unwrap().to_string();
        assert!(e.contains("d/a") && e.contains("parent"), "{e}");
        let mut m = manifest();
        m.entries.push(entry("b/under-a-file", Kind::Fifo, 0o10644));
        assert!(Tree::new(&m, 1).is_err());
    }
}
