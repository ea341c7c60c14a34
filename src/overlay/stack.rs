//! The layer stack: one upper dir over lower dirs, and the one place that applies the merge
//! rules of kernel overlayfs (Documentation/filesystems/overlayfs.rst, "Directories",
//! "whiteouts and opaque directories", "readdir"):
//! * an entry of a higher layer hides the entries of that name below it, unless both are
//!   directories, which merge;
//! * a whiteout (see [`whiteout`]: a 0/0 device, or a `.wh.NAME` file beside the name) hides
//!   the name in every layer below it; `.wh.` names never show;
//! * an opaque directory hides everything below it in lower layers;
//! * a directory's merged names are the union over the layers merged into it, upper first,
//!   each name once, whiteouts left out.
//!
//! [`Stack::lookup`] answers "what is at this name, in which layers", [`Stack::merged_names`]
//! "what does this directory hold", [`Stack::lower_has`] "does a lower layer still show this
//! name" (so removing it needs a whiteout). The FUSE engine (`fs.rs`, `ops.rs`) and promotion
//! (`store/promote.rs`) both go through them; nothing here knows about node ids or FUSE.
//! Layers are addressed by [`Tree`] and paths relative to their roots (`.` for the root), read
//! with `*at` syscalls on directory fds opened once.
//!
//! Also here: the probe of the upper filesystem's features ([`probe_upper`]).

use std::collections::HashSet;
use std::ffi::{CStr, CString, OsStr, OsString};
use std::fs::File;
use std::io;
use std::os::fd::{AsFd, AsRawFd, OwnedFd, RawFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

use super::layer::{DirTree, Layer, LayerDir, fstatat, stat_at};
use super::whiteout;
use crate::error::{Error, Result};
use crate::sys::{self, child};

/// Checks that the upper/work filesystem supports what the overlay needs: d_type, opaque
/// marks (an xattr, or the marker file where xattrs are missing), whiteouts in the form the
/// mount will write ([`whiteout::Form::choose`]) and rename.
///
/// Errors: [`Error::Invalid`] naming the upperdir and the missing feature.
pub fn probe_upper(upper: &Path, work: &Path) -> Result<()> {
    let _ = upper;
    let probe = work.join(".layercache-probe");
    let _ = std::fs::remove_dir_all(&probe);
    std::fs::create_dir(&probe)
        .map_err(|e| Error::invalid(format!("workdir {}: not writable: {e}", work.display())))?;
    let result = (|| -> std::result::Result<(), String> {
        let dir = std::fs::File::open(&probe).map_err(|e| e.to_string())?;
        use std::os::fd::AsFd;
        crate::overlay::whiteout::set_opaque(dir.as_fd())
            .map_err(|e| format!("cannot mark directories opaque ({e})"))?;
        let form = whiteout::Form::choose(dir.as_fd());
        whiteout::create_whiteout_in(dir.as_raw_fd(), c"wh", form)
            .map_err(|e| format!("cannot create whiteouts ({e})"))?;
        let (wh, wh2) = match form {
            whiteout::Form::Device => ("wh", "wh2"),
            whiteout::Form::File => (".wh.wh", ".wh.wh2"),
        };
        let mut saw_dtype = false;
        for ent in std::fs::read_dir(&probe).map_err(|e| e.to_string())? {
            let ent = ent.map_err(|e| e.to_string())?;
            saw_dtype |= ent
                .file_type()
                .map(|t| {
                    use std::os::unix::fs::FileTypeExt;
                    t.is_char_device() || t.is_file()
                })
                .unwrap_or(false);
        }
        if !saw_dtype {
            return Err("no d_type support".into());
        }
        std::fs::rename(probe.join(wh), probe.join(wh2))
            .map_err(|e| format!("rename fails ({e})"))?;
        Ok(())
    })();
    let _ = std::fs::remove_dir_all(&probe);
    result.map_err(|why| {
        Error::invalid(format!(
            "upperdir {}: its filesystem cannot hold an overlay upper layer: {why}",
            upper.display()
        ))
    })
}

/// The file type of a node, from `st_mode`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    /// `S_IFDIR`.
    Dir,
    /// `S_IFREG`.
    File,
    /// `S_IFLNK`.
    Symlink,
    /// Fifos, sockets and device nodes, with their `d_type` (`DT_FIFO`, `DT_SOCK`, `DT_CHR`,
    /// `DT_BLK`), which is `(st_mode & S_IFMT) >> 12`.
    Special(u8),
}

impl Kind {
    /// The kind for an `st_mode`.
    pub fn from_mode(mode: u32) -> Kind {
        match mode & libc::S_IFMT {
            libc::S_IFDIR => Kind::Dir,
            libc::S_IFREG => Kind::File,
            libc::S_IFLNK => Kind::Symlink,
            t => Kind::Special((t >> 12) as u8),
        }
    }
}

/// Which directory tree a relative path is resolved in.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Tree {
    /// The writable upper dir.
    Upper,
    /// Lower dir number `i` (0 = topmost).
    Lower(u8),
    /// The workdir (copy-up staging, orphans).
    Work,
}

/// The layer stack: directory fds of the upper dir, the workdir and every lower dir, opened
/// before mounting so the daemon never resolves paths through its own mountpoint, with the
/// `*at` syscalls the engine needs and the merge rules (see the module docs).
pub struct Stack {
    upper: Option<DirTree>,
    work: Option<DirTree>,
    /// The lower layers, top first, read only through [`Layer`] (`layer.rs`).
    lowers: Vec<Box<dyn Layer>>,
    /// How whiteouts are written in the upper dir (both forms are always read).
    form: whiteout::Form,
}

