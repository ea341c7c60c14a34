//! The compact form of a remote manifest (`manifests/<layer>.compact`): the same
//! [`RemoteManifest`] as `<layer>.json`, encoded so that a fresh runner can fetch and read it in
//! the time a lazy mount has before its command starts.
//!
//! The JSON manifest spends about 320 bytes on an entry (its path in full, its object id as 64
//! hex digits, again in the pack table, field names) and a reader about as many ns parsing
//! them: 32 MB and 2-3 s for a layer of 100k files at 200 Mbit/s. The compact form keeps each
//! distinct object id once as 32 bytes, refers to objects by index, stores a path as the bytes
//! it shares with the previous entry's path plus the rest, and writes integers as varints
//! ([postcard](https://docs.rs/postcard)'s wire format), the whole compressed with zstd: about
//! 45 bytes an entry, most of them the object ids, which do not compress.
//!
//! Layout: [`MAGIC`] (8 bytes), then one zstd frame holding the postcard encoding of [`Wire`].
//! Decoding yields exactly the manifest that was encoded (a unit test checks it field by field),
//! so every reader of a manifest is unchanged; a lazy mount reads the decoded [`Wire`] itself
//! ([`wire`]: objects by index, paths as prefix + rest), which spares it a string per entry.
//! A lazy mount starts from less: the *tree manifest* ([`TreeHead`], `<layer>.tree`), the same
//! entries and link groups without the object table (the ids, ~90 % of the bytes), fetched
//! after the mount. The JSON form stays the authority: a push writes all three (JSON first, so
//! older readers never miss it; the tree last, as it names the compact form), `remote gc`
//! removes them together, and a reader falls back to the next form when one is missing (a
//! layer pushed by an older version).

use std::collections::HashMap;
use std::io::Read;

use serde::{Deserialize, Serialize};

use super::manifest::{Entry, Kind, RemoteManifest};
use crate::error::{Error, Result};
use crate::ids::ObjectId;

/// The first bytes of a compact manifest (format 1).
pub const MAGIC: &[u8; 8] = b"LCMANZ1\n";

/// The largest decoded size accepted (bytes): a corrupt or hostile object cannot make a reader
/// allocate more. 1 GiB is ~20 M entries.
const MAX_DECODED: u64 = 1 << 30;

/// zstd level: 3 is zstd's default; higher levels gain little on what does not compress (ids).
const LEVEL: i32 = 3;

/// The encoded manifest; also what a lazy layer's daemon builds its tree from
/// ([`wire`]), which spares it the manifest's per-entry strings (hex ids, whole paths).
#[derive(Serialize, Deserialize)]
pub(crate) struct Wire {
    pub remote_format: u32,
    /// The layer's local manifest, as JSON (small; keeps its optional fields exact).
    pub layer: String,
    /// The distinct object ids, in order of first use (entries first, then packs).
    pub objects: Vec<[u8; 32]>,
    pub entries: Vec<WireEntry>,
    /// Pack id → `(object index, offset, length)`.
    pub packs: Vec<(String, Vec<PackedObject>)>,
    /// Link groups as entry indexes.
    pub links: Vec<Vec<u32>>,
}

/// `(object index, offset, length)` of an object in a pack (bytes).
pub(crate) type PackedObject = (u32, u64, u64);

/// An entry of [`Wire`]: [`Entry`] with its path relative to the previous entry's and its
/// object by index.
#[derive(Serialize, Deserialize)]
pub(crate) struct WireEntry {
    /// Bytes of the path shared with the previous entry's path.
    pub shared: u32,
    /// The rest of the path.
    pub rest: String,
    pub kind: WireKind,
    pub mode: u32,
    pub uid: u32,
    pub gid: u32,
    pub mtime: (i64, i64),
    pub atime: (i64, i64),
    /// Content xattrs, name and value in hex (as [`Entry::xattrs`]).
    pub xattrs: Vec<(String, String)>,
}

/// [`Kind`] with a file's object by index into [`Wire::objects`].
#[derive(Serialize, Deserialize)]
pub(crate) enum WireKind {
    Dir,
    File { object: u32, size: u64 },
    Symlink { target: String },
    Fifo,
}

