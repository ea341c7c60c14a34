//! Content-addressed file objects of one project: `objects/<aa>/<blake3-hex>-<meta>`.
//!
//! An object is an immutable regular file. Layer trees hardlink to objects, so a file shared
//! between layer versions is stored once. Because hardlinks share an inode — and with it the
//! mode, owner, timestamps and xattrs — the object name carries, after the blake3 hash of the
//! content (the [`ObjectId`]), a 16-hex-digit tag of that shared metadata: two files with equal
//! bytes but different modes are two objects. (Content addressing follows composefs/ostree;
//! the store-it-once protocol is composefs-rs's: link into place, `EEXIST` means "already
//! stored" and is success.)
//!
//! Filesystems cap the hardlink count of an inode (ext4: 65,000). When linking to an object
//! fails with `EMLINK`, a spill copy `…-<meta>.<n>` is created (same content and metadata) and
//! linked instead.
//!
//! An object whose link count is 1 is referenced by no layer and no staging tree: gc removes it.

use std::collections::HashMap;
use std::fs::{self, File};
use std::io::{self, Read};
use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

use crate::error::{IoContext, Result};
use crate::ids::ObjectId;
use crate::overlay::whiteout::is_private_xattr;
use crate::sys;

/// Highest spill copy index tried before giving up with `EMLINK`.
const MAX_SPILLS: u32 = 100_000;

/// Read buffer for hashing (bytes).
const HASH_BUF: usize = 256 * 1024;

/// The objects directory of one project.
#[derive(Clone, Debug)]
pub struct ObjectStore {
    dir: PathBuf,
}

/// Where a stored file now lives, and whether this call added it.
#[derive(Clone, Debug)]
pub struct Stored {
    /// The object path (`objects/<aa>/<name>`, possibly a spill copy).
    pub path: PathBuf,
    /// True when the object did not exist before (its bytes are new to the store).
    pub new: bool,
}

/// Hashes the bytes of the regular file at `path` with blake3 (the file is opened with
/// `O_NOFOLLOW`, so a symlink is never followed).
///
/// Errors: the open/read errno (`ELOOP` for a symlink).
pub fn hash_file(path: &Path) -> io::Result<ObjectId> {
    let mut f = fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_NOATIME)
        .open(path)
        .or_else(|e| {
            // O_NOATIME needs ownership; retry without it.
            if e.raw_os_error() == Some(libc::EPERM) {
                fs::OpenOptions::new()
                    .read(true)
                    .custom_flags(libc::O_NOFOLLOW)
                    .open(path)
            } else {
                Err(e)
            }
        })?;
    hash_reader(&mut f)
}

/// Hashes `paths` (regular files) on up to `threads` threads (blake3 of the bytes, as
/// [`hash_file`]). Files that cannot be read are left out; the caller hashes them itself and
/// reports the error with its path.
pub fn hash_files(paths: Vec<PathBuf>, threads: usize) -> HashMap<PathBuf, ObjectId> {
    let threads = threads.clamp(1, 8);
    let next = std::sync::atomic::AtomicUsize::new(0);
    let paths = &paths;
    std::thread::scope(|s| {
        let workers: Vec<_> = (0..threads)
            .map(|_| {
                s.spawn(|| {
                    let mut out = Vec::new();
                    loop {
                        let i = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                        let Some(p) = paths.get(i) else { break };
                        if let Ok(id) = hash_file(p) {
                            out.push((p.clone(), id));
                        }
                    }
                    out
                })
            })
            .collect();
        workers
            .into_iter()
            .flat_map(|w| w.join().unwrap_or_default())
            .collect()
    })
}

fn hash_reader(f: &mut File) -> io::Result<ObjectId> {
    let mut hasher = blake3::Hasher::new();
    let mut buf = vec![0u8; HASH_BUF];
    loop {
        let n = match f.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e),
        };
        hasher.update(&buf[..n]);
    }
    Ok(ObjectId(*hasher.finalize().as_bytes()))
}

/// The xattrs of `path` that belong to its content (overlay-private ones excluded), sorted.
///
/// Errors: the `llistxattr`/`lgetxattr` errno.
pub fn content_xattrs(path: &Path) -> io::Result<Vec<(Vec<u8>, Vec<u8>)>> {
    let mut out = Vec::new();
    for name in sys::list_xattrs(path)? {
        if is_private_xattr(&name) {
            continue;
        }
        match sys::get_xattr(path, &name) {
            Ok(v) => out.push((name, v)),
            Err(e) if e.raw_os_error() == Some(libc::ENODATA) => {}
            Err(e) => return Err(e),
        }
    }
    out.sort();
    Ok(out)
}

