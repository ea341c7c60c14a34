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

use std::ffi::{CStr, CString, OsString};
use std::hash::BuildHasher;
use std::io;
use std::os::unix::ffi::OsStringExt;

use super::super::compact::{Wire, WireEntry, WireKind};
use super::super::manifest::unhex;
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
    /// Entry indexes by the hash of their path ([`Tree::index`]).
    by_path: hashbrown::HashTable<u32>,
    hasher: hashbrown::DefaultHashBuilder,
    /// The distinct contents of the layer's files: `(index in the compact manifest's object
    /// table, bytes)`, first use first (the ids come with that table: [`super::fetch`]).
    pub objects: Vec<(u32, u64)>,
    /// For each content, the entry whose metadata its local object gets (its first file).
    pub object_entry: Vec<u32>,
    /// The `st_dev` every entry shows.
    dev: u64,
}

/// Whether `path` is a plain relative path: components that are neither empty, `.` nor `..`,
/// and no NUL.
fn plain_relative(path: &[u8]) -> bool {
    !path.contains(&0)
        && path
            .split(|&b| b == b'/')
            .all(|c| !c.is_empty() && c != b"." && c != b"..")
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
    /// The tree of the manifest `w`, showing `dev` as every entry's device, checked as
    /// [`RemoteManifest::validate`](crate::remote::manifest::RemoteManifest::validate) checks
    /// a manifest: the root directory first, plain relative paths (no empty, `.` or `..`
    /// component, no NUL), parents before children, link groups of two or more regular files
    /// with the same object and metadata, each file in one group. Built from the manifest's
    /// wire form (objects by index, paths as prefix + rest), so a layer of 100k files costs no
    /// hex id or path string per entry: what a lazy mount reads before its command starts.
    ///
    /// Errors: [`Error::Failed`] naming the entry or link group that breaks a rule, or an
    /// index (path prefix, object, link entry) out of range, or a malformed xattr.
    pub fn new(w: &Wire, dev: u64) -> Result<Tree> {
        Tree::build(&w.entries, &w.links, w.objects.len(), dev)
    }

    /// [`Tree::new`] of a manifest's `entries` and `links` (a compact manifest's or a tree
    /// manifest's), whose object table has `objects` entries.
    ///
    /// Errors: as [`Tree::new`].
    pub fn build(
        entries: &[WireEntry],
        links: &[Vec<u32>],
        objects: usize,
        dev: u64,
    ) -> Result<Tree> {
        let bad = |what: String| Error::Failed(format!("remote manifest: {what}"));
        let mut group_size = vec![0u32; entries.len()];
        for g in links {
            if g.len() < 2 {
                return Err(bad(format!("link group {g:?} has fewer than two files")));
            }
            for &i in g {
                let n = (group_size.get_mut(i as usize))
                    .ok_or_else(|| bad(format!("link entry {i} out of range")))?;
                if *n != 0 {
                    return Err(bad(format!("entry {i} is in more than one link group")));
                }
                *n = g.len() as u32;
            }
        }
        let root = entries.first();
        if !root.is_some_and(|e| e.rest.is_empty() && matches!(e.kind, WireKind::Dir)) {
            return Err(bad("the first entry must be the root directory".into()));
        }
        let mut t = Tree {
            nodes: Vec::with_capacity(entries.len()),
            by_path: hashbrown::HashTable::with_capacity(entries.len()),
            hasher: Default::default(),
            objects: Vec::new(),
            object_entry: Vec::new(),
            dev,
        };
        // Wire object index -> tree object index (u32::MAX: no entry uses it yet).
        let mut of_wire = vec![u32::MAX; objects];
        for (i, e) in entries.iter().enumerate() {
            let i = i as u32;
            let path: Box<[u8]> = {
                let prev: &[u8] = t.nodes.last().map_or(b"", |n| &n.path);
                let shared = (prev.get(..e.shared as usize))
                    .ok_or_else(|| bad(format!("path prefix {} out of range", e.shared)))?;
                [shared, e.rest.as_bytes()].concat().into()
            };
            let (size, object, target) = match &e.kind {
                WireKind::Dir => (4096, None, None),
                WireKind::File { object, size } => {
                    let slot = (of_wire.get_mut(*object as usize))
                        .ok_or_else(|| bad(format!("object index {object} out of range")))?;
                    if *slot == u32::MAX {
                        *slot = t.objects.len() as u32;
                        t.objects.push((*object, *size));
                        t.object_entry.push(i);
                    }
                    (*size, Some(*slot), None)
                }
                WireKind::Symlink { target } => (
                    target.len() as u64,
                    None,
                    Some(target.as_bytes().to_vec().into_boxed_slice()),
                ),
                WireKind::Fifo => (0, None, None),
            };
            let shown = || String::from_utf8_lossy(&path);
            if i > 0 && !plain_relative(&path) {
                return Err(bad(format!(
                    "entry {:?}: not a plain relative path",
                    shown()
                )));
            }
            let xattrs = (e.xattrs.iter())
                .map(|(n, v)| Ok((unhex(n, &shown())?, unhex(v, &shown())?)))
                .collect::<Result<Vec<_>>>()?
                .into_iter()
                .filter_map(|(n, v)| CString::new(n).ok().map(|n| (n, v)))
                .collect();
            let nlink = match &e.kind {
                WireKind::Dir => 2,
                WireKind::File { .. } => group_size[i as usize].max(1),
                _ => 1,
            };
            if i > 0 {
                let parent = match path.iter().rposition(|&b| b == b'/') {
                    Some(n) => &path[..n],
                    None => &b""[..],
                };
                let p = t
                    .index(parent)
                    .filter(|&p| t.nodes[p as usize].mode & libc::S_IFMT == libc::S_IFDIR)
                    .ok_or_else(|| {
                        bad(format!(
                            "entry {:?}: its parent is not a directory before it",
                            shown()
                        ))
                    })?;
                let pn = &mut t.nodes[p as usize];
                pn.children.push(i);
                if matches!(e.kind, WireKind::Dir) {
                    pn.nlink += 1;
                }
            }
            if t.index(&path).is_some() {
                return Err(bad(format!("entry {:?} comes twice", shown())));
            }
            let hash = t.hasher.hash_one(&*path);
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
            let (nodes, hasher) = (&t.nodes, &t.hasher);
            t.by_path
                .insert_unique(hash, i, |&j| hasher.hash_one(&*nodes[j as usize].path));
        }
        t.check_links(links)?;
        Ok(t)
    }

    /// Checks that each link group of `w` is one file of the filled tree: regular files with
    /// the same object and metadata (the sizes and indexes were checked by [`Tree::new`]).
    ///
    /// Errors: [`Error::Failed`] naming the group's first path and the file that differs.
    fn check_links(&self, links: &[Vec<u32>]) -> Result<()> {
        let one_file = |n: &Node| (n.object, n.mode, n.uid, n.gid, n.mtime);
        for g in links {
            let first = &self.nodes[g[0] as usize];
            for &i in g {
                let n = &self.nodes[i as usize];
                if n.object.is_none() || one_file(n) != one_file(first) {
                    return Err(Error::Failed(format!(
                        "remote manifest: link group of {:?}: {:?} is not the same regular file",
                        String::from_utf8_lossy(&first.path),
                        String::from_utf8_lossy(&n.path)
                    )));
                }
            }
        }
        Ok(())
    }

    /// The local object tag (`<meta>` of `objects/<aa>/<hex>-<meta>`) of entry `i`'s file:
    /// what [`crate::remote::manifest::Entry::meta_tag`] gives for its manifest entry.
    pub fn meta_tag(&self, i: u32) -> u64 {
        let n = &self.nodes[i as usize];
        let meta = crate::store::SharedMeta {
            mode: n.mode,
            uid: n.uid,
            gid: n.gid,
            mtime: n.mtime,
        };
        let xattrs: Vec<(Vec<u8>, Vec<u8>)> = (n.xattrs.iter())
            .map(|(k, v)| (k.as_bytes().to_vec(), v.clone()))
            .collect();
        meta.tag(&xattrs)
    }

    /// The entry whose path is `path` (empty for the root), if any.
    fn index(&self, path: &[u8]) -> Option<u32> {
        let hash = self.hasher.hash_one(path);
        (self
            .by_path
            .find(hash, |&j| &*self.nodes[j as usize].path == path))
        .copied()
    }

    /// The entry at `rel` (`.` for the root).
    ///
    /// Errors: `ENOENT` when the tree has none.
    pub fn find(&self, rel: &CStr) -> io::Result<u32> {
        self.index(key(rel))
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
        self.index(&p)
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
    use crate::remote::compact;
    use crate::remote::manifest::tests::{sample_entry as entry, sample_manifest as manifest};
    use crate::remote::manifest::{Kind, RemoteManifest};

    /// The tree of `m` as a lazy layer's daemon reads it: from its tree manifest, which must
    /// give the same tree as its compact form and as the JSON form (layers pushed by older
    /// versions).
    fn tree_of(m: &RemoteManifest, dev: u64) -> Result<Tree> {
        let from_json = Tree::new(&compact::wire(&serde_json::to_vec(m).unwrap())?, dev);
        let compact = compact::encode(m)?;
        let wire = compact::wire(&compact)?;
        let from_compact = Tree::new(&wire, dev);
        let head = compact::decode_tree(&compact::encode_tree(&wire, &compact)?)?;
        let t = Tree::build(
            &head.entries,
            &head.links,
            head.prefix.objects as usize,
            dev,
        )?;
        for other in [from_json.unwrap(), from_compact.unwrap()] {
            assert_eq!(other.nodes.len(), t.nodes.len());
            for (a, b) in other.nodes.iter().zip(&t.nodes) {
                assert_eq!(
                    (&a.path, a.mode, a.object, a.nlink),
                    (&b.path, b.mode, b.object, b.nlink)
                );
            }
            assert_eq!(other.objects, t.objects);
        }
        Ok(t)
    }

    /// Every attribute a pulled tree would show through the overlay comes from the manifest:
    /// type, mode, owner, size, times (ctime = mtime), link counts (a link group's size; a
    /// directory's 2 + subdirectories), listings, symlink targets, xattrs; files share their
    /// content's object.
    #[test]
    fn the_tree_answers_what_a_pulled_tree_shows() {
        let m = manifest();
        let t = tree_of(&m, 42).unwrap();
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
        // A fetched object is looked for in the store under its first file's metadata.
        for (i, e) in m.entries.iter().enumerate() {
            assert_eq!(t.meta_tag(i as u32), e.meta_tag().unwrap(), "{}", e.path);
        }
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
        let e = tree_of(&m, 1).err().unwrap().to_string();
        assert!(e.contains("d/a") && e.contains("parent"), "{e}");
        let mut m = manifest();
        m.entries.push(entry("b/under-a-file", Kind::Fifo, 0o10644));
        assert!(tree_of(&m, 1).is_err());
    }

    /// What a full pull refuses (`RemoteManifest::validate`), a lazy mount refuses too: the
    /// tree is the lazy layer's check of its manifest.
    #[test]
    fn the_tree_refuses_what_validate_refuses() {
        let with_entry = |path: &str| {
            let mut m = manifest();
            m.entries.push(entry(path, Kind::Dir, 0o40755));
            m
        };
        let with_links = |links: &[&[&str]]| {
            let mut m = manifest();
            m.links = (links.iter())
                .map(|g| g.iter().map(|p| p.to_string()).collect())
                .collect();
            m
        };
        let mut root_later = manifest();
        root_later.entries.swap(0, 1);
        let mut no_root = manifest();
        no_root.entries[0].kind = Kind::Fifo;
        let bad = [
            with_entry("d/."),
            with_entry("d/../x"),
            with_entry("d//x"),
            with_entry("/abs"),
            with_entry("d/x\0y"),
            root_later,
            no_root,
            with_links(&[&["d/a"]]),
            with_links(&[&["d/a", "d"]]),
            with_links(&[&["d/a", "l"]]),
            with_links(&[&["d/a", "b"]]),
            with_links(&[&["d/a", "d/hard"], &["d/hard", "d/a"]]),
        ];
        for m in bad {
            let what = format!("{:?} / {:?}", m.entries.last().unwrap().path, m.links);
            assert!(m.validate().is_err(), "validate accepts {what}");
            assert!(tree_of(&m, 1).is_err(), "the tree accepts {what}");
        }
        // A path twice would be two nodes for one name: refused as well.
        assert!(tree_of(&with_entry("d"), 1).is_err());
        tree_of(&manifest(), 1).unwrap();
    }
}