fn bad(what: impl std::fmt::Display) -> Error {
    bad_in(COMPACT, what)
}

/// What errors about a compact manifest start with.
const COMPACT: &str = "compact manifest";

/// What errors about a tree manifest start with.
const TREE: &str = "tree manifest";

/// An [`Error::Failed`] about the manifest form `form` ([`COMPACT`], [`TREE`]): `"<form>:
/// <what>"`.
fn bad_in(form: &str, what: impl std::fmt::Display) -> Error {
    Error::Failed(format!("{form}: {what}"))
}

/// Encodes `m` (see the module docs).
///
/// Errors: [`Error::Failed`] for a malformed object id, or a link group naming a path that is
/// not an entry of `m`.
#[cfg(test)]
pub fn encode(m: &RemoteManifest) -> Result<Vec<u8>> {
    encode_wire(&to_wire(m)?)
}

/// `m` as [`Wire`].
///
/// Errors: [`Error::Failed`] for a malformed object id, or a link group naming a path that is
/// not an entry of `m`.
pub(crate) fn to_wire(m: &RemoteManifest) -> Result<Wire> {
    let mut objects = ObjectTable::default();
    let mut entries = Vec::with_capacity(m.entries.len());
    let mut prev = "";
    for e in &m.entries {
        let shared = common_prefix(prev, &e.path);
        let kind = match &e.kind {
            Kind::Dir => WireKind::Dir,
            Kind::File { object, size } => WireKind::File {
                object: objects.index(object)?,
                size: *size,
            },
            Kind::Symlink { target } => WireKind::Symlink {
                target: target.clone(),
            },
            Kind::Fifo => WireKind::Fifo,
        };
        entries.push(WireEntry {
            shared: shared as u32,
            rest: e.path[shared..].to_string(),
            kind,
            mode: e.mode,
            uid: e.uid,
            gid: e.gid,
            mtime: e.mtime,
            atime: e.atime,
            xattrs: e.xattrs.clone(),
        });
        prev = &e.path;
    }
    let packs = (m.packs.iter())
        .map(|(name, objs)| {
            let list = (objs.iter())
                .map(|(hex, off, len)| Ok((objects.index(hex)?, *off, *len)))
                .collect::<Result<Vec<_>>>()?;
            Ok((name.clone(), list))
        })
        .collect::<Result<Vec<_>>>()?;
    let by_path: HashMap<&str, u32> = (m.entries.iter().enumerate())
        .map(|(i, e)| (e.path.as_str(), i as u32))
        .collect();
    let links = (m.links.iter())
        .map(|g| {
            (g.iter())
                .map(|p| {
                    (by_path.get(p.as_str()).copied())
                        .ok_or_else(|| bad(format!("link group names {p:?}, which is no entry")))
                })
                .collect::<Result<Vec<_>>>()
        })
        .collect::<Result<Vec<_>>>()?;
    Ok(Wire {
        remote_format: m.remote_format,
        layer: serde_json::to_string(&m.layer).map_err(bad)?,
        objects: objects.ids,
        entries,
        packs,
        links,
    })
}

/// The distinct object ids of a manifest being encoded, in order of first use.
#[derive(Default)]
struct ObjectTable<'a> {
    ids: Vec<[u8; 32]>,
    index: HashMap<&'a str, u32>,
}

impl<'a> ObjectTable<'a> {
    /// The index of object `hex`, added when new. Errors: [`Error::Failed`] for a bad id.
    fn index(&mut self, hex: &'a str) -> Result<u32> {
        if let Some(&i) = self.index.get(hex) {
            return Ok(i);
        }
        let id = ObjectId::from_hex(hex).map_err(|e| bad(format!("object {hex:?}: {e}")))?;
        let i = self.ids.len() as u32;
        self.ids.push(id.0);
        self.index.insert(hex, i);
        Ok(i)
    }
}

/// The byte length of the longest common prefix of `a` and `b` that ends on a char boundary.
fn common_prefix(a: &str, b: &str) -> usize {
    let n = (a.bytes().zip(b.bytes()))
        .take_while(|(x, y)| x == y)
        .count();
    (0..=n).rev().find(|&i| b.is_char_boundary(i)).unwrap_or(0)
}

