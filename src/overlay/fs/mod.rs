//! The overlay engine: [`OverlayFs`], the parts of a mount as private fields — the layer
//! stack (`stack.rs`), the names (`names.rs`), the data (`node_data.rs`), the policy (`policy.rs`)
//! and the kernel side (`kernel.rs`) — and every filesystem operation that needs more than one
//! of them, as a method returning `Result<_, Errno>`. This file: opening a mount, resolving a
//! name across the layers, attributes. Its children: namespace operations (`ops.rs`), copy-up
//! (`copy_up.rs`), the data operations (`data_ops.rs`), attributes and xattrs (`attrs.rs`),
//! file handles across a remount (`fhandle.rs`) and the `fuser::Filesystem` glue
//! (`handlers.rs`). Only this module's files see the parts; none reaches inside one.

mod attrs;
mod copy_up;
mod data_ops;
mod fhandle;
mod handlers;
mod ops;
pub mod reset;

use std::ffi::{CString, OsStr};
use std::fs::File;
use std::io;
use std::os::unix::fs::FileExt;
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use fuser::{Errno, FileAttr, FileType};
use parking_lot::Mutex;

use crate::error::{Error, Result};
use crate::overlay::OverlayConfig;
use crate::overlay::dir::Listing;
use crate::overlay::errno::{OpResult, errno};
use crate::overlay::inode::{Backing, ORPHANS, ROOT};
use crate::overlay::kernel::Kernel;
use crate::overlay::links::Links;
use crate::overlay::names::{Names, Relookup, Resolved};
use crate::overlay::node_data::Data;
use crate::overlay::policy::MountPolicy;
use crate::overlay::stack::{DirFds, Entry, Stack, Tree};
use crate::sys::child;

/// How long the kernel may cache entries and attributes. Long: the lower layers are immutable
/// and every change to the upper goes through this daemon.
pub const TTL: Duration = Duration::from_secs(3600);
const NAME_MAX: usize = 255;

