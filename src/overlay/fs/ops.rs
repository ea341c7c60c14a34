//! Namespace operations of the overlay engine (create, unlink, rmdir, rename, link, forget)
//! and the per-node data operations the handlers forward (fsync, fallocate, lseek,
//! copy_file_range, the set-id drop after a write, the attribute TTL), each returning
//! `Result<_, Errno>`. Attributes and xattrs are `attrs.rs`'s.

use std::ffi::{CStr, CString, OsStr};
use std::os::unix::ffi::OsStrExt;
use std::path::Path;
use std::time::SystemTime;

use fuser::{Errno, FileAttr, TimeOrNow};

use super::{OpResult, OverlayFs, Resolved, TTL, errno};
use crate::overlay::inode::{Backing, orphan_name};
use crate::overlay::privs::{self, Caller};
use crate::overlay::stack::{Kind, Tree};
use crate::overlay::whiteout;
use crate::sys::{child, cstr};

/// What becomes of the upper entry of a file whose name leaves the merged view (see
/// [`OverlayFs::detach`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Leaving {
    /// Unlinked: the entry is removed here (moved to the orphans while its node is held).
    Unlinked,
    /// The target of a rename: the entry stays for the rename to replace atomically (a held
    /// node's data is linked to the orphans first).
    Replaced,
}

/// What a create-like operation makes.
pub enum NewEntry<'a> {
    /// A regular file with this mode (permission bits).
    File(u32),
    /// A directory with this mode.
    Dir(u32),
    /// A symlink to this target.
    Symlink(&'a Path),
    /// A fifo, socket or device node (full `st_mode` with type bits, and `rdev`).
    Special(u32, u64),
    /// A new name for existing node id.
    Link(u64),
}

/// The `utimensat` time for a SETATTR time: `UTIME_OMIT` when unchanged, `UTIME_NOW` for
/// "now" (the kernel's clock), else the given time.
pub(super) fn timespec(t: Option<TimeOrNow>) -> libc::timespec {
    match t {
        None => libc::timespec {
            tv_sec: 0,
            tv_nsec: libc::UTIME_OMIT,
        },
        Some(TimeOrNow::Now) => libc::timespec {
            tv_sec: 0,
            tv_nsec: libc::UTIME_NOW,
        },
        Some(TimeOrNow::SpecificTime(t)) => {
            let (sec, nsec) = match t.duration_since(SystemTime::UNIX_EPOCH) {
                Ok(d) => (d.as_secs() as i64, d.subsec_nanos() as i64),
                Err(e) => {
                    let d = e.duration();
                    let mut s = -(d.as_secs() as i64);
                    let mut n = d.subsec_nanos() as i64;
                    if n > 0 {
                        s -= 1;
                        n = 1_000_000_000 - n;
                    }
                    (s, n)
                }
            };
            libc::timespec {
                tv_sec: sec,
                tv_nsec: nsec,
            }
        }
    }
}

impl OverlayFs {
    /// True when a lower layer merged into directory `pdir` has a visible entry `name`.
    fn lower_has(&self, pdir: &Backing, name: &OsStr) -> OpResult<bool> {
        let rel = child(&pdir.path, name).map_err(errno)?;
        self.stack.lower_has(pdir.lowers, &rel).map_err(errno)
    }

    /// Creates `name` in `parent` owned by `uid`/`gid` (the parent's gid when it is setgid),
    /// replacing a whiteout atomically and making a new directory opaque when it hides a
    /// deleted lower directory. Returns the new entry's attributes (lookup count +1).
    ///
    /// Errors: `EEXIST` if the name exists in the merged view, `ENAMETOOLONG`, `EPERM` for a
    /// 0/0 character device or a `.wh.` name (the whiteout encodings, see `whiteout.rs`), or
    /// the errno of the upper dir's syscall.
    pub fn make(
        &self,
        parent: u64,
        name: &OsStr,
        uid: u32,
        gid: u32,
        what: NewEntry<'_>,
    ) -> OpResult<FileAttr> {
        self.make_masked(parent, name, uid, gid, what, 0)
    }