/// Removes overlay-private xattrs (`trusted.overlay.*`, `user.overlay.*`) from `path`.
///
/// Errors: the `l*xattr` errno.
pub fn strip_private_xattrs(path: &Path) -> io::Result<()> {
    for name in sys::list_xattrs(path)? {
        if is_private_xattr(&name) {
            match sys::remove_xattr(path, &name) {
                Ok(()) => {}
                Err(e) if e.raw_os_error() == Some(libc::ENODATA) => {}
                Err(e) => return Err(e),
            }
        }
    }
    Ok(())
}

/// The 64-bit tag of the metadata hardlinks share: permission bits, owner, mtime (ns) and
/// content xattrs. Part of an object's name.
///
/// Errors: reading xattrs.
pub fn meta_tag(path: &Path, meta: &fs::Metadata) -> io::Result<u64> {
    let shared = SharedMeta {
        mode: meta.mode(),
        uid: meta.uid(),
        gid: meta.gid(),
        mtime: (meta.mtime(), meta.mtime_nsec()),
    };
    Ok(shared.tag(&content_xattrs(path)?))
}

/// The metadata hardlinks of an object share (what [`meta_tag`] hashes besides the xattrs).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SharedMeta {
    /// `st_mode` (file type and permission bits).
    pub mode: u32,
    /// Owner uid.
    pub uid: u32,
    /// Owner gid.
    pub gid: u32,
    /// mtime: seconds and nanoseconds since the epoch.
    pub mtime: (i64, i64),
}

impl SharedMeta {
    /// The 64-bit tag of this metadata plus `xattrs` (content xattrs, sorted as
    /// [`content_xattrs`] returns them): the `<meta>` part of an object's name, equal to
    /// [`meta_tag`] of a file that has them. Lets the remote tier name an object before the
    /// file exists.
    pub fn tag(&self, xattrs: &[(Vec<u8>, Vec<u8>)]) -> u64 {
        let mut h = blake3::Hasher::new();
        h.update(&self.mode.to_le_bytes());
        h.update(&self.uid.to_le_bytes());
        h.update(&self.gid.to_le_bytes());
        h.update(&self.mtime.0.to_le_bytes());
        h.update(&self.mtime.1.to_le_bytes());
        for (n, v) in xattrs {
            h.update(&(n.len() as u64).to_le_bytes());
            h.update(n);
            h.update(&(v.len() as u64).to_le_bytes());
            h.update(v);
        }
        tag_of(h)
    }
}

fn tag_of(h: blake3::Hasher) -> u64 {
    let b = h.finalize();
    let mut tag = [0u8; 8];
    tag.copy_from_slice(&b.as_bytes()[..8]);
    u64::from_le_bytes(tag)
}

/// Parses an object file name `<64 hex>-<16 hex>[.<n>]` into its content id.
/// Returns `None` for anything else (temporary files, foreign files).
pub fn parse_name(name: &str) -> Option<ObjectId> {
    let (hex, rest) = name.split_at_checked(64)?;
    let rest = rest.strip_prefix('-')?;
    let tag = rest.split('.').next()?;
    if tag.len() != 16 || !tag.bytes().all(|b| b.is_ascii_hexdigit()) {
        return None;
    }
    ObjectId::from_hex(hex).ok()
}

impl ObjectStore {
    /// The object store rooted at `dir` (`projects/<p>/objects`); nothing is created.
    pub fn new(dir: impl Into<PathBuf>) -> Self {
        ObjectStore { dir: dir.into() }
    }

    /// The objects directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The path an object with content `id` and metadata `tag` has.
    pub fn path_for(&self, id: &ObjectId, tag: u64) -> PathBuf {
        let hex = id.to_hex();
        self.dir.join(&hex[..2]).join(format!("{hex}-{tag:016x}"))
    }

    /// Stores the regular file at `src` as an object **without copying its bytes**: `src` is
    /// hashed and hardlinked into `objects/` (so `src` and the object become the same inode).
    /// Overlay-private xattrs are removed from `src` first. When an equal object (same content
    /// and metadata) exists already, nothing is added and that object is returned.
    ///
    /// Errors: [`crate::Error::Io`] naming `src` or the object path (e.g. `ENOSPC` creating the
    /// fan-out directory).
    pub fn store_by_link(&self, src: &Path) -> Result<Stored> {
        self.store_by_link_hashed(src, None)
    }

