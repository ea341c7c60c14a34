//! File handles that survive a clean remount: the node index a writable `layercache overlay`
//! mount leaves in its workdir when it ends, and reads back (then removes) at the next mount of
//! the same upperdir and lowerdirs (xfstests generic/477, 777; kernel overlayfs does this with
//! `index=on,nfs_export=on`, Documentation/filesystems/overlayfs.rst "NFS export").
//!
//! The kernel's handle of a FUSE file is node id + generation (fs/fuse/inode.c,
//! `fuse_encode_fh`); opening one in a new mount sends LOOKUP(id, "."), which the node table
//! answers from its parked names (`inode.rs`). So the index holds what a new mount needs to
//! give the same ids to the same files and to find them by name:
//! * the generation (kept for as long as every unmount is clean) and the next counter id (the
//!   new mount's counter starts there: no id of the old mount goes to another file);
//! * for every node the kernel may hold a handle of — the live ones and the parked ones, at
//!   most [`PARKED_MAX`] — its id, its (parent id, name) and the id it shows as `st_ino`;
//!   for a node kept in the upper dir also the upper inode's identity ([`UpperIdentity`]), so
//!   the inode is given its old id again ([`Nodes::restore`](super::inode::Nodes::restore)).
//!   Ids derived from a lower inode (lower files and directories, merged directories, hard-
//!   linked lower files) need no identity: resolving the name computes the same id again,
//!   or another one (ESTALE).
//!
//! Nothing in it can make a handle open the wrong file:
//! * it is read only when its checksum (BLAKE3), its upper root and its lowers (device and
//!   inode number, in order) match this mount; an upper entry only when the inode at its path
//!   is still the one recorded (its upper filesystem's own file handle, which holds the inode
//!   number and generation, or where that filesystem has none, inode number and ctime);
//! * it is removed, durably (the workdir is fsynced), before the mount serves a request: a
//!   mount that then crashes leaves no index, and the next mount takes a new random
//!   generation, so every older handle is ESTALE (never another file's: the new mount's
//!   counter ids start again at 2, under another generation);
//! * it is written atomically (a temporary file, fsynced, renamed over) once the session has
//!   ended, under an exclusive `flock` on `<workdir>/node-index.lock` that the daemon holds
//!   for its whole life. A mount waits up to [`LOCK_WAIT`] for it (umount(2) returns before
//!   the old daemon has written its index; `mount` right after must wait for it), then goes
//!   on without the index and without writing one (another daemon uses this workdir).
//!
//! A missing, stale or corrupt index only means that handles of the earlier mount are ESTALE.
//! The store's mounts (`layercache run` views, `layercache mount`) keep no index
//! ([`OverlayConfig::persist_handles`](super::OverlayConfig::persist_handles)): their uppers
//! are private to one run.

use std::collections::HashMap;
use std::ffi::{CStr, CString, OsStr};
use std::io::{self, Write};
use std::os::fd::{OwnedFd, RawFd};
use std::os::unix::ffi::OsStrExt;
use std::time::{Duration, Instant};

use super::fs::OverlayFs;
pub use super::inode::PARKED_MAX;
use super::inode::ROOT;
use super::stack::Tree;

/// Counter ids (upper inodes, fallbacks) are below this; ids derived from a lower inode are
/// not (`inode.rs`).
const COUNTER_END: u64 = 1 << 56;

/// The index's name in the workdir.
pub const INDEX: &CStr = c"node-index";
/// Where the index is written before it is renamed to [`INDEX`].
const INDEX_TMP: &CStr = c"node-index.tmp";
/// The lock file held by the daemon that owns the index (see the module docs).
const LOCK: &CStr = c"node-index.lock";
/// How long a mount waits for the daemon of an earlier mount of the same workdir to write its
/// index and exit.
pub const LOCK_WAIT: Duration = Duration::from_secs(10);
/// Format version 1; a file of another version is not read (bump it with any change below).
const MAGIC: &[u8; 8] = b"LCNODES1";
/// An index larger than this (bytes) is not read: [`PARKED_MAX`] entries of the longest name
/// and handle are ~50 MiB.
const MAX_BYTES: u64 = 64 << 20;