    /// [`Self::make`] of a file, directory or special file with the caller's `umask`, which
    /// the kernel leaves to the daemon (FUSE_POSIX_ACL + FUSE_DONT_MASK): as on a local
    /// filesystem with POSIX ACLs (acl(5), "object creation and default ACLs"), a parent
    /// with a default ACL gives the new entry that ACL — and the mode it implies — instead of
    /// the umask; otherwise the umask applies.
    ///
    /// Errors: as [`Self::make`].
    pub fn make_masked(
        &self,
        parent: u64,
        name: &OsStr,
        uid: u32,
        gid: u32,
        what: NewEntry<'_>,
        umask: u32,
    ) -> OpResult<FileAttr> {
        if let NewEntry::Special(mode, 0) = what
            && mode & libc::S_IFMT == libc::S_IFCHR
        {
            // A 0/0 character device is the whiteout encoding (overlayfs.rst); as on kernel
            // overlayfs it cannot exist as a file in the merged view.
            return Err(Errno::EPERM);
        }
        if whiteout::is_marker_name(name.as_bytes()) {
            return Err(Errno::EPERM);
        }
        let _g = self.names.shared();
        let (pdir, existing) = self.resolve_in(parent, name)?;
        if existing.is_some() {
            return Err(Errno::EEXIST);
        }
        if let NewEntry::Link(src) = what {
            self.copy_up(src, None)?;
        }
        self.ensure_upper_dir(parent)?;
        let rel = child(&pdir.path, name).map_err(errno)?;
        let pst = self.stack.stat(Tree::Upper, &pdir.path).map_err(errno)?;
        let (uid, gid, setgid) = self.new_owner(&pst, uid, gid);
        // The upper dir's filesystem applies a default ACL itself at creation (the daemon's
        // umask is 0); without one, the caller's umask is applied here.
        let umask = if umask != 0 && self.has_default_acl(&pdir.path) {
            0
        } else {
            umask & 0o777
        };
        let what = match what {
            NewEntry::File(m) => NewEntry::File(m & !umask),
            NewEntry::Dir(m) => NewEntry::Dir(m & !umask),
            NewEntry::Special(m, rdev) => NewEntry::Special(m & !umask, rdev),
            other => other,
        };
        let wh_form = self.stack.upper_whiteout(&rel).map_err(errno)?;
        let wh = wh_form.is_some();
        let (layer, at) = if wh {
            (Tree::Work, self.tmp_name())
        } else {
            (Tree::Upper, rel.clone())
        };
        let is_dir = matches!(what, NewEntry::Dir(_));
        let made = self
            .create_entry(layer, &at, &what, uid, gid, setgid)
            .and_then(|()| match wh_form {
                Some(form) => self.replace_whiteout(layer, &at, &rel, form, is_dir),
                None => Ok(()),
            });
        if let Err(e) = made {
            if wh {
                let _ = self.stack.unlink(Tree::Work, &at, is_dir);
            }
            return Err(errno(e));
        }
        let (id, attr) = self.lookup_and_remember(parent, name)?.ok_or(Errno::EIO)?;
        let kind = self.names.kind(id).unwrap_or(Kind::File);
        self.names.entry_added(parent, name, kind);
        Ok(attr)
    }

    /// The owner a new entry made by `uid`:`gid` in the upper directory whose stat is `pst`
    /// is given, and whether that directory is set-group-ID: the caller's ids (the canonical
    /// 0:0 under squash_to_uid/gid), with the directory's group when it is set-group-ID.
    fn new_owner(&self, pst: &libc::stat, uid: u32, gid: u32) -> (u32, u32, bool) {
        let (uid, gid) = if self.policy.squashes() {
            (0, 0)
        } else {
            (uid, gid)
        };
        let setgid = pst.st_mode & libc::S_ISGID != 0;
        (uid, if setgid { pst.st_gid } else { gid }, setgid)
    }

