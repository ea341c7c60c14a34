//! Materialising a pulled layer's objects and tree links as the bytes arrive: worker threads
//! take each downloaded object off a bounded channel, verify its blake3 and length, write it
//! straight into its fan-out directory under a temporary name (metadata set through the open
//! file: `fchown`, `fsetxattr`, `fchmod`, `futimens`), rename it into place within that
//! directory (no cross-directory rename) and hardlink every tree entry that uses it. Nothing is
//! fsynced per file: the publish's one `syncfs` makes the whole layer durable
//! ([`crate::store::Store::publish_built`]).

use std::collections::{HashMap, HashSet};
use std::fs;
use std::io::Write;
use std::os::fd::AsFd;
use std::os::unix::fs::MetadataExt;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};

use bytes::Bytes;
use parking_lot::Mutex;

use super::error::RemoteError;
use super::manifest::{Entry, Kind, RemoteManifest};
use crate::error::{Error, IoContext, Result};
use crate::ids::ObjectId;
use crate::overlay::whiteout::is_private_xattr;
use crate::store::{ObjectStore as LocalObjects, SharedMeta, meta_tag};
use crate::sys;

/// Objects waiting in the channel between the downloads and the writers (bounds memory to
/// about this many small objects beyond the packs in flight).
pub(super) const CHANNEL: usize = 1024;

/// A downloaded object, handed to the writers.
pub(super) enum Arrived {
    /// A packed object's bytes (not yet verified).
    Bytes(ObjectId, Bytes),
    /// A large object streamed into this temporary file (verified while streaming).
    File(ObjectId, PathBuf),
}

/// Temporary names of one pull: `.pull-<random>-<n>` next to the object they become.
pub(super) struct Temps {
    prefix: String,
    next: AtomicU64,
    tracked: Mutex<Vec<PathBuf>>,
}

impl Temps {
    pub(super) fn new() -> Temps {
        Temps {
            prefix: sys::random_hex(6),
            next: AtomicU64::new(0),
            tracked: Mutex::new(Vec::new()),
        }
    }

    /// A fresh name in the directory of `dst`.
    fn beside(&self, dst: &Path) -> PathBuf {
        let n = self.next.fetch_add(1, Ordering::Relaxed);
        dst.with_file_name(format!(".pull-{}-{n}", self.prefix))
    }

    /// [`Temps::beside`], removed when the pull ends if it is still there (a download).
    pub(super) fn tracked(&self, dst: &Path) -> PathBuf {
        let p = self.beside(dst);
        self.tracked.lock().push(p.clone());
        p
    }
}

impl Drop for Temps {
    fn drop(&mut self) {
        for p in self.tracked.lock().drain(..) {
            let _ = fs::remove_file(p);
        }
    }
}

/// One (content, metadata tag) object a layer needs and the entries that link it.
struct Variant<'m> {
    tag: u64,
    /// The first entry with this metadata (what the object's inode gets).
    meta: &'m Entry,
    links: Vec<&'m Entry>,
    /// The object when the project holds it already.
    have: Option<PathBuf>,
}

/// What a pull must do: per content id, its variants; which content is downloaded and which
/// is held locally.
pub(super) struct Plan<'m> {
    variants: HashMap<ObjectId, Vec<Variant<'m>>>,
    /// Bytes of each content id.
    pub sizes: HashMap<ObjectId, u64>,
    /// Content to download, sorted.
    pub missing: Vec<(ObjectId, u64)>,
    /// Content held locally: a file with its bytes (`None` when every variant exists), and
    /// whether that file is the pull's to move into place (a lazy fetch's, verified).
    local: Vec<(ObjectId, Option<PathBuf>, bool)>,
}