/// Which inode an upper entry is: the upper filesystem's handle of it (name_to_handle_at(2);
/// empty where the filesystem has none), its inode number and ctime (seconds, nanoseconds).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct UpperIdentity {
    /// Inode number in the upper filesystem.
    pub ino: u64,
    /// `st_ctime`, `st_ctime_nsec`.
    pub ctime: (i64, i64),
    /// name_to_handle_at(2) type and bytes; `bytes` empty when unsupported.
    pub fh_type: i32,
    /// Handle bytes (at most 128, MAX_HANDLE_SZ).
    pub fh: Vec<u8>,
}

impl UpperIdentity {
    /// Whether `now` (read at mount) is the inode recorded in `self` (read at the last
    /// unmount): the same inode number and file handle, or, without handles, the same ctime
    /// (an offline change then makes the handle stale, which is safe).
    pub fn same_inode(&self, now: &UpperIdentity) -> bool {
        if self.ino != now.ino {
            return false;
        }
        if !self.fh.is_empty() && !now.fh.is_empty() {
            return self.fh_type == now.fh_type && self.fh == now.fh;
        }
        self.ctime == now.ctime
    }
}

/// One node of the index.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Entry {
    /// Node id.
    pub id: u64,
    /// Parent node id ([`super::inode::ROOT`] for a name in the root).
    pub parent: u64,
    /// Name in the parent (no `/`, no NUL, at most 255 bytes).
    pub name: Box<OsStr>,
    /// The node id it shows as `st_ino` (`Nodes::shown_id`).
    pub shown: u64,
    /// For a node kept in the upper dir under a counter id or a copied-up one: its inode.
    pub upper: Option<UpperIdentity>,
}

/// The identity of the directories a mount is made of: (st_dev, st_ino) of the upper root,
/// then of each lower root, top first.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Roots {
    /// Upper root.
    pub upper: (u64, u64),
    /// Lower roots, top first.
    pub lowers: Vec<(u64, u64)>,
}

/// The whole index.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Index {
    /// The generation of every node id (FUSE `fuse_entry_out.generation`).
    pub generation: u32,
    /// The next counter id to give.
    pub next: u64,
    /// The mount's layers.
    pub roots: Roots,
    /// Nodes, least recently used first.
    pub entries: Vec<Entry>,
}

fn put_u64(b: &mut Vec<u8>, v: u64) {
    b.extend_from_slice(&v.to_le_bytes());
}

impl Index {
    /// The file's bytes: [`MAGIC`], the body, and a BLAKE3 hash of both (32 bytes).
    pub fn encode(&self) -> Vec<u8> {
        let mut b = Vec::with_capacity(64 + self.entries.len() * 48);
        b.extend_from_slice(MAGIC);
        b.extend_from_slice(&self.generation.to_le_bytes());
        put_u64(&mut b, self.next);
        put_u64(&mut b, self.roots.upper.0);
        put_u64(&mut b, self.roots.upper.1);
        b.extend_from_slice(&(self.roots.lowers.len() as u32).to_le_bytes());
        for (dev, ino) in &self.roots.lowers {
            put_u64(&mut b, *dev);
            put_u64(&mut b, *ino);
        }
        b.extend_from_slice(&(self.entries.len() as u32).to_le_bytes());
        for e in &self.entries {
            put_u64(&mut b, e.id);
            put_u64(&mut b, e.parent);
            put_u64(&mut b, e.shown);
            let name = e.name.as_bytes();
            b.extend_from_slice(&(name.len() as u16).to_le_bytes());
            b.extend_from_slice(name);
            match &e.upper {
                None => b.push(0),
                Some(u) => {
                    b.push(1);
                    put_u64(&mut b, u.ino);
                    b.extend_from_slice(&u.ctime.0.to_le_bytes());
                    b.extend_from_slice(&u.ctime.1.to_le_bytes());
                    b.extend_from_slice(&u.fh_type.to_le_bytes());
                    b.push(u.fh.len() as u8);
                    b.extend_from_slice(&u.fh);
                }
            }
        }
        let sum = blake3::hash(&b);
        b.extend_from_slice(sum.as_bytes());
        b
    }

