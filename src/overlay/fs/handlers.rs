//! `fuser::Filesystem` for [`OverlayFs`]: every handler is a thin call into an engine
//! operation that returns `Result<_, Errno>`, or into a part (`self.names`, `self.data`,
//! `self.policy`, `self.stack`, `self.kernel`) when one part answers alone.
//!
//! Kernel caching setup (docs/PERFORMANCE.md and docs/overlay.md): long entry/attr TTLs,
//! negative entries cached, readdirplus for every readdir, parallel directory operations,
//! cached symlinks, and "no open" mode — open and opendir answer ENOSYS so the kernel stops
//! sending them and serves pages and listings from its caches (FLUSH answers ENOSYS too, so
//! closes cost no round trip); I/O then arrives without a file handle and uses the engine's per-node fd cache, and copy-up happens lazily at the first
//! write/setattr/setxattr (never at open). In passthrough mode OPEN and OPENDIR are answered:
//! files get their backing file (`passthrough.rs`), directories no FOPEN_CACHE_DIR, so the
//! mount keeps no page cache of its own, neither file data nor listings (symlink bodies aside).

use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;
use std::path::Path;

use fuser::{
    CopyFileRangeFlags, Errno, FileAttr, FileHandle, FopenFlags, Generation, INodeNo, InitFlags,
    KernelConfig, LockOwner, OpenFlags, RenameFlags, ReplyAttr, ReplyCreate, ReplyData,
    ReplyDirectory, ReplyDirectoryPlus, ReplyEmpty, ReplyEntry, ReplyLseek, ReplyOpen, ReplyStatfs,
    ReplyWrite, ReplyXattr, Request, TimeOrNow, WriteFlags,
};

use super::attrs::{AttrChange, XattrReply};
use super::ops::NewEntry;
use super::{OpResult, OverlayFs, TTL, attr_from_stat, errno};
use crate::overlay::inode::{Backing, ROOT};
use crate::overlay::passthrough::{FH_CACHED, FH_PASSTHROUGH, OpenMode};
use crate::overlay::privs::{self, Caller};
use crate::overlay::stack::{DirFds, Kind, Tree};

/// Runs `f`, the work of FUSE operation `op` on node `node`, inside a debug-level span named
/// `fuse` (fields `op`, `node`) and ends it with an event giving the errno (0 for success) and
/// the duration in µs. Off by default: `LAYERCACHE_LOG=debug` or `RUST_LOG=debug` (or just the
/// target, `layercache::fuse=debug`) turns it on; when off, one check of the level filter is all
/// it costs.
///
/// First it removes the kept data of unlinked files the kernel forgot
/// ([`OverlayFs::reap_orphans`]), except in FORGET and READ: those may arrive when no process
/// holds the mount any more (a FORGET queued at the last close, a readahead READ still in
/// flight after it), so `umount` may have returned already.
#[inline]
fn traced<T>(
    fs: &OverlayFs,
    op: &'static str,
    node: u64,
    f: impl FnOnce() -> OpResult<T>,
) -> OpResult<T> {
    if op != "forget" && op != "read" {
        fs.reap_orphans();
    }
    if !tracing::enabled!(target: "layercache::fuse", tracing::Level::DEBUG) {
        return f();
    }
    let span = tracing::debug_span!(target: "layercache::fuse", "fuse", op, node);
    let _in = span.enter();
    let start = std::time::Instant::now();
    let r = f();
    let errno = r.as_ref().err().map_or(0, |e| e.code());
    let us = start.elapsed().as_micros() as u64;
    tracing::debug!(target: "layercache::fuse", errno, us, "done");
    r
}

fn negative_entry() -> FileAttr {
    let st = crate::sys::empty_stat();
    attr_from_stat(0, &st, 0)
}

/// The entry READDIRPLUS sends for "." or ".." (node `id`, a directory): the kernel reads only
/// the inode number of these two and takes no reference to them.
fn dot_entry(id: u64) -> FileAttr {
    let mut a = negative_entry();
    a.ino = INodeNo(id);
    a.kind = fuser::FileType::Directory;
    a.perm = 0o755;
    a
}

/// Replies with entry `r` (node id = `attr.ino`) and the mount's generation `g`.
fn entry(reply: ReplyEntry, r: OpResult<FileAttr>, g: Generation) {
    match r {
        Ok(a) => reply.entry(&TTL, &a, g),
        Err(e) => reply.error(e),
    }
}

