//! The remote manifest of a layer: the local [`Manifest`] plus every entry of the tree (path,
//! type, mode, owner, times, xattrs, object id or symlink target), enough to rebuild the tree
//! locally exactly as `promote` built it — and the key record that points at it.

use std::collections::HashMap;
use std::fs;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{FileTypeExt, MetadataExt};
use std::path::Path;

use serde::{Deserialize, Serialize};

use crate::error::{Error, IoContext, Result};
use crate::ids::{LayerId, ObjectId};
use crate::overlay::links::LinkGroups;
use crate::store::{Manifest, ProjectDirs, SharedMeta, content_xattrs, hash_file};
use crate::units::hex;

/// Remote manifest format written by this version.
pub const REMOTE_MANIFEST_FORMAT: u32 = 1;

/// `manifests/<layer>.json`.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
pub struct RemoteManifest {
    /// `REMOTE_MANIFEST_FORMAT`.
    pub remote_format: u32,
    /// The layer's local manifest (id, project, cache, key, parent, created, counts).
    pub layer: Manifest,
    /// Every entry of the tree, parents before children; the root is the entry with path "".
    pub entries: Vec<Entry>,
    /// Where the packed objects of the layer are: pack id → `(object hex, offset, length)`.
    /// Objects not listed here are stored alone under `objects/`.
    #[serde(default)]
    pub packs: std::collections::BTreeMap<String, Vec<(String, u64, u64)>>,
    /// The layer's link groups (`layers/<id>/links`, see `overlay::links`): regular files, by
    /// path as in `Entry::path`, that were one inode in the filled tree, two or more per
    /// group. Absent in manifests of layers without links (and of older pushes: their pulls
    /// show every file with one link).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub links: Vec<Vec<String>>,
}

/// One entry of a layer tree.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
pub struct Entry {
    /// Path relative to the tree, `/`-separated, `""` for the root (UTF-8 only).
    pub path: String,
    /// What it is.
    #[serde(flatten)]
    pub kind: Kind,
    /// `st_mode` (type and permission bits).
    pub mode: u32,
    /// Owner uid.
    pub uid: u32,
    /// Owner gid.
    pub gid: u32,
    /// mtime (seconds, nanoseconds).
    pub mtime: (i64, i64),
    /// atime (seconds, nanoseconds).
    pub atime: (i64, i64),
    /// Content xattrs as `(name hex, value hex)`, sorted by name (none for symlinks).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub xattrs: Vec<(String, String)>,
}

/// The type of an [`Entry`] and what only that type has.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
#[serde(tag = "type", rename_all = "lowercase")]
pub enum Kind {
    /// A directory.
    Dir,
    /// A regular file: its object and size in bytes.
    File {
        /// Object id (blake3 hex).
        object: String,
        /// Bytes.
        size: u64,
    },
    /// A symlink and its target (never followed).
    Symlink {
        /// Target as stored (UTF-8 only).
        target: String,
    },
    /// A fifo.
    Fifo,
}

impl Entry {
    /// The object id of a regular file.
    ///
    /// Errors: [`Error::Failed`] for a malformed id.
    pub fn object(&self) -> Result<Option<(ObjectId, u64)>> {
        match &self.kind {
            Kind::File { object, size } => ObjectId::from_hex(object)
                .map(|id| Some((id, *size)))
                .map_err(|e| Error::Failed(format!("remote manifest entry {:?}: {e}", self.path))),
            _ => Ok(None),
        }
    }

    /// The xattrs decoded to bytes.
    ///
    /// Errors: [`Error::Failed`] for bad hex.
    pub fn xattr_bytes(&self) -> Result<Vec<(Vec<u8>, Vec<u8>)>> {
        self.xattrs
            .iter()
            .map(|(n, v)| Ok((unhex(n, &self.path)?, unhex(v, &self.path)?)))
            .collect()
    }

    /// The local object tag (the `<meta>` part of its name) this entry's file has.
    ///
    /// Errors: as [`Entry::xattr_bytes`].
    pub fn meta_tag(&self) -> Result<u64> {
        let shared = SharedMeta {
            mode: self.mode,
            uid: self.uid,
            gid: self.gid,
            mtime: self.mtime,
        };
        Ok(shared.tag(&self.xattr_bytes()?))
    }
}

/// `caches/<cache>/keys/<key>`: which layer a key publishes (plus what `remote ls` shows).
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
pub struct KeyRecord {
    /// The layer.
    pub layer: LayerId,
    /// Created, ms since the epoch.
    pub created_ms: u64,
    /// Apparent bytes of its regular files.
    pub bytes: u64,
    /// Regular files.
    pub files: u64,
    /// Distinct objects the manifest names.
    pub objects: u64,
    /// The key's recorded inputs ([`crate::why`]), so a pulling store can say why a later
    /// key misses; absent in records of older versions or when none were recorded.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub inputs: Option<crate::store::Inputs>,
}