    /// Parses [`Index::encode`]'s bytes. `None` for anything else: another magic or version, a
    /// wrong checksum, a truncated or overlong field, a name that is empty, too long or holds
    /// `/` or NUL, a node id of 0 or 1 (the root is never indexed).
    pub fn decode(bytes: &[u8]) -> Option<Index> {
        let (body, sum) = bytes.split_at_checked(bytes.len().checked_sub(32)?)?;
        if blake3::hash(body).as_bytes() != sum || !body.starts_with(MAGIC) {
            return None;
        }
        let mut r = Reader(&body[MAGIC.len()..]);
        let generation = u32::from_le_bytes(r.take()?);
        let next = r.u64()?;
        let upper = (r.u64()?, r.u64()?);
        let n = u32::from_le_bytes(r.take()?) as usize;
        if n > 64 {
            return None;
        }
        let lowers = (0..n)
            .map(|_| Some((r.u64()?, r.u64()?)))
            .collect::<Option<Vec<_>>>()?;
        let count = u32::from_le_bytes(r.take()?) as usize;
        if count > PARKED_MAX {
            return None;
        }
        let mut entries = Vec::with_capacity(count);
        for _ in 0..count {
            let id = r.u64()?;
            let parent = r.u64()?;
            let shown = r.u64()?;
            let len = u16::from_le_bytes(r.take()?) as usize;
            let name = r.bytes(len)?;
            let bad_name =
                name.is_empty() || len > 255 || name.iter().any(|&c| c == b'/' || c == 0);
            if bad_name || id <= ROOT || parent == 0 {
                return None;
            }
            let upper = match r.bytes(1)?[0] {
                0 => None,
                1 => {
                    let ino = r.u64()?;
                    let ctime = (i64::from_le_bytes(r.take()?), i64::from_le_bytes(r.take()?));
                    let fh_type = i32::from_le_bytes(r.take()?);
                    let fh_len = r.bytes(1)?[0] as usize;
                    if fh_len > 128 {
                        return None;
                    }
                    let fh = r.bytes(fh_len)?.to_vec();
                    Some(UpperIdentity {
                        ino,
                        ctime,
                        fh_type,
                        fh,
                    })
                }
                _ => return None,
            };
            entries.push(Entry {
                id,
                parent,
                name: OsStr::from_bytes(name).into(),
                shown,
                upper,
            });
        }
        if !r.0.is_empty() {
            return None;
        }
        Some(Index {
            generation,
            next,
            roots: Roots { upper, lowers },
            entries,
        })
    }
}

/// Reads fields off the front of a byte slice; `None` past its end.
struct Reader<'a>(&'a [u8]);

impl<'a> Reader<'a> {
    fn bytes(&mut self, n: usize) -> Option<&'a [u8]> {
        let (head, rest) = self.0.split_at_checked(n)?;
        self.0 = rest;
        Some(head)
    }

    fn take<const N: usize>(&mut self) -> Option<[u8; N]> {
        self.bytes(N)?.try_into().ok()
    }

    fn u64(&mut self) -> Option<u64> {
        Some(u64::from_le_bytes(self.take()?))
    }
}

/// (st_dev, st_ino) of the open directory `fd`.
///
/// Errors: the `fstat` errno.
pub fn dir_identity(fd: RawFd) -> io::Result<(u64, u64)> {
    let st = crate::sys::fstat(&fd)?;
    Ok((st.st_dev, st.st_ino))
}

/// The identity of the inode at `rel` below directory `dir` (not following a last symlink),
/// whose `stat` is `st`: its upper filesystem's handle where it has them.
pub fn upper_identity(dir: RawFd, rel: &CStr, st: &libc::stat) -> UpperIdentity {
    let (kind, fh) = crate::sys::name_to_handle(dir, rel).unwrap_or((0, Vec::new()));
    UpperIdentity {
        ino: st.st_ino,
        ctime: (st.st_ctime, st.st_ctime_nsec),
        fh_type: if fh.is_empty() { 0 } else { kind },
        fh,
    }
}

/// The exclusive lock on a workdir's index: while held, this daemon alone reads, removes and
/// writes it. Released when dropped (the daemon's exit releases it too).
#[derive(Debug)]
pub struct IndexLock {
    _fd: OwnedFd,
}

impl IndexLock {
    /// The locked descriptor: the lock is held while it is open.
    pub fn into_fd(self) -> OwnedFd {
        self._fd
    }