fn empty(reply: ReplyEmpty, r: OpResult<()>) {
    match r {
        Ok(()) => reply.ok(),
        Err(e) => reply.error(e),
    }
}

/// The sender of `req` (for the set-id rule, `privs.rs`).
fn caller(req: &Request) -> Caller {
    Caller {
        uid: req.uid(),
        gid: req.gid(),
        pid: req.pid(),
    }
}

fn dtype(k: Kind) -> fuser::FileType {
    match k {
        Kind::Dir => fuser::FileType::Directory,
        Kind::File => fuser::FileType::RegularFile,
        Kind::Symlink => fuser::FileType::Symlink,
        Kind::Special(libc::DT_SOCK) => fuser::FileType::Socket,
        Kind::Special(libc::DT_CHR) => fuser::FileType::CharDevice,
        Kind::Special(libc::DT_BLK) => fuser::FileType::BlockDevice,
        Kind::Special(_) => fuser::FileType::NamedPipe,
    }
}

impl OverlayFs {
    /// The open of a file CREATE or TMPFILE just made (attributes `a`, one kernel reference
    /// recorded): cached, or in passthrough mode its backing registered through `reply`.
    /// On failure the reference is given back.
    fn open_created(&self, a: FileAttr, reply: &ReplyCreate) -> OpResult<(FileAttr, OpenMode)> {
        if !self.data.passthrough_on() {
            return Ok((a, OpenMode::Cached));
        }
        match self.open_node(a.ino.0, true, None, |f| reply.open_backing(f)) {
            Ok(m) => Ok((a, m)),
            Err(e) => {
                self.names.unremember(a.ino.0);
                Err(e)
            }
        }
    }

    /// Replies to CREATE or TMPFILE with [`Self::open_created`]'s outcome.
    fn reply_created(&self, r: OpResult<(FileAttr, OpenMode)>, reply: ReplyCreate) {
        match r {
            Ok((a, OpenMode::Passthrough(b))) => reply.created_passthrough(
                &TTL,
                &a,
                self.names.generation(),
                FileHandle(FH_PASSTHROUGH),
                FopenFlags::FOPEN_NOFLUSH,
                &b,
            ),
            Ok((a, OpenMode::Busy)) => {
                // A new file has no readers: cannot happen; undo the lookup the reply carried.
                self.names.unremember(a.ino.0);
                reply.error(Errno::ETXTBSY)
            }
            Ok((a, OpenMode::Cached)) => reply.created(
                &TTL,
                &a,
                self.names.generation(),
                FileHandle(FH_CACHED),
                self.policy.cached_open_flags(),
            ),
            Err(e) => reply.error(e),
        }
    }

    /// Walks "." and ".." then the listing of `dir` from `offset`. `add` gets the entry's id
    /// (for "." and "..") or 0, its name, kind and cookie, the directory as one read of the
    /// node table found it and its layers open ([`DirFds`], for resolving the entry with one
    /// `fstatat` per layer relative to the directory), and returns true when the reply is full.
    ///
    /// The namespace lock is held for the walk and only for it (the caller sends the reply
    /// after): the listing is built and every entry resolved — and, for readdirplus,
    /// remembered under `dir` — against that one snapshot of the directory's layers and path,
    /// which no rename or unlink can change meanwhile; entries are not each re-resolved from
    /// the root.
    fn readdir_walk(
        &self,
        dir: u64,
        offset: u64,
        mut add: impl FnMut(u64, &OsStr, Kind, u64, &Backing, &DirFds<'_>) -> OpResult<bool>,
    ) -> OpResult<()> {
        let _g = self.names.shared();
        let d = self.names.dir(dir)?;
        let at = DirFds::new(&self.stack, d.upper, d.lowers, &d.path);
        let listing = self.listing(dir, &at)?;
        let parent = if d.parent != 0 { d.parent } else { dir };
        let mut idx = offset;
        if idx == 0 {
            if add(dir, OsStr::new("."), Kind::Dir, 1, &d, &at)? {
                return Ok(());
            }
            idx = 1;
        }
        if idx == 1 {
            if add(parent, OsStr::new(".."), Kind::Dir, 2, &d, &at)? {
                return Ok(());
            }
            idx = 2;
        }
        let mut i = (idx - 2) as usize;
        loop {
            let Some(e) = listing.lock().get(i) else {
                return Ok(());
            };
            if let Some((name, kind)) = e
                && add(0, &name, kind, i as u64 + 3, &d, &at)?
            {
                return Ok(());
            }
            i += 1;
        }
    }
}

impl fuser::Filesystem for OverlayFs {
    fn read_only(&self) -> bool {
        self.policy.read_only()
    }