    /// `open(dir, O_TMPFILE)` (FUSE_TMPFILE): a regular file with no name, made for directory
    /// `parent` (copied up first, as kernel overlayfs makes it in the upper dir) and kept in
    /// the workdir at [`orphan_name`] like the data of an unlinked file: every operation on
    /// the node reaches it there, a LINK (`linkat(fd, "", …, AT_EMPTY_PATH)`) links it into
    /// the upper dir under a name ([`Self::make_masked`] with `NewEntry::Link`), and when the
    /// kernel forgets the node the workdir link goes ([`Self::reap_orphans`]). Owned by
    /// `uid`:`gid` (the directory's group if it is set-group-ID), mode `mode` less `umask`, or
    /// where the directory has a default ACL, that ACL and the mode it implies
    /// ([`Self::tmpfile_in_upper`]). One
    /// kernel reference is recorded; the attributes show nlink 0.
    ///
    /// Errors: `ENOTDIR` when `parent` is not a directory, `ENOENT` for a node that is gone,
    /// or the upper/work dir's errno.
    pub fn tmpfile(
        &self,
        parent: u64,
        uid: u32,
        gid: u32,
        mode: u32,
        umask: u32,
    ) -> OpResult<FileAttr> {
        let _g = self.names.shared();
        if self.names.kind(parent).ok_or(Errno::ENOENT)? != Kind::Dir {
            return Err(Errno::ENOTDIR);
        }
        self.ensure_upper_dir(parent)?;
        let pdir = self.names.locate(parent)?;
        let pst = self.stack.stat(Tree::Upper, &pdir.path).map_err(errno)?;
        let (uid, gid, setgid) = self.new_owner(&pst, uid, gid);
        let tmp = self.tmp_name();
        // As for CREATE (make_masked): a directory with a default ACL gives the file that ACL
        // and the mode it implies, which only the upper filesystem computes — so the file is
        // made unnamed in the upper directory itself and then linked into the workdir.
        let made = if umask != 0 && self.has_default_acl(&pdir.path) {
            self.tmpfile_in_upper(&pdir.path, &tmp, mode, uid, gid)
        } else {
            let what = NewEntry::File(mode & !(umask & 0o777));
            self.create_entry(Tree::Work, &tmp, &what, uid, gid, setgid)
        }
        .and_then(|()| self.stack.stat(Tree::Work, &tmp));
        let st = match made {
            Ok(st) => st,
            Err(e) => {
                let _ = self.stack.unlink(Tree::Work, &tmp, false);
                return Err(errno(e));
            }
        };
        let id = self.names.upper_id(st.st_ino);
        if let Err(e) = self
            .stack
            .rename(Tree::Work, &tmp, Tree::Work, &orphan_name(id), 0)
        {
            self.names.drop_upper(st.st_ino);
            let _ = self.stack.unlink(Tree::Work, &tmp, false);
            return Err(errno(e));
        }
        self.names.kept_as_orphan(id);
        self.names.remember_unnamed(id, Kind::File);
        self.getattr_node(id)
    }

    /// An unnamed file made in upper directory `dir` (`O_TMPFILE`, mode `mode` unmasked: the
    /// upper filesystem applies `dir`'s default ACL, acl(5)), linked into the workdir at `at`
    /// and owned by `uid`:`gid` with the mode the ACL gave it, as [`Self::create_entry`]
    /// leaves a new file.
    ///
    /// Errors: the upper or work dir's syscall error (`EOPNOTSUPP` when the upper filesystem
    /// has no `O_TMPFILE`).
    fn tmpfile_in_upper(
        &self,
        dir: &CStr,
        at: &CString,
        mode: u32,
        uid: u32,
        gid: u32,
    ) -> std::io::Result<()> {
        let f = self.stack.open(
            Tree::Upper,
            dir,
            libc::O_TMPFILE | libc::O_RDWR,
            mode & 0o7777,
        )?;
        self.stack.link_unnamed(&f, Tree::Work, at)?;
        let made = self.stack.stat(Tree::Work, at)?.st_mode & 0o7777;
        self.stack.chown(Tree::Work, at, uid, gid)?;
        // chown clears set-id bits; put the mode back.
        self.stack.chmod(Tree::Work, at, made)
    }

    /// Creates `what` (its mode already masked) at `at` in `layer` for
    /// [`Self::make_masked`], owned by `uid`:`gid`; a directory is set-group-ID when
    /// `setgid` (its parent is).
    ///
    /// Errors: the upper or work dir's syscall error.
    fn create_entry(
        &self,
        layer: Tree,
        at: &CString,
        what: &NewEntry<'_>,
        uid: u32,
        gid: u32,
        setgid: bool,
    ) -> std::io::Result<()> {
        let is_dir = matches!(what, NewEntry::Dir(_));
        match *what {
            NewEntry::File(mode) => {
                self.stack.open(
                    layer,
                    at,
                    libc::O_CREAT | libc::O_EXCL | libc::O_WRONLY,
                    mode & 0o7777,
                )?;
            }
            NewEntry::Dir(mode) => {
                let mode = (mode & 0o7777) | if setgid { libc::S_ISGID } else { 0 };
                self.stack.mkdir(layer, at, mode)?;
            }
            NewEntry::Symlink(target) => {
                self.stack.symlink(&cstr(target.as_os_str())?, layer, at)?;
            }
            NewEntry::Special(mode, rdev) => self.stack.mknod(layer, at, mode, rdev)?,
            NewEntry::Link(src) => {
                let s = self
                    .names
                    .locate(src)
                    .map_err(|e| std::io::Error::from_raw_os_error(e.code()))?;
                self.stack.link(s.tree, &s.path, layer, at)?;
            }
        }
        if !matches!(what, NewEntry::Link(_)) {
            // The mode the entry was made with: the requested one, or what a default ACL
            // of the parent made of it (which a chmod to the requested mode would undo).
            let made = self.stack.stat(layer, at)?.st_mode & 0o7777;
            self.stack.chown(layer, at, uid, gid)?;
            if let NewEntry::Dir(_) | NewEntry::File(_) | NewEntry::Special(..) = what {
                // chown clears set-id bits of non-directories; put the mode back.
                let m = made | if setgid && is_dir { libc::S_ISGID } else { 0 };
                self.stack.chmod(layer, at, m)?;
            }
        }
        Ok(())
    }