    /// [`ObjectStore::store_by_link`] with the content hash already computed (`Some`), e.g. by
    /// [`hash_files`] on several threads.
    ///
    /// Errors: as [`ObjectStore::store_by_link`].
    pub fn store_by_link_hashed(&self, src: &Path, hash: Option<ObjectId>) -> Result<Stored> {
        strip_private_xattrs(src).at(src)?;
        let meta = fs::symlink_metadata(src).at(src)?;
        let id = match hash {
            Some(id) => id,
            None => hash_file(src).at(src)?,
        };
        let tag = meta_tag(src, &meta).at(src)?;
        let obj = self.path_for(&id, tag);
        // Ok(true): linked as a new object; Ok(false): an equal object exists already.
        let link = || match fs::hard_link(src, &obj) {
            Ok(()) => Ok(true),
            Err(e) if e.raw_os_error() == Some(libc::EEXIST) => Ok(false),
            Err(e) => Err(e),
        };
        let new = match link() {
            Err(e) if e.raw_os_error() == Some(libc::ENOENT) => {
                let parent = obj.parent().unwrap_or(&self.dir);
                fs::create_dir_all(parent).at(parent)?;
                link()
            }
            // The source inode itself is at its link limit: it is an object already (a lower
            // tree file); find or make a spill copy to hand out instead.
            Err(e) if e.raw_os_error() == Some(libc::EMLINK) => Ok(false),
            r => r,
        }
        .at(&obj)?;
        Ok(Stored { path: obj, new })
    }

    /// Hardlinks `object` at `dst`. When the object is at the filesystem's link limit
    /// (`EMLINK`), links a spill copy `<object>.<n>` instead, creating it (a copy of the bytes,
    /// mode, owner, times and xattrs) if needed. Returns the path actually linked.
    ///
    /// Errors: [`crate::Error::Io`] naming `dst` or the spill copy.
    pub fn link_object(&self, object: &Path, dst: &Path) -> Result<PathBuf> {
        match fs::hard_link(object, dst) {
            Ok(()) => return Ok(object.to_path_buf()),
            Err(e) if e.raw_os_error() == Some(libc::EMLINK) => {}
            Err(e) => return Err(crate::Error::io(dst, e)),
        }
        let base = object.as_os_str().to_string_lossy().into_owned();
        for n in 1..=MAX_SPILLS {
            let spill = PathBuf::from(format!("{base}.{n}"));
            match fs::hard_link(&spill, dst) {
                Ok(()) => return Ok(spill),
                Err(e) if e.raw_os_error() == Some(libc::EMLINK) => continue,
                Err(e) if e.raw_os_error() == Some(libc::ENOENT) => {
                    self.make_spill(object, &spill)?;
                    match fs::hard_link(&spill, dst) {
                        Ok(()) => return Ok(spill),
                        Err(e) if e.raw_os_error() == Some(libc::EMLINK) => continue,
                        Err(e) => return Err(crate::Error::io(dst, e)),
                    }
                }
                Err(e) => return Err(crate::Error::io(dst, e)),
            }
        }
        Err(crate::Error::io(
            dst,
            io::Error::from_raw_os_error(libc::EMLINK),
        ))
    }

    /// Copies `object` (bytes via `fs::copy`, which uses `copy_file_range`/reflink where the
    /// filesystem can, plus metadata) to a temporary file and links it as `spill`
    /// (`EEXIST` = another process made it: fine).
    fn make_spill(&self, object: &Path, spill: &Path) -> Result<()> {
        let tmp = self.dir.join(format!(".spill-{}", sys::random_hex(8)));
        let result = (|| -> Result<()> {
            fs::copy(object, &tmp).at(&tmp)?;
            copy_metadata(object, &tmp)?;
            match fs::hard_link(&tmp, spill) {
                Ok(()) => Ok(()),
                Err(e) if e.raw_os_error() == Some(libc::EEXIST) => Ok(()),
                Err(e) => Err(crate::Error::io(spill, e)),
            }
        })();
        let _ = fs::remove_file(&tmp);
        result
    }