/// The lower dirs at `paths`, top first, each a [`DirTree`].
///
/// Errors: the `open(2)` errno of the first that fails.
fn open_lowers<'p>(paths: impl Iterator<Item = &'p Path>) -> io::Result<Vec<Box<dyn Layer>>> {
    paths
        .map(|p| Ok(Box::new(DirTree::new(open_dir(p)?, true)) as Box<dyn Layer>))
        .collect()
}

fn open_dir(p: &Path) -> io::Result<OwnedFd> {
    let c = CString::new(p.as_os_str().as_bytes())
        .map_err(|_| io::Error::from_raw_os_error(libc::EINVAL))?;
    sys::openat(
        libc::AT_FDCWD,
        &c,
        libc::O_RDONLY | libc::O_DIRECTORY | libc::O_CLOEXEC,
        0,
    )
}

impl Stack {
    /// Makes every lower layer read through a private noatime view of it
    /// ([`crate::sys::noatime_view`]), so that files opened there — FUSE passthrough backing
    /// files included, which the kernel opens with the reader's flags, not `O_NOATIME` — never
    /// write a lower inode's atime. The views' mount fds are returned: keep them for the life
    /// of the stack.
    ///
    /// Errors: the errno of making a view (the stack is unchanged then).
    pub fn lowers_noatime(&mut self) -> io::Result<Vec<OwnedFd>> {
        let mut views = Vec::new();
        let mut layers: Vec<Option<Box<dyn Layer>>> = Vec::new();
        for l in &self.lowers {
            match l.noatime_view()? {
                Some((view, layer)) => {
                    views.push(view);
                    layers.push(Some(layer));
                }
                None => layers.push(None),
            }
        }
        for (l, new) in self.lowers.iter_mut().zip(layers) {
            if let Some(new) = new {
                *l = new;
            }
        }
        Ok(views)
    }

    /// Makes the upper dir (and the workdir, `work`, when the stack has one) be reached
    /// through one private view of the mount holding them ([`crate::sys::atime_view`]) with
    /// atime rule `rule`, so that the kernel applies the overlay mount's own atime rule to
    /// every read of an upper file or directory — the daemon's reads and FUSE passthrough
    /// reads alike — instead of the rule of the mount the upper dir happens to sit on. Kernel
    /// overlayfs does the same with its private clone of the upper mount (it clears the clone's
    /// atime flags and applies its own mount's rule in `ovl_file_accessed`,
    /// fs/overlayfs/file.c). `upper` and `work` are the directories' paths; both are reached
    /// through one clone (of their deepest common directory) so that renames between them
    /// stay within one mount. The view's mount fd is returned: keep it for the life of the
    /// stack.
    ///
    /// Errors: the errno of making the view; `EXDEV` when a path does not reach the directory
    /// already open (another mount in between). The stack is unchanged then.
    pub fn upper_atime(
        &mut self,
        upper: &Path,
        work: Option<&Path>,
        rule: crate::sys::AtimeRule,
    ) -> io::Result<OwnedFd> {
        let upper = std::fs::canonicalize(upper)?;
        let work = work.map(std::fs::canonicalize).transpose()?;
        let base: PathBuf = match &work {
            Some(w) => upper
                .components()
                .zip(w.components())
                .take_while(|(a, b)| a == b)
                .map(|(a, _)| a)
                .collect(),
            None => upper.clone(),
        };
        let (tree, dir) = crate::sys::atime_view(open_dir(&base)?.as_fd(), rule)?;
        let reopen = |path: &Path, open: Option<&DirTree>| -> io::Result<Option<OwnedFd>> {
            let Some(open) = open else { return Ok(None) };
            let rel = path.strip_prefix(&base).unwrap_or(Path::new(""));
            let rel = if rel.as_os_str().is_empty() {
                CString::from(c".")
            } else {
                CString::new(rel.as_os_str().as_bytes())
                    .map_err(|_| io::Error::from_raw_os_error(libc::EINVAL))?
            };
            let fd = crate::sys::openat(
                dir.as_raw_fd(),
                &rel,
                libc::O_RDONLY | libc::O_DIRECTORY | libc::O_CLOEXEC,
                0,
            )?;
            let (a, b) = (crate::sys::fstat(&fd)?, crate::sys::fstat(&open.root())?);
            if (a.st_dev, a.st_ino) != (b.st_dev, b.st_ino) {
                return Err(io::Error::from_raw_os_error(libc::EXDEV));
            }
            Ok(Some(fd))
        };
        let new_upper = reopen(&upper, self.upper.as_ref())?;
        let new_work = match &work {
            Some(w) => reopen(w, self.work.as_ref())?,
            None => None,
        };
        if let Some(fd) = new_upper {
            self.upper = Some(DirTree::new(fd, false));
        }
        if let Some(fd) = new_work {
            self.work = Some(DirTree::new(fd, false));
        }
        Ok(tree)
    }