impl<'m> Plan<'m> {
    /// Plans the objects of `m` against what `objects` holds, and what `held` holds (the
    /// `held/` directory of a lazily mounted layer: verified bytes named by their hex id; a
    /// file there with one link is moved into place, one linked elsewhere too is copied).
    ///
    /// Errors: [`Error::Io`] listing the objects; [`Error::Failed`] for a malformed entry.
    pub(super) fn new(
        objects: &LocalObjects,
        m: &'m RemoteManifest,
        held: Option<&Path>,
    ) -> Result<Plan<'m>> {
        let mut exact: HashMap<(ObjectId, u64), PathBuf> = HashMap::new();
        let mut by_content: HashMap<ObjectId, PathBuf> = HashMap::new();
        for (path, id, _) in objects.list()? {
            if let Some(tag) = object_tag(&path) {
                exact.entry((id, tag)).or_insert_with(|| path.clone());
            }
            by_content.entry(id).or_insert(path);
        }
        let mut variants: HashMap<ObjectId, Vec<Variant<'m>>> = HashMap::new();
        let mut sizes = HashMap::new();
        for e in &m.entries {
            let Some((id, size)) = e.object()? else {
                continue;
            };
            sizes.insert(id, size);
            let tag = e.meta_tag()?;
            let vs = variants.entry(id).or_default();
            match vs.iter_mut().find(|v| v.tag == tag) {
                Some(v) => v.links.push(e),
                None => vs.push(Variant {
                    tag,
                    meta: e,
                    links: vec![e],
                    have: exact.get(&(id, tag)).cloned(),
                }),
            }
        }
        let mut missing = Vec::new();
        let mut local = Vec::new();
        let in_held = |id: &ObjectId| {
            let p = held?.join(id.to_string());
            let n = fs::symlink_metadata(&p).ok()?.nlink();
            Some((p, n == 1))
        };
        for (id, vs) in &variants {
            if vs.iter().all(|v| v.have.is_some()) {
                local.push((*id, None, false));
            } else if let Some(p) = by_content.get(id) {
                local.push((*id, Some(p.clone()), false));
            } else if let Some((p, only)) = in_held(id) {
                local.push((*id, Some(p), only));
            } else {
                missing.push((*id, sizes[id]));
            }
        }
        missing.sort();
        Ok(Plan {
            variants,
            sizes,
            missing,
            local,
        })
    }

    /// The fan-out directories objects will be created in.
    fn fans(&self, objects: &LocalObjects) -> HashSet<PathBuf> {
        self.variants
            .iter()
            .filter(|(_, vs)| vs.iter().any(|v| v.have.is_none()))
            .filter_map(|(id, _)| objects.path_for(id, 0).parent().map(Path::to_path_buf))
            .collect()
    }
}

/// Where the bytes of the objects of one content id come from.
enum Src<'a> {
    /// Downloaded bytes, verified.
    Bytes(&'a [u8]),
    /// A verified download in a temporary file (moved into place as the first object).
    Temp(&'a Path),
    /// A local object with the same bytes (copied).
    Local(&'a Path),
    /// Every object exists: only links are made.
    Linked,
}

/// The objects and links of one pull being made, shared by the writer threads.
pub(super) struct Unpack<'a> {
    objects: &'a LocalObjects,
    tree: &'a Path,
    plan: &'a Plan<'a>,
    temps: &'a Temps,
    url: &'a str,
    /// Objects created (path, bytes): undone if the pull fails.
    pub made: Mutex<Vec<(PathBuf, u64)>>,
    /// Objects made from local bytes rather than downloaded ones.
    pub copied: AtomicU64,
}

impl<'a> Unpack<'a> {
    /// Creates the fan-out directories the plan needs (the tree's directories are the
    /// caller's).
    ///
    /// Errors: [`Error::Io`] naming the directory.
    pub(super) fn new(
        objects: &'a LocalObjects,
        tree: &'a Path,
        plan: &'a Plan<'a>,
        temps: &'a Temps,
        url: &'a str,
    ) -> Result<Unpack<'a>> {
        for d in plan.fans(objects) {
            fs::create_dir_all(&d).at(&d)?;
        }
        Ok(Unpack {
            objects,
            tree,
            plan,
            temps,
            url,
            made: Mutex::new(Vec::new()),
            copied: AtomicU64::new(0),
        })
    }

    /// Runs `prepare` (creating the tree's directories) on a thread of its own while the
    /// downloads start, then `threads` writers over the locally held content and over what
    /// `download` sends (it gets the channel's sender and returns when every download is done
    /// or one failed). A writer's or `prepare`'s error closes the channel, which ends the
    /// downloads.
    ///
    /// Errors: the first writer or `prepare` error, else the download's.
    pub(super) fn run(
        &self,
        threads: usize,
        prepare: impl FnOnce() -> Result<()> + Send,
        download: impl FnOnce(tokio::sync::mpsc::Sender<Arrived>) -> Result<()>,
    ) -> Result<()> {
        let threads = threads.max(1);
        let ready = std::sync::Barrier::new(threads + 1);
        let (tx, rx) = tokio::sync::mpsc::channel(CHANNEL);
        let rx = Mutex::new(rx);
        let next = AtomicUsize::new(0);
        let failed: Mutex<Option<Error>> = Mutex::new(None);
        let fail = |e: Error| {
            failed.lock().get_or_insert(e);
            rx.lock().close();
        };
        let downloaded = std::thread::scope(|s| {
            s.spawn(|| {
                if let Err(e) = prepare() {
                    fail(e);
                }
                ready.wait();
            });
            for _ in 0..threads {
                s.spawn(|| {
                    ready.wait(); // the tree's directories exist
                    while failed.lock().is_none() {
                        let i = next.fetch_add(1, Ordering::Relaxed);
                        let Some((id, from, moved)) = self.plan.local.get(i) else {
                            break;
                        };
                        let src = match (from.as_deref(), moved) {
                            (None, _) => Src::Linked,
                            (Some(p), true) => Src::Temp(p),
                            (Some(p), false) => Src::Local(p),
                        };
                        if let Err(e) = self.place(id, src) {
                            fail(e);
                        }
                    }
                    loop {
                        let Some(got) = rx.lock().blocking_recv() else {
                            break;
                        };
                        if failed.lock().is_some() {
                            continue; // drain: the downloads stop at their next send
                        }
                        if let Err(e) = self.arrived(got) {
                            fail(e);
                        }
                    }
                });
            }
            download(tx)
        });
        match failed.into_inner() {
            Some(e) => Err(e),
            None => downloaded,
        }
    }

    fn arrived(&self, got: Arrived) -> Result<()> {
        match got {
            Arrived::Bytes(id, bytes) => {
                let size = self.plan.sizes.get(&id).copied().unwrap_or(u64::MAX);
                if bytes.len() as u64 != size || blake3::hash(&bytes).as_bytes() != &id.0 {
                    return Err(RemoteError::Corrupt {
                        url: self.url.to_string(),
                        what: format!("object {id} in a pack"),
                        detail: format!("{} bytes received of {size}", bytes.len()),
                    }
                    .into());
                }
                self.place(&id, Src::Bytes(&bytes))
            }
            Arrived::File(id, tmp) => self.place(&id, Src::Temp(&tmp)),
        }
    }

    /// Makes every missing object of content `id` from `src` and links every tree entry that
    /// uses one of its objects.
    fn place(&self, id: &ObjectId, src: Src<'_>) -> Result<()> {
        let vs = self
            .plan
            .variants
            .get(id)
            .ok_or_else(|| Error::Failed(format!("object {id}: not in the pulled manifest")))?;
        let mut first: Option<PathBuf> = None;
        for v in vs {
            let obj = match &v.have {
                Some(p) => p.clone(),
                None => {
                    let dst = self.objects.path_for(id, v.tag);
                    let copy = |from: &Path| -> Result<bool> {
                        let tmp = self.temps.beside(&dst);
                        fs::copy(from, &tmp).at(&tmp)?;
                        make_object(&tmp, &dst, v)
                    };
                    let made = match (&src, &first) {
                        (Src::Bytes(b), _) => write_object(&self.temps.beside(&dst), &dst, v, b)?,
                        (Src::Temp(t), None) => make_object(t, &dst, v)?,
                        (Src::Temp(_), Some(f)) => copy(f)?,
                        (Src::Local(p), _) => copy(p)?,
                        (Src::Linked, _) => {
                            return Err(Error::Failed(format!("object {id}: no bytes")));
                        }
                    };
                    if made {
                        self.made.lock().push((dst.clone(), self.plan.sizes[id]));
                    }
                    if first.is_some() || matches!(src, Src::Local(_)) {
                        self.copied.fetch_add(1, Ordering::Relaxed);
                    }
                    first.get_or_insert_with(|| dst.clone());
                    dst
                }
            };
            for e in &v.links {
                self.objects.link_object(&obj, &self.tree.join(&e.path))?;
            }
        }
        Ok(())
    }
}

