//! The overlay engine: name resolution across layers, attributes, and every filesystem
//! operation as a method returning `Result<_, Errno>`; `fuse.rs`-style glue lives in
//! `handlers.rs`.

use std::ffi::{CString, OsStr};
use std::fs::File;
use std::io;
use std::num::NonZeroUsize;
use std::os::unix::fs::FileExt;
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use fuser::{Errno, FileAttr, FileType};
use parking_lot::{Mutex, RwLock};

use super::OverlayConfig;
use super::dir::Listings;
use super::errno::to_errno;
use super::inode::{IdKey, Kind, Loc, Located, Nodes, ORPHANS, Place, top_lower};
use super::layers::{Layer, Roots};
use super::whiteout;
use crate::error::{Error, Result};
use crate::sys::child;

/// How long the kernel may cache entries and attributes. Long: the lower layers are immutable
/// and every change to the upper goes through this daemon.
pub const TTL: Duration = Duration::from_secs(3600);
const NAME_MAX: usize = 255;

/// Result type of the engine's operations: an errno for the kernel on failure.
pub type OpResult<T> = std::result::Result<T, Errno>;

/// What a name resolves to across the layers.
#[derive(Clone, Debug)]
pub struct Resolved {
    /// The node id (= st_ino).
    pub id: u64,
    /// File type.
    pub kind: Kind,
    /// Present in the upper dir.
    pub upper: bool,
    /// Lower layers holding it (see [`Node::lowers`](super::inode::Node::lowers)).
    pub lowers: u64,
    /// `stat` of the layer that provides data and metadata (upper if present, else top lower).
    pub st: libc::stat,
}

/// The overlay filesystem state shared by all worker threads.
pub struct OverlayFs {
    pub(super) roots: Roots,
    pub(super) nodes: Nodes,
    pub(super) listings: Listings,
    /// Serialises namespace changes that move existing paths (rename, unlink, rmdir) against
    /// path-based operations. Taken once per operation at its top; never nested.
    pub(super) ns: RwLock<()>,
    /// Serialises copy-ups (so two writers do not copy the same file twice).
    pub(super) copy_lock: Mutex<()>,
    fds: Mutex<lru::LruCache<u64, CachedFd>>,
    /// Nodes whose upper inode has a link at `<workdir>/orphans/<id>`.
    pub(super) orphans: Mutex<std::collections::HashSet<u64>>,
    /// Removed directories the kernel still holds (an open fd, a process's cwd): their
    /// attributes at removal with nlink 0, which GETATTR answers and SETATTR changes, as a
    /// disk filesystem (and kernel overlayfs) keeps serving fstat/fchmod of a removed
    /// directory. Dropped when the kernel forgets the node.
    pub(super) gone_dirs: Mutex<std::collections::HashMap<u64, FileAttr>>,
    tmp_seq: std::sync::atomic::AtomicU64,
}

#[derive(Clone)]
struct CachedFd {
    file: Arc<File>,
    writable: bool,
}

pub(super) fn errno(e: io::Error) -> Errno {
    to_errno(&e)
}

fn ts(sec: i64, nsec: i64) -> SystemTime {
    if sec >= 0 {
        UNIX_EPOCH + Duration::new(sec as u64, nsec as u32)
    } else {
        UNIX_EPOCH - Duration::new((-sec) as u64, 0) + Duration::from_nanos(nsec as u64)
    }
}

/// Reads up to `buf.len()` bytes at `offset` of `f` into `buf`; returns how many (fewer at end
/// of file).
///
/// Errors: the `pread` errno.
pub(super) fn read_into(f: &File, offset: u64, buf: &mut [u8]) -> OpResult<usize> {
    loop {
        // A short pread of a regular file means end of file: no second call to learn it.
        match f.read_at(buf, offset) {
            Ok(n) => return Ok(n),
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(errno(e)),
        }
    }
}

/// The layer a located node's data is in (its [`Located::path`] is relative to that layer's
/// root). Errors: `ENOENT` for a lower-only node with no lower layer.
pub(super) fn layer_of(l: &Located) -> OpResult<Layer> {
    Ok(match l.place {
        Place::Attached if l.upper => Layer::Upper,
        Place::Attached | Place::OrphanLower => {
            top_lower(l.lowers).map(Layer::Lower).ok_or(Errno::ENOENT)?
        }
        Place::OrphanUpper => Layer::Work,
    })
}