/// The bytes the hex string `s` (of the entry at `path`, named in the error) spells.
///
/// Errors: [`Error::Failed`] for an odd length or a character that is no hex digit.
pub(crate) fn unhex(s: &str, path: &str) -> Result<Vec<u8>> {
    let bad = || Error::Failed(format!("remote manifest entry {path:?}: bad hex {s:?}"));
    if !s.len().is_multiple_of(2) {
        return Err(bad());
    }
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(s.get(i..i + 2).ok_or_else(bad)?, 16).map_err(|_| bad()))
        .collect()
}

fn utf8(p: &Path, what: &str) -> Result<String> {
    p.to_str().map(str::to_string).ok_or_else(|| {
        Error::Failed(format!(
            "{}: {what} is not UTF-8; the remote tier cannot carry it",
            p.display()
        ))
    })
}

/// Reads layer `id` of `pd` into a remote manifest. A regular file's object id comes from the
/// object it is a hardlink of (found by inode among `objects/`, so nothing is re-hashed); a
/// file that is no object link (never the case for a promoted layer) is hashed.
///
/// Errors: [`Error::Io`] reading the tree; [`Error::Failed`] for a non-UTF-8 name or target.
pub fn from_layer(pd: &ProjectDirs, id: &LayerId) -> Result<RemoteManifest> {
    let layer = pd.layer(id);
    let manifest = layer.manifest()?;
    let mut by_inode: HashMap<(u64, u64), ObjectId> = HashMap::new();
    for (_, oid, meta) in pd.objects().list()? {
        by_inode.insert((meta.dev(), meta.ino()), oid);
    }
    let links_path = layer.links_path();
    let links = LinkGroups::read(&links_path)
        .at(&links_path)?
        .groups()
        .into_iter()
        .map(|g| {
            g.into_iter()
                .map(|p| utf8(Path::new(std::ffi::OsStr::from_bytes(&p)), "a linked path"))
                .collect::<Result<Vec<_>>>()
        })
        .collect::<Result<Vec<_>>>()?;
    let root = layer.tree();
    let mut entries = Vec::new();
    let mut stack = vec![(root.clone(), String::new())];
    while let Some((dir, rel)) = stack.pop() {
        let meta = fs::symlink_metadata(&dir).at(&dir)?;
        entries.push(entry(&dir, &meta, rel.clone(), Kind::Dir)?);
        let mut names: Vec<_> = fs::read_dir(&dir)
            .at(&dir)?
            .map(|e| e.map(|e| e.file_name()))
            .collect::<std::io::Result<_>>()
            .at(&dir)?;
        names.sort();
        // Reverse so the stack pops children in name order.
        let mut subdirs = Vec::new();
        for name in names {
            let p = dir.join(&name);
            let name = utf8(Path::new(&name), "a file name")?;
            let r = if rel.is_empty() {
                name
            } else {
                format!("{rel}/{name}")
            };
            let m = fs::symlink_metadata(&p).at(&p)?;
            let ft = m.file_type();
            if ft.is_dir() {
                subdirs.push((p, r));
            } else if ft.is_file() {
                let oid = match by_inode.get(&(m.dev(), m.ino())) {
                    Some(o) => *o,
                    None => hash_file(&p).at(&p)?,
                };
                let kind = Kind::File {
                    object: oid.to_hex(),
                    size: m.len(),
                };
                entries.push(entry(&p, &m, r, kind)?);
            } else if ft.is_symlink() {
                let target = utf8(&fs::read_link(&p).at(&p)?, "a symlink target")?;
                entries.push(entry(&p, &m, r, Kind::Symlink { target })?);
            } else if ft.is_fifo() {
                entries.push(entry(&p, &m, r, Kind::Fifo)?);
            }
        }
        stack.extend(subdirs.into_iter().rev());
    }
    Ok(RemoteManifest {
        remote_format: REMOTE_MANIFEST_FORMAT,
        layer: manifest,
        entries,
        packs: Default::default(),
        links,
    })
}

fn entry(p: &Path, m: &fs::Metadata, path: String, kind: Kind) -> Result<Entry> {
    let xattrs = if m.file_type().is_symlink() {
        Vec::new()
    } else {
        content_xattrs(p)
            .at(p)?
            .into_iter()
            .map(|(n, v)| (hex(&n), hex(&v)))
            .collect()
    };
    Ok(Entry {
        path,
        kind,
        mode: m.mode(),
        uid: m.uid(),
        gid: m.gid(),
        mtime: (m.mtime(), m.mtime_nsec()),
        atime: (m.atime(), m.atime_nsec()),
        xattrs,
    })
}