    /// Moves the entry [`Self::create_entry`] made at `at` in `layer` (the workdir) to `rel`
    /// in the upper dir, where a whiteout of form `form` is: a new directory is opaque and,
    /// over a 0/0 device, swapped with it; a `.wh.` marker is removed after.
    ///
    /// Errors: the upper or work dir's syscall error.
    fn replace_whiteout(
        &self,
        layer: Tree,
        at: &CString,
        rel: &CString,
        form: whiteout::Form,
        is_dir: bool,
    ) -> std::io::Result<()> {
        if is_dir {
            self.stack.set_opaque(layer, at)?;
        }
        if is_dir && form == whiteout::Form::Device {
            // Swap the new directory with the whiteout, then drop the whiteout.
            self.stack
                .rename(Tree::Work, at, Tree::Upper, rel, libc::RENAME_EXCHANGE)?;
            self.stack.unlink(Tree::Work, at, false)?;
        } else {
            // Over a 0/0 device (replaced), or beside a `.wh.` file (removed next).
            self.stack.rename(Tree::Work, at, Tree::Upper, rel, 0)?;
        }
        if form == whiteout::Form::File {
            self.stack.remove_marker(rel)?;
        }
        Ok(())
    }

    /// Name `rel` of `r` leaves the merged view (unlink, rmdir, or the target of a rename):
    /// the one place that keeps the books. A node the kernel still holds is detached — a
    /// directory is marked gone; a file's data stays reachable so open files keep working
    /// (upper data at [`orphan_name`], lower data where it is) — and an upper inode that loses
    /// its last link loses its id. For an upper file, `leaving` says whether its entry is
    /// removed here or left for a rename to replace; a directory's upper entry is the
    /// caller's (rmdir removes it, a rename replaces it).
    ///
    /// Errors: the errno of moving, linking or removing the upper entry.
    fn detach(&self, r: &Resolved, rel: &CString, leaving: Leaving) -> OpResult<()> {
        let held = self.names.is_held(r.id);
        if r.kind == Kind::Dir {
            // Removed by rmdir or replaced by a rename: its upper inode number may be reused.
            if r.upper {
                self.names.drop_upper(r.st.st_ino);
            }
            if held {
                let mut attr = self.attr_of(r);
                attr.nlink = 0;
                self.names.dir_removed(r.id, attr);
            }
            return Ok(());
        }
        if !r.upper {
            if held {
                self.names.lower_unlinked(r.id, rel.clone());
            }
            return Ok(());
        }
        match leaving {
            Leaving::Unlinked if !held || self.names.is_orphan(r.id) => {
                // Held: another name of this inode is already kept there, and rename(2)
                // between two links of one inode would do nothing, so just drop this name.
                self.stack.unlink(Tree::Upper, rel, false).map_err(errno)?;
            }
            Leaving::Unlinked => self
                .stack
                .rename(Tree::Upper, rel, Tree::Work, &orphan_name(r.id), 0)
                .map_err(errno)?,
            Leaving::Replaced if held => {
                let o = orphan_name(r.id);
                let _ = self.stack.unlink(Tree::Work, &o, false);
                self.stack
                    .link(Tree::Upper, rel, Tree::Work, &o)
                    .map_err(errno)?;
            }
            Leaving::Replaced => {}
        }
        if held {
            self.names.kept_as_orphan(r.id);
        } else if r.st.st_nlink <= 1 {
            self.names.drop_upper(r.st.st_ino);
        }
        Ok(())
    }