    /// Opens the layers of a mount: `lowers` top first, the upper dir and the workdir.
    /// Whiteouts are written in the form [`whiteout::Form::choose`] picks for the workdir's
    /// filesystem.
    ///
    /// Errors: the `open(2)` errno of the first directory that fails.
    pub fn new(lowers: &[PathBuf], upper: &Path, work: &Path) -> io::Result<Stack> {
        let work = open_dir(work)?;
        Ok(Stack {
            upper: Some(DirTree::new(open_dir(upper)?, false)),
            form: whiteout::Form::choose(work.as_fd()),
            work: Some(DirTree::new(work, false)),
            lowers: open_lowers(lowers.iter().map(|p| p.as_path()))?,
        })
    }

    /// How this stack writes whiteouts in its upper dir.
    pub fn whiteout_form(&self) -> whiteout::Form {
        self.form
    }

    /// Opens a stack for reading merged trees only (promotion): an optional upper dir over
    /// `lowers` (top first, at most 64), no workdir. Operations on [`Tree::Work`] (or on a
    /// missing upper) fail with `EBADF`.
    ///
    /// Errors: the `open(2)` errno of the first directory that fails; `EINVAL` for more than
    /// 64 lowers.
    pub fn open_merge(upper: Option<&Path>, lowers: &[&Path]) -> io::Result<Stack> {
        if lowers.len() > 64 {
            return Err(io::Error::from_raw_os_error(libc::EINVAL));
        }
        Ok(Stack {
            upper: upper
                .map(|u| Ok::<_, io::Error>(DirTree::new(open_dir(u)?, false)))
                .transpose()?,
            work: None,
            lowers: open_lowers(lowers.iter().copied())?,
            form: whiteout::Form::Device,
        })
    }

    /// The lowers merged into the root directory: every lower, whatever the upper root's
    /// opaque mark says — kernel overlayfs builds its root from all layers and never reads the
    /// root's opaque xattr (fs/overlayfs/super.c, `ovl_get_root`). The mount and promotion
    /// both start from this.
    pub fn root_lowers(&self) -> u64 {
        self.all_lowers()
    }

    /// The mask of every lower layer (bit i = lower i).
    pub fn all_lowers(&self) -> u64 {
        match self.lowers.len() {
            0 => 0,
            64.. => u64::MAX,
            n => (1u64 << n) - 1,
        }
    }

    /// Replaces lower `index` (0 = topmost) with `layer`.
    ///
    /// Errors: `EINVAL` for an index the stack does not have.
    pub fn set_lower(&mut self, index: usize, layer: Box<dyn Layer>) -> io::Result<()> {
        match self.lowers.get_mut(index) {
            Some(l) => {
                *l = layer;
                Ok(())
            }
            None => Err(io::Error::from_raw_os_error(libc::EINVAL)),
        }
    }

    /// True when the stack has an upper dir.
    pub fn has_upper(&self) -> bool {
        self.upper.is_some()
    }

    /// The directory fd of the upper dir or the workdir (`tree`), for the `*at` syscalls that
    /// write; -1, which every syscall refuses with `EBADF`, for a tree this stack does not
    /// have and for a lower layer (read only through `Stack::layer`).
    pub fn fd(&self, tree: Tree) -> RawFd {
        let t = match tree {
            Tree::Upper => self.upper.as_ref(),
            Tree::Work => self.work.as_ref(),
            Tree::Lower(_) => None,
        };
        t.map_or(-1, |t| t.fd())
    }

    /// The read side of layer `tree` ([`Layer`]).
    ///
    /// Errors: `EBADF` for a tree this stack does not have.
    pub(super) fn layer(&self, tree: Tree) -> io::Result<&dyn Layer> {
        let l: Option<&dyn Layer> = match tree {
            Tree::Upper => self.upper.as_ref().map(|t| t as &dyn Layer),
            Tree::Work => self.work.as_ref().map(|t| t as &dyn Layer),
            Tree::Lower(i) => self.lowers.get(i as usize).map(|l| l.as_ref()),
        };
        l.ok_or_else(|| io::Error::from_raw_os_error(libc::EBADF))
    }

    /// `fstatat(layer, rel, AT_SYMLINK_NOFOLLOW)`. Errors: its errno (`ENOENT`, `ENOTDIR`…).
    pub fn stat(&self, layer: Tree, rel: &CStr) -> io::Result<libc::stat> {
        match layer {
            Tree::Lower(_) => self.layer(layer)?.stat(rel),
            _ => fstatat(self.fd(layer), rel),
        }
    }

    /// Like [`Stack::stat`] but `Ok(None)` for `ENOENT`/`ENOTDIR`.
    pub fn stat_opt(&self, layer: Tree, rel: &CStr) -> io::Result<Option<libc::stat>> {
        match layer {
            Tree::Lower(_) => match self.layer(layer)?.stat(rel) {
                Ok(st) => Ok(Some(st)),
                Err(e) if matches!(e.raw_os_error(), Some(libc::ENOENT) | Some(libc::ENOTDIR)) => {
                    Ok(None)
                }
                Err(e) => Err(e),
            },
            _ => stat_at(self.fd(layer), rel),
        }
    }