/// Decodes a compact manifest (see the module docs). The result is not validated: the caller
/// checks it as it checks a JSON manifest ([`RemoteManifest::validate`]).
///
/// Errors: [`Error::Failed`] naming what is wrong: no [`MAGIC`], a zstd frame that does not
/// decode or decodes to more than 1 GiB, an encoding that does not parse, or an index (path
/// prefix, object, entry) out of range.
pub fn decode(bytes: &[u8]) -> Result<RemoteManifest> {
    from_wire(decode_wire(bytes)?)
}

/// The [`Wire`] of a manifest in either form (compact, or JSON as [`parse`] reads it). Not
/// validated, as [`decode`].
///
/// Errors: as [`parse`].
pub(crate) fn wire(bytes: &[u8]) -> Result<Wire> {
    if bytes.starts_with(MAGIC) {
        decode_wire(bytes)
    } else {
        to_wire(&parse(bytes)?)
    }
}

/// The compact form of the manifest `w` (as [`encode`] makes it).
///
/// Errors: [`Error::Failed`] if it cannot be serialized or compressed.
pub(crate) fn encode_wire(w: &Wire) -> Result<Vec<u8>> {
    let raw = postcard::to_stdvec(w).map_err(bad)?;
    let mut out = MAGIC.to_vec();
    out.extend(compress(&raw)?);
    Ok(out)
}

/// The layer's local manifest `w` carries, once its format is checked.
///
/// Errors: [`Error::Failed`] for a remote format other than
/// [`super::manifest::REMOTE_MANIFEST_FORMAT`] or a header that does not parse.
pub(crate) fn header(w: &Wire) -> Result<crate::store::Manifest> {
    check_header(COMPACT, w.remote_format, &w.layer)
}

/// The layer's local manifest `layer` (JSON) of a manifest (of form `form`, which errors
/// name) in `remote_format`. Errors: as [`header`].
fn check_header(form: &str, remote_format: u32, layer: &str) -> Result<crate::store::Manifest> {
    let want = super::manifest::REMOTE_MANIFEST_FORMAT;
    if remote_format != want {
        return Err(bad_in(
            form,
            format!("format {remote_format} is not supported (want {want})"),
        ));
    }
    serde_json::from_str(layer).map_err(|e| bad_in(form, format!("its layer header: {e}")))
}

/// The [`Wire`] of a compact manifest. Errors: as [`decode`].
fn decode_wire(bytes: &[u8]) -> Result<Wire> {
    postcard::from_bytes(&unzstd(bytes, MAGIC, COMPACT)?).map_err(bad)
}

/// `raw` as one zstd frame at [`LEVEL`] with its content checksum (a frame damaged in the
/// remote or on the way fails to decode instead of decoding to another manifest; frames
/// written without one, by older versions, still decode).
///
/// Errors: [`Error::Failed`] if zstd fails.
fn compress(raw: &[u8]) -> Result<Vec<u8>> {
    let mut c = zstd::bulk::Compressor::new(LEVEL).map_err(bad)?;
    c.include_checksum(true).map_err(bad)?;
    c.compress(raw).map_err(bad)
}

/// The zstd frame after `magic` in `bytes` (a manifest of form `form`, which errors name),
/// decoded.
///
/// Errors: [`Error::Failed`] for other first bytes, a frame that does not decode or decodes
/// to more than 1 GiB.
fn unzstd(bytes: &[u8], magic: &[u8; 8], form: &str) -> Result<Vec<u8>> {
    let bad = |what: String| bad_in(form, what);
    let body = bytes
        .strip_prefix(magic.as_slice())
        .ok_or_else(|| bad(format!("it does not start with the {form}'s magic bytes")))?;
    let mut raw = Vec::new();
    zstd::stream::read::Decoder::new(body)
        .map_err(|e| bad(e.to_string()))?
        .take(MAX_DECODED + 1)
        .read_to_end(&mut raw)
        .map_err(|e| bad(format!("zstd: {e}")))?;
    if raw.len() as u64 > MAX_DECODED {
        return Err(bad("it decodes to more than 1 GiB".into()));
    }
    Ok(raw)
}

