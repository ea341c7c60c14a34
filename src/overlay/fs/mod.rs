//! The overlay engine: name resolution across layers, attributes, and every filesystem
//! operation as a method returning `Result<_, Errno>`; `fuse.rs`-style glue lives in
//! `handlers.rs`.

mod attrs;
mod copy_up;
mod data_ops;
mod fhandle;
mod handlers;
mod ops;

use std::ffi::{CString, OsStr};
use std::fs::File;
use std::io;
use std::num::NonZeroUsize;
use std::os::unix::fs::FileExt;
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use fuser::{Errno, FileAttr, FileType};
use parking_lot::{Mutex, RwLock};

use crate::error::{Error, Result};
use crate::overlay::OverlayConfig;
use crate::overlay::dir::{Listing, Listings};
use crate::overlay::errno::to_errno;
use crate::overlay::fdcache::{CopyLocks, FdCache};
use crate::overlay::inode::{Backing, Loc, Nodes, ORPHANS, ROOT};
use crate::overlay::links::{LinkGroups, Links};
use crate::overlay::passthrough::Passthrough;
use crate::overlay::policy::MountPolicy;
use crate::overlay::removed::Removed;
use crate::overlay::stack::{DirFds, Entry, Kind, Stack, Tree, top_lower};
use crate::sys::child;

/// How long the kernel may cache entries and attributes. Long: the lower layers are immutable
/// and every change to the upper goes through this daemon.
pub const TTL: Duration = Duration::from_secs(3600);
const NAME_MAX: usize = 255;

/// Result type of the engine's operations: an errno for the kernel on failure.
pub type OpResult<T> = std::result::Result<T, Errno>;

/// What a name resolves to: the layer stack's [`Entry`] and the node id it has.
#[derive(Clone, Debug)]
pub struct Resolved {
    /// The node id (= st_ino).
    pub id: u64,
    /// What the layers hold at the name.
    pub entry: Entry,
    /// The inode number and link count the name shows ([`OverlayFs::shown`]).
    pub shown: (u64, u32),
}

impl std::ops::Deref for Resolved {
    type Target = Entry;
    fn deref(&self) -> &Entry {
        &self.entry
    }
}

/// The overlay filesystem state shared by all worker threads.
pub struct OverlayFs {
    pub(super) stack: Stack,
    pub(super) nodes: Nodes,
    pub(super) listings: Listings,
    /// Serialises namespace changes that move existing paths (rename, unlink, rmdir) against
    /// path-based operations. Taken once per operation at its top; never nested.
    pub(super) ns: RwLock<()>,
    /// Per-node copy-up locks (two writers never copy the same file twice; unrelated files
    /// copy in parallel).
    pub(super) copy_locks: CopyLocks,
    /// Serialises the short publish step of copy-ups (rename into the upper dir and restoring
    /// the parent's timestamps).
    pub(super) publish_lock: Mutex<()>,
    /// The fd cache: each node's open data file (`data.rs`).
    pub(super) fds: FdCache,
    /// What the kernel still holds of removed names: orphans and removed directories
    /// (`removed.rs`).
    pub(super) removed: Removed,
    tmp_seq: std::sync::atomic::AtomicU64,
    /// FUSE passthrough state (see `passthrough.rs`).
    pub(super) pt: Passthrough,
    /// The mount's fixed choices: read-only, strictatime, ownership mapping, how lowers
    /// show hard links (`policy.rs`).
    pub(super) policy: MountPolicy,
    /// The private views the layers are read through, kept open for the life of the mount:
    /// noatime views of the lowers in passthrough mode ([`Stack::lowers_noatime`]) and the
    /// view of the upper dir and workdir with the mount's atime rule
    /// ([`Stack::upper_atime`]).
    _lower_views: Vec<std::os::fd::OwnedFd>,
    /// The session's notifier, set once the session exists (`daemon.rs`): how the engine tells
    /// the kernel that attributes it caches changed where no reply carries them (FUSE_IOCTL).
    pub(super) notifier: Arc<std::sync::OnceLock<fuser::Notifier>>,
    /// The node index this mount keeps in its workdir so file handles survive a remount
    /// (`node_index.rs`); `None` for mounts that keep none.
    pub(super) journal: Option<crate::overlay::node_index::Journal>,
}

