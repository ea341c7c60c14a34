//! A warm mount's reset (`overlay/warm.rs`, `store/warm.rs`): drops everything a run changed
//! through the mount, so the next run sees the layers exactly as a fresh mount shows them,
//! while what the kernel learned of the files the run did not change stays (dentries, inodes,
//! attributes, page cache).
//!
//! Called once the run's processes are gone (the store asks for it at the end of a run), from
//! the daemon's control thread, never from a request handler. The steps:
//! 1. **What changed** is what the upper dir holds: every entry there is a name the run
//!    created, replaced, removed (a whiteout) or copied up (data, metadata, a directory that
//!    got a new entry).
//! 2. **The kernel drops it** (written to /dev/fuse, no daemon lock held, deepest first):
//!    FUSE_NOTIFY_INVAL_ENTRY of each such name in its parent, which drops the dentry (a
//!    negative one for a removed name), its unused subtree with their inodes and pages, and
//!    resets the parent's cached attributes and listing — except a directory that the upper
//!    only merges with the same directory of a lower (copied up because something below it
//!    changed, not opaque): its dentry and its unchanged children stay, and its attributes
//!    and listing are dropped (FUSE_NOTIFY_INVAL_INODE) once the upper is empty.
//! 3. **The kernel forgets** those nodes (FORGET, asynchronous): the reset waits, bounded
//!    ([`FORGET_WAIT`]), until no node in the table is one a fresh mount would not have —
//!    upper (other than such a merged directory), superseded, unlinked or removed. A node the
//!    kernel still holds after that makes the reset fail: the store then ends the mount.
//! 4. **Under the namespace lock** (no request runs): the upper and work dirs are emptied, the
//!    merged directories are the lowers' alone again, and the caches that knew the upper (fds,
//!    listings, upper inode ids, parked names) are dropped.
//!
//! The notes in /work/shared/notes/warmstart.md ("A reset that is safe") give the kernel
//! facts this rests on.

use std::collections::{HashMap, HashSet};
use std::ffi::{CStr, CString, OsStr, OsString};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use super::OverlayFs;
use crate::overlay::OverlayConfig;
use crate::overlay::inode::{Loc, ORPHANS, ROOT};
use crate::overlay::names::Names;
use crate::overlay::node_data::Data;
use crate::overlay::stack::{Kind, Stack, Tree};

/// The most names a reset drops one by one (FUSE_NOTIFY_INVAL_ENTRY, about half a millisecond
/// each with the FORGETs that follow); a run that changed more ends its mount instead.
pub const RESET_MAX_NAMES: usize = 4096;

/// How long a reset waits for the kernel to forget the nodes it invalidated.
pub const FORGET_WAIT: Duration = Duration::from_secs(2);

/// What a reset needs of a mount's engine, shared with the session (see the module docs).
pub struct Resetter {
    stack: Arc<Stack>,
    names: Arc<Names>,
    data: Arc<Data>,
    notifier: Arc<OnceLock<fuser::Notifier>>,
    upper: PathBuf,
    work: PathBuf,
    /// The upper root as the mount was made (the cache's root directory shows its mode,
    /// owner, xattrs — ACLs too — and times): set back once the upper is emptied.
    upper_root: Option<RootState>,
}

/// What the root directory of a view shows of the upper root (see [`Resetter`]).
struct RootState {
    /// Permission bits (`st_mode & 07777`).
    mode: u32,
    uid: u32,
    gid: u32,
    /// Every xattr: name and value.
    xattrs: Vec<(Vec<u8>, Vec<u8>)>,
    /// atime, mtime.
    times: [libc::timespec; 2],
}