    /// Every object file: `(path, content id, metadata)`. Temporary files are skipped.
    ///
    /// Errors: [`crate::Error::Io`] reading the directories.
    pub fn list(&self) -> Result<Vec<(PathBuf, ObjectId, fs::Metadata)>> {
        self.scan(&mut Vec::new())
    }

    /// [`ObjectStore::list`], also collecting into `strays` the temporary files a remote pull
    /// cut short by a crash left in the fan-out directories (`.pull-*`, see
    /// `crate::remote::unpack`).
    fn scan(&self, strays: &mut Vec<PathBuf>) -> Result<Vec<(PathBuf, ObjectId, fs::Metadata)>> {
        let mut out = Vec::new();
        let top = match fs::read_dir(&self.dir) {
            Ok(r) => r,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(out),
            Err(e) => return Err(crate::Error::io(&self.dir, e)),
        };
        for fan in top {
            let fan = fan.at(&self.dir)?;
            if !fan.file_type().at(fan.path())?.is_dir() {
                continue;
            }
            for ent in fs::read_dir(fan.path()).at(fan.path())? {
                let ent = ent.at(fan.path())?;
                let name = ent.file_name();
                let Some(id) = name.to_str().and_then(parse_name) else {
                    if name.as_encoded_bytes().starts_with(b".pull-") {
                        strays.push(ent.path());
                    }
                    continue;
                };
                let meta = ent.metadata().at(ent.path())?;
                out.push((ent.path(), id, meta));
            }
        }
        Ok(out)
    }

    /// Removes objects no layer or staging tree links to (link count 1) and stray temporary
    /// spill and pull files. Returns `(objects removed, bytes freed)`. With `dry_run`, only counts.
    /// The caller must hold the project lock exclusively (no promotion may be linking).
    ///
    /// Errors: [`crate::Error::Io`] for anything but a file that vanished meanwhile.
    pub fn sweep_unreferenced(&self, dry_run: bool) -> Result<(u64, u64)> {
        let (mut count, mut bytes) = (0, 0);
        let mut strays = Vec::new();
        for (path, _, meta) in self.scan(&mut strays)? {
            if meta.nlink() <= 1 {
                count += 1;
                bytes += meta.len();
                if !dry_run {
                    match fs::remove_file(&path) {
                        Ok(()) => {}
                        Err(e) if e.kind() == io::ErrorKind::NotFound => {}
                        Err(e) => return Err(crate::Error::io(&path, e)),
                    }
                }
            }
        }
        if !dry_run {
            for p in strays {
                let _ = fs::remove_file(p);
            }
        }
        if !dry_run && let Ok(rd) = fs::read_dir(&self.dir) {
            for ent in rd.flatten() {
                let name = ent.file_name();
                let name = name.to_string_lossy();
                // .pull-: downloads of pulls cut short by a crash (earlier versions put them
                // here; now they sit beside their object, collected by `scan`).
                if name.starts_with(".spill-") || name.starts_with(".pull-") {
                    let _ = fs::remove_file(ent.path());
                }
            }
        }
        Ok((count, bytes))
    }
}

/// Copies permission bits, owner, atime/mtime (ns) and content xattrs from `src` to `dst`
/// (neither followed if a symlink; permission bits are skipped for symlinks).
///
/// Errors: [`crate::Error::Io`] naming `dst`.
pub fn copy_metadata(src: &Path, dst: &Path) -> Result<()> {
    copy_metadata_owned(src, dst, None)
}