    /// `openat(layer, rel, flags | O_CLOEXEC | O_NOFOLLOW, mode)` as a `File`; a read-only
    /// open in a lower layer adds `O_NOATIME` where allowed (`DirTree::open_mode`; a lower
    /// layer is opened through `Layer::open`, `mode` unused: nothing is created there).
    ///
    /// Errors: the `openat` errno; `EBADF` for a tree this stack does not have.
    pub fn open(
        &self,
        layer: Tree,
        rel: &CStr,
        flags: libc::c_int,
        mode: libc::mode_t,
    ) -> io::Result<File> {
        let tree = match layer {
            Tree::Upper => self.upper.as_ref(),
            Tree::Work => self.work.as_ref(),
            Tree::Lower(_) => return self.layer(layer)?.open(rel, flags),
        };
        match tree {
            Some(t) => t.open_mode(rel, flags, mode),
            None => Err(io::Error::from_raw_os_error(libc::EBADF)),
        }
    }

    /// The data file of `rel` in `layer` for READs: a lower layer's through
    /// [`Layer::open_data`] (which may hand back a file still arriving, with its gate), the
    /// upper dir's or the workdir's as [`Stack::open`] opens it, complete.
    ///
    /// Errors: as [`Stack::open`].
    pub fn open_data(
        &self,
        layer: Tree,
        rel: &CStr,
        flags: libc::c_int,
    ) -> io::Result<super::layer::LowerData> {
        if let Tree::Lower(_) = layer {
            return self.layer(layer)?.open_data(rel, flags);
        }
        Ok(super::layer::LowerData {
            file: self.open(layer, rel, flags, 0)?,
            gate: None,
            fstat_is_meta: true,
        })
    }

    /// `/proc/self/fd/<root>/<rel>` of the upper dir or the workdir: a path for the xattr
    /// syscalls that have no *at form (a lower layer's xattrs are read with [`Stack::xattr`]).
    pub fn proc_path(&self, layer: Tree, rel: &CStr) -> CString {
        super::layer::proc_path(self.fd(layer), rel)
    }

    /// The value of xattr `name` of `rel` in `layer` into `buf` (`Layer::xattr`).
    ///
    /// Errors: as `Layer::xattr`; `EBADF` for a tree this stack does not have.
    pub fn xattr(&self, layer: Tree, rel: &CStr, name: &CStr, buf: &mut [u8]) -> io::Result<usize> {
        self.layer(layer)?.xattr(rel, name, buf)
    }

    /// The xattr names of `rel` in `layer` (`Layer::xattr_names`).
    ///
    /// Errors: as `Layer::xattr_names`; `EBADF` for a tree this stack does not have.
    pub fn xattr_names(&self, layer: Tree, rel: &CStr) -> io::Result<Vec<Vec<u8>>> {
        self.layer(layer)?.xattr_names(rel)
    }

    /// `statx` of `rel` in `layer` for `mask` (`Layer::statx`).
    ///
    /// Errors: the `statx` errno; `EBADF` for a tree this stack does not have.
    pub fn statx(&self, layer: Tree, rel: &CStr, mask: u32) -> io::Result<libc::statx> {
        self.layer(layer)?.statx(rel, mask)
    }

    /// `fstatvfs` of the filesystem `layer` is on (`Layer::statvfs`).
    ///
    /// Errors: the `fstatvfs` errno; `EBADF` for a tree this stack does not have.
    pub fn statvfs(&self, layer: Tree) -> io::Result<libc::statvfs> {
        self.layer(layer)?.statvfs()
    }

    /// `mkdirat`. Errors: its errno.
    pub fn mkdir(&self, layer: Tree, rel: &CStr, mode: u32) -> io::Result<()> {
        sys::mkdirat(self.fd(layer), rel, mode)
    }

    /// `mknodat`. Errors: its errno.
    pub fn mknod(&self, layer: Tree, rel: &CStr, mode: u32, rdev: u64) -> io::Result<()> {
        sys::mknodat(self.fd(layer), rel, mode, rdev)
    }

    /// `symlinkat(target, layer, rel)`. Errors: its errno.
    pub fn symlink(&self, target: &CStr, layer: Tree, rel: &CStr) -> io::Result<()> {
        sys::symlinkat(target, self.fd(layer), rel)
    }

    /// The target of symlink `rel` in `layer` (`Layer::readlink`). Errors: the
    /// `readlinkat` errno; `EBADF` for a tree this stack does not have.
    pub fn readlink(&self, layer: Tree, rel: &CStr) -> io::Result<Vec<u8>> {
        self.layer(layer)?.readlink(rel)
    }

    /// `unlinkat` (with `AT_REMOVEDIR` when `dir`). Errors: its errno.
    pub fn unlink(&self, layer: Tree, rel: &CStr, dir: bool) -> io::Result<()> {
        let flags = if dir { libc::AT_REMOVEDIR } else { 0 };
        sys::unlinkat(self.fd(layer), rel, flags)
    }

    /// `renameat2(from_layer/from, to_layer/to, flags)`. Errors: its errno.
    pub fn rename(&self, fl: Tree, from: &CStr, tl: Tree, to: &CStr, flags: u32) -> io::Result<()> {
        sys::renameat2(self.fd(fl), from, self.fd(tl), to, flags)
    }

    /// `linkat(from_layer/from, to_layer/to, 0)`. Errors: its errno (`EMLINK`…).
    pub fn link(&self, fl: Tree, from: &CStr, tl: Tree, to: &CStr) -> io::Result<()> {
        sys::linkat(self.fd(fl), from, self.fd(tl), to, 0)
    }