/// The first bytes of a tree manifest (format 1): see [`TreeHead`].
pub const TREE_MAGIC: &[u8; 8] = b"LCTREE1\n";

/// What a lazy mount needs before its command starts, without the object ids and pack
/// table that make up ~90 % of a compact manifest: `manifests/<layer>.tree`, written by a
/// push beside the compact form ([`encode_tree`]). Layout: [`TREE_MAGIC`] (8 bytes), then one
/// zstd frame holding the postcard encoding of this struct. Its entries index the compact
/// form's object table, which the layer's daemon fetches after the mount; the compact form's
/// length and blake3 digest tie the two together.
#[derive(Deserialize)]
pub(crate) struct TreeHead {
    /// Encoded first, so [`tree_prefix`] reads it alone.
    pub prefix: TreePrefix,
    pub entries: Vec<WireEntry>,
    /// Link groups as entry indexes.
    pub links: Vec<Vec<u32>>,
}

/// The first fields of a [`TreeHead`]: what a run checks before it hands the tree to the
/// layer's daemon (decoding them costs nothing per entry).
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
pub(crate) struct TreePrefix {
    pub remote_format: u32,
    /// The layer's local manifest, as JSON.
    pub layer: String,
    /// Bytes of the compact form.
    pub compact_len: u64,
    /// The blake3 digest of the compact form.
    pub compact_digest: [u8; 32],
    /// Entries of the compact form's object table.
    pub objects: u32,
    /// Bytes of the distinct objects the entries name.
    pub object_bytes: u64,
}

/// [`TreeHead`] as written: borrows the compact form's entries.
#[derive(Serialize)]
struct TreeHeadRef<'a> {
    prefix: &'a TreePrefix,
    entries: &'a [WireEntry],
    links: &'a [Vec<u32>],
}

/// The tree manifest of `w`, whose compact form is `compact` (see [`TreeHead`]).
///
/// Errors: [`Error::Failed`] if it cannot be serialized or compressed.
pub(crate) fn encode_tree(w: &Wire, compact: &[u8]) -> Result<Vec<u8>> {
    let mut seen = vec![false; w.objects.len()];
    let mut object_bytes = 0u64;
    for e in &w.entries {
        if let WireKind::File { object, size } = e.kind
            && let Some(s) = seen.get_mut(object as usize)
            && !std::mem::replace(s, true)
        {
            object_bytes += size;
        }
    }
    let prefix = TreePrefix {
        remote_format: w.remote_format,
        layer: w.layer.clone(),
        compact_len: compact.len() as u64,
        compact_digest: *blake3::hash(compact).as_bytes(),
        objects: w.objects.len() as u32,
        object_bytes,
    };
    let head = TreeHeadRef {
        prefix: &prefix,
        entries: &w.entries,
        links: &w.links,
    };
    let raw = postcard::to_stdvec(&head).map_err(bad)?;
    let mut out = TREE_MAGIC.to_vec();
    out.extend(compress(&raw)?);
    Ok(out)
}

/// Decodes a tree manifest. Not validated: [`super::lazy`]'s tree checks its entries.
///
/// Errors: as [`decode`], for [`TREE_MAGIC`].
pub(crate) fn decode_tree(bytes: &[u8]) -> Result<TreeHead> {
    postcard::from_bytes(&unzstd(bytes, TREE_MAGIC, TREE)?).map_err(|e| bad_in(TREE, e))
}

/// The [`TreePrefix`] of a tree manifest and the layer's local manifest it carries (format
/// checked), without decoding its entries.
///
/// Errors: as [`decode_tree`]; as [`header`].
pub(crate) fn tree_prefix(bytes: &[u8]) -> Result<(TreePrefix, crate::store::Manifest)> {
    let raw = unzstd(bytes, TREE_MAGIC, TREE)?;
    let (prefix, _): (TreePrefix, _) =
        postcard::take_from_bytes(&raw).map_err(|e| bad_in(TREE, e))?;
    let header = check_header(TREE, prefix.remote_format, &prefix.layer)?;
    Ok((prefix, header))
}