impl RootState {
    /// The state of directory `dir` now.
    fn read(dir: &Path) -> std::io::Result<RootState> {
        use std::os::unix::fs::MetadataExt;
        let m = std::fs::symlink_metadata(dir)?;
        let xattrs = crate::sys::list_xattrs(dir)?
            .into_iter()
            .map(|n| crate::sys::get_xattr(dir, &n).map(|v| (n, v)))
            .collect::<std::io::Result<Vec<_>>>()?;
        let ts = |s, ns| libc::timespec {
            tv_sec: s,
            tv_nsec: ns,
        };
        Ok(RootState {
            mode: m.mode() & 0o7777,
            uid: m.uid(),
            gid: m.gid(),
            xattrs,
            times: [ts(m.atime(), m.atime_nsec()), ts(m.mtime(), m.mtime_nsec())],
        })
    }

    /// Makes directory `dir` show this state again: xattrs (those added removed, the others
    /// set to their value), owner, mode (after the ACLs, which change the group bits), times.
    fn restore(&self, dir: &Path) -> std::io::Result<()> {
        for name in crate::sys::list_xattrs(dir)? {
            if !self.xattrs.iter().any(|(n, _)| *n == name) {
                crate::sys::remove_xattr(dir, &name)?;
            }
        }
        for (name, value) in &self.xattrs {
            if crate::sys::get_xattr(dir, name).ok().as_ref() != Some(value) {
                crate::sys::set_xattr(dir, name, value)?;
            }
        }
        std::os::unix::fs::lchown(dir, Some(self.uid), Some(self.gid))?;
        std::fs::set_permissions(dir, std::os::unix::fs::PermissionsExt::from_mode(self.mode))?;
        set_times(dir, &self.times)
    }
}

/// What a reset did: upper entries found, names and inodes the kernel was told to drop, nodes
/// it still holds (unchanged, warm), and how long it took.
#[derive(Clone, Debug, Default)]
pub struct ResetReport {
    /// Entries the upper dir held.
    pub upper_entries: usize,
    /// FUSE_NOTIFY_INVAL_ENTRY sent.
    pub entries_dropped: usize,
    /// Directories kept (merged with a lower), their attributes and listing dropped.
    pub dirs_kept: usize,
    /// Nodes in the table after the reset.
    pub nodes_kept: usize,
    /// Time taken (ms).
    pub ms: u64,
}

/// The mount's resetter, once its session runs (one mount per daemon process).
static RESETTER: OnceLock<Resetter> = OnceLock::new();

impl OverlayFs {
    /// Makes this mount's [`Resetter`] the one [`reset`] uses. Nothing for a mount without an
    /// upper dir or with a node index (its upper outlives the mount: never reset).
    pub fn install_resetter(&self, cfg: &OverlayConfig) {
        if !cfg.has_upper() || cfg.read_only || cfg.persist_handles {
            return;
        }
        let upper_root = RootState::read(&cfg.upperdir)
            .inspect_err(|e| tracing::info!(error = %e, "the upper root cannot be read: no reset"))
            .ok();
        let _ = RESETTER.set(Resetter {
            upper_root,
            stack: Arc::clone(&self.stack),
            names: Arc::clone(&self.names),
            data: Arc::clone(&self.data),
            notifier: self.kernel.notifier_slot(),
            upper: cfg.upperdir.clone(),
            work: cfg.workdir.clone(),
        });
    }
}

/// Resets this process's mount (see the module docs).
///
/// Errors: a message when the mount has no resetter, the upper or work dir cannot be read or
/// emptied, or the kernel still holds a changed node after [`FORGET_WAIT`]; the mount must
/// then not be used by another run.
pub fn reset() -> Result<ResetReport, String> {
    RESETTER
        .get()
        .ok_or_else(|| "this mount cannot be reset".to_string())?
        .reset()
}