    fn init(&mut self, _req: &Request, config: &mut KernelConfig) -> std::io::Result<()> {
        let want = InitFlags::FUSE_DO_READDIRPLUS
            | InitFlags::FUSE_PARALLEL_DIROPS
            | InitFlags::FUSE_CACHE_SYMLINKS
            | InitFlags::FUSE_ASYNC_READ
            | InitFlags::FUSE_BIG_WRITES
            | InitFlags::FUSE_EXPORT_SUPPORT
            // POSIX ACLs as a local filesystem has them (the kernel checks them, caches them
            // and refreshes the mode after setfacl); with DONT_MASK the umask reaches the
            // daemon, which applies it only where no default ACL does (`make_masked`).
            | InitFlags::FUSE_POSIX_ACL
            | InitFlags::FUSE_DONT_MASK;
        if let Err(unsupported) = config.add_capabilities(want) {
            let _ = config.add_capabilities(want & !unsupported);
        }
        if self.data.passthrough_on() {
            // Backing files must sit on a filesystem that is not itself stacked (ext4, xfs,
            // tmpfs…); a lower on overlayfs makes registering fail, which turns passthrough off.
            let pt = InitFlags::FUSE_PASSTHROUGH | InitFlags::FUSE_DIRECT_IO_ALLOW_MMAP;
            if config.add_capabilities(pt).is_err() || config.set_max_stack_depth(1).is_err() {
                let _ = config.add_capabilities(InitFlags::FUSE_DIRECT_IO_ALLOW_MMAP);
                self.data.passthrough_off();
            }
        }
        let _ = config.set_max_write(1 << 20);
        let _ = config
            .set_max_readahead(1 << 20)
            .or_else(|max| config.set_max_readahead(max));
        Ok(())
    }

    fn destroy(&mut self) {
        // The session has ended (unmounted). Nothing is written here: `umount` has returned
        // already, and the node index is kept up to date while mounted (`fhandle.rs`).
    }

    fn lookup(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEntry) {
        let r = traced(self, "lookup", parent.0, || {
            let _g = self.names.shared();
            // The VFS resolves "." and ".." itself: these come only from the FUSE module's
            // export operations (FUSE_EXPORT_SUPPORT), for a file handle whose inode it forgot
            // and for the parent of a directory opened by handle.
            match name.as_bytes() {
                b"." => Ok(Some((parent.0, self.lookup_self(parent.0)?))),
                b".." => self.lookup_parent(parent.0).map(Some),
                _ => self.lookup_and_remember(parent.0, name),
            }
        });
        match r {
            Ok(Some((id, a))) => reply.entry_of(INodeNo(id), &TTL, &a, self.names.generation()),
            Ok(None) => reply.entry(&TTL, &negative_entry(), self.names.generation()),
            Err(e) => reply.error(e),
        }
    }

    fn forget(&self, _req: &Request, ino: INodeNo, nlookup: u64) {
        let _ = traced(self, "forget", ino.0, || {
            OverlayFs::forget(self, ino.0, nlookup);
            Ok(())
        });
    }

    fn getattr(&self, _req: &Request, ino: INodeNo, _fh: Option<FileHandle>, reply: ReplyAttr) {
        let r = traced(self, "getattr", ino.0, || {
            let _g = self.names.shared();
            self.getattr_node(ino.0)
        });
        match r {
            Ok(a) => reply.attr(&self.attr_ttl(ino.0), &a),
            Err(e) => reply.error(e),
        }
    }

    fn statx(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: Option<FileHandle>,
        _flags: u32,
        _mask: u32,
        reply: fuser::ReplyStatx,
    ) {
        let r = traced(self, "statx", ino.0, || {
            let _g = self.names.shared();
            self.statx_node(ino.0)
        });
        match r {
            Ok((a, btime)) => reply.statx(&self.attr_ttl(ino.0), &a, btime),
            Err(e) => reply.error(e),
        }
    }