/// The manifest `wire` encodes. Errors: as [`decode`].
fn from_wire(wire: Wire) -> Result<RemoteManifest> {
    let hexes: Vec<String> = (wire.objects.iter())
        .map(|b| ObjectId(*b).to_hex())
        .collect();
    let hex_of = |i: u32| -> Result<String> {
        (hexes.get(i as usize).cloned())
            .ok_or_else(|| bad(format!("object index {i} out of range")))
    };
    let mut entries: Vec<Entry> = Vec::with_capacity(wire.entries.len());
    for w in wire.entries {
        let prev = entries.last().map_or("", |e| e.path.as_str());
        let shared = (prev.get(..w.shared as usize))
            .ok_or_else(|| bad(format!("path prefix {} out of range", w.shared)))?;
        let kind = match w.kind {
            WireKind::Dir => Kind::Dir,
            WireKind::File { object, size } => Kind::File {
                object: hex_of(object)?,
                size,
            },
            WireKind::Symlink { target } => Kind::Symlink { target },
            WireKind::Fifo => Kind::Fifo,
        };
        entries.push(Entry {
            path: format!("{shared}{}", w.rest),
            kind,
            mode: w.mode,
            uid: w.uid,
            gid: w.gid,
            mtime: w.mtime,
            atime: w.atime,
            xattrs: w.xattrs,
        });
    }
    let packs = (wire.packs.into_iter())
        .map(|(name, list)| {
            let list = (list.into_iter())
                .map(|(o, off, len)| Ok((hex_of(o)?, off, len)))
                .collect::<Result<Vec<_>>>()?;
            Ok((name, list))
        })
        .collect::<Result<_>>()?;
    let links = (wire.links.into_iter())
        .map(|g| {
            (g.into_iter())
                .map(|i| {
                    (entries.get(i as usize).map(|e| e.path.clone()))
                        .ok_or_else(|| bad(format!("link entry {i} out of range")))
                })
                .collect::<Result<Vec<_>>>()
        })
        .collect::<Result<Vec<_>>>()?;
    Ok(RemoteManifest {
        remote_format: wire.remote_format,
        layer: serde_json::from_str(&wire.layer).map_err(bad)?,
        entries,
        packs,
        links,
    })
}