    /// Removes non-directory `name` from `parent` (a whiteout hides a lower copy).
    ///
    /// Errors: `ENOENT`, `EISDIR`, or the upper dir's errno.
    pub fn unlink(&self, parent: u64, name: &OsStr) -> OpResult<()> {
        let _g = self.names.exclusive();
        let (pdir, r) = self.resolve_in(parent, name)?;
        let r = r.ok_or(Errno::ENOENT)?;
        if r.kind == Kind::Dir {
            return Err(Errno::EISDIR);
        }
        self.ensure_upper_dir(parent)?;
        let lower_has = self.lower_has(&pdir, name)?;
        let rel = child(&pdir.path, name).map_err(errno)?;
        if !self.unlink_one_link(parent, name, &pdir, &r, &rel)? {
            self.detach(&r, &rel, Leaving::Unlinked)?;
        }
        if lower_has {
            self.stack.create_whiteout(&rel).map_err(errno)?;
        }
        self.names.entry_removed(parent, name);
        Ok(())
    }

    /// Unlinks name `name` (at `rel`) of upper file `r` in `parent` (`pdir`) when the node
    /// keeps a name: the node is attached at another name already, or another hard link of the
    /// inode is in the same directory (then the node moves there). Its data then needs no
    /// orphan copy, and the node stays attached, so its file handle keeps opening it once the
    /// kernel forgets it. Returns false (nothing done) otherwise.
    ///
    /// Errors: the errno of reading the directory or removing the entry.
    fn unlink_one_link(
        &self,
        parent: u64,
        name: &OsStr,
        pdir: &Backing,
        r: &Resolved,
        rel: &CString,
    ) -> OpResult<bool> {
        if !r.upper || r.st.st_nlink <= 1 || self.names.is_orphan(r.id) {
            return Ok(false);
        }
        // Not held, or held with no name: the plain unlink of `detach` is all there is to do.
        let Some((p, nm)) = self.names.attached_name(r.id) else {
            return Ok(false);
        };
        let here = p == parent && *nm == *name;
        let other = if here {
            match self
                .stack
                .other_link(Tree::Upper, &pdir.path, r.st.st_ino, name)
                .map_err(errno)?
            {
                Some(o) => Some(o),
                None => return Ok(false),
            }
        } else {
            None
        };
        self.stack.unlink(Tree::Upper, rel, false).map_err(errno)?;
        if let Some(o) = other {
            self.names.relinked(r.id, parent, &o);
            if self.kernel.keeps_index() {
                let path = child(&pdir.path, &o).ok();
                self.index_node(r.id, path.as_deref());
            }
        }
        Ok(true)
    }

    /// Checks that directory `r` at `rel` has no entry in the merged view (whiteouts aside).
    ///
    /// Errors: `ENOTEMPTY`, or the errno of reading a layer.
    fn check_empty(&self, r: &Resolved, rel: &CString) -> OpResult<()> {
        let names = self
            .stack
            .merged_names(r.upper, r.lowers, rel)
            .map_err(errno)?;
        if names.is_empty() {
            Ok(())
        } else {
            Err(Errno::ENOTEMPTY)
        }
    }

    /// Removes the empty (in the merged view) directory `name` from `parent`.
    ///
    /// Errors: `ENOENT`, `ENOTDIR`, `ENOTEMPTY`, or the upper dir's errno.
    pub fn rmdir(&self, parent: u64, name: &OsStr) -> OpResult<()> {
        let _g = self.names.exclusive();
        let (pdir, r) = self.resolve_in(parent, name)?;
        let r = r.ok_or(Errno::ENOENT)?;
        if r.kind != Kind::Dir {
            return Err(Errno::ENOTDIR);
        }
        self.check_may_delete(parent, r.id)?;
        let rel = child(&pdir.path, name).map_err(errno)?;
        self.check_empty(&r, &rel)?;
        self.ensure_upper_dir(parent)?;
        let lower_has = self.lower_has(&pdir, name)?;
        if r.upper {
            self.stack.purge_whiteouts(&rel).map_err(errno)?;
            self.stack.unlink(Tree::Upper, &rel, true).map_err(errno)?;
        }
        if lower_has {
            self.stack.create_whiteout(&rel).map_err(errno)?;
        }
        self.detach(&r, &rel, Leaving::Unlinked)?;
        self.names.entry_removed(parent, name);
        self.names.drop_listing(r.id);
        Ok(())
    }