/// [`copy_metadata`], with `owner` `(uid, gid)` instead of `src`'s when given (promotion's
/// canonical owner, [`super::promote::canonical_owner`]).
///
/// Errors: [`crate::Error::Io`] naming `dst` (`EPERM` when the owner cannot be set).
pub fn copy_metadata_owned(src: &Path, dst: &Path, owner: Option<(u32, u32)>) -> Result<()> {
    let meta = fs::symlink_metadata(src).at(src)?;
    let (uid, gid) = owner.unwrap_or((meta.uid(), meta.gid()));
    std::os::unix::fs::lchown(dst, Some(uid), Some(gid)).at(dst)?;
    if !meta.file_type().is_symlink() {
        for (n, v) in content_xattrs(src).at(src)? {
            sys::set_xattr(dst, &n, &v).at(dst)?;
        }
        fs::set_permissions(
            dst,
            std::os::unix::fs::PermissionsExt::from_mode(meta.mode()),
        )
        .at(dst)?;
    }
    sys::set_times_nofollow(
        dst,
        (meta.atime(), meta.atime_nsec()),
        (meta.mtime(), meta.mtime_nsec()),
    )
    .at(dst)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    fn setup() -> (tempfile::TempDir, ObjectStore) {
        let t = tempfile::tempdir().unwrap();
        let s = ObjectStore::new(t.path().join("objects"));
        fs::create_dir(s.dir()).unwrap();
        (t, s)
    }

    #[test]
    fn equal_files_are_stored_once_and_names_parse() {
        let (t, s) = setup();
        let a = t.path().join("a");
        let b = t.path().join("b");
        fs::write(&a, b"same bytes").unwrap();
        fs::write(&b, b"same bytes").unwrap();
        let mtime = fs::metadata(&a).unwrap().modified().unwrap();
        File::options()
            .write(true)
            .open(&b)
            .unwrap()
            .set_modified(mtime)
            .unwrap();
        let sa = s.store_by_link(&a).unwrap();
        let sb = s.store_by_link(&b).unwrap();
        assert!(sa.new && !sb.new);
        assert_eq!(sa.path, sb.path);
        let name = sa.path.file_name().unwrap().to_str().unwrap();
        assert_eq!(
            parse_name(name).unwrap(),
            ObjectId(*blake3::hash(b"same bytes").as_bytes())
        );
        assert_eq!(fs::metadata(&sa.path).unwrap().nlink(), 2);
    }

    #[test]
    fn different_modes_are_different_objects() {
        let (t, s) = setup();
        let a = t.path().join("a");
        let b = t.path().join("b");
        fs::write(&a, b"x").unwrap();
        fs::write(&b, b"x").unwrap();
        fs::set_permissions(&b, fs::Permissions::from_mode(0o755)).unwrap();
        assert_ne!(
            s.store_by_link(&a).unwrap().path,
            s.store_by_link(&b).unwrap().path
        );
    }

    #[test]
    fn sweep_removes_only_unreferenced() {
        let (t, s) = setup();
        let a = t.path().join("a");
        let b = t.path().join("b");
        fs::write(&a, b"keep").unwrap();
        fs::write(&b, b"drop").unwrap();
        s.store_by_link(&a).unwrap();
        let sb = s.store_by_link(&b).unwrap();
        fs::remove_file(&b).unwrap();
        // A crashed pull's temporary file in a fan-out directory goes too.
        let stray = sb.path.with_file_name(".pull-0a1b2c-7");
        fs::write(&stray, b"half").unwrap();
        assert_eq!(s.sweep_unreferenced(true).unwrap(), (1, 4));
        assert!(sb.path.exists() && stray.exists());
        assert_eq!(s.sweep_unreferenced(false).unwrap(), (1, 4));
        assert!(!sb.path.exists() && !stray.exists());
        assert_eq!(s.list().unwrap().len(), 1);
    }

    /// Real hardlink limit: on ext4 an inode takes 65,000 links; the 65,000th link must spill.
    #[test]
    fn emlink_starts_a_new_copy() {
        let (t, s) = setup();
        let a = t.path().join("a");
        fs::write(&a, b"popular empty-ish file").unwrap();
        let obj = s.store_by_link(&a).unwrap().path;
        let links = t.path().join("links");
        fs::create_dir(&links).unwrap();
        let mut spilled = None;
        for i in 0..70_000u32 {
            let got = s.link_object(&obj, &links.join(i.to_string())).unwrap();
            if got != obj {
                spilled = Some((i, got));
                break;
            }
        }
        let Some((i, spill)) = spilled else {
            eprintln!("filesystem allows > 70,000 links; EMLINK path not exercised");
            return;
        };
        assert!(i > 1000, "spilled after only {i} links");
        assert_eq!(fs::read(&spill).unwrap(), b"popular empty-ish file");
        let (m0, m1) = (fs::metadata(&obj).unwrap(), fs::metadata(&spill).unwrap());
        assert_eq!(
            (m0.mode(), m0.uid(), m0.mtime(), m0.mtime_nsec()),
            (m1.mode(), m1.uid(), m1.mtime(), m1.mtime_nsec())
        );
        assert!(
            parse_name(spill.file_name().unwrap().to_str().unwrap()).is_some(),
            "spill copies are objects too"
        );
        // The next link goes to the spill copy without another copy.
        let next = s.link_object(&obj, &links.join("after")).unwrap();
        assert_eq!(next, spill);
    }
}