/// The error a download returns when the writers closed the channel (one of them failed; its
/// error is the one reported).
pub(super) fn writers_stopped() -> Error {
    Error::Failed("pull stopped: writing the pulled objects failed".into())
}

/// Writes `bytes` to the new file `tmp`, gives it `v`'s metadata through the open file,
/// checks the metadata tag and renames it to `dst` (same directory). `Ok(false)` when `dst`
/// existed already (another pull or promotion made it; `tmp` is removed).
///
/// Errors: [`Error::Io`] naming the path; [`Error::Failed`] when the metadata cannot be
/// reproduced (e.g. another owner when not root).
fn write_object(tmp: &Path, dst: &Path, v: &Variant<'_>, bytes: &[u8]) -> Result<bool> {
    let f = fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(tmp)
        .at(tmp)?;
    let r = (|| {
        (&f).write_all(bytes).at(tmp)?;
        set_meta_fd(&f, v.meta).at(tmp)?;
        check_tag_fd(&f, v, tmp)?;
        drop(f);
        rename_into(tmp, dst)
    })();
    if r.is_err() {
        let _ = fs::remove_file(tmp);
    }
    r
}

/// Owner, xattrs, permission bits and times of `e`, set through `f` (owner first: chown
/// clears setuid bits; times last).
fn set_meta_fd(f: &fs::File, e: &Entry) -> std::io::Result<()> {
    std::os::unix::fs::fchown(f, Some(e.uid), Some(e.gid))?;
    let xattrs = e
        .xattr_bytes()
        .map_err(|e| std::io::Error::other(e.to_string()))?;
    for (n, v) in xattrs {
        let name = <std::ffi::OsStr as std::os::unix::ffi::OsStrExt>::from_bytes(&n);
        rustix::fs::fsetxattr(f.as_fd(), name, &v, rustix::fs::XattrFlags::empty())?;
    }
    rustix::fs::fchmod(f.as_fd(), rustix::fs::Mode::from_raw_mode(e.mode & 0o7777))?;
    let ts = |(s, ns): (i64, i64)| rustix::fs::Timespec {
        tv_sec: s,
        tv_nsec: ns as _,
    };
    rustix::fs::futimens(
        f.as_fd(),
        &rustix::fs::Timestamps {
            last_access: ts(e.atime),
            last_modification: ts(e.mtime),
        },
    )?;
    Ok(())
}