    /// Gives the unnamed file `file` (opened `O_TMPFILE`) the name `to` in `tl`:
    /// `linkat` of its `/proc/self/fd/N` with `AT_SYMLINK_FOLLOW` (open(2), "O_TMPFILE"; the
    /// `AT_EMPTY_PATH` form needs CAP_DAC_READ_SEARCH). Errors: its errno (`ENOENT` without
    /// /proc, `EEXIST`…).
    pub fn link_unnamed(&self, file: &File, tl: Tree, to: &CStr) -> io::Result<()> {
        use std::os::fd::AsRawFd;
        let proc = std::ffi::CString::new(format!("/proc/self/fd/{}", file.as_raw_fd()))
            .map_err(|_| io::Error::from_raw_os_error(libc::EINVAL))?;
        sys::linkat(
            libc::AT_FDCWD,
            &proc,
            self.fd(tl),
            to,
            libc::AT_SYMLINK_FOLLOW,
        )
    }

    /// `fchownat(…, AT_SYMLINK_NOFOLLOW)`; `u32::MAX` leaves an id unchanged. Errors: its errno.
    pub fn chown(&self, layer: Tree, rel: &CStr, uid: u32, gid: u32) -> io::Result<()> {
        sys::fchownat(self.fd(layer), rel, uid, gid, libc::AT_SYMLINK_NOFOLLOW)
    }

    /// `fchmodat` (never on a symlink). Errors: its errno.
    pub fn chmod(&self, layer: Tree, rel: &CStr, mode: u32) -> io::Result<()> {
        sys::fchmodat(self.fd(layer), rel, mode, 0)
    }

    /// `utimensat(…, AT_SYMLINK_NOFOLLOW)` with [atime, mtime]. Errors: its errno.
    pub fn utimens(&self, layer: Tree, rel: &CStr, times: &[libc::timespec; 2]) -> io::Result<()> {
        sys::utimensat(self.fd(layer), rel, times, libc::AT_SYMLINK_NOFOLLOW)
    }

    /// Names in the directory `rel` of `layer` with their `d_type` (`DT_UNKNOWN` possible),
    /// without `.` and `..`. Errors: the `openat`/`getdents` errno.
    pub fn read_dir(&self, layer: Tree, rel: &CStr) -> io::Result<Vec<(OsString, u8)>> {
        let dir = self.open(layer, rel, libc::O_RDONLY | libc::O_DIRECTORY, 0)?;
        let fd: OwnedFd = dir.into();
        let mut d = rustix::fs::Dir::new(fd)?;
        let mut out = Vec::new();
        while let Some(ent) = d.read() {
            let ent = ent?;
            let name = ent.file_name().to_bytes();
            if name == b"." || name == b".." {
                continue;
            }
            use rustix::fs::FileType as T;
            let dtype = match ent.file_type() {
                T::Directory => libc::DT_DIR,
                T::RegularFile => libc::DT_REG,
                T::Symlink => libc::DT_LNK,
                T::CharacterDevice => libc::DT_CHR,
                T::BlockDevice => libc::DT_BLK,
                T::Fifo => libc::DT_FIFO,
                T::Socket => libc::DT_SOCK,
                T::Unknown => libc::DT_UNKNOWN,
            };
            out.push((OsStr::from_bytes(name).to_os_string(), dtype));
        }
        Ok(out)
    }
}

impl Stack {
    /// A name other than `except` in directory `rel` of `layer` whose entry has inode number
    /// `ino` (another hard link of that inode in the same directory), if there is one: one
    /// pass of getdents, no stat.
    ///
    /// Errors: the `openat`/`getdents` errno.
    pub fn other_link(
        &self,
        layer: Tree,
        rel: &CStr,
        ino: u64,
        except: &OsStr,
    ) -> io::Result<Option<OsString>> {
        let dir = self.open(layer, rel, libc::O_RDONLY | libc::O_DIRECTORY, 0)?;
        let fd: OwnedFd = dir.into();
        let mut d = rustix::fs::Dir::new(fd)?;
        while let Some(ent) = d.read() {
            let ent = ent?;
            let name = OsStr::from_bytes(ent.file_name().to_bytes());
            if ent.ino() == ino && name != except && name != "." && name != ".." {
                return Ok(Some(name.to_os_string()));
            }
        }
        Ok(None)
    }
}

/// The topmost (lowest-numbered) layer in a lower mask.
pub fn top_lower(mask: u64) -> Option<u8> {
    (mask != 0).then(|| mask.trailing_zeros() as u8)
}

/// The lower layers of `mask`, top first.
fn lowers_of(mut mask: u64) -> impl Iterator<Item = u8> {
    std::iter::from_fn(move || {
        let l = top_lower(mask)?;
        mask &= mask - 1;
        Some(l)
    })
}

/// What a name holds in the merged view, as [`Stack::lookup`] found it.
#[derive(Clone, Debug)]
pub struct Entry {
    /// File type.
    pub kind: Kind,
    /// Present in the upper dir (data and metadata come from there).
    pub upper: bool,
    /// Bit i set: lower layer i holds it — for a directory every lower directory merged into
    /// it, for anything else the one lower that provides it (0 when the upper does).
    pub lowers: u64,
    /// Inode number of the entry in the top layer of `lowers` (its identity when it is a
    /// merged directory); `None` when `lowers` is 0.
    pub lower_ino: Option<u64>,
    /// `stat` of the layer that provides data and metadata: the upper if present, else the
    /// top lower.
    pub st: libc::stat,
}