/// Converts a `stat` to the FUSE attribute with `ino` as the node id.
pub fn attr_from_stat(ino: u64, st: &libc::stat, nlink: u32) -> FileAttr {
    let kind = match st.st_mode & libc::S_IFMT {
        libc::S_IFDIR => FileType::Directory,
        libc::S_IFLNK => FileType::Symlink,
        libc::S_IFCHR => FileType::CharDevice,
        libc::S_IFBLK => FileType::BlockDevice,
        libc::S_IFIFO => FileType::NamedPipe,
        libc::S_IFSOCK => FileType::Socket,
        _ => FileType::RegularFile,
    };
    FileAttr {
        ino: fuser::INodeNo(ino),
        size: st.st_size as u64,
        blocks: st.st_blocks as u64,
        atime: ts(st.st_atime, st.st_atime_nsec),
        mtime: ts(st.st_mtime, st.st_mtime_nsec),
        ctime: ts(st.st_ctime, st.st_ctime_nsec),
        crtime: UNIX_EPOCH,
        kind,
        perm: (st.st_mode & 0o7777) as u16,
        nlink,
        uid: st.st_uid,
        gid: st.st_gid,
        rdev: st.st_rdev as u32,
        blksize: st.st_blksize as u32,
        flags: 0,
    }
}

impl OverlayFs {
    /// Opens the layers of `cfg` and prepares the workdir (orphans of an earlier run are removed).
    ///
    /// Errors: [`Error::Invalid`] naming a directory that cannot be opened.
    pub fn new(cfg: &OverlayConfig) -> Result<OverlayFs> {
        let roots = Roots::new(&cfg.lowerdirs, &cfg.upperdir, &cfg.workdir)
            .map_err(|e| Error::invalid(format!("cannot open layer directories: {e}")))?;
        let orphans = cfg.workdir.join(ORPHANS);
        let _ = std::fs::remove_dir_all(&orphans);
        std::fs::create_dir_all(&orphans).map_err(|e| Error::io(&orphans, e))?;
        // Unlinked files' data lives here: private to root, like the workdir overlayfs uses.
        std::fs::set_permissions(
            &orphans,
            std::os::unix::fs::PermissionsExt::from_mode(0o700),
        )
        .map_err(|e| Error::io(&orphans, e))?;
        let lowers = if cfg.lowerdirs.is_empty() {
            0
        } else {
            (1u64 << cfg.lowerdirs.len()) - 1
        };
        let cap = NonZeroUsize::new(4096).expect("nonzero");
        Ok(OverlayFs {
            roots,
            nodes: Nodes::new(lowers),
            listings: Listings::default(),
            ns: RwLock::new(()),
            copy_lock: Mutex::new(()),
            fds: Mutex::new(lru::LruCache::new(cap)),
            orphans: Mutex::default(),
            gone_dirs: Default::default(),
            tmp_seq: Default::default(),
        })
    }

    /// A fresh name for a staging entry in the workdir.
    pub(super) fn tmp_name(&self) -> CString {
        let n = self
            .tmp_seq
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        CString::new(format!("tmp-{}-{n}", std::process::id())).expect("no NUL")
    }

    /// Relative path of an attached node. Errors: `ENOENT` for detached nodes.
    pub(super) fn path_of(&self, id: u64) -> OpResult<CString> {
        self.nodes.path(id).ok_or(Errno::ENOENT)
    }

    /// Where node `id` currently keeps its data: the layer its [`Located::path`] is in, and
    /// its state. Errors: `ENOENT` for a node that is gone.
    pub(super) fn backing(&self, id: u64) -> OpResult<(Layer, Located)> {
        let l = self.nodes.locate(id).ok_or(Errno::ENOENT)?;
        Ok((layer_of(&l)?, l))
    }

    /// Directory node `id` as one read of the node table finds it: the layers it is merged
    /// from, its path and its parent. The caller holds `ns`, so the snapshot stays true for
    /// the rest of its operation.
    ///
    /// Errors: `ENOTDIR` for another kind of node, `ENOENT` for one that is absent, removed or
    /// detached.
    pub(super) fn dir(&self, id: u64) -> OpResult<Located> {
        match self.nodes.locate(id) {
            Some(l) if l.kind != Kind::Dir => Err(Errno::ENOTDIR),
            Some(l) if l.place == Place::Attached => Ok(l),
            Some(_) => Err(Errno::ENOENT),
            // Removed, or below a detached node: the kind still decides first.
            None if self.nodes.peek(id, |n| n.kind != Kind::Dir) == Some(true) => {
                Err(Errno::ENOTDIR)
            }
            None => Err(Errno::ENOENT),
        }
    }