impl RemoteManifest {
    /// The distinct objects the manifest names, with their sizes.
    ///
    /// Errors: [`Error::Failed`] for a malformed object id.
    pub fn objects(&self) -> Result<HashMap<ObjectId, u64>> {
        let mut out = HashMap::new();
        for e in &self.entries {
            if let Some((id, size)) = e.object()? {
                out.insert(id, size);
            }
        }
        Ok(out)
    }

    /// Where each packed object of the layer is.
    ///
    /// Errors: [`Error::Failed`] for a malformed object id.
    pub fn pack_locations(&self) -> Result<HashMap<ObjectId, Location>> {
        let mut out = HashMap::new();
        for (pack, objs) in &self.packs {
            for (hex, offset, len) in objs {
                let id = ObjectId::from_hex(hex).map_err(|e| {
                    Error::Failed(format!(
                        "remote manifest of layer {}: {e}",
                        self.layer.layer
                    ))
                })?;
                let loc = Location {
                    pack: pack.clone(),
                    offset: *offset,
                    len: *len,
                };
                out.insert(id, loc);
            }
        }
        Ok(out)
    }

    /// Checks what a pull will trust: the format, the root entry first, relative paths with no
    /// `.`/`..`/empty components (so nothing lands outside the tree), parents before children,
    /// and link groups of two or more regular files of the layer with the same object and
    /// metadata (one inode in the filled tree), each file in one group.
    ///
    /// Errors: [`Error::Failed`] naming the offending entry.
    pub fn validate(&self) -> Result<()> {
        if self.remote_format != REMOTE_MANIFEST_FORMAT {
            return Err(Error::Failed(format!(
                "remote manifest of layer {}: format {} is not supported (want {})",
                self.layer.layer, self.remote_format, REMOTE_MANIFEST_FORMAT
            )));
        }
        let mut dirs = std::collections::HashSet::new();
        for (i, e) in self.entries.iter().enumerate() {
            let bad = |why: &str| {
                Error::Failed(format!(
                    "remote manifest of layer {}: entry {:?}: {why}",
                    self.layer.layer, e.path
                ))
            };
            if i == 0 {
                if !e.path.is_empty() || e.kind != Kind::Dir {
                    return Err(bad("the first entry must be the root directory"));
                }
                dirs.insert(String::new());
                continue;
            }
            let (parent, name) = e.path.rsplit_once('/').unwrap_or(("", &e.path));
            if name.is_empty()
                || name == "."
                || name == ".."
                || name.contains('\0')
                || e.path
                    .split('/')
                    .any(|c| c.is_empty() || c == "." || c == "..")
            {
                return Err(bad("not a plain relative path"));
            }
            if !dirs.contains(parent) {
                return Err(bad("its parent directory comes later or not at all"));
            }
            if e.kind == Kind::Dir {
                dirs.insert(e.path.clone());
            }
        }
        if self.entries.is_empty() {
            return Err(Error::Failed(format!(
                "remote manifest of layer {}: no entries",
                self.layer.layer
            )));
        }
        let files: HashMap<&str, &Entry> = self
            .entries
            .iter()
            .filter(|e| matches!(e.kind, Kind::File { .. }))
            .map(|e| (e.path.as_str(), e))
            .collect();
        // One inode in the filled tree: the same object and the same metadata.
        let one_file = |a: &Entry, b: &Entry| {
            (&a.kind, a.mode, a.uid, a.gid, a.mtime) == (&b.kind, b.mode, b.uid, b.gid, b.mtime)
        };
        let mut linked = std::collections::HashSet::new();
        for g in &self.links {
            let bad = |why: String| {
                Error::Failed(format!(
                    "remote manifest of layer {}: link group {g:?}: {why}",
                    self.layer.layer
                ))
            };
            if g.len() < 2 {
                return Err(bad("a group has two or more paths".into()));
            }
            for p in g {
                let Some(file) = files.get(p.as_str()) else {
                    return Err(bad(format!("{p:?} is not a regular file of the layer")));
                };
                if !files
                    .get(g[0].as_str())
                    .is_some_and(|first| one_file(first, file))
                {
                    return Err(bad(format!(
                        "{p:?} and {:?} differ in content or metadata, so they were no one file",
                        g[0]
                    )));
                }
                if !linked.insert(p.as_str()) {
                    return Err(bad(format!("{p:?} is in more than one group")));
                }
            }
        }
        Ok(())
    }
}