    /// Takes the lock of the workdir open at `work`, waiting up to `wait`; `Ok(None)` when
    /// another process still holds it then.
    ///
    /// Errors: the errno of creating or locking the lock file.
    pub fn acquire(work: RawFd, wait: Duration) -> io::Result<Option<IndexLock>> {
        let fd = crate::sys::openat(
            work,
            LOCK,
            libc::O_RDWR | libc::O_CREAT | libc::O_CLOEXEC | libc::O_NOFOLLOW,
            0o600,
        )?;
        let until = Instant::now() + wait;
        loop {
            match crate::sys::flock(&fd, libc::LOCK_EX | libc::LOCK_NB) {
                Ok(()) => return Ok(Some(IndexLock { _fd: fd })),
                Err(e) if e.raw_os_error() != Some(libc::EWOULDBLOCK) => return Err(e),
                Err(_) => {}
            }
            if Instant::now() >= until {
                return Ok(None);
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }
}

/// Reads the index of the workdir open at `work` and removes it durably (also a leftover
/// temporary one), whatever it held. `Ok(None)` when there is none or it is not an index
/// ([`Index::decode`]).
///
/// Errors: the errno of reading, removing it or syncing the workdir (the caller must then not
/// use it: it might be read again after a crash).
pub fn take(work: RawFd) -> io::Result<Option<Index>> {
    let _ = crate::sys::unlinkat(work, INDEX_TMP, 0);
    let flags = libc::O_RDONLY | libc::O_CLOEXEC | libc::O_NOFOLLOW;
    let f = match crate::sys::openat(work, INDEX, flags, 0) {
        Ok(fd) => std::fs::File::from(fd),
        Err(e) if e.raw_os_error() == Some(libc::ENOENT) => return Ok(None),
        Err(e) => return Err(e),
    };
    let mut bytes = Vec::new();
    let read = io::Read::read_to_end(&mut io::Read::take(&f, MAX_BYTES + 1), &mut bytes);
    crate::sys::unlinkat(work, INDEX, 0)?;
    crate::sys::fsync_fd(work)?;
    read?;
    if bytes.len() as u64 > MAX_BYTES {
        return Ok(None);
    }
    Ok(Index::decode(&bytes))
}

/// Writes `index` as the index of the workdir open at `work`, atomically: a temporary file,
/// fsynced, renamed over [`INDEX`], then the workdir fsynced.
///
/// Errors: the errno of any step (the temporary file is removed then).
pub fn write(work: RawFd, index: &Index) -> io::Result<()> {
    let bytes = index.encode();
    let res = (|| {
        let flags =
            libc::O_WRONLY | libc::O_CREAT | libc::O_TRUNC | libc::O_CLOEXEC | libc::O_NOFOLLOW;
        let mut f = std::fs::File::from(crate::sys::openat(work, INDEX_TMP, flags, 0o600)?);
        f.write_all(&bytes)?;
        f.sync_all()?;
        crate::sys::renameat2(work, INDEX_TMP, work, INDEX, 0)?;
        crate::sys::fsync_fd(work)
    })();
    if res.is_err() {
        let _ = crate::sys::unlinkat(work, INDEX_TMP, 0);
    }
    res.map(drop)
}

/// `parent/name` for a path relative to a layer root (`parent` is `.` for the root).
pub fn join(parent: &CStr, name: &OsStr) -> Option<CString> {
    if parent.to_bytes() == b"." {
        CString::new(name.as_bytes()).ok()
    } else {
        crate::sys::child(parent, name).ok()
    }
}

/// Paths relative to the layer roots of the nodes named in `names` (node id → (parent id,
/// name)), built through their parents (memoised in `memo`, which starts with the root's);
/// `None` for a node whose chain of parents leaves `names` before reaching the root.
fn path_via(
    names: &HashMap<u64, (u64, &OsStr)>,
    memo: &mut HashMap<u64, CString>,
    id: u64,
) -> Option<CString> {
    let mut chain = Vec::new();
    let mut cur = id;
    while !memo.contains_key(&cur) {
        if chain.len() > 4096 {
            return None;
        }
        let (parent, _) = names.get(&cur)?;
        chain.push(cur);
        cur = *parent;
    }
    for &n in chain.iter().rev() {
        let (parent, name) = names[&n];
        let p = join(&memo[&parent], name)?;
        memo.insert(n, p);
    }
    memo.get(&id).cloned()
}

fn root_memo() -> HashMap<u64, CString> {
    HashMap::from([(ROOT, c".".to_owned())])
}

impl OverlayFs {
    /// The identity of this mount's upper root and lower roots ([`Roots`]).
    ///
    /// Errors: the `fstat` errno.
    fn roots(&self) -> io::Result<Roots> {
        let upper = dir_identity(self.stack.fd(Tree::Upper))?;
        let mut lowers = Vec::new();
        for i in 0..=u8::MAX {
            let fd = self.stack.fd(Tree::Lower(i));
            if fd < 0 {
                break;
            }
            lowers.push(dir_identity(fd)?);
        }
        Ok(Roots { upper, lowers })
    }

    /// At mount (before serving): takes the workdir's index lock and its node index, and
    /// continues the mount that wrote it when it was of these layers, with the entries still
    /// true ([`Nodes::restore`](super::inode::Nodes::restore)). Without the lock (another
    /// daemon holds it past [`LOCK_WAIT`]) or when the index cannot be removed, the mount
    /// keeps no handles across its remount and writes no index. Never fails the mount.
    pub(super) fn load_handles(&mut self) {
        let work = self.stack.fd(Tree::Work);
        let lock = match IndexLock::acquire(work, LOCK_WAIT) {
            Ok(Some(l)) => l,
            Ok(None) => {
                tracing::warn!(
                    "another daemon still holds this workdir's node index: file handles of \
                     this mount will not survive a remount"
                );
                return;
            }
            Err(e) => {
                tracing::warn!("node index lock: {e}: file handles will not survive a remount");
                return;
            }
        };
        let index = match take(work) {
            Ok(i) => i,
            Err(e) => {
                tracing::warn!("node index: {e}: file handles will not survive a remount");
                return;
            }
        };
        self.handle_lock = Some(lock.into_fd());
        let Some(index) = index else {
            return;
        };
        if self.roots().ok().as_ref() != Some(&index.roots) {
            tracing::info!("the node index is of other layers: earlier file handles are stale");
            return;
        }
        let names: HashMap<u64, (u64, &OsStr)> = index
            .entries
            .iter()
            .map(|e| (e.id, (e.parent, &*e.name)))
            .collect();
        let mut memo = root_memo();
        let mut parked = Vec::new();
        let mut uppers = Vec::new();
        for e in &index.entries {
            match &e.upper {
                // A counter id is this index's only if it was given before it was written.
                Some(_) if e.id < COUNTER_END && e.id >= index.next => continue,
                Some(u) => {
                    let Some(path) = path_via(&names, &mut memo, e.id) else {
                        continue;
                    };
                    let Ok(st) = self.stack.stat(Tree::Upper, &path) else {
                        continue;
                    };
                    let now = upper_identity(self.stack.fd(Tree::Upper), &path, &st);
                    if !u.same_inode(&now) {
                        continue;
                    }
                    uppers.push((u.ino, e.id, e.shown));
                }
                // Derived from a lower inode: resolving the name gives it again, or not.
                None if e.id >= COUNTER_END => {}
                None => continue,
            }
            parked.push((e.id, e.parent, e.name.clone()));
        }
        tracing::debug!(
            names = parked.len(),
            uppers = uppers.len(),
            "node index of the last mount restored"
        );
        self.nodes
            .restore(index.generation, index.next, parked, uppers);
    }

    /// When the session has ended (FUSE `destroy`): writes the node index of this mount to its
    /// workdir (see the module docs), if it holds the index lock. Failures are logged: the
    /// next mount's handles of this one are then ESTALE.
    pub(super) fn save_handles(&self) {
        if self.handle_lock.is_none() {
            return;
        }
        let t = Instant::now();
        let (list, next) = self.nodes.index_names(PARKED_MAX);
        let names: HashMap<u64, (u64, &OsStr)> =
            list.iter().map(|(id, p, n)| (*id, (*p, &**n))).collect();
        let mut memo = root_memo();
        let upper_fd = self.stack.fd(Tree::Upper);
        let mut entries = Vec::with_capacity(list.len());
        for (id, parent, name) in &list {
            let Some(path) = path_via(&names, &mut memo, *id) else {
                continue;
            };
            let at = self.stack.stat_opt(Tree::Upper, &path).ok().flatten();
            let kept = at.and_then(|st| {
                let (known, shown) = self.nodes.upper_known(st.st_ino)?;
                (known == *id).then(|| (upper_identity(upper_fd, &path, &st), shown))
            });
            let (upper, shown) = match kept {
                Some((u, shown)) => (Some(u), shown),
                // Only ids derived from a lower inode are found again without one.
                None if *id >= COUNTER_END => (None, self.nodes.shown_id(*id)),
                None => continue,
            };
            entries.push(Entry {
                id: *id,
                parent: *parent,
                name: name.clone(),
                shown,
                upper,
            });
        }
        let roots = match self.roots() {
            Ok(r) => r,
            Err(e) => {
                tracing::warn!("node index not written: {e}");
                return;
            }
        };
        let index = Index {
            generation: self.nodes.generation(),
            next,
            roots,
            entries,
        };
        match write(self.stack.fd(Tree::Work), &index) {
            Ok(()) => tracing::debug!(
                entries = index.entries.len(),
                ms = t.elapsed().as_millis() as u64,
                "node index written"
            ),
            Err(e) => tracing::warn!("node index not written: {e}"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::fd::AsRawFd;

    fn sample() -> Index {
        Index {
            generation: 0xdead_beef,
            next: 1234,
            roots: Roots {
                upper: (7, 2),
                lowers: vec![(8, 2), (9, 11)],
            },
            entries: vec![
                Entry {
                    id: 1 << 56 | 40,
                    parent: 1,
                    name: OsStr::new("dir").into(),
                    shown: 1 << 56 | 40,
                    upper: None,
                },
                Entry {
                    id: 17,
                    parent: 1 << 56 | 40,
                    name: OsStr::new("a file").into(),
                    shown: 17,
                    upper: Some(UpperIdentity {
                        ino: 99,
                        ctime: (1_700_000_000, 5),
                        fh_type: 1,
                        fh: vec![1, 2, 3, 4, 5, 6, 7, 8],
                    }),
                },
            ],
        }
    }

    #[test]
    fn an_index_reads_back_and_any_damage_is_refused() {
        let idx = sample();
        let bytes = idx.encode();
        assert_eq!(Index::decode(&bytes), Some(idx));
        // Every single-byte change and every truncation is caught (checksum, lengths).
        for i in 0..bytes.len() {
            let mut b = bytes.clone();
            b[i] ^= 0x40;
            assert_eq!(Index::decode(&b), None, "byte {i} flipped");
        }
        for n in 0..bytes.len() {
            assert_eq!(Index::decode(&bytes[..n]), None, "cut at {n}");
        }
        // A well-formed body with a bad name is refused even with a right checksum.
        let mut bad = sample();
        bad.entries[0].name = OsStr::new("a/b").into();
        assert_eq!(Index::decode(&bad.encode()), None);
        let mut root = sample();
        root.entries[1].id = 1;
        assert_eq!(Index::decode(&root.encode()), None);
    }

    #[test]
    fn identities_compare_handles_or_else_ctime() {
        let a = sample().entries[1].upper.clone().unwrap();
        assert!(a.same_inode(&a));
        let other_gen = UpperIdentity {
            fh: vec![1, 2, 3, 4, 9, 9, 9, 9],
            ..a.clone()
        };
        assert!(
            !a.same_inode(&other_gen),
            "same ino, another inode generation"
        );
        let touched = UpperIdentity {
            ctime: (1, 1),
            ..a.clone()
        };
        assert!(
            a.same_inode(&touched),
            "a handle decides when both have one"
        );
        let no_fh = UpperIdentity {
            fh: Vec::new(),
            fh_type: 0,
            ..a.clone()
        };
        assert!(no_fh.same_inode(&a));
        assert!(
            !no_fh.same_inode(&touched),
            "without handles, ctime decides"
        );
        let moved = UpperIdentity {
            ino: 100,
            ..a.clone()
        };
        assert!(!a.same_inode(&moved));
    }

    #[test]
    fn written_index_is_taken_once() {
        let d = tempfile::tempdir().unwrap();
        let dir = std::fs::File::open(d.path()).unwrap();
        let fd = dir.as_raw_fd();
        assert_eq!(take(fd).unwrap(), None, "none yet");
        let idx = sample();
        write(fd, &idx).unwrap();
        assert!(!d.path().join("node-index.tmp").exists());
        assert_eq!(take(fd).unwrap(), Some(idx));
        assert!(!d.path().join("node-index").exists(), "removed once read");
        assert_eq!(take(fd).unwrap(), None);
        std::fs::write(d.path().join("node-index"), b"LCNODES1 garbage").unwrap();
        assert_eq!(take(fd).unwrap(), None, "corrupt: not used");
        assert!(!d.path().join("node-index").exists(), "and removed");
        let held = IndexLock::acquire(fd, Duration::ZERO).unwrap();
        assert!(held.is_some());
        // flock is per open file: another open of the lock file waits, then gives up.
        let again = IndexLock::acquire(fd, Duration::from_millis(30)).unwrap();
        assert!(again.is_none(), "held by the first");
        drop(held);
        assert!(IndexLock::acquire(fd, Duration::ZERO).unwrap().is_some());
    }
}