/// The inode number shown for link group `group` of store layer `layer` (see `links.rs`):
/// top byte 0x7f, which no node id has (lower ids use 0x01..=0x40, path ids set the top bit,
/// counter ids stay below 2^56).
fn group_ino(layer: u8, group: u32) -> u64 {
    (0x7f << 56) | ((layer as u64) << 48) | group as u64
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

/// What a multiply-linked file at `path` of store layer `layer` (link groups `g`), node `id`,
/// shows: its group's inode and size, or its node id and one link when it is in no group.
fn shown_recorded(id: u64, layer: u8, g: &LinkGroups, path: &std::ffi::CStr) -> (u64, u32) {
    match g.group(path) {
        Some((group, size)) => (group_ino(layer, group), size),
        None => (id, 1),
    }
}

/// Whether a mount configured with `configured` ([`OverlayConfig::passthrough`]) uses FUSE
/// passthrough (see `passthrough.rs`): `LAYERCACHE_PASSTHROUGH=1`/`0` overrides the
/// configuration, and only root in the initial user namespace gets it (registering a backing
/// file needs CAP_SYS_ADMIN there; fs/fuse/backing.c) — anyone else keeps no-open mode,
/// silently.
fn passthrough_wanted(configured: bool) -> bool {
    let wanted = match std::env::var("LAYERCACHE_PASSTHROUGH").as_deref() {
        Ok("1") | Ok("on") | Ok("yes") => true,
        Ok("0") | Ok("off") | Ok("no") => false,
        _ => configured,
    };
    wanted && root_in_initial_namespace()
}

/// Whether this process is root in the initial user namespace (its uid map is the identity of
/// every id, as only the initial namespace's is).
fn root_in_initial_namespace() -> bool {
    let identity = std::fs::read_to_string("/proc/self/uid_map").is_ok_and(|m| {
        let f: Vec<&str> = m.split_whitespace().collect();
        f == ["0", "0", "4294967295"]
    });
    identity && rustix::process::geteuid().is_root()
}

/// The error for layer directories the stack could not open (`e`): one line naming the first
/// of `dirs` (option name, path; in the order the stack opens them) that `open(2)` refuses
/// now, with its errno and what would do; `e` alone when none does (a race).
fn layer_dir_error(dirs: &[(&str, &std::path::Path)], e: io::Error) -> Error {
    use std::os::unix::fs::OpenOptionsExt;
    let refused = dirs.iter().find_map(|(opt, dir)| {
        std::fs::OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_DIRECTORY)
            .open(dir)
            .err()
            .map(|err| (opt, dir, err))
    });
    match refused {
        Some((opt, dir, err)) => Error::invalid(format!(
            "{opt} {}: cannot open it: {err}; a layer directory must be a directory this user \
             can read and search",
            dir.display()
        )),
        None => Error::invalid(format!("cannot open layer directories: {e}")),
    }
}

impl OverlayFs {
    /// Opens the layers of `cfg` and prepares the workdir (orphans of an earlier run are removed).
    /// A read-only mount opens no workdir and writes nothing; without an upper (lowerdir-only)
    /// the root is the top lower's directory.
    ///
    /// Errors: [`Error::Invalid`] naming a directory that cannot be opened.
    pub fn new(cfg: &OverlayConfig) -> Result<OverlayFs> {
        if cfg.read_only {
            let lowers: Vec<&std::path::Path> = cfg.lowerdirs.iter().map(|p| p.as_path()).collect();
            let upper = cfg.has_upper().then_some(cfg.upperdir.as_path());
            let stack = Stack::open_merge(upper, &lowers).map_err(|e| {
                let mut dirs: Vec<(&str, &std::path::Path)> =
                    upper.map(|u| ("upperdir", u)).into_iter().collect();
                dirs.extend(lowers.iter().map(|l| ("lowerdir", *l)));
                layer_dir_error(&dirs, e)
            })?;
            let fs = OverlayFs::with_stack(cfg, stack)?;
            if !cfg.has_upper() {
                fs.nodes
                    .update(crate::overlay::inode::ROOT, |n| n.upper = false);
            }
            return Ok(fs);
        }
        let stack = Stack::new(&cfg.lowerdirs, &cfg.upperdir, &cfg.workdir).map_err(|e| {
            let mut dirs = vec![
                ("workdir", cfg.workdir.as_path()),
                ("upperdir", cfg.upperdir.as_path()),
            ];
            dirs.extend(cfg.lowerdirs.iter().map(|l| ("lowerdir", l.as_path())));
            layer_dir_error(&dirs, e)
        })?;
        let orphans = cfg.workdir.join(ORPHANS);
        let _ = std::fs::remove_dir_all(&orphans);
        std::fs::create_dir_all(&orphans).map_err(|e| Error::io(&orphans, e))?;
        // Unlinked files' data lives here: private to root, like the workdir overlayfs uses.
        std::fs::set_permissions(
            &orphans,
            std::os::unix::fs::PermissionsExt::from_mode(0o700),
        )
        .map_err(|e| Error::io(&orphans, e))?;
        let mut fs = OverlayFs::with_stack(cfg, stack)?;
        if cfg.persist_handles {
            fs.load_handles();
        }
        Ok(fs)
    }