/// The overlay filesystem state shared by all worker threads: the parts it is made of, each
/// with private fields and a narrow interface — the layer stack, the names (node table,
/// listings, removed names, the namespace lock), the data (fd cache, copy-up locks,
/// passthrough), the mount's policy and the kernel side (notifier, node index). The engine's
/// operations (this module's files) call into them; a part never reaches into another.
pub struct OverlayFs {
    // Shared (not owned alone) so that a warm mount's reset ([`reset::Resetter`]) reaches them
    // from the daemon's control thread while the session owns the engine.
    stack: Arc<Stack>,
    names: Arc<Names>,
    data: Arc<Data>,
    policy: Arc<MountPolicy>,
    kernel: Kernel,
    tmp_seq: std::sync::atomic::AtomicU64,
    /// The private views the layers are read through, kept open for the life of the mount:
    /// noatime views of the lowers in passthrough mode ([`Stack::lowers_noatime`]) and the
    /// view of the upper dir and workdir with the mount's atime rule
    /// ([`Stack::upper_atime`]).
    _lower_views: Vec<std::os::fd::OwnedFd>,
    /// The first opens of lower files' data, when the mount records them
    /// ([`OverlayConfig::open_trace`]).
    trace: Option<std::sync::Arc<crate::overlay::open_trace::OpenTrace>>,
    /// The kernel keeps each directory's listing in its page cache (OPENDIR answered ENOSYS,
    /// "no-opendir": no OPENDIR, READDIR or RELEASEDIR once a listing is cached): always in
    /// no-open mode; in passthrough mode only for a mount that may outlive its run
    /// ([`OverlayConfig::control`]), whose listings then serve every later run of the layer
    /// (a warm `find` sends no request), at a page or more per directory of this mount's own.
    cache_listings: bool,
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
                fs.names.root_without_upper();
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
        let mut stack = stack;
        for m in &cfg.made_lowers {
            let layer = super::layer::make_layer(&m.spec).map_err(|e| {
                Error::Failed(format!("lower layer {} cannot be made: {e}", m.index))
            })?;
            stack
                .set_lower(m.index, layer)
                .map_err(|e| Error::Failed(format!("lower layer {}: {e}", m.index)))?;
        }
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
        let trace = match &cfg.open_trace {
            Some(f) => {
                Some(crate::overlay::open_trace::OpenTrace::start(f).map_err(|e| Error::io(f, e))?)
            }
            None => None,
        };
        let lowers = stack.root_lowers();
        let links = (0..cfg.lowerdirs.len())
            .map(|i| Links::load(cfg.lower_links.get(i).unwrap_or(&Default::default())))
            .collect::<io::Result<Vec<_>>>()
            .map_err(|e| Error::invalid(format!("cannot read the link groups of a lower: {e}")))?;
        Ok(OverlayFs {
            stack: Arc::new(stack),
            names: Arc::new(Names::new(lowers)),
            data: Arc::new(Data::new(passthrough)),
            policy: Arc::new(MountPolicy::new(
                cfg.squash,
                cfg.read_only,
                rule.mode == crate::sys::AtimeMode::Strict,
                links,
            )),
            kernel: Kernel::default(),
            tmp_seq: Default::default(),
            _lower_views: views,
            trace,
            cache_listings: !passthrough || cfg.control.is_some(),
        })
    }

    /// The attributes of node `id` and the birth time (`statx` `STATX_BTIME`) of its data
    /// file, for a STATX: where its data is is looked up once for both. The birth time is the
    /// upper copy's once there is one, as kernel overlayfs shows the real inode's, and `None`
    /// where its filesystem keeps none or the node has no file any more (a removed directory
    /// held open). Caller holds the namespace.
    ///
    /// Errors: as [`Self::getattr_node`].
    pub(super) fn statx_node(&self, id: u64) -> OpResult<(FileAttr, Option<SystemTime>)> {
        match self.names.locate(id) {
            Ok(l) => Ok((self.attr_at(id, &l)?, self.birth_time(&l))),
            Err(e) => self.names.gone_dir_attr(id).map(|a| (a, None)).ok_or(e),
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
        self.kernel.notifier_slot()
    }

    /// A fresh name for a staging entry in the workdir.
    pub(super) fn tmp_name(&self) -> CString {
        let n = self
            .tmp_seq
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        CString::new(format!("tmp-{}-{n}", std::process::id())).expect("no NUL")
    }

    /// Resolves `name` in directory node `parent` (as [`Names::dir`] found it: `pdir`) across
    /// the layers ([`Stack::lookup`]) and gives it its node id ([`Names::identify`]).
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
        let r = self
            .names
            .identify(parent, name, e, &self.policy, || Ok(crel))?;
        Ok(Some(r))
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
        let path = || child(&pdir.path, name).map_err(errno);
        let r = self.names.identify(parent, name, e, &self.policy, path)?;
        Ok(Some(r))
    }

    /// Resolves a child of `parent`; returns the parent as [`Names::dir`] found it too.
    pub(super) fn resolve_in(
        &self,
        parent: u64,
        name: &OsStr,
    ) -> OpResult<(Backing, Option<Resolved>)> {
        let pdir = self.names.dir(parent)?;
        let r = self.resolve(parent, &pdir, name)?;
        Ok((pdir, r))
    }

    /// The attribute the kernel sees for a resolved entry (`ino` is the inode number it
    /// shows, [`Resolved::shown`]; the node id is `r.id`).
    pub(super) fn attr_of(&self, r: &Resolved) -> FileAttr {
        let (ino, nlink) = r.shown;
        let mut attr = attr_from_stat(ino, &r.st, nlink);
        // The orphan link in the workdir (kept for open fds) is not a name the user can see.
        if r.upper && self.names.is_orphan(r.id) {
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
        let parent = self.names.parent(id)?;
        Ok((parent, self.revive(parent, 0)?))
    }

    /// Records one more kernel reference to node `id` and returns its attributes: a node in
    /// the table must be attached; a forgotten one is resolved again at its parked name
    /// (its parent revived the same way) and must resolve to `id`. Either way the node then
    /// holds a lookup of its parent ([`Names::pin`]), revived the same way, since the kernel's
    /// dentry of it has no parent to hold one.
    ///
    /// Errors: as [`Self::lookup_self`].
    fn revive(&self, id: u64, depth: u32) -> OpResult<FileAttr> {
        if depth > 4096 {
            return Err(Errno::ENOENT);
        }
        match self.names.relookup(id) {
            Relookup::Attached { parent, pin } => {
                // The kernel gets this node on a dentry with no parent, so nothing of the
                // kernel's may hold its directory: the node holds it (as one found at its
                // parked name does), or the kernel's forgetting that directory leaves it with
                // no path. It is live here while the kernel holds only such dentries of it
                // (opened by handle earlier), or while the kernel's FORGET of it is still
                // on its way.
                if pin == 0 && parent != ROOT && id != ROOT {
                    if let Err(e) = self.revive(parent, depth + 1) {
                        self.names.unremember(id);
                        return Err(e);
                    }
                    if !self.names.pin(id, parent) {
                        self.forget(parent, 1);
                    }
                }
                return self
                    .getattr_node(id)
                    .inspect_err(|_| self.names.unremember(id));
            }
            Relookup::Detached => return Err(Errno::ENOENT),
            Relookup::Absent => {}
        }
        let (parent, name) = self.names.parked(id).ok_or(Errno::ENOENT)?;
        self.revive(parent, depth + 1)?;
        let found = self.resolve_in(parent, &name);
        let out = match found {
            Ok((pdir, Some(r))) if r.id == id => Ok(self.remember(parent, &pdir, &name, &r)),
            Ok(_) => Err(Errno::ENOENT),
            Err(e) => Err(e),
        };
        // Kept while the node lives when it was found (its dentry has no parent to pin it);
        // the parent is a directory: never an orphan, so forgetting takes no namespace lock.
        if out.is_err() || !self.names.pin(id, parent) {
            self.forget(parent, 1);
        }
        out
    }

    /// Records a kernel reference to the resolved entry `name` of directory node `parent`
    /// (as [`Names::dir`] found it: `pdir`) and returns the attributes to send with it.
    pub(super) fn remember(
        &self,
        parent: u64,
        pdir: &Backing,
        name: &OsStr,
        r: &Resolved,
    ) -> FileAttr {
        let new_name = self.names.remember(parent, name, r);
        if self.kernel.keeps_index() {
            let upper_st = r.upper.then_some(&r.st);
            self.index_remembered(r.id, &pdir.path, name, upper_st, new_name);
        }
        self.attr_of(r)
    }

    /// Current attributes of node `id` (for a removed directory still held by the kernel, the
    /// ones the names part keeps).
    ///
    /// Errors: `ENOENT` for a node that is not (or no longer) known, or the `fstatat` errno.
    pub(super) fn getattr_node(&self, id: u64) -> OpResult<FileAttr> {
        match self.names.locate(id) {
            Ok(l) => self.attr_at(id, &l),
            Err(e) => self.names.gone_dir_attr(id).ok_or(e),
        }
    }

    /// The attributes of node `id`, whose data is where [`Names::locate`] found it (`l`); for
    /// a lower file whose fd is cached, from that fd ([`Data::lower_stat`]).
    ///
    /// Errors: the `fstatat`/`fstat` errno.
    pub(super) fn attr_at(&self, id: u64, l: &Backing) -> OpResult<FileAttr> {
        // A superseded node's attributes are its copy's (`l` is where the copy is).
        let id = self.names.successor_or_self(id);
        let cached = match l.tree {
            Tree::Lower(_) => self.data.lower_stat(id),
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
        let shown = self.names.shown(id, &entry, &l.path, &self.policy);
        let r = Resolved { id, entry, shown };
        let mut attr = self.attr_of(&r);
        // An unlinked lower-only file has no name left.
        if l.unlinked_lower() {
            attr.nlink = 0;
        }
        Ok(attr)
    }

    /// The listing of directory node `dir` (its layers open in `at`), built from the layers'
    /// merged names on first use.
    ///
    /// Errors: the errno of reading a layer.
    pub(super) fn listing(&self, dir: u64, at: &DirFds<'_>) -> OpResult<Arc<Mutex<Listing>>> {
        self.names.listing(dir, || at.merged_names())
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