    fn setattr(
        &self,
        req: &Request,
        ino: INodeNo,
        mode: Option<u32>,
        uid: Option<u32>,
        gid: Option<u32>,
        size: Option<u64>,
        atime: Option<TimeOrNow>,
        mtime: Option<TimeOrNow>,
        _ctime: Option<std::time::SystemTime>,
        _fh: Option<FileHandle>,
        _crtime: Option<std::time::SystemTime>,
        _chgtime: Option<std::time::SystemTime>,
        _bkuptime: Option<std::time::SystemTime>,
        _flags: Option<fuser::BsdFileFlags>,
        reply: ReplyAttr,
    ) {
        let mut change = AttrChange {
            mode,
            uid,
            gid,
            size,
            atime,
            mtime,
        };
        match traced(self, "setattr", ino.0, || {
            if let Some(m) = mode
                && m & libc::S_ISGID != 0
            {
                // The kernel's privilege drop before a write or truncate keeps S_ISGID of a
                // file that is not group-executable: complete it (privs.rs).
                let file_gid = match gid {
                    Some(g) => g,
                    None => {
                        let _g = self.names.shared();
                        self.getattr_node(ino.0)?.gid
                    }
                };
                if !privs::may_keep_sgid(&caller(req), file_gid) {
                    change.mode = Some(m & !libc::S_ISGID);
                }
            }
            let mut a = OverlayFs::setattr(self, ino.0, &change)?;
            if size.is_some()
                && let Some(perm) = self.drop_setid(ino.0, &caller(req))?
            {
                a.perm = perm as u16;
            }
            Ok(a)
        }) {
            Ok(a) => reply.attr(&self.attr_ttl(ino.0), &a),
            Err(e) => reply.error(e),
        }
    }

    fn readlink(&self, _req: &Request, ino: INodeNo, reply: ReplyData) {
        match traced(self, "readlink", ino.0, || OverlayFs::readlink(self, ino.0)) {
            Ok(t) => reply.data(&t),
            Err(e) => reply.error(e),
        }
    }

    fn mknod(
        &self,
        req: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        umask: u32,
        rdev: u32,
        reply: ReplyEntry,
    ) {
        let what = if mode & libc::S_IFMT == libc::S_IFREG || mode & libc::S_IFMT == 0 {
            NewEntry::File(mode)
        } else {
            NewEntry::Special(mode, rdev as u64)
        };
        let r = traced(self, "mknod", parent.0, || {
            self.make_masked(parent.0, name, req.uid(), req.gid(), what, umask)
        });
        entry(reply, r, self.names.generation());
    }

    fn mkdir(
        &self,
        req: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        umask: u32,
        reply: ReplyEntry,
    ) {
        let r = traced(self, "mkdir", parent.0, || {
            let what = NewEntry::Dir(mode);
            self.make_masked(parent.0, name, req.uid(), req.gid(), what, umask)
        });
        entry(reply, r, self.names.generation());
    }

    fn unlink(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        empty(
            reply,
            traced(self, "unlink", parent.0, || {
                OverlayFs::unlink(self, parent.0, name)
            }),
        );
    }

    fn rmdir(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        empty(
            reply,
            traced(self, "rmdir", parent.0, || {
                OverlayFs::rmdir(self, parent.0, name)
            }),
        );
    }

    fn symlink(
        &self,
        req: &Request,
        parent: INodeNo,
        link_name: &OsStr,
        target: &Path,
        reply: ReplyEntry,
    ) {
        let r = traced(self, "symlink", parent.0, || {
            let what = NewEntry::Symlink(target);
            self.make(parent.0, link_name, req.uid(), req.gid(), what)
        });
        entry(reply, r, self.names.generation());
    }

    fn rename(
        &self,
        _req: &Request,
        parent: INodeNo,
        name: &OsStr,
        newparent: INodeNo,
        newname: &OsStr,
        flags: RenameFlags,
        reply: ReplyEmpty,
    ) {
        let r = traced(self, "rename", parent.0, || {
            OverlayFs::rename(self, parent.0, name, newparent.0, newname, flags.bits())
        });
        empty(reply, r);
    }