    /// The engine over the opened `stack` of `cfg`.
    ///
    /// Errors: [`Error::Invalid`] when a lower's link groups cannot be read.
    fn with_stack(cfg: &OverlayConfig, mut stack: Stack) -> Result<OverlayFs> {
        let passthrough = passthrough_wanted(cfg.passthrough);
        // Passthrough backing files are opened with the reader's flags: only a noatime view
        // keeps reads from writing the lower inodes' atimes (no-open mode opens O_NOATIME).
        let views = if passthrough {
            stack.lowers_noatime().unwrap_or_else(|e| {
                tracing::debug!("no noatime view of the lowers: {e}");
                Vec::new()
            })
        } else {
            Vec::new()
        };
        let mut views = views;
        // Reads of upper files follow the mount's atime rule (a read-only mount updates none),
        // not the rule of the mount the upper dir sits on.
        let rule = if cfg.read_only {
            crate::sys::AtimeRule::NEVER
        } else {
            crate::sys::AtimeRule::from_ms_flags(cfg.mount_flags)
        };
        if stack.has_upper() {
            let work = (!cfg.read_only).then_some(cfg.workdir.as_path());
            match stack.upper_atime(&cfg.upperdir, work, rule) {
                Ok(v) => views.push(v),
                Err(e) => {
                    tracing::debug!("no view of the upper dir with the mount's atime rule: {e}")
                }
            }
        }
        let lowers = stack.root_lowers();
        let links = (0..cfg.lowerdirs.len())
            .map(|i| Links::load(cfg.lower_links.get(i).unwrap_or(&Default::default())))
            .collect::<io::Result<Vec<_>>>()
            .map_err(|e| Error::invalid(format!("cannot read the link groups of a lower: {e}")))?;
        let cap = NonZeroUsize::new(4096).expect("nonzero");
        Ok(OverlayFs {
            stack,
            nodes: Nodes::new(lowers),
            listings: Listings::default(),
            ns: RwLock::new(()),
            copy_locks: CopyLocks::default(),
            publish_lock: Mutex::new(()),
            fds: FdCache::new(cap),
            removed: Removed::default(),
            tmp_seq: Default::default(),
            pt: Passthrough::new(passthrough),
            _lower_views: views,
            policy: MountPolicy::new(
                cfg.squash,
                cfg.read_only,
                rule.mode == crate::sys::AtimeMode::Strict,
                links,
            ),
            journal: None,
            notifier: Default::default(),
        })
    }

    /// The attributes of node `id` and the birth time (`statx` `STATX_BTIME`) of its data
    /// file, for a STATX: where its data is is looked up once for both. The birth time is the
    /// upper copy's once there is one, as kernel overlayfs shows the real inode's, and `None`
    /// where its filesystem keeps none or the node has no file any more (a removed directory
    /// held open). Caller holds `ns`.
    ///
    /// Errors: as [`Self::getattr_node`].
    pub(super) fn statx_node(&self, id: u64) -> OpResult<(FileAttr, Option<SystemTime>)> {
        match self.backing(id) {
            Ok(l) => Ok((self.attr_at(id, &l)?, self.birth_time(&l))),
            Err(e) => self.gone_dir_attr(id).map(|a| (a, None)).ok_or(e),
        }
    }

    /// The birth time of the data file at `l`, `None` where its filesystem keeps none.
    fn birth_time(&self, l: &Backing) -> Option<SystemTime> {
        let stx = self.stack.statx(l.tree, &l.path, libc::STATX_BTIME).ok()?;
        (stx.stx_mask & libc::STATX_BTIME != 0)
            .then(|| ts(stx.stx_btime.tv_sec, stx.stx_btime.tv_nsec as i64))
    }