    /// Renames `parent/name` to `newparent/newname` (`flags`: RENAME_NOREPLACE,
    /// RENAME_EXCHANGE). Directories with lower contents are copied up whole first, so
    /// renaming them works (kernel overlayfs without redirect_dir returns EXDEV here).
    ///
    /// Errors: `ENOENT`, `EEXIST` (NOREPLACE), `ENOTEMPTY`, `EINVAL` (RENAME_WHITEOUT or
    /// unknown flags), or the upper dir's errno.
    pub fn rename(
        &self,
        parent: u64,
        name: &OsStr,
        newparent: u64,
        newname: &OsStr,
        flags: u32,
    ) -> OpResult<()> {
        if flags & !(libc::RENAME_NOREPLACE | libc::RENAME_EXCHANGE) != 0 {
            return Err(Errno::EINVAL);
        }
        if whiteout::is_marker_name(newname.as_bytes()) {
            return Err(Errno::EPERM);
        }
        // Copy a directory source with lower contents up while other requests go on (the
        // namespace lock shared); the rename proper below, which holds it exclusively, then
        // finds the tree already up and only moves it.
        {
            let _g = self.names.shared();
            if let (_, Some(src)) = self.resolve_in(parent, name)?
                && src.kind == Kind::Dir
                && src.lowers != 0
            {
                self.bring_up(parent, name, &src)?;
            }
        }
        let _g = self.names.exclusive();
        let exchange = flags & libc::RENAME_EXCHANGE != 0;
        let (pdir, src) = self.resolve_in(parent, name)?;
        let src = src.ok_or(Errno::ENOENT)?;
        let (npdir, dst) = self.resolve_in(newparent, newname)?;
        if dst.is_some() && flags & libc::RENAME_NOREPLACE != 0 {
            return Err(Errno::EEXIST);
        }
        if exchange && dst.is_none() {
            return Err(Errno::ENOENT);
        }
        if dst.as_ref().is_some_and(|d| d.id == src.id) && !exchange {
            return Ok(());
        }
        self.ensure_upper_dir(parent)?;
        self.ensure_upper_dir(newparent)?;
        let srel = child(&pdir.path, name).map_err(errno)?;
        let drel = child(&npdir.path, newname).map_err(errno)?;
        // Bring the source (and for an exchange the target) wholly into the upper dir.
        self.bring_up(parent, name, &src)?;
        if exchange {
            let d = dst.as_ref().ok_or(Errno::ENOENT)?;
            return self.exchange((parent, name, &src, &srel), (newparent, newname, d, &drel));
        }
        let src_lower = self.lower_has(&pdir, name)?;
        let dst_lower = self.lower_has(&npdir, newname)?;
        if src.kind == Kind::Dir && dst_lower {
            self.stack.set_opaque(Tree::Upper, &srel).map_err(errno)?;
        }
        // Clear the target: an emptied directory or whiteout in the upper dir, detach its node.
        if let Some(d) = &dst {
            if d.kind == Kind::Dir {
                self.check_empty(d, &drel)?;
                if d.upper {
                    self.stack.purge_whiteouts(&drel).map_err(errno)?;
                }
                self.names.drop_listing(d.id);
            }
            self.detach(d, &drel, Leaving::Replaced)?;
        }
        let dst_wh = match dst {
            Some(_) => None,
            None => self.stack.upper_whiteout(&drel).map_err(errno)?,
        };
        if src.kind == Kind::Dir && dst_wh == Some(whiteout::Form::Device) {
            self.stack
                .unlink(Tree::Upper, &drel, false)
                .map_err(errno)?;
        }
        if src_lower {
            self.move_leaving_whiteout(&srel, &drel)?;
        } else {
            self.stack
                .rename(Tree::Upper, &srel, Tree::Upper, &drel, 0)
                .map_err(errno)?;
        }
        if dst_wh == Some(whiteout::Form::File) {
            self.stack.remove_marker(&drel).map_err(errno)?;
        }
        self.moved(src.id, src.kind, newparent, newname);
        self.names.entry_removed(parent, name);
        self.names.entry_removed(newparent, newname);
        self.names.entry_added(newparent, newname, src.kind);
        Ok(())
    }