    /// Resolves `name` in directory node `parent` (as [`Self::dir`] found it: `pdir`) across
    /// the layers. `Ok(None)` when the name does not exist in the merged view (absent or
    /// whited out).
    pub(super) fn resolve(
        &self,
        parent: u64,
        pdir: &Located,
        name: &OsStr,
    ) -> OpResult<Option<Resolved>> {
        if name.len() > NAME_MAX {
            return Err(Errno::ENAMETOOLONG);
        }
        let crel = child(&pdir.path, name).map_err(errno)?;
        let mut upper_st: Option<libc::stat> = None;
        if pdir.upper
            && let Some(st) = self.roots.stat_opt(Layer::Upper, &crel).map_err(errno)?
        {
            if whiteout::is_whiteout_stat(&st) {
                return Ok(None);
            }
            let kind = Kind::from_mode(st.st_mode);
            // A non-directory, or a directory with nothing below it to merge (no lower dirs
            // under the parent, or opaque), hides every lower entry of that name.
            let upper_only = kind != Kind::Dir
                || pdir.lowers == 0
                || whiteout::dir_is_opaque_at(self.roots.fd(Layer::Upper), &crel).map_err(errno)?;
            if upper_only {
                let id = self.nodes.keyed(IdKey::Upper(st.st_ino));
                return Ok(Some(Resolved {
                    id,
                    kind,
                    upper: true,
                    lowers: 0,
                    st,
                }));
            }
            upper_st = Some(st);
        }
        let mut lowers = 0u64;
        let mut first: Option<(u8, libc::stat)> = None;
        let mut mask = pdir.lowers;
        while mask != 0 {
            let l = mask.trailing_zeros() as u8;
            mask &= mask - 1;
            let Some(st) = self.roots.stat_opt(Layer::Lower(l), &crel).map_err(errno)? else {
                continue;
            };
            if whiteout::is_whiteout_stat(&st) {
                break;
            }
            let kind = Kind::from_mode(st.st_mode);
            if kind != Kind::Dir {
                if upper_st.is_none() && first.is_none() {
                    first = Some((l, st));
                    lowers = 1 << l;
                }
                break;
            }
            if first
                .as_ref()
                .is_some_and(|(_, f)| Kind::from_mode(f.st_mode) != Kind::Dir)
            {
                break;
            }
            lowers |= 1 << l;
            if first.is_none() {
                first = Some((l, st));
            }
            if mask != 0
                && whiteout::dir_is_opaque_at(self.roots.fd(Layer::Lower(l)), &crel)
                    .map_err(errno)?
            {
                break;
            }
        }
        match (upper_st, first) {
            (Some(st), Some((l, lst))) => {
                // A merged directory: identity from the top lower dir.
                let id = self.nodes.lower_id(l, lst.st_ino);
                Ok(Some(Resolved {
                    id,
                    kind: Kind::Dir,
                    upper: true,
                    lowers,
                    st,
                }))
            }
            (Some(st), None) => {
                let id = self.nodes.keyed(IdKey::Upper(st.st_ino));
                Ok(Some(Resolved {
                    id,
                    kind: Kind::Dir,
                    upper: true,
                    lowers: 0,
                    st,
                }))
            }
            (None, Some((l, st))) => {
                let kind = Kind::from_mode(st.st_mode);
                let id = if kind == Kind::Dir || st.st_nlink <= 1 {
                    self.nodes.lower_id(l, st.st_ino)
                } else {
                    self.nodes
                        .keyed(IdKey::LowerPath(parent, name.to_os_string()))
                };
                Ok(Some(Resolved {
                    id,
                    kind,
                    upper: false,
                    lowers,
                    st,
                }))
            }
            (None, None) => Ok(None),
        }
    }

    /// Resolves a child of `parent`; returns the parent as [`Self::dir`] found it too.
    pub(super) fn resolve_in(
        &self,
        parent: u64,
        name: &OsStr,
    ) -> OpResult<(Located, Option<Resolved>)> {
        let pdir = self.dir(parent)?;
        let r = self.resolve(parent, &pdir, name)?;
        Ok((pdir, r))
    }