impl Resetter {
    fn reset(&self) -> Result<ResetReport, String> {
        let t0 = Instant::now();
        let notifier = self.notifier.get().ok_or("no session")?;
        let mut report = ResetReport::default();
        // 1. What the upper holds. A directory dropped whole (not merged in place) takes its
        //    subtree with it: what is below it needs no notification of its own.
        let mut entries = walk(&self.upper).map_err(|e| format!("reading the upper dir: {e}"))?;
        report.upper_entries = entries.len();
        entries.sort_by_key(|(rel, _)| depth(rel));
        let mut dropped_dirs: HashSet<Vec<u8>> = HashSet::new();
        let mut merged_rels: Vec<CString> = Vec::new();
        let mut to_drop: Vec<CString> = Vec::new();
        for (rel, is_dir) in entries {
            let bytes = rel.as_bytes();
            let below_dropped = (bytes.iter().enumerate())
                .filter(|(_, b)| **b == b'/')
                .any(|(i, _)| dropped_dirs.contains(&bytes[..i]));
            if below_dropped {
                continue;
            }
            if is_dir && self.merges_in_place(&rel)? {
                merged_rels.push(rel);
                continue;
            }
            if is_dir {
                dropped_dirs.insert(bytes.to_vec());
            }
            to_drop.push(rel);
        }
        if to_drop.len() > RESET_MAX_NAMES {
            return Err(format!(
                "{} changed names (more than {RESET_MAX_NAMES}): a fresh mount is cheaper",
                to_drop.len()
            ));
        }
        // 2. Tell the kernel, deepest first.
        let by_name = self.by_name();
        let id_of = |rel: &[u8]| -> Option<u64> {
            let mut cur = ROOT;
            if rel == b"." {
                return Some(cur);
            }
            for part in rel.split(|&b| b == b'/') {
                cur = *by_name.get(&(cur, OsStr::from_bytes(part).to_os_string()))?;
            }
            Some(cur)
        };
        to_drop.sort_by_key(|rel| std::cmp::Reverse(depth(rel)));
        for rel in &to_drop {
            let bytes = rel.as_bytes();
            let (parent, name) = match bytes.iter().rposition(|&b| b == b'/') {
                Some(i) => (&bytes[..i], &bytes[i + 1..]),
                None => (&b"."[..], bytes),
            };
            if let Some(p) = id_of(parent) {
                match notifier.inval_entry(fuser::INodeNo(p), OsStr::from_bytes(name)) {
                    Ok(()) => report.entries_dropped += 1,
                    Err(e) if e.raw_os_error() == Some(libc::ENOENT) => {}
                    Err(e) => return Err(format!("invalidating {rel:?}: {e}")),
                }
            }
        }
        let merged: HashSet<u64> = merged_rels
            .iter()
            .filter_map(|r| id_of(r.as_bytes()))
            .collect();
        // 3. Wait until the kernel forgot what changed.
        let deadline = Instant::now() + FORGET_WAIT;
        while let Some(held) = self.changed_node(&merged) {
            if Instant::now() >= deadline {
                return Err(format!(
                    "the kernel still holds node {held} that the run changed (a file open?)"
                ));
            }
            std::thread::sleep(Duration::from_millis(5));
        }
        // 4. No request runs meanwhile.
        {
            let _ns = self.names.exclusive();
            if let Some(held) = self.changed_node(&merged) {
                return Err(format!("node {held} was changed again during the reset"));
            }
            empty(&self.upper).map_err(|e| format!("emptying the upper dir: {e}"))?;
            self.upper_root
                .as_ref()
                .ok_or("the upper root was not read at mount")?
                .restore(&self.upper)
                .map_err(|e| format!("setting the upper root back: {e}"))?;
            empty(&self.work).map_err(|e| format!("emptying the work dir: {e}"))?;
            let orphans = self.work.join(ORPHANS);
            std::fs::create_dir(&orphans)
                .and_then(|()| {
                    std::fs::set_permissions(
                        &orphans,
                        std::os::unix::fs::PermissionsExt::from_mode(0o700),
                    )
                })
                .map_err(|e| format!("{}: {e}", orphans.display()))?;
            for v in self.names.snapshot() {
                if merged.contains(&v.id) && v.upper {
                    self.names.back_to_lowers(v.id, v.lowers);
                }
            }
            self.data.drop_all_fds();
            self.names.forget_upper();
            report.nodes_kept = self.names.snapshot().len();
        }
        // 5. The kept directories' (and the root's) attributes and listings are read again.
        for id in merged.iter().copied().chain([ROOT]) {
            match notifier.inval_inode(fuser::INodeNo(id), 0, 0) {
                Ok(()) => {}
                Err(e) if e.raw_os_error() == Some(libc::ENOENT) => {}
                Err(e) => return Err(format!("invalidating node {id}: {e}")),
            }
        }
        report.dirs_kept = merged.len();
        report.ms = t0.elapsed().as_millis() as u64;
        Ok(report)
    }