/// Reads a manifest in either form: compact when it starts with [`MAGIC`], else JSON.
///
/// Errors: [`Error::Failed`] when it does not decode or parse (as [`decode`], or serde_json's
/// message).
pub fn parse(bytes: &[u8]) -> Result<RemoteManifest> {
    if bytes.starts_with(MAGIC) {
        decode(bytes)
    } else {
        serde_json::from_slice(bytes).map_err(|e| Error::Failed(format!("manifest: {e}")))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::remote::manifest::tests::sample_manifest as base;

    /// The shared sample plus what it lacks: a fifo, non-ASCII names sharing a prefix, packs
    /// (one naming an object no entry has).
    fn sample_manifest() -> RemoteManifest {
        let mut m = base();
        let mut extra = m.entries[1].clone();
        for (path, kind) in [("fifo", Kind::Fifo), ("d/é", Kind::Dir), ("d/è", Kind::Dir)] {
            extra.path = path.into();
            extra.kind = kind;
            m.entries.push(extra.clone());
        }
        m.packs.insert(
            "p1".into(),
            vec![("aa".repeat(32), 0, 10), ("cc".repeat(32), 10, 5)],
        );
        m.packs.insert("p2".into(), vec![("bb".repeat(32), 0, 3)]);
        m
    }

    #[test]
    fn round_trip_is_exact() {
        let m = sample_manifest();
        let c = encode(&m).unwrap();
        assert!(c.starts_with(MAGIC));
        let back = decode(&c).unwrap();
        assert_eq!(back, m);
        assert_eq!(parse(&c).unwrap(), m);
        assert_eq!(parse(&serde_json::to_vec(&m).unwrap()).unwrap(), m);
    }

    #[test]
    fn smaller_than_json() {
        let m = sample_manifest();
        let json = serde_json::to_vec(&m).unwrap().len();
        let c = encode(&m).unwrap().len();
        assert!(c * 3 < json, "compact {c} bytes, json {json}");
    }

    #[test]
    fn damage_is_an_error_not_a_panic() {
        let m = sample_manifest();
        let c = encode(&m).unwrap();
        assert!(decode(&c[1..]).is_err());
        assert!(decode(&c[..c.len() / 2]).is_err());
        for i in MAGIC.len()..c.len() {
            let mut d = c.clone();
            d[i] ^= 0x5a;
            // the frame's checksum: an error, never a different manifest (nor a panic); a
            // flip zstd ignores (a header field, padding) decodes to the same one
            if let Ok(back) = decode(&d) {
                assert_eq!(back, m, "a flip at byte {i}");
            }
        }
    }

    /// The tree manifest holds the compact form's entries and links and names the compact
    /// form by length and digest; its prefix reads alone; damage is an error.
    #[test]
    fn the_tree_manifest_is_the_compact_form_without_its_object_table() {
        let m = sample_manifest();
        let w = to_wire(&m).unwrap();
        let compact = encode_wire(&w).unwrap();
        let t = encode_tree(&w, &compact).unwrap();
        assert!(t.starts_with(TREE_MAGIC));
        let head = decode_tree(&t).unwrap();
        assert_eq!(head.prefix.compact_len, compact.len() as u64);
        assert_eq!(
            &head.prefix.compact_digest,
            blake3::hash(&compact).as_bytes()
        );
        assert_eq!(head.prefix.objects as usize, w.objects.len());
        let distinct: std::collections::HashSet<_> = (m.entries.iter())
            .filter_map(|e| match &e.kind {
                Kind::File { object, size } => Some((object.clone(), *size)),
                _ => None,
            })
            .collect();
        assert_eq!(
            head.prefix.object_bytes,
            distinct.iter().map(|(_, s)| s).sum::<u64>()
        );
        assert_eq!(
            postcard::to_stdvec(&head.entries).unwrap(),
            postcard::to_stdvec(&w.entries).unwrap()
        );
        assert_eq!(head.links, w.links);
        let (prefix, header) = tree_prefix(&t).unwrap();
        assert_eq!(prefix, head.prefix);
        assert_eq!(header, m.layer);
        // The compact form is not a tree manifest, nor a cut one.
        assert!(decode_tree(&compact).is_err());
        assert!(decode_tree(&t[..t.len() / 2]).is_err());
        assert!(tree_prefix(&t[..t.len() / 2]).is_err());
        // Any flipped bit is an error (the frame's checksum), never another tree.
        // (A flip zstd ignores, in a header field or padding, decodes to the same tree.)
        let raw_entries = postcard::to_stdvec(&w.entries).unwrap();
        let same = |h: &TreeHead| postcard::to_stdvec(&h.entries).unwrap() == raw_entries;
        for i in TREE_MAGIC.len()..t.len() {
            let mut d = t.clone();
            d[i] ^= 0x10;
            if let Ok(h) = decode_tree(&d) {
                assert!(same(&h) && h.prefix == head.prefix, "a flip at byte {i}");
            }
        }
    }

    /// Errors about a tree manifest name the tree manifest (what the run's warning and the
    /// broken mark then say), errors about a compact one the compact one.
    #[test]
    fn errors_name_the_manifest_form_they_are_about() {
        let w = to_wire(&sample_manifest()).unwrap();
        let compact = encode_wire(&w).unwrap();
        let t = encode_tree(&w, &compact).unwrap();
        let no_magic = "tree manifest: it does not start with the tree manifest's magic bytes";
        let e = decode_tree(&compact).err().unwrap().to_string();
        assert_eq!(e, no_magic);
        let e = tree_prefix(&compact).err().unwrap().to_string();
        assert_eq!(e, no_magic);
        for cut in [
            decode_tree(&t[..t.len() / 2]).err(),
            tree_prefix(&t[..12]).err(),
        ] {
            let e = cut.unwrap().to_string();
            assert!(e.starts_with("tree manifest: "), "{e}");
        }
        let e = decode(&t).unwrap_err().to_string();
        assert_eq!(
            e,
            "compact manifest: it does not start with the compact manifest's magic bytes"
        );
    }

    #[test]
    fn unicode_paths_share_prefixes_on_char_boundaries() {
        assert_eq!(common_prefix("a/é", "a/è"), 2);
        assert_eq!(common_prefix("abc", "abd"), 2);
        assert_eq!(common_prefix("", "x"), 0);
    }
}