impl Stack {
    /// True when `tree` records a whiteout of `rel`, in either form ([`whiteout::whited_out`]).
    ///
    /// Errors: the `fstatat` errno other than `ENOENT`/`ENOTDIR` (which mean no).
    pub fn is_whiteout(&self, tree: Tree, rel: &CStr) -> io::Result<bool> {
        let st = self.stat_opt(tree, rel)?;
        self.layer(tree)?.whited_out(rel, st.as_ref())
    }

    /// The form of the upper dir's whiteout of `rel`, if it has one: a 0/0 device occupies
    /// the name itself (a new entry replaces it), a `.wh.` file lies beside it (a new entry
    /// goes in beside it and the marker is then removed).
    ///
    /// Errors: as [`Stack::is_whiteout`].
    pub fn upper_whiteout(&self, rel: &CStr) -> io::Result<Option<whiteout::Form>> {
        let st = self.stat_opt(Tree::Upper, rel)?;
        Ok(match st {
            Some(st) if whiteout::is_whiteout_stat(&st) => Some(whiteout::Form::Device),
            Some(_) => None,
            None => whiteout::whited_out(self.fd(Tree::Upper), rel, None)?
                .then_some(whiteout::Form::File),
        })
    }

    /// Removes the upper dir's `.wh.` file whiteout of `rel`, if any ([`whiteout::remove_marker`]).
    ///
    /// Errors: the `unlinkat` errno other than `ENOENT`.
    pub fn remove_marker(&self, rel: &CStr) -> io::Result<()> {
        whiteout::remove_marker(self.fd(Tree::Upper), rel)
    }

    /// True when the directory `rel` of `tree` is opaque (a symlink is never followed).
    ///
    /// Errors: as [`whiteout::dir_is_opaque_at`].
    pub fn is_opaque(&self, tree: Tree, rel: &CStr) -> io::Result<bool> {
        self.layer(tree)?.is_opaque(rel)
    }

    /// Marks the directory `rel` of `tree` opaque.
    ///
    /// Errors: the `openat` errno (`ENOTDIR`…) or as [`whiteout::set_opaque`].
    pub fn set_opaque(&self, tree: Tree, rel: &CStr) -> io::Result<()> {
        let d = self.open(tree, rel, libc::O_RDONLY | libc::O_DIRECTORY, 0)?;
        whiteout::set_opaque(d.as_fd())
    }

    /// Creates a whiteout of `rel` in the upper dir, in the stack's form.
    ///
    /// Errors: as [`whiteout::create_whiteout_in`] (`EEXIST` if `rel` exists, device form).
    pub fn create_whiteout(&self, rel: &CStr) -> io::Result<()> {
        whiteout::create_whiteout_in(self.fd(Tree::Upper), rel, self.form)
    }

    /// What is at `rel` (a child of a directory in the upper dir when `upper`, merged from the
    /// lower layers `lowers`) in the merged view; `None` when nothing is, or a whiteout hides it.
    ///
    /// The rules: an upper whiteout hides the name; an upper non-directory, or an upper
    /// directory that is opaque or has no lower to merge, stands alone; otherwise the lowers
    /// are searched top down — a whiteout ends the search, the first non-directory is the entry
    /// (when nothing is above it) and ends it, directories merge until an opaque one or a
    /// non-directory below them.
    ///
    /// Errors: the errno of an `fstatat` or of reading an opaque marker (not `ENOENT`/`ENOTDIR`).
    pub fn lookup(&self, upper: bool, lowers: u64, rel: &CStr) -> io::Result<Option<Entry>> {
        let name = rel
            .to_bytes()
            .rsplit(|&c| c == b'/')
            .next()
            .unwrap_or_default();
        if whiteout::is_marker_name(name) {
            return Ok(None);
        }
        merge_lookup(
            upper,
            lowers,
            |t| self.stat_opt(t, rel),
            |t| self.layer(t)?.whited_out(rel, None),
            |t| self.is_opaque(t, rel),
        )
    }

    /// True when a lower layer of `lowers` shows an entry at `rel` (the topmost that has the
    /// name decides: a whiteout there means no) — removing the name then needs a whiteout.
    ///
    /// Errors: the `fstatat` errno other than `ENOENT`/`ENOTDIR`.
    pub fn lower_has(&self, lowers: u64, rel: &CStr) -> io::Result<bool> {
        let mut layers = lowers_of(lowers).peekable();
        while let Some(l) = layers.next() {
            if let Some(st) = self.stat_opt(Tree::Lower(l), rel)? {
                return Ok(!whiteout::is_whiteout_stat(&st));
            }
            if layers.peek().is_some() && self.layer(Tree::Lower(l))?.whited_out(rel, None)? {
                return Ok(false);
            }
        }
        Ok(false)
    }

    /// The merged names of the directory at `rel`, in the upper dir when `upper` and merged
    /// from the lower layers `lowers`, with their kinds: upper first, then each lower top
    /// down, each name once, whiteouts left out. A layer where `rel` is missing or not a
    /// directory adds nothing.
    ///
    /// Errors: the `openat`/`getdents`/`fstatat` errno of a layer.
    pub fn merged_names(
        &self,
        upper: bool,
        lowers: u64,
        rel: &CStr,
    ) -> io::Result<Vec<(OsString, Kind)>> {
        DirFds::new(self, upper, lowers, rel).merged_names()
    }