    /// The node table by (parent id, name).
    fn by_name(&self) -> HashMap<(u64, OsString), u64> {
        self.names
            .snapshot()
            .into_iter()
            .filter_map(|v| match v.loc {
                Loc::Attached { parent, name } => Some(((parent, name.into()), v.id)),
                _ => None,
            })
            .collect()
    }

    /// A node a fresh mount would not have (see the module docs), if any: in the upper dir
    /// (other than the root and the directories in `merged`), superseded by a copy, unlinked
    /// or removed.
    fn changed_node(&self, merged: &HashSet<u64>) -> Option<u64> {
        self.names.find_node(|id, n| {
            id != ROOT
                && (n.succ != 0
                    || !matches!(n.loc, Loc::Attached { .. })
                    || (n.upper && !(merged.contains(&id) && n.kind == Kind::Dir)))
        })
    }

    /// Whether the upper directory `rel` merges in place with a lower directory at the same
    /// path (it is not opaque and a lower has a directory there).
    fn merges_in_place(&self, rel: &CStr) -> Result<bool, String> {
        let opaque = self
            .stack
            .is_opaque(Tree::Upper, rel)
            .map_err(|e| format!("{rel:?}: {e}"))?;
        if opaque {
            return Ok(false);
        }
        let lower = self
            .stack
            .lookup(false, self.stack.root_lowers(), rel)
            .map_err(|e| format!("{rel:?}: {e}"))?;
        Ok(lower.is_some_and(|e| e.kind == Kind::Dir))
    }
}

/// How many components path `rel` has.
fn depth(rel: &CStr) -> usize {
    rel.to_bytes().split(|&b| b == b'/').count()
}

/// Every entry below `root` (relative paths, `a/b/c`), with whether it is a directory (a
/// symlink is not followed).
fn walk(root: &Path) -> std::io::Result<Vec<(CString, bool)>> {
    let mut out = Vec::new();
    let mut stack = vec![root.to_path_buf()];
    while let Some(dir) = stack.pop() {
        for e in std::fs::read_dir(&dir)? {
            let e = e?;
            let is_dir = e.file_type()?.is_dir();
            let p = e.path();
            let rel = p.strip_prefix(root).unwrap_or(&p);
            out.push((CString::new(rel.as_os_str().as_bytes())?, is_dir));
            if is_dir {
                stack.push(p);
            }
        }
    }
    Ok(out)
}

/// Sets the atime and mtime of `path` (`utimensat`, following no symlink).
fn set_times(path: &Path, times: &[libc::timespec; 2]) -> std::io::Result<()> {
    let c = CString::new(path.as_os_str().as_bytes())?;
    // SAFETY: `c` is a NUL-terminated path and `times` two valid timespecs.
    let r = unsafe {
        libc::utimensat(
            libc::AT_FDCWD,
            c.as_ptr(),
            times.as_ptr(),
            libc::AT_SYMLINK_NOFOLLOW,
        )
    };
    if r == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error())
    }
}

/// Removes everything in directory `dir` (not `dir` itself).
fn empty(dir: &Path) -> std::io::Result<()> {
    for e in std::fs::read_dir(dir)? {
        let e = e?;
        if e.file_type()?.is_dir() {
            std::fs::remove_dir_all(e.path())?;
        } else {
            std::fs::remove_file(e.path())?;
        }
    }
    Ok(())
}