    fn link(
        &self,
        req: &Request,
        ino: INodeNo,
        newparent: INodeNo,
        newname: &OsStr,
        reply: ReplyEntry,
    ) {
        let r = traced(self, "link", ino.0, || {
            let what = NewEntry::Link(ino.0);
            self.make(newparent.0, newname, req.uid(), req.gid(), what)
        });
        entry(reply, r, self.names.generation());
    }

    fn open(&self, _req: &Request, ino: INodeNo, flags: OpenFlags, reply: ReplyOpen) {
        if !self.data.passthrough_on() && !self.policy.strict_atime() {
            // No-open mode: the kernel stops sending OPEN/RELEASE and keeps its page cache.
            return reply.error(Errno::ENOSYS);
        }
        let write = flags.0 & libc::O_ACCMODE != libc::O_RDONLY;
        if !self.data.passthrough_on() {
            if write
                && let Err(e) = traced(self, "open", ino.0, || {
                    self.check_open_for_write(ino.0, flags.0)
                })
            {
                return reply.error(e);
            }
            return reply.opened(FileHandle(FH_CACHED), self.policy.cached_open_flags());
        }
        let r = traced(self, "open", ino.0, || {
            let check = write.then_some(flags.0);
            self.open_node(ino.0, write, check, |f| reply.open_backing(f))
        });
        match r {
            Ok(OpenMode::Passthrough(b)) => {
                if write {
                    // Attributes cached before this writer are dropped; from now on they are
                    // sent with no TTL while it is open (`Passthrough::has_writer`).
                    self.kernel.invalidate_attrs(ino.0);
                }
                reply.opened_passthrough(FileHandle(FH_PASSTHROUGH), FopenFlags::FOPEN_NOFLUSH, &b)
            }
            Ok(OpenMode::Busy) => reply.error(Errno::ETXTBSY),
            Ok(OpenMode::Cached) => {
                reply.opened(FileHandle(FH_CACHED), self.policy.cached_open_flags())
            }
            Err(e) => reply.error(e),
        }
    }

    fn release(
        &self,
        _req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        _flush: bool,
        reply: ReplyEmpty,
    ) {
        if fh.0 == FH_PASSTHROUGH {
            self.data
                .released(ino.0, flags.0 & libc::O_ACCMODE != libc::O_RDONLY);
        }
        reply.ok();
    }

    fn read(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        size: u32,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyData,
    ) {
        // The data is read straight into the reply buffer (the io_uring entry's payload).
        let _ = traced(self, "read", ino.0, || {
            let f = match self.read_fd(ino.0) {
                Ok(f) => f,
                Err(e) => {
                    reply.error(e);
                    return Err(e);
                }
            };
            if let Err(e) = f.ready(offset, size as u64) {
                let e = errno(e);
                reply.error(e);
                return Err(e);
            }
            let mut res = Ok(());
            reply.data_with(size as usize, |buf| {
                let r = super::read_into(&f, offset, buf);
                res = r.map(drop);
                r
            });
            res
        });
    }

    fn write(
        &self,
        req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        data: &[u8],
        _write_flags: WriteFlags,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyWrite,
    ) {
        match traced(self, "write", ino.0, || {
            let n = OverlayFs::write(self, ino.0, offset, data)?;
            self.drop_setid(ino.0, &caller(req))?;
            Ok(n)
        }) {
            Ok(n) => reply.written(n),
            Err(e) => reply.error(e),
        }
    }

    fn flush(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _fh: FileHandle,
        _lock_owner: LockOwner,
        reply: ReplyEmpty,
    ) {
        // Nothing is buffered here and locks are the kernel's own, so FLUSH has nothing to do:
        // ENOSYS makes the kernel stop sending it (one round trip less on every close).
        reply.error(Errno::ENOSYS);
    }

    fn fsync(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        datasync: bool,
        reply: ReplyEmpty,
    ) {
        empty(
            reply,
            traced(self, "fsync", ino.0, || self.fsync_node(ino.0, datasync)),
        );
    }

    fn ioctl(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        _flags: fuser::IoctlFlags,
        cmd: u32,
        in_data: &[u8],
        _out_size: u32,
        reply: fuser::ReplyIoctl,
    ) {
        match traced(self, "ioctl", ino.0, || {
            self.fileattr_ioctl(ino.0, cmd, in_data)
        }) {
            Ok(out) => reply.ioctl(0, &out),
            Err(e) => reply.error(e),
        }
    }