    /// The `RENAME_EXCHANGE` of [`Self::rename`], both entries resolved (`src` at `srel`,
    /// named `name` in `parent`; `d` at `drel`, `newname` in `newparent`) and the source
    /// brought up: brings the target up, makes each directory opaque, exchanges them in the
    /// upper dir and keeps the books.
    ///
    /// Errors: the errno of copy-up or of the upper dir's syscalls.
    fn exchange(
        &self,
        (parent, name, src, srel): (u64, &OsStr, &Resolved, &CString),
        (newparent, newname, d, drel): (u64, &OsStr, &Resolved, &CString),
    ) -> OpResult<()> {
        self.bring_up(newparent, newname, d)?;
        for (r, p) in [(src, srel), (d, drel)] {
            if r.kind == Kind::Dir {
                self.stack.set_opaque(Tree::Upper, p).map_err(errno)?;
            }
        }
        self.stack
            .rename(Tree::Upper, srel, Tree::Upper, drel, libc::RENAME_EXCHANGE)
            .map_err(errno)?;
        self.moved(src.id, src.kind, newparent, newname);
        self.moved(d.id, d.kind, parent, name);
        self.names.entry_added(newparent, newname, src.kind);
        self.names.entry_added(parent, name, d.kind);
        Ok(())
    }

    /// Moves the upper entry `srel`, whose name a lower layer also has, to `drel` and leaves a
    /// whiteout at `srel`: in one `RENAME_WHITEOUT` with the device form, else (or where the
    /// upper filesystem refuses it: `EINVAL`, `EPERM`) a rename and then a whiteout.
    ///
    /// Errors: the errno of the rename or of making the whiteout.
    fn move_leaving_whiteout(&self, srel: &CString, drel: &CString) -> OpResult<()> {
        let device_form = self.stack.whiteout_form() == whiteout::Form::Device;
        match self.stack.rename(
            Tree::Upper,
            srel,
            Tree::Upper,
            drel,
            if device_form {
                libc::RENAME_WHITEOUT
            } else {
                0
            },
        ) {
            Ok(()) if device_form => {}
            Ok(()) => self.stack.create_whiteout(srel).map_err(errno)?,
            Err(e) if matches!(e.raw_os_error(), Some(libc::EINVAL) | Some(libc::EPERM)) => {
                self.stack
                    .rename(Tree::Upper, srel, Tree::Upper, drel, 0)
                    .map_err(errno)?;
                self.stack.create_whiteout(srel).map_err(errno)?;
            }
            Err(e) => return Err(errno(e)),
        }
        Ok(())
    }

    /// Copies a rename source wholly into the upper dir (a directory with its whole merged tree).
    fn bring_up(&self, parent: u64, name: &OsStr, r: &Resolved) -> OpResult<()> {
        if r.upper && (r.kind != Kind::Dir || r.lowers == 0) {
            return Ok(());
        }
        // Make sure a node exists for the entry so copy-up can find its path.
        self.names.remember(parent, name, r);
        let res = (|| {
            self.copy_up(r.id, None)?;
            if r.kind == Kind::Dir {
                let d = Backing::upper_dir(r.lowers, parent, self.names.path(r.id)?);
                self.copy_up_tree(r.id, &d)?;
                self.stack.set_opaque(Tree::Upper, &d.path).map_err(errno)?;
            }
            Ok(())
        })();
        self.names.unremember(r.id);
        res
    }

    /// Keeps the books after `id` moved to (`newparent`, `newname`) (`Names::moved`): it and
    /// everything below it now live only in the upper dir, so their cached fds go; the parent
    /// lookup it gave up is forgotten, and the node index records it.
    fn moved(&self, id: u64, kind: Kind, newparent: u64, newname: &OsStr) {
        let m = self.names.moved(id, kind, newparent, newname);
        if m.unpinned != 0 {
            self.forget(m.unpinned, 1);
        }
        for d in m.below {
            self.data.drop_fd(d);
        }
        self.data.drop_fd(m.id);
        if self.kernel.keeps_index() {
            let path = self.names.path(m.id).ok();
            self.index_node(m.id, path.as_deref());
        }
    }

    /// Called when the kernel drops `n` references to `id`: frees each node that leaves the
    /// table (`Names::forget`) and its cached fd and backing.
    pub fn forget(&self, id: u64, n: u64) {
        self.names.forget(id, n, |gone| self.data.forget(gone));
    }

    /// Removes the kept data (`<workdir>/orphans/<id>`) of the unlinked files the kernel
    /// forgot since the last call. Called at the top of the handler of every request a process
    /// waits for (one atomic load when there is nothing to do), with no lock held: such a
    /// request keeps the mount busy, so the workdir never changes once `umount` returned
    /// (what the kernel forgets just before the unmount stays until the next mount removes
    /// the orphans).
    pub fn reap_orphans(&self) {
        if !self.names.orphans_due() {
            return;
        }
        // Exclusive against lookups: a lookup of another name of an inode computes nlink from
        // the upper (which counts the orphan link) and then subtracts the orphan link if
        // `orphans` still lists it; both must see the same state.
        let _g = self.names.exclusive();
        for id in self.names.take_due_orphans() {
            let o = orphan_name(id);
            if let Ok(st) = self.stack.stat(Tree::Work, &o)
                && st.st_nlink <= 1
            {
                self.names.drop_upper(st.st_ino);
            }
            let _ = self.stack.unlink(Tree::Work, &o, false);
        }
    }
}