/// Where a packed object is.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Location {
    /// Pack id (blake3 hex of the pack's bytes).
    pub pack: String,
    /// Byte offset in the pack.
    pub offset: u64,
    /// Length in bytes.
    pub len: u64,
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::ids::{CacheId, CacheKey, ProjectId};
    use crate::store::{MANIFEST_FORMAT, TreeCounts, new_layer_id};

    /// An entry of [`sample_manifest`]: owner 7:8, fixed times, one xattr.
    pub(crate) fn sample_entry(path: &str, kind: Kind, mode: u32) -> Entry {
        Entry {
            path: path.into(),
            kind,
            mode,
            uid: 7,
            gid: 8,
            mtime: (100, 5),
            atime: (200, 6),
            xattrs: vec![(hex("user.a"), hex("v1"))],
        }
    }

    fn hex(s: &str) -> String {
        s.bytes().map(|b| format!("{b:02x}")).collect()
    }

    /// The local manifest of the samples: project `p`, cache `c`, key `k`, a new layer id.
    fn sample_header() -> Manifest {
        Manifest {
            format: MANIFEST_FORMAT,
            layer: new_layer_id(),
            project: ProjectId::new("p").unwrap(),
            cache: CacheId::new("c").unwrap(),
            key: CacheKey::new("k").unwrap(),
            parent: None,
            created_ms: 0,
            counts: TreeCounts::default(),
            dropped: vec![],
        }
    }

    /// A small manifest with every kind but fifos, a link group and xattrs: the remote and
    /// lazy tests' fixture.
    pub(crate) fn sample_manifest() -> RemoteManifest {
        let file = |o: &str, size| Kind::File {
            object: o.repeat(32),
            size,
        };
        RemoteManifest {
            remote_format: REMOTE_MANIFEST_FORMAT,
            layer: sample_header(),
            entries: vec![
                sample_entry("", Kind::Dir, 0o40755),
                sample_entry("d", Kind::Dir, 0o40700),
                sample_entry("d/e", Kind::Dir, 0o40755),
                sample_entry("d/a", file("aa", 10), 0o100644),
                sample_entry("d/hard", file("aa", 10), 0o100644),
                sample_entry("b", file("bb", 3), 0o100755),
                sample_entry(
                    "l",
                    Kind::Symlink {
                        target: "d/a".into(),
                    },
                    0o120777,
                ),
            ],
            packs: Default::default(),
            links: vec![vec!["d/a".into(), "d/hard".into()]],
        }
    }

    /// A key record of a version before `inputs` still reads (no inputs), and one without
    /// inputs is written as before.
    #[test]
    fn key_records_without_inputs_read_and_write_as_before() {
        let old = format!(
            r#"{{"layer":"{}","created_ms":1,"bytes":2,"files":3,"objects":4}}"#,
            new_layer_id()
        );
        let rec: KeyRecord = serde_json::from_str(&old).unwrap();
        assert_eq!((rec.objects, rec.inputs.as_ref()), (4, None));
        assert_eq!(serde_json::to_string(&rec).unwrap(), old);
    }

    fn manifest(links: Vec<Vec<&str>>) -> RemoteManifest {
        let e = |path: &str, kind: Kind| Entry {
            path: path.into(),
            kind,
            mode: 0o100644,
            uid: 0,
            gid: 0,
            mtime: (0, 0),
            atime: (0, 0),
            xattrs: vec![],
        };
        let file = || Kind::File {
            object: "00".repeat(32),
            size: 1,
        };
        RemoteManifest {
            remote_format: REMOTE_MANIFEST_FORMAT,
            layer: sample_header(),
            entries: vec![
                e("", Kind::Dir),
                e("d", Kind::Dir),
                e("d/a", file()),
                e("b", file()),
                e("c", file()),
                e(
                    "other",
                    Kind::File {
                        object: "11".repeat(32),
                        size: 1,
                    },
                ),
            ],
            packs: Default::default(),
            links: links
                .into_iter()
                .map(|g| g.into_iter().map(String::from).collect())
                .collect(),
        }
    }

    #[test]
    fn link_groups_must_name_regular_files_of_the_layer_once() {
        manifest(vec![vec!["d/a", "b"]]).validate().unwrap();
        for (links, why) in [
            (vec![vec!["b"]], "two or more"),
            (vec![vec!["b", "d"]], "\"d\" is not a regular file"),
            (vec![vec!["b", "../x"]], "\"../x\" is not a regular file"),
            (
                vec![vec!["b", "c"], vec!["c", "d/a"]],
                "\"c\" is in more than one",
            ),
            (
                vec![vec!["b", "other"]],
                "\"other\" and \"b\" differ in content",
            ),
        ] {
            let e = manifest(links).validate().unwrap_err().to_string();
            assert!(e.contains(why), "{e}");
        }
    }
}