    /// Removes the whiteouts inside the upper directory `rel` (0/0 devices, `.wh.` files and
    /// the `.wh..wh..opq` marker), so that it can be removed or replaced (it must hold nothing
    /// else).
    ///
    /// Errors: `ENOTEMPTY` for any other entry, or the errno of reading or unlinking.
    pub fn purge_whiteouts(&self, rel: &CStr) -> io::Result<()> {
        for (name, _) in self.read_dir(Tree::Upper, rel)? {
            let p = child(rel, &name)?;
            let marker = whiteout::is_marker_name(name.as_bytes());
            if !marker
                && !self
                    .stat_opt(Tree::Upper, &p)?
                    .is_some_and(|st| whiteout::is_whiteout_stat(&st))
            {
                return Err(io::Error::from_raw_os_error(libc::ENOTEMPTY));
            }
            self.unlink(Tree::Upper, &p, false)?;
        }
        Ok(())
    }
}

/// The merge rules of [`Stack::lookup`] over one name, whose layers are read through `stat`
/// (`fstatat` of the name in a tree, `None` for `ENOENT`/`ENOTDIR`), `marked` (whether a tree
/// where the name is absent has a `.wh.` file whiteout of it, [`whiteout::whited_out`]; asked
/// only where a layer below could show the name) and `opaque` (whether the name, a directory
/// in that tree, is opaque): shared by the lookup by path from the layer roots and the lookup
/// in a directory whose layers are open ([`DirFds::lookup`]).
fn merge_lookup(
    upper: bool,
    lowers: u64,
    stat: impl Fn(Tree) -> io::Result<Option<libc::stat>>,
    marked: impl Fn(Tree) -> io::Result<bool>,
    opaque: impl Fn(Tree) -> io::Result<bool>,
) -> io::Result<Option<Entry>> {
    let mut upper_st: Option<libc::stat> = None;
    let upper_st_now = if upper { stat(Tree::Upper)? } else { None };
    if upper && upper_st_now.is_none() && lowers != 0 && marked(Tree::Upper)? {
        return Ok(None);
    }
    if let Some(st) = upper_st_now {
        if whiteout::is_whiteout_stat(&st) {
            return Ok(None);
        }
        let kind = Kind::from_mode(st.st_mode);
        if kind != Kind::Dir || lowers == 0 || opaque(Tree::Upper)? {
            return Ok(Some(Entry {
                kind,
                upper: true,
                lowers: 0,
                lower_ino: None,
                st,
            }));
        }
        upper_st = Some(st);
    }
    let mut found = 0u64;
    let mut first: Option<libc::stat> = None;
    let mut layers = lowers_of(lowers).peekable();
    while let Some(l) = layers.next() {
        let Some(st) = stat(Tree::Lower(l))? else {
            if layers.peek().is_some() && marked(Tree::Lower(l))? {
                break;
            }
            continue;
        };
        if whiteout::is_whiteout_stat(&st) {
            break;
        }
        if Kind::from_mode(st.st_mode) != Kind::Dir {
            if upper_st.is_none() && first.is_none() {
                first = Some(st);
                found = 1 << l;
            }
            break;
        }
        found |= 1 << l;
        first.get_or_insert(st);
        if layers.peek().is_some() && opaque(Tree::Lower(l))? {
            break;
        }
    }
    Ok(match (upper_st, first) {
        (Some(st), first) => Some(Entry {
            kind: Kind::Dir,
            upper: true,
            lowers: found,
            lower_ino: first.map(|f| f.st_ino),
            st,
        }),
        (None, Some(st)) => Some(Entry {
            kind: Kind::from_mode(st.st_mode),
            upper: false,
            lowers: found,
            lower_ino: Some(st.st_ino),
            st,
        }),
        (None, None) => None,
    })
}

/// A directory of [`DirFds`] in one tree: the tree, the directory there (`None` when it is not
/// a directory there), and whether it was listed.
type OpenDir = (Tree, Option<Box<dyn LayerDir>>, bool);

/// One merged directory — `rel` (relative to the layer roots), in the upper dir when `upper`,
/// merged from the lower layers `lowers` — with its directory fd in each of those layers,
/// opened on first use (`O_DIRECTORY | O_NOFOLLOW`) and closed on drop. Looking up a name or
/// listing the directory through it costs one `fstatat`/`getdents64` per layer relative to the
/// open directory, instead of a walk of the whole path from each layer root per name: what a
/// READDIRPLUS, which resolves every name of a directory, is answered with. It follows the same
/// merge rules as [`Stack::lookup`] and [`Stack::merged_names`] (they are built on it or share
/// [`merge_lookup`]); a layer where `rel` is missing or not a directory holds no name.
///
/// The fds are taken while the caller holds the namespace lock (the directory cannot be moved
/// meanwhile), and kept only for that one operation.
pub struct DirFds<'a> {
    stack: &'a Stack,
    rel: &'a CStr,
    /// Present in the upper dir.
    pub upper: bool,
    /// The lower layers merged into it.
    pub lowers: u64,
    /// Opened so far: the tree, the directory there (`Layer::open_dir`; `None` when `rel`
    /// is not a directory there), and whether its listing was read (the next read starts
    /// over).
    fds: std::cell::RefCell<Vec<OpenDir>>,
}