    fn opendir(&self, _req: &Request, _ino: INodeNo, _flags: OpenFlags, reply: ReplyOpen) {
        // Readdir is stateless over the engine's per-directory listing either way: no handle.
        if self.cache_listings || !self.data.passthrough_on() {
            // No-opendir mode: the kernel stops sending OPENDIR/RELEASEDIR and keeps each
            // directory's listing in the directory's page cache (FOPEN_CACHE_DIR, the kernel's
            // default for it: fs/fuse/file.c `fuse_file_open`).
            return reply.error(Errno::ENOSYS);
        }
        // Passthrough mode shares the lower files' page cache with every other mount; a cached
        // listing would be this mount's own copy (a page per directory at least: about 6 MiB
        // per mount for the 1,461 directories of the npm fixture's tree). So no
        // FOPEN_CACHE_DIR: each getdents asks the daemon, which keeps the listing in memory
        // anyway; RELEASEDIR gets the default reply. (A warm-capable mount caches them: see
        // `OverlayFs::cache_listings`.)
        reply.opened(FileHandle(0), FopenFlags::empty());
    }

    fn readdir(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        mut reply: ReplyDirectory,
    ) {
        let dir = ino.0;
        let r = traced(self, "readdir", dir, || {
            self.readdir_walk(dir, offset, |id, name, kind, cookie, d, at| {
                // d_ino: the inode number the entry shows (its st_ino).
                let ino = if id != 0 {
                    id
                } else {
                    match self.resolve_at(dir, d, at, name)? {
                        Some(r) => r.shown.0,
                        None => return Ok(false),
                    }
                };
                Ok(reply.add(INodeNo(ino), cookie, dtype(kind), name))
            })
        });
        match r {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(e),
        }
    }

    fn readdirplus(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        mut reply: ReplyDirectoryPlus,
    ) {
        let dir = ino.0;
        let r = traced(self, "readdirplus", dir, || {
            // The node index records of the entries go out in one write, before the reply.
            self.index_batch(|| {
                self.readdir_walk(dir, offset, |id, name, _kind, cookie, d, at| {
                    if id != 0 {
                        // "." and "..": the kernel takes only their inode number (the dirent's
                        // d_ino) and ignores the rest of the entry (fs/fuse/readdir.c,
                        // fuse_direntplus_link), so no stat is spent on them.
                        let a = dot_entry(id);
                        return Ok(reply.add(
                            INodeNo(id),
                            cookie,
                            name,
                            &TTL,
                            &a,
                            self.names.generation(),
                        ));
                    }
                    let (id, a) = match self.resolve_at(dir, d, at, name)? {
                        Some(r) => (r.id, self.remember(dir, d, name, &r)),
                        None => return Ok(false),
                    };
                    let full =
                        reply.add(INodeNo(id), cookie, name, &TTL, &a, self.names.generation());
                    if full {
                        self.names.unremember(id);
                    }
                    Ok(full)
                })
            })
        });
        match r {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(e),
        }
    }

    fn fsyncdir(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _fh: FileHandle,
        _datasync: bool,
        reply: ReplyEmpty,
    ) {
        reply.ok();
    }

    fn statfs(&self, _req: &Request, _ino: INodeNo, reply: ReplyStatfs) {
        let r = traced(self, "statfs", ROOT, || {
            let tree = if self.stack.has_upper() {
                Tree::Upper
            } else {
                Tree::Lower(0)
            };
            self.stack.statvfs(tree).map_err(errno)
        });
        match r {
            Ok(s) => reply.statfs(
                s.f_blocks,
                s.f_bfree,
                s.f_bavail,
                s.f_files,
                s.f_ffree,
                s.f_bsize as u32,
                255,
                s.f_frsize as u32,
            ),
            Err(e) => reply.error(e),
        }
    }

    fn setxattr(
        &self,
        req: &Request,
        ino: INodeNo,
        name: &OsStr,
        value: &[u8],
        flags: i32,
        _position: u32,
        reply: ReplyEmpty,
    ) {
        let r = traced(self, "setxattr", ino.0, || {
            OverlayFs::setxattr(self, ino.0, name, value, flags)?;
            if name == "system.posix_acl_access" {
                // Copied up by the setxattr: the upper file or directory.
                let p = {
                    let _g = self.names.shared();
                    let l = self.names.locate(ino.0)?;
                    self.stack.proc_path(l.tree, &l.path)
                };
                let p = std::path::Path::new(std::ffi::OsStr::from_bytes(p.as_bytes()));
                let gid = |g| self.policy.shown_gid(g);
                privs::drop_after_acl(p, &caller(req), gid).map_err(errno)?;
            }
            Ok(())
        });
        empty(reply, r);
    }