    /// The attribute the kernel sees for a resolved entry.
    pub(super) fn attr_of(&self, r: &Resolved) -> FileAttr {
        // A merged directory, or a store-deduplicated lower file (each path is its own file).
        let merged_dir = r.kind == Kind::Dir && r.lowers != 0;
        let dedup_lower = !r.upper && r.kind != Kind::Dir && r.st.st_nlink > 1;
        let nlink = if merged_dir || dedup_lower {
            1
        } else {
            r.st.st_nlink as u32
        };
        let mut attr = attr_from_stat(r.id, &r.st, nlink);
        // The orphan link in the workdir (kept for open fds) is not a name the user can see.
        if r.upper && self.orphans.lock().contains(&r.id) {
            attr.nlink = attr.nlink.saturating_sub(1);
        }
        attr
    }

    /// Looks `name` up in `parent` and records the kernel reference (lookup, create, readdirplus).
    pub(super) fn lookup_and_remember(
        &self,
        parent: u64,
        name: &OsStr,
    ) -> OpResult<Option<FileAttr>> {
        let (_, r) = self.resolve_in(parent, name)?;
        Ok(r.map(|r| self.remember(parent, name, &r)))
    }

    /// Records a kernel reference to the resolved entry `name` of `parent` and returns the
    /// attributes to send with it.
    pub(super) fn remember(&self, parent: u64, name: &OsStr, r: &Resolved) -> FileAttr {
        self.nodes
            .remember(r.id, parent, name, r.kind, r.upper, r.lowers);
        self.attr_of(r)
    }

    /// Current attributes of node `id` (for a removed directory still held by the kernel, the
    /// ones kept in [`Self::gone_dirs`]).
    ///
    /// Errors: `ENOENT` for a node that is not (or no longer) known, or the `fstatat` errno.
    pub(super) fn getattr_node(&self, id: u64) -> OpResult<FileAttr> {
        match self.backing(id) {
            Ok((layer, l)) => self.attr_at(id, layer, &l),
            Err(e) => self.gone_dir_attr(id).ok_or(e),
        }
    }

    /// The kept attributes of `id` when it is a removed directory the kernel still holds.
    pub(super) fn gone_dir_attr(&self, id: u64) -> Option<FileAttr> {
        if self.nodes.peek(id, |n| n.loc == Loc::Gone) != Some(true) {
            return None;
        }
        self.gone_dirs.lock().get(&id).copied()
    }

    /// The attributes of node `id`, whose data is in `layer` as [`Self::backing`] found.
    ///
    /// Errors: the `fstatat` errno.
    pub(super) fn attr_at(&self, id: u64, layer: Layer, l: &Located) -> OpResult<FileAttr> {
        let st = self.roots.stat(layer, &l.path).map_err(errno)?;
        let r = Resolved {
            id,
            kind: l.kind,
            upper: l.upper || layer == Layer::Work,
            lowers: l.lowers,
            st,
        };
        let mut attr = self.attr_of(&r);
        // An unlinked lower-only file has no name left.
        if l.place == Place::OrphanLower {
            attr.nlink = 0;
        }
        Ok(attr)
    }

    /// A cached fd for node `id`'s data, writable if asked (the caller copied it up first).
    pub(super) fn data_fd(&self, id: u64, writable: bool) -> OpResult<Arc<File>> {
        if let Some(fd) = self.fds.lock().get(&id)
            && (fd.writable || !writable)
        {
            return Ok(fd.file.clone());
        }
        let (layer, l) = self.backing(id)?;
        if writable && matches!(layer, Layer::Lower(_)) {
            return Err(Errno::EIO);
        }
        let flags = if writable {
            libc::O_RDWR
        } else {
            libc::O_RDONLY
        };
        let file = Arc::new(self.roots.open(layer, &l.path, flags, 0).map_err(errno)?);
        self.fds.lock().put(
            id,
            CachedFd {
                file: file.clone(),
                writable,
            },
        );
        Ok(file)
    }

    /// Drops the cached fd of `id` (after copy-up, so the next access opens the upper copy).
    pub(super) fn drop_fd(&self, id: u64) {
        self.fds.lock().pop(&id);
    }

    /// The file READs of node `id` are served from (upper copy or lower file).
    pub(super) fn read_fd(&self, id: u64) -> OpResult<Arc<File>> {
        let _g = self.ns.read();
        self.data_fd(id, false)
    }

    /// Writes `data` at `offset`, copying the file up first. Returns bytes written.
    pub fn write(&self, id: u64, offset: u64, data: &[u8]) -> OpResult<u32> {
        let f = {
            let _g = self.ns.read();
            self.copy_up(id, None)?;
            self.data_fd(id, true)?
        };
        f.write_all_at(data, offset).map_err(errno)?;
        Ok(data.len() as u32)
    }
}