    /// Where the daemon puts the session's notifier once the session is made (the engine is
    /// moved into the session first).
    pub fn notifier_slot(&self) -> Arc<std::sync::OnceLock<fuser::Notifier>> {
        self.notifier.clone()
    }

    /// Makes the kernel drop the attributes it caches of node `id` (FUSE_NOTIFY_INVAL_INODE
    /// with a negative offset: attributes and ACLs only, no page cache), so the next stat asks
    /// the daemon. Sent from the handler before its reply: with no page range the kernel's
    /// `fuse_reverse_inval_inode` takes no inode lock and waits for no page, so the request in
    /// flight cannot deadlock it (unlike INVAL_ENTRY or a page range, see
    /// /work/shared/notes/warmstart.md), and the caller's next stat sees the change. Written
    /// to /dev/fuse, also when requests come over io_uring (6.18 takes no notification
    /// there). Best effort: without a session (unit tests), or when the kernel no longer has
    /// the inode (ENOENT), there is nothing cached to drop.
    pub(super) fn invalidate_attrs(&self, id: u64) {
        let Some(n) = self.notifier.get() else {
            return;
        };
        match n.inval_inode(fuser::INodeNo(id), -1, 0) {
            Ok(()) => {}
            Err(e) if e.raw_os_error() == Some(libc::ENOENT) => {}
            Err(e) => tracing::debug!(node = id, "inval_inode: {e}"),
        }
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

    /// Where node `id` currently keeps its data. Errors: `ENOENT` for a node that is gone.
    pub(super) fn backing(&self, id: u64) -> OpResult<Backing> {
        self.nodes.locate(id).ok_or(Errno::ENOENT)
    }

    /// Directory node `id` as one read of the node table finds it: the layers it is merged
    /// from, its path and its parent. The caller holds `ns`, so the snapshot stays true for
    /// the rest of its operation.
    ///
    /// Errors: `ENOTDIR` for another kind of node, `ENOENT` for one that is absent, removed or
    /// detached.
    pub(super) fn dir(&self, id: u64) -> OpResult<Backing> {
        match self.nodes.locate(id) {
            Some(l) if l.kind != Kind::Dir => Err(Errno::ENOTDIR),
            Some(l) if l.attached => Ok(l),
            Some(_) => Err(Errno::ENOENT),
            // Removed, or below a detached node: the kind still decides first.
            None if self.nodes.peek(id, |n| n.kind != Kind::Dir) == Some(true) => {
                Err(Errno::ENOTDIR)
            }
            None => Err(Errno::ENOENT),
        }
    }

    /// Resolves `name` in directory node `parent` (as [`Self::dir`] found it: `pdir`) across
    /// the layers ([`Stack::lookup`]) and gives it its node id (see [`crate::overlay::inode`]).
    /// `Ok(None)` when the name does not exist in the merged view (absent or whited out).
    ///
    /// Errors: `ENAMETOOLONG`, or the errno of reading a layer.
    pub(super) fn resolve(
        &self,
        parent: u64,
        pdir: &Backing,
        name: &OsStr,
    ) -> OpResult<Option<Resolved>> {
        if name.len() > NAME_MAX {
            return Err(Errno::ENAMETOOLONG);
        }
        let crel = child(&pdir.path, name).map_err(errno)?;
        let Some(e) = self
            .stack
            .lookup(pdir.upper, pdir.lowers, &crel)
            .map_err(errno)?
        else {
            return Ok(None);
        };
        Ok(Some(self.identify(parent, name, e, || Ok(crel))?))
    }

    /// Like [`Self::resolve`], with the parent directory's layers open (`at`, made from the
    /// same `pdir`): one `fstatat` per layer relative to the open directory instead of a
    /// walk of the whole path from each layer root. What READDIRPLUS and READDIR resolve every
    /// name of a listing with.
    ///
    /// Errors: as [`Self::resolve`].
    pub(super) fn resolve_at(
        &self,
        parent: u64,
        pdir: &Backing,
        at: &DirFds<'_>,
        name: &OsStr,
    ) -> OpResult<Option<Resolved>> {
        if name.len() > NAME_MAX {
            return Err(Errno::ENAMETOOLONG);
        }
        let cname = crate::sys::cstr(name).map_err(errno)?;
        let Some(e) = at.lookup(&cname).map_err(errno)? else {
            return Ok(None);
        };
        let r = self.identify(parent, name, e, || child(&pdir.path, name).map_err(errno))?;
        Ok(Some(r))
    }

    /// Gives the entry `e` found at `name` in directory node `parent` its node id (see
    /// [`crate::overlay::inode`]) and the identity it shows; `path` builds its path relative to the layer
    /// roots, needed only for a multiply-linked lower file.
    fn identify(
        &self,
        parent: u64,
        name: &OsStr,
        e: Entry,
        path: impl FnOnce() -> OpResult<CString>,
    ) -> OpResult<Resolved> {
        let id = match (e.upper, top_lower(e.lowers), e.lower_ino) {
            // A merged directory: identity from the top lower dir.
            (true, Some(l), Some(ino)) => self.nodes.lower_id(l, ino),
            (true, _, _) => self.nodes.upper_id(e.st.st_ino),
            (false, Some(l), _) if e.kind == Kind::Dir || e.st.st_nlink <= 1 => {
                self.nodes.lower_id(l, e.st.st_ino)
            }
            (false, _, _) => self.nodes.path_id(parent, name),
        };
        let shown = if self.shown_needs_path(&e) {
            self.shown(id, &e, &path()?)
        } else {
            self.shown(id, &e, c"")
        };
        Ok(Resolved {
            id,
            entry: e,
            shown,
        })
    }

    /// Whether [`Self::shown`] reads the entry's path: only for a lower non-directory with
    /// several links.
    fn shown_needs_path(&self, e: &Entry) -> bool {
        e.kind != Kind::Dir && !e.upper && e.st.st_nlink > 1 && e.lowers != 0
    }

    /// The inode number and link count that entry `e` at `path` (relative to the layer roots),
    /// node `id`, shows: its node id and own link count, except
    /// * a merged directory shows nlink 1 (its link count is not known without reading every
    ///   layer; `find` and `fts` take 1 as "unknown");
    /// * a lower non-directory with several links shows, as kernel overlayfs does, the lower
    ///   inode's identity (one `st_ino` for all its names, [`Nodes::lower_id`]) and its link
    ///   count — while each name stays a node of its own, so a name that is copied up breaks
    ///   from the group (kernel overlayfs without `index=on`);
    /// * in a store layer ([`Links::Recorded`]) such a file shows its recorded link group's
    ///   inode and size, and a file in no group shows its node id and nlink 1.
    pub(super) fn shown(&self, id: u64, e: &Entry, path: &std::ffi::CStr) -> (u64, u32) {
        // The copy made by a copy-up by re-lookup shows the node it superseded.
        let id = self.nodes.shown_id(id);
        let nlink = e.st.st_nlink as u32;
        if e.kind == Kind::Dir {
            return (id, if e.lowers != 0 { 1 } else { nlink });
        }
        let top = top_lower(e.lowers).filter(|_| !e.upper && nlink > 1);
        let Some(l) = top else {
            return (id, nlink);
        };
        match self.policy.links(l) {
            Some(Links::Recorded(g)) => shown_recorded(id, l, g, path),
            _ => (self.nodes.lower_id(l, e.st.st_ino), nlink),
        }
    }

    /// Resolves a child of `parent`; returns the parent as [`Self::dir`] found it too.
    pub(super) fn resolve_in(
        &self,
        parent: u64,
        name: &OsStr,
    ) -> OpResult<(Backing, Option<Resolved>)> {
        let pdir = self.dir(parent)?;
        let r = self.resolve(parent, &pdir, name)?;
        Ok((pdir, r))
    }

    /// The attribute the kernel sees for a resolved entry (`ino` is the inode number it
    /// shows, [`Resolved::shown`]; the node id is `r.id`).
    pub(super) fn attr_of(&self, r: &Resolved) -> FileAttr {
        let (ino, nlink) = r.shown;
        let mut attr = attr_from_stat(ino, &r.st, nlink);
        // The orphan link in the workdir (kept for open fds) is not a name the user can see.
        if r.upper && self.removed.is_orphan(r.id) {
            attr.nlink = attr.nlink.saturating_sub(1);
        }
        self.policy.squashed(attr)
    }

    /// Looks `name` up in `parent` and records the kernel reference (lookup, create,
    /// readdirplus): the node id and the attributes to send with it.
    pub(super) fn lookup_and_remember(
        &self,
        parent: u64,
        name: &OsStr,
    ) -> OpResult<Option<(u64, FileAttr)>> {
        let (pdir, r) = self.resolve_in(parent, name)?;
        Ok(r.map(|r| (r.id, self.remember(parent, &pdir, name, &r))))
    }

    /// The generation sent with every entry of this mount ([`Nodes::generation`]).
    pub(super) fn generation(&self) -> fuser::Generation {
        fuser::Generation(self.nodes.generation().into())
    }

    /// LOOKUP(`id`, "."): node `id` itself, which the kernel may have forgotten (it opens a
    /// file handle, fs/fuse/inode.c `fuse_get_dentry`), found again where it was last
    /// attached; records a kernel reference to it.
    ///
    /// Errors: `ENOENT` (the kernel answers ESTALE) when the node is unknown, unlinked, no
    /// longer at its last name, or its name was dropped from the parked names; or the errno
    /// of resolving it.
    pub(super) fn lookup_self(&self, id: u64) -> OpResult<FileAttr> {
        self.revive(id, 0)
    }

    /// LOOKUP(`id`, ".."): the parent of directory node `id` (the kernel connects a
    /// directory opened by handle to the tree, fs/fuse/inode.c `fuse_get_parent`); the root is
    /// its own parent. Records a kernel reference to the parent and returns its id too.
    ///
    /// Errors: as [`Self::lookup_self`], for the parent.
    pub(super) fn lookup_parent(&self, id: u64) -> OpResult<(u64, FileAttr)> {
        let parent = if id == ROOT {
            ROOT
        } else {
            match self.nodes.peek(id, |n| n.loc.parent()) {
                Some(p) => p.ok_or(Errno::ENOENT)?,
                None => self.nodes.parked(id).ok_or(Errno::ENOENT)?.0,
            }
        };
        Ok((parent, self.revive(parent, 0)?))
    }

    /// Records one more kernel reference to node `id` and returns its attributes: a node in
    /// the table must be attached; a forgotten one is resolved again at its parked name
    /// (its parent revived the same way) and must resolve to `id`. Either way the node then
    /// holds a lookup of its parent ([`Node::pin`](crate::overlay::inode::Node::pin)), revived the
    /// same way, since the kernel's dentry of it has no parent to hold one.
    ///
    /// Errors: as [`Self::lookup_self`].
    fn revive(&self, id: u64, depth: u32) -> OpResult<FileAttr> {
        if depth > 4096 {
            return Err(Errno::ENOENT);
        }
        let live = self.nodes.update(id, |n| match n.loc {
            Loc::Attached { parent, .. } => {
                n.lookups += 1;
                Some((parent, n.pin))
            }
            _ => None,
        });
        match live {
            Some(Some((parent, pin))) => {
                // The kernel gets this node on a dentry with no parent, so nothing of the
                // kernel's may hold its directory: the node holds it (as one found at its
                // parked name does), or the kernel's forgetting that directory leaves it with
                // no path. It is live here while the kernel holds only such dentries of it
                // (opened by handle earlier), or while the kernel's FORGET of it is still
                // on its way.
                if pin == 0 && parent != ROOT && id != ROOT {
                    if let Err(e) = self.revive(parent, depth + 1) {
                        self.nodes.unremember(id);
                        return Err(e);
                    }
                    if !self.nodes.pin(id, parent) {
                        self.forget(parent, 1);
                    }
                }
                return self
                    .getattr_node(id)
                    .inspect_err(|_| self.nodes.unremember(id));
            }
            Some(None) => return Err(Errno::ENOENT),
            None => {}
        }
        let (parent, name) = self.nodes.parked(id).ok_or(Errno::ENOENT)?;
        self.revive(parent, depth + 1)?;
        let found = self.resolve_in(parent, &name);
        let out = match found {
            Ok((pdir, Some(r))) if r.id == id => Ok(self.remember(parent, &pdir, &name, &r)),
            Ok(_) => Err(Errno::ENOENT),
            Err(e) => Err(e),
        };
        // Kept while the node lives when it was found (its dentry has no parent to pin it);
        // the parent is a directory: never an orphan, so forgetting takes no namespace lock.
        if out.is_err() || !self.nodes.pin(id, parent) {
            self.forget(parent, 1);
        }
        out
    }

    /// Records a kernel reference to the resolved entry `name` of directory node `parent`
    /// (as [`Self::dir`] found it: `pdir`) and returns the attributes to send with it.
    pub(super) fn remember(
        &self,
        parent: u64,
        pdir: &Backing,
        name: &OsStr,
        r: &Resolved,
    ) -> FileAttr {
        let new_name = self
            .nodes
            .remember(r.id, parent, name, r.kind, r.upper, r.lowers);
        if self.journal.is_some() {
            let upper_st = r.upper.then_some(&r.st);
            self.index_remembered(r.id, &pdir.path, name, upper_st, new_name);
        }
        self.attr_of(r)
    }

    /// Current attributes of node `id` (for a removed directory still held by the kernel, the
    /// ones kept in [`Removed`]).
    ///
    /// Errors: `ENOENT` for a node that is not (or no longer) known, or the `fstatat` errno.
    pub(super) fn getattr_node(&self, id: u64) -> OpResult<FileAttr> {
        match self.backing(id) {
            Ok(l) => self.attr_at(id, &l),
            Err(e) => self.gone_dir_attr(id).ok_or(e),
        }
    }

    /// The kept attributes of `id` when it is a removed directory the kernel still holds.
    pub(super) fn gone_dir_attr(&self, id: u64) -> Option<FileAttr> {
        if self.nodes.peek(id, |n| n.loc == Loc::Gone) != Some(true) {
            return None;
        }
        self.removed.dir_attr(id)
    }

    /// The attributes of node `id`, whose data is where [`Self::backing`] found it (`l`); for
    /// a lower file whose fd is cached, from that fd ([`FdCache::lower_stat`]).
    ///
    /// Errors: the `fstatat`/`fstat` errno.
    pub(super) fn attr_at(&self, id: u64, l: &Backing) -> OpResult<FileAttr> {
        // A superseded node's attributes are its copy's (`l` is where the copy is).
        let id = self.nodes.successor_if_any(id);
        let cached = match l.tree {
            Tree::Lower(_) => self.fds.lower_stat(id),
            _ => None,
        };
        let st = match cached {
            Some(st) => st,
            None => self.stack.stat(l.tree, &l.path),
        }
        .map_err(errno)?;
        let entry = Entry {
            kind: l.kind,
            upper: l.upper || l.tree == Tree::Work,
            lowers: l.lowers,
            lower_ino: None,
            st,
        };
        let shown = self.shown(id, &entry, &l.path);
        let r = Resolved { id, entry, shown };
        let mut attr = self.attr_of(&r);
        // An unlinked lower-only file has no name left.
        if l.unlinked_lower() {
            attr.nlink = 0;
        }
        Ok(attr)
    }

    /// The listing of directory node `dir` (as [`Self::dir`] found it: `d`; its layers open
    /// in `at`), built from the layers' merged names on first use.
    ///
    /// Errors: the errno of reading a layer.
    pub(super) fn listing(&self, dir: u64, at: &DirFds<'_>) -> OpResult<Arc<Mutex<Listing>>> {
        if let Some(l) = self.listings.get(dir) {
            return Ok(l);
        }
        let names = at.merged_names().map_err(errno)?;
        Ok(self.listings.insert(dir, names))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_layer_dir_that_cannot_be_opened_is_named() {
        let d = tempfile::tempdir().unwrap();
        let file = d.path().join("file");
        std::fs::write(&file, b"x").unwrap();
        let gone = d.path().join("gone");
        let dirs = [
            ("workdir", d.path()),
            ("lowerdir", file.as_path()),
            ("lowerdir", gone.as_path()),
        ];
        let e = layer_dir_error(&dirs, io::Error::from_raw_os_error(libc::ENOTDIR));
        assert!(matches!(e, Error::Invalid(_)), "{e:?}");
        let msg = e.to_string();
        assert!(
            msg.starts_with(&format!("lowerdir {}: cannot open it: ", file.display()))
                && msg.contains("os error 20"),
            "{msg}"
        );
        assert!(!msg.contains('\n'), "{msg}");
        // Every directory opens now (a race): the stack's error alone.
        let e = layer_dir_error(&dirs[..1], io::Error::from_raw_os_error(libc::EACCES));
        assert!(
            e.to_string().contains("cannot open layer directories"),
            "{e}"
        );
    }
}