    fn getxattr(&self, _req: &Request, ino: INodeNo, name: &OsStr, size: u32, reply: ReplyXattr) {
        match traced(self, "getxattr", ino.0, || {
            OverlayFs::getxattr(self, ino.0, name, size)
        }) {
            Ok(XattrReply::Size(n)) => reply.size(n),
            Ok(XattrReply::Data(d)) => reply.data(&d),
            Err(e) => reply.error(e),
        }
    }

    fn listxattr(&self, _req: &Request, ino: INodeNo, size: u32, reply: ReplyXattr) {
        match traced(self, "listxattr", ino.0, || {
            OverlayFs::listxattr(self, ino.0, size)
        }) {
            Ok(XattrReply::Size(n)) => reply.size(n),
            Ok(XattrReply::Data(d)) => reply.data(&d),
            Err(e) => reply.error(e),
        }
    }

    fn removexattr(&self, _req: &Request, ino: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        let r = traced(self, "removexattr", ino.0, || {
            OverlayFs::removexattr(self, ino.0, name)
        });
        empty(reply, r);
    }

    fn create(
        &self,
        req: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        umask: u32,
        _flags: i32,
        reply: ReplyCreate,
    ) {
        let r = traced(self, "create", parent.0, || {
            let what = NewEntry::File(mode);
            let a = self.make_masked(parent.0, name, req.uid(), req.gid(), what, umask)?;
            self.open_created(a, &reply)
        });
        self.reply_created(r, reply);
    }

    fn tmpfile(
        &self,
        req: &Request,
        parent: INodeNo,
        mode: u32,
        umask: u32,
        _flags: i32,
        reply: ReplyCreate,
    ) {
        let r = traced(self, "tmpfile", parent.0, || {
            let a = OverlayFs::tmpfile(self, parent.0, req.uid(), req.gid(), mode, umask)?;
            self.open_created(a, &reply)
        });
        self.reply_created(r, reply);
    }

    fn fallocate(
        &self,
        req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        length: u64,
        mode: i32,
        reply: ReplyEmpty,
    ) {
        let r = traced(self, "fallocate", ino.0, || {
            self.fallocate_node(ino.0, offset, length, mode)?;
            self.drop_setid(ino.0, &caller(req)).map(drop)
        });
        empty(reply, r);
    }

    fn lseek(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: i64,
        whence: i32,
        reply: ReplyLseek,
    ) {
        match traced(self, "lseek", ino.0, || {
            self.lseek_node(ino.0, offset, whence)
        }) {
            Ok(o) => reply.offset(o),
            Err(e) => reply.error(e),
        }
    }

    fn copy_file_range(
        &self,
        req: &Request,
        ino_in: INodeNo,
        _fh_in: FileHandle,
        offset_in: u64,
        ino_out: INodeNo,
        _fh_out: FileHandle,
        offset_out: u64,
        len: u64,
        _flags: CopyFileRangeFlags,
        reply: ReplyWrite,
    ) {
        let r = traced(self, "copy_file_range", ino_out.0, || {
            let n = self.copy_range_nodes(ino_in.0, offset_in, ino_out.0, offset_out, len)?;
            self.drop_setid(ino_out.0, &caller(req))?;
            Ok(n)
        });
        match r {
            Ok(n) => reply.written(n),
            Err(e) => reply.error(e),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plain_readdir_types_follow_the_file_type() {
        use fuser::FileType as T;
        let of = |mode| dtype(Kind::from_mode(mode));
        assert_eq!(of(libc::S_IFIFO), T::NamedPipe);
        assert_eq!(of(libc::S_IFSOCK), T::Socket);
        assert_eq!(of(libc::S_IFCHR), T::CharDevice);
        assert_eq!(of(libc::S_IFBLK), T::BlockDevice);
        assert_eq!(of(libc::S_IFDIR), T::Directory);
        assert_eq!(of(libc::S_IFLNK), T::Symlink);
        assert_eq!(of(libc::S_IFREG), T::RegularFile);
    }
}