impl OverlayFs {
    /// After a content change of node `id` (copied up) by `caller`: drops the set-id bits the
    /// kernel would ([`privs::drop_after_write`]); returns the new permission bits if it did.
    ///
    /// Errors: the errno of opening, `fstat` or `fchmod` of the upper file.
    pub(super) fn drop_setid(&self, id: u64, caller: &Caller) -> OpResult<Option<u32>> {
        // fstat and fchmod need no write access (an append-only file has no read-write fd).
        let f = {
            let _g = self.names.shared();
            self.data_fd(id, false)?
        };
        privs::drop_after_write(&f, caller, |g| self.policy.shown_gid(g)).map_err(errno)
    }

    /// How long the kernel may keep node `id`'s attributes: [`TTL`], or none for a node
    /// superseded by a copy (copy-up by re-lookup): its metadata is the copy's, which changes
    /// through another kernel inode, so the fds still open on it ask every time; none either
    /// while a passthrough open for writing is outstanding, whose writes through a shared
    /// mapping change mtime and ctime behind the kernel's cache
    /// ([`Passthrough::has_writer`](crate::overlay::passthrough::Passthrough::has_writer)).
    pub(super) fn attr_ttl(&self, id: u64) -> std::time::Duration {
        if self.names.successor(id).is_some() || self.data.has_passthrough_writer(id) {
            std::time::Duration::ZERO
        } else {
            TTL
        }
    }

    pub(super) fn fsync_node(&self, id: u64, datasync: bool) -> OpResult<()> {
        if !self.names.is_upper(id).ok_or(Errno::ENOENT)? {
            return Ok(());
        }
        // fsync needs no write access (an append-only file has no read-write fd).
        let f = {
            let _g = self.names.shared();
            self.data_fd(id, false)?
        };
        let r = if datasync {
            f.sync_data()
        } else {
            f.sync_all()
        };
        r.map_err(errno)
    }

    pub(super) fn fallocate_node(
        &self,
        id: u64,
        offset: u64,
        length: u64,
        mode: i32,
    ) -> OpResult<()> {
        let f = {
            let _g = self.names.shared();
            self.copy_up(id, None)?;
            self.data_fd(id, true)?
        };
        crate::sys::fallocate(&f, mode, offset as i64, length as i64).map_err(errno)
    }

    pub(super) fn lseek_node(&self, id: u64, offset: i64, whence: i32) -> OpResult<i64> {
        let f = {
            let _g = self.names.shared();
            self.data_fd(id, false)?
        };
        if !f.complete() && matches!(whence, libc::SEEK_DATA | libc::SEEK_HOLE) {
            // A file still arriving is sparse where its bytes are not here yet; the file it
            // becomes is dense (a layer's objects are written whole).
            let size = crate::sys::fstat(&f).map_err(errno)?.st_size;
            return match (whence, offset) {
                (_, o) if o < 0 => Err(Errno::EINVAL),
                (_, o) if o >= size => Err(Errno::ENXIO),
                (libc::SEEK_DATA, o) => Ok(o),
                _ => Ok(size),
            };
        }
        // The shared fd's position is not used by pread/pwrite.
        crate::sys::lseek(&f, offset, whence).map_err(errno)
    }

    pub(super) fn copy_range_nodes(
        &self,
        id_in: u64,
        off_in: u64,
        id_out: u64,
        off_out: u64,
        len: u64,
    ) -> OpResult<u32> {
        let (fi, fo) = {
            let _g = self.names.shared();
            self.copy_up(id_out, None)?;
            (self.data_fd(id_in, false)?, self.data_fd(id_out, true)?)
        };
        let (mut oi, mut oo) = (off_in as i64, off_out as i64);
        let len = len.min(1 << 30) as usize;
        fi.ready(off_in, len as u64).map_err(errno)?;
        let n = crate::sys::copy_file_range(&fi, &mut oi, &fo, &mut oo, len).map_err(errno)?;
        Ok(n as u32)
    }
}