impl<'a> DirFds<'a> {
    /// The directory `rel` of `stack`, present in the upper dir when `upper` and in the lower
    /// layers `lowers`; nothing is opened yet.
    pub fn new(stack: &'a Stack, upper: bool, lowers: u64, rel: &'a CStr) -> DirFds<'a> {
        DirFds {
            stack,
            rel,
            upper,
            lowers,
            fds: Default::default(),
        }
    }

    /// Runs `f` with the directory in `tree` (`None` when it is not a directory there),
    /// opening it first if needed; `list` marks it as listed (the bool given to `f` says
    /// whether it was before).
    ///
    /// Errors: the open's errno other than `ENOENT`/`ENOTDIR`, or `f`'s.
    fn with_dir<R>(
        &self,
        tree: Tree,
        list: bool,
        f: impl FnOnce(Option<&dyn LayerDir>, bool) -> io::Result<R>,
    ) -> io::Result<R> {
        let mut fds = self.fds.borrow_mut();
        let i = match fds.iter().position(|(t, _, _)| *t == tree) {
            Some(i) => i,
            None => {
                let dir = self.stack.layer(tree)?.open_dir(self.rel)?;
                fds.push((tree, dir, false));
                fds.len() - 1
            }
        };
        let (_, dir, listed) = &mut fds[i];
        let was = *listed;
        *listed |= list;
        f(dir.as_deref(), was)
    }

    /// `fstatat` of `name` in this directory of `tree`; `None` when absent (or the directory
    /// is not there). Errors: the `openat`/`fstatat` errno other than `ENOENT`/`ENOTDIR`.
    fn stat_opt(&self, tree: Tree, name: &CStr) -> io::Result<Option<libc::stat>> {
        self.with_dir(tree, false, |d, _| match d {
            Some(d) => d.stat(name),
            None => Ok(None),
        })
    }

    /// Whether `name`, a directory in this directory of `tree`, is opaque (see
    /// [`Stack::is_opaque`]).
    fn is_opaque(&self, tree: Tree, name: &CStr) -> io::Result<bool> {
        self.with_dir(tree, false, |d, _| match d {
            Some(d) => d.is_opaque(name),
            None => Err(io::Error::from_raw_os_error(libc::ENOENT)),
        })
    }

    /// What is at `name` in this directory in the merged view, as [`Stack::lookup`] of its
    /// path would find it; `None` when nothing is, or a whiteout hides it.
    ///
    /// Errors: as [`Stack::lookup`].
    pub fn lookup(&self, name: &CStr) -> io::Result<Option<Entry>> {
        if whiteout::is_marker_name(name.to_bytes()) {
            return Ok(None);
        }
        merge_lookup(
            self.upper,
            self.lowers,
            |t| self.stat_opt(t, name),
            |t| self.marked(t, name),
            |t| self.is_opaque(t, name),
        )
    }

    /// Whether this directory of `tree` holds a `.wh.` file whiteout of `name` (false when
    /// the directory is not there). Errors: as [`whiteout::whited_out`].
    fn marked(&self, tree: Tree, name: &CStr) -> io::Result<bool> {
        self.with_dir(tree, false, |d, _| match d {
            Some(d) => d.marked(name),
            None => Ok(false),
        })
    }

    /// The merged names of this directory with their kinds, as [`Stack::merged_names`]
    /// describes them.
    ///
    /// Errors: the `openat`/`getdents64`/`fstatat` errno of a layer.
    pub fn merged_names(&self) -> io::Result<Vec<(OsString, Kind)>> {
        let trees: Vec<Tree> = self
            .upper
            .then_some(Tree::Upper)
            .into_iter()
            .chain(lowers_of(self.lowers).map(Tree::Lower))
            .collect();
        let multi = trees.len() > 1;
        let mut seen: HashSet<OsString> = HashSet::new();
        let mut out = Vec::new();
        for tree in trees {
            let names = self.with_dir(tree, true, |d, was| match d {
                Some(d) => d.names(was),
                None => Ok(Vec::new()),
            })?;
            // `.wh.NAME` files hide NAME in the layers below this one (not in this one).
            let mut hidden: Vec<OsString> = Vec::new();
            for (name, dtype) in names {
                if let Some(target) = name.as_bytes().strip_prefix(whiteout::WH_PREFIX) {
                    if multi {
                        hidden.push(OsStr::from_bytes(target).to_os_string());
                    }
                    continue;
                }
                if multi && seen.contains(&name) {
                    continue;
                }
                let kind = match kind_of_dtype(dtype) {
                    Some(k) => k,
                    None => {
                        let cname = crate::sys::cstr(&name)?;
                        let st = self
                            .stat_opt(tree, &cname)?
                            .ok_or_else(|| io::Error::from_raw_os_error(libc::ENOENT))?;
                        if whiteout::is_whiteout_stat(&st) {
                            if multi {
                                seen.insert(name);
                            }
                            continue;
                        }
                        Kind::from_mode(st.st_mode)
                    }
                };
                if multi {
                    seen.insert(name.clone());
                }
                out.push((name, kind));
            }
            seen.extend(hidden);
        }
        Ok(out)
    }
}

/// The kind for a `d_type`, `None` when a `stat` must tell (unknown, or a character device,
/// which may be a whiteout).
fn kind_of_dtype(t: u8) -> Option<Kind> {
    match t {
        libc::DT_DIR => Some(Kind::Dir),
        libc::DT_REG => Some(Kind::File),
        libc::DT_LNK => Some(Kind::Symlink),
        libc::DT_UNKNOWN | libc::DT_CHR => None,
        t => Some(Kind::Special(t)),
    }
}

#[cfg(test)]
mod tests;