/// Checks that `f` now carries the metadata tag `v.tag` (owner, mode, mtime and the names of
/// its content xattrs, read back through the file).
fn check_tag_fd(f: &fs::File, v: &Variant<'_>, tmp: &Path) -> Result<()> {
    let st = rustix::fs::fstat(f.as_fd())
        .map_err(std::io::Error::from)
        .at(tmp)?;
    let mut buf = vec![0u8; 4096];
    let n = rustix::fs::flistxattr(f.as_fd(), &mut buf[..])
        .map_err(std::io::Error::from)
        .at(tmp)?;
    let mut names: Vec<&[u8]> = buf[..n]
        .split(|b| *b == 0)
        .filter(|s| !s.is_empty() && !is_private_xattr(s))
        .collect();
    names.sort();
    let xattrs = v.meta.xattr_bytes()?;
    let want: Vec<&[u8]> = xattrs.iter().map(|(n, _)| n.as_slice()).collect();
    let shared = SharedMeta {
        mode: st.st_mode,
        uid: st.st_uid,
        gid: st.st_gid,
        mtime: (st.st_mtime, st.st_mtime_nsec as i64),
    };
    if names != want || shared.tag(&xattrs) != v.tag {
        return Err(unreproducible(tmp, v.meta));
    }
    Ok(())
}

fn unreproducible(tmp: &Path, e: &Entry) -> Error {
    Error::Failed(format!(
        "{}: metadata of {:?} could not be reproduced (owner {}:{} mode {:o}; run as root?)",
        tmp.display(),
        e.path,
        e.uid,
        e.gid,
        e.mode
    ))
}

/// Gives the file `tmp` the metadata of `v`, checks it now has `v.tag`, and renames it to
/// `dst` (same directory). `Ok(false)` when `dst` existed already (`tmp` is removed).
///
/// Errors: as [`write_object`].
fn make_object(tmp: &Path, dst: &Path, v: &Variant<'_>) -> Result<bool> {
    let r = (|| {
        apply_meta(tmp, v.meta)?;
        let got = meta_tag(tmp, &fs::symlink_metadata(tmp).at(tmp)?).at(tmp)?;
        if got != v.tag {
            return Err(unreproducible(tmp, v.meta));
        }
        rename_into(tmp, dst)
    })();
    if r.is_err() {
        let _ = fs::remove_file(tmp);
    }
    r
}

/// `rename(tmp, dst)` unless `dst` exists: `Ok(false)` then, and `tmp` is removed.
fn rename_into(tmp: &Path, dst: &Path) -> Result<bool> {
    match sys::rename_noreplace(tmp, dst) {
        Ok(()) => Ok(true),
        Err(e) if e.raw_os_error() == Some(libc::EEXIST) => {
            let _ = fs::remove_file(tmp);
            Ok(false)
        }
        Err(e) => Err(Error::io(dst, e)),
    }
}

/// The tag part of an object file name (`<hex>-<tag>[.<n>]`).
fn object_tag(p: &Path) -> Option<u64> {
    let name = p.file_name()?.to_str()?;
    let tag = name.get(65..81)?;
    u64::from_str_radix(tag, 16).ok()
}

/// Sets owner, xattrs, permission bits and times of `p` from `e` (not following a symlink;
/// permission bits and xattrs are skipped for symlinks). Owner first: chown clears setuid bits.
///
/// Errors: [`Error::Io`] naming `p` (EPERM for another owner when not root).
pub(super) fn apply_meta(p: &Path, e: &Entry) -> Result<()> {
    std::os::unix::fs::lchown(p, Some(e.uid), Some(e.gid)).at(p)?;
    if !matches!(e.kind, Kind::Symlink { .. }) {
        for (n, v) in e.xattr_bytes()? {
            sys::set_xattr(p, &n, &v).at(p)?;
        }
        use std::os::unix::fs::PermissionsExt;
        fs::set_permissions(p, fs::Permissions::from_mode(e.mode & 0o7777)).at(p)?;
    }
    sys::set_times_nofollow(p, e.atime, e.mtime).at(p)
}
