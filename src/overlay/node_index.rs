//! File handles that survive a remount: the node index a writable `layercache overlay` mount
//! keeps in its workdir while it is mounted, and reads back at the next mount of the same
//! upperdir and lowerdirs (xfstests generic/477, 777; kernel overlayfs does this with
//! `index=on,nfs_export=on`, Documentation/filesystems/overlayfs.rst "NFS export", and keeps
//! its index up to date while mounted too).
//!
//! The kernel's handle of a FUSE file is node id + generation (fs/fuse/inode.c,
//! `fuse_encode_fh`); opening one in a new mount sends LOOKUP(id, "."), which the node table
//! answers from its parked names (`inode.rs`). So the index holds what a new mount needs to
//! give the same ids to the same files and to find them by name:
//! * the generation and a bound below which every counter id given so far lies (the new
//!   mount's counter starts there: no id of the old mount goes to another file);
//! * for every node the kernel was given — at most [`PARKED_MAX`], the most recent — its id,
//!   its (parent id, name) and the id it shows as `st_ino`; for a node kept in the upper dir
//!   also the upper inode's identity ([`UpperIdentity`]), so the inode is given its old id
//!   again ([`Nodes::restore`](super::inode::Nodes::restore)). Ids derived from a lower inode
//!   (lower files and directories, merged directories, hard-linked lower files) need no
//!   identity: resolving the name computes the same id again, or another one (ESTALE).
//!
//! **Written while mounted, never after.** The FUSE module sends no DESTROY when a plain
//! `fuse` mount goes away (only `fuseblk` mounts get one, fs/fuse/inode.c
//! `fuse_init_fs_context`): `umount(2)` aborts the connection and returns while the daemon may
//! still be running. So the index is a journal ([`Journal`]): a record is appended (one
//! `write(2)`, no fsync) before the reply that gives the kernel a node id at a new name, moves
//! a name (rename) or gives a node an upper inode (copy-up), and nothing is written once the
//! session has ended; `umount m && rm -rf upper work` then never races the daemon. A request
//! the kernel waits for holds the mount busy (`umount` fails with EBUSY meanwhile), so every
//! record is in the file when `umount` returns. Counter ids are reserved in blocks of
//! [`RESERVE_BLOCK`], each reservation written and `fdatasync`ed before an id of the block
//! reaches the kernel, so a crash never lets the next mount give an id already handed out.
//! The journal is rewritten compactly (a temporary file, fsynced, renamed over) at mount and
//! when it has grown past [`COMPACT_MIN`] and twice its last compact size.
//!
//! Nothing in it can make a handle open the wrong file:
//! * it is read only when every record's checksum (BLAKE3) holds, and its upper root and its
//!   lowers (device and inode number, in order) match this mount; an upper entry only when
//!   the inode at its path is still the one recorded (its upper filesystem's own file handle,
//!   which holds the inode number and generation, or where that filesystem has none, inode
//!   number and ctime — then a file changed after its record is ESTALE after a remount);
//! * a damaged or torn journal is not used at all: the next mount takes a new random
//!   generation, so every older handle is ESTALE (never another file's: that mount's counter
//!   ids start again at 2, under another generation);
//! * the daemon holds an exclusive `flock` on `<workdir>/node-index.lock` for its whole life.
//!   A mount waits up to [`LOCK_WAIT`] for it (a daemon whose mount was just unmounted may
//!   still be exiting), then goes on without the index and without writing one (another
//!   daemon uses this workdir).
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
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use parking_lot::Mutex;

pub use super::inode::PARKED_MAX;
use super::inode::ROOT;

/// Counter ids (upper inodes, fallbacks) are below this; ids derived from a lower inode are
/// not (`inode.rs`).
pub(super) const COUNTER_END: u64 = 1 << 56;

/// The index's name in the workdir.
pub const INDEX: &CStr = c"node-index";
/// Where the index is written before it is renamed to [`INDEX`].
const INDEX_TMP: &CStr = c"node-index.tmp";
/// The lock file held by the daemon that owns the index (see the module docs).
const LOCK: &CStr = c"node-index.lock";
/// How long a mount waits for the daemon of an earlier mount of the same workdir to write its
/// index and exit.
pub const LOCK_WAIT: Duration = Duration::from_secs(10);
/// Format version 2 (a journal of checksummed records); a file of another version is not read
/// (bump it with any change to the records).
const MAGIC: &[u8; 8] = b"LCNODES2";
/// An index larger than this (bytes) is not read: [`PARKED_MAX`] entries of the longest name
/// and handle are ~50 MiB.
const MAX_BYTES: u64 = 64 << 20;
/// Record kinds: the header (generation, reserved counter ids, roots; first and only once),
/// a node ([`Entry`]), a reservation of counter ids.
const REC_HEADER: u8 = b'H';
const REC_ENTRY: u8 = b'E';
const REC_RESERVE: u8 = b'R';
/// Bytes of a record's checksum (a BLAKE3 prefix of its kind and body).
const SUM_LEN: usize = 16;
/// Counter ids reserved by one durable record (see the module docs): ids are 56 bits, so
/// 2^36 blocks are there to take.
pub const RESERVE_BLOCK: u64 = 1 << 20;
/// The journal is compacted once it is larger than this (bytes) and than twice its size after
/// its last compaction. `LAYERCACHE_NODE_INDEX_COMPACT` (bytes, at least 1024) overrides it
/// (tests).
pub const COMPACT_MIN: u64 = 8 << 20;

/// [`COMPACT_MIN`], or its override from the environment.
fn compact_min() -> u64 {
    std::env::var("LAYERCACHE_NODE_INDEX_COMPACT")
        .ok()
        .and_then(|v| v.parse().ok())
        .filter(|&n: &u64| n >= 1024)
        .unwrap_or(COMPACT_MIN)
}

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
    /// Whether `now` (read at mount) is the inode recorded in `self` (read when the record
    /// was written): the same inode number and file handle, or, without handles, the same
    /// ctime (an offline change then makes the handle stale, which is safe).
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

/// The whole index, as a mount reads it (the last record of each node, in record order).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Index {
    /// The generation of every node id (FUSE `fuse_entry_out.generation`).
    pub generation: u32,
    /// The next counter id to give: no counter id at or above it was given.
    pub next: u64,
    /// The mount's layers.
    pub roots: Roots,
    /// Nodes, least recently recorded first.
    pub entries: Vec<Entry>,
}

fn put_u64(b: &mut Vec<u8>, v: u64) {
    b.extend_from_slice(&v.to_le_bytes());
}

/// Appends one framed record: its length (u32, of kind and body), its kind, its body and
/// [`SUM_LEN`] bytes of BLAKE3 of kind and body.
fn put_record(out: &mut Vec<u8>, kind: u8, body: &[u8]) {
    out.extend_from_slice(&(body.len() as u32 + 1).to_le_bytes());
    let start = out.len();
    out.push(kind);
    out.extend_from_slice(body);
    let sum = blake3::hash(&out[start..]);
    out.extend_from_slice(&sum.as_bytes()[..SUM_LEN]);
}

/// The records of a journal body (after [`MAGIC`]), each (kind, body); `None` when any is
/// truncated or fails its checksum.
fn records(mut bytes: &[u8]) -> Option<Vec<(u8, &[u8])>> {
    let mut out = Vec::new();
    while !bytes.is_empty() {
        let (len, rest) = bytes.split_at_checked(4)?;
        let len = u32::from_le_bytes(len.try_into().ok()?) as usize;
        let (rec, rest) = rest.split_at_checked(len)?;
        let (sum, rest) = rest.split_at_checked(SUM_LEN)?;
        let (&kind, body) = rec.split_first()?;
        if &blake3::hash(rec).as_bytes()[..SUM_LEN] != sum {
            return None;
        }
        out.push((kind, body));
        bytes = rest;
    }
    Some(out)
}

impl Entry {
    /// The body of this entry's record.
    fn encode(&self) -> Vec<u8> {
        let mut b = Vec::with_capacity(64 + self.name.len());
        put_u64(&mut b, self.id);
        put_u64(&mut b, self.parent);
        put_u64(&mut b, self.shown);
        let name = self.name.as_bytes();
        b.extend_from_slice(&(name.len() as u16).to_le_bytes());
        b.extend_from_slice(name);
        match &self.upper {
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
        b
    }

    /// This entry as one framed journal record.
    pub fn record(&self) -> Vec<u8> {
        let mut out = Vec::new();
        put_record(&mut out, REC_ENTRY, &self.encode());
        out
    }

    /// Parses [`Entry::encode`]'s bytes; `None` for a truncated or overlong field, a name that
    /// is empty, too long or holds `/` or NUL, a node id of 0 or 1 (the root is never indexed).
    fn decode(body: &[u8]) -> Option<Entry> {
        let mut r = Reader(body);
        let id = r.u64()?;
        let parent = r.u64()?;
        let shown = r.u64()?;
        let len = u16::from_le_bytes(r.take()?) as usize;
        let name = r.bytes(len)?;
        let bad_name = name.is_empty() || len > 255 || name.iter().any(|&c| c == b'/' || c == 0);
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
        if !r.0.is_empty() {
            return None;
        }
        Some(Entry {
            id,
            parent,
            name: OsStr::from_bytes(name).into(),
            shown,
            upper,
        })
    }
}

/// A reservation record: counter ids below `bound` may have been given.
pub fn reserve_record(bound: u64) -> Vec<u8> {
    let mut out = Vec::new();
    put_record(&mut out, REC_RESERVE, &bound.to_le_bytes());
    out
}

impl Index {
    /// A whole journal holding this index: [`MAGIC`], the header record (with [`Self::next`]
    /// as the reservation) and one record per entry.
    pub fn encode(&self) -> Vec<u8> {
        let mut h = Vec::with_capacity(64);
        h.extend_from_slice(&self.generation.to_le_bytes());
        put_u64(&mut h, self.next);
        put_u64(&mut h, self.roots.upper.0);
        put_u64(&mut h, self.roots.upper.1);
        h.extend_from_slice(&(self.roots.lowers.len() as u32).to_le_bytes());
        for (dev, ino) in &self.roots.lowers {
            put_u64(&mut h, *dev);
            put_u64(&mut h, *ino);
        }
        let mut b = Vec::with_capacity(64 + self.entries.len() * 64);
        b.extend_from_slice(MAGIC);
        put_record(&mut b, REC_HEADER, &h);
        for e in &self.entries {
            put_record(&mut b, REC_ENTRY, &e.encode());
        }
        b
    }

    /// Reads a journal ([`Index::encode`] followed by appended records): the last record of
    /// each node wins, the most recent [`PARKED_MAX`] are kept, and `next` is the highest
    /// reservation (or above the highest counter id recorded). `None` for anything else:
    /// another magic or version, a record that is truncated or fails its checksum, a header
    /// that is not first or not alone, a malformed entry.
    pub fn decode(bytes: &[u8]) -> Option<Index> {
        let recs = records(bytes.strip_prefix(MAGIC)?)?;
        let ((REC_HEADER, head), rest) = recs.split_first()? else {
            return None;
        };
        let mut r = Reader(head);
        let generation = u32::from_le_bytes(r.take()?);
        let mut next = r.u64()?;
        let upper = (r.u64()?, r.u64()?);
        let n = u32::from_le_bytes(r.take()?) as usize;
        if n > 64 {
            return None;
        }
        let lowers = (0..n)
            .map(|_| Some((r.u64()?, r.u64()?)))
            .collect::<Option<Vec<_>>>()?;
        if !r.0.is_empty() {
            return None;
        }
        // Node id → (sequence number of its last record, entry).
        let mut last: HashMap<u64, (usize, Entry)> = HashMap::new();
        for (seq, (kind, body)) in rest.iter().enumerate() {
            match *kind {
                REC_ENTRY => {
                    let e = Entry::decode(body)?;
                    for id in [e.id, e.shown] {
                        if id < COUNTER_END {
                            next = next.max(id + 1);
                        }
                    }
                    last.insert(e.id, (seq, e));
                }
                REC_RESERVE => {
                    next = next.max(u64::from_le_bytes((*body).try_into().ok()?));
                }
                _ => return None,
            }
        }
        let mut entries: Vec<(usize, Entry)> = last.into_values().collect();
        entries.sort_unstable_by_key(|(seq, _)| *seq);
        let cut = entries.len().saturating_sub(PARKED_MAX);
        Some(Index {
            generation,
            next,
            roots: Roots { upper, lowers },
            entries: entries.into_iter().skip(cut).map(|(_, e)| e).collect(),
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

/// Reads the index of the workdir open at `work` (a leftover temporary one is removed).
/// `Ok(None)` when there is none, it is larger than [`MAX_BYTES`] or it is not an index
/// ([`Index::decode`]).
///
/// Errors: the errno of opening or reading it.
pub fn read(work: RawFd) -> io::Result<Option<Index>> {
    let _ = crate::sys::unlinkat(work, INDEX_TMP, 0);
    let flags = libc::O_RDONLY | libc::O_CLOEXEC | libc::O_NOFOLLOW;
    let f = match crate::sys::openat(work, INDEX, flags, 0) {
        Ok(fd) => std::fs::File::from(fd),
        Err(e) if e.raw_os_error() == Some(libc::ENOENT) => return Ok(None),
        Err(e) => return Err(e),
    };
    let mut bytes = Vec::new();
    io::Read::read_to_end(&mut io::Read::take(&f, MAX_BYTES + 1), &mut bytes)?;
    if bytes.len() as u64 > MAX_BYTES {
        return Ok(None);
    }
    Ok(Index::decode(&bytes))
}

/// Removes the index of the workdir open at `work`, durably (the workdir is fsynced).
///
/// Errors: the errno of the unlink (other than ENOENT) or of the fsync.
pub fn remove(work: RawFd) -> io::Result<()> {
    match crate::sys::unlinkat(work, INDEX, 0) {
        Err(e) if e.raw_os_error() != Some(libc::ENOENT) => return Err(e),
        _ => {}
    }
    crate::sys::fsync_fd(work)
}

/// Writes `index` as the index of the workdir open at `work`, atomically: a temporary file,
/// fsynced, renamed over [`INDEX`], then the workdir fsynced. Returns the file, open for
/// appending records, and its length in bytes.
///
/// Errors: the errno of any step (the temporary file is removed then).
pub fn write(work: RawFd, index: &Index) -> io::Result<(std::fs::File, u64)> {
    let bytes = index.encode();
    let res = (|| {
        let flags = libc::O_WRONLY
            | libc::O_CREAT
            | libc::O_TRUNC
            | libc::O_APPEND
            | libc::O_CLOEXEC
            | libc::O_NOFOLLOW;
        let mut f = std::fs::File::from(crate::sys::openat(work, INDEX_TMP, flags, 0o600)?);
        f.write_all(&bytes)?;
        f.sync_all()?;
        crate::sys::renameat2(work, INDEX_TMP, work, INDEX, 0)?;
        crate::sys::fsync_fd(work)?;
        Ok(f)
    })();
    if res.is_err() {
        let _ = crate::sys::unlinkat(work, INDEX_TMP, 0);
    }
    res.map(|f| (f, bytes.len() as u64))
}

/// The node index of a mount that keeps one (see the module docs): the journal open for
/// appending, the workdir's index lock held for the daemon's life, and the bound below which
/// counter ids are reserved. After a write error the journal is removed and nothing more is
/// recorded (the mount's handles then do not survive a remount; a record cut short would make
/// the next mount refuse the whole journal anyway).
#[derive(Debug)]
pub struct Journal {
    work: RawFd,
    reserved: AtomicU64,
    state: Mutex<JournalState>,
    /// [`compact_min`], read once.
    compact_min: u64,
    _lock: OwnedFd,
}

std::thread_local! {
    /// Records collected by [`Journal::batch`] on this thread.
    static BATCH: std::cell::RefCell<Option<Vec<u8>>> = const { std::cell::RefCell::new(None) };
}

#[derive(Debug)]
struct JournalState {
    /// `None` once recording stopped after an error.
    file: Option<std::fs::File>,
    len: u64,
    /// Compact once `len` exceeds this.
    compact_at: u64,
}

impl Journal {
    /// Writes `index` as the workdir's journal ([`write`]) and keeps it for appending;
    /// `index.next` is the reservation bound.
    ///
    /// Errors: the errno of writing it.
    pub(super) fn create(work: RawFd, lock: IndexLock, index: &Index) -> io::Result<Journal> {
        let (file, len) = write(work, index)?;
        Ok(Journal {
            work,
            reserved: AtomicU64::new(index.next),
            state: Mutex::new(JournalState {
                file: Some(file),
                len,
                compact_at: compact_min().max(2 * len),
            }),
            compact_min: compact_min(),
            _lock: lock.into_fd(),
        })
    }

    /// Appends `record` (one `write(2)`, or into this thread's batch inside
    /// [`Journal::batch`]). Returns whether the journal should be compacted now.
    pub fn append(&self, record: &[u8]) -> bool {
        let batched = BATCH.with(|b| match &mut *b.borrow_mut() {
            Some(buf) => {
                buf.extend_from_slice(record);
                true
            }
            None => false,
        });
        if batched {
            return false;
        }
        self.write_now(record)
    }

    /// Runs `f`, collecting the records it appends on this thread, then appends them in one
    /// `write(2)` (a READDIRPLUS gives the kernel up to a few hundred nodes: one write instead
    /// of one per node). Call it around work whose reply is sent after it returns. Returns
    /// `f`'s result and whether the journal should be compacted now.
    pub fn batch<R>(&self, f: impl FnOnce() -> R) -> (R, bool) {
        let outer = BATCH.with(|b| b.borrow().is_some());
        if outer {
            return (f(), false);
        }
        BATCH.with(|b| *b.borrow_mut() = Some(Vec::new()));
        // Taken back even when `f` panics, so the thread's next request writes directly.
        struct Take;
        impl Drop for Take {
            fn drop(&mut self) {
                BATCH.with(|b| b.borrow_mut().take());
            }
        }
        let take = Take;
        let r = f();
        let buf = BATCH.with(|b| b.borrow_mut().take()).unwrap_or_default();
        drop(take);
        let compact = !buf.is_empty() && self.write_now(&buf);
        (r, compact)
    }

    /// Writes `bytes` (whole records) at the journal's end.
    fn write_now(&self, bytes: &[u8]) -> bool {
        let mut st = self.state.lock();
        let Some(f) = &mut st.file else {
            return false;
        };
        if let Err(e) = f.write_all(bytes) {
            self.stop(&mut st, &e);
            return false;
        }
        st.len += bytes.len() as u64;
        st.len > st.compact_at
    }

    /// Makes sure counter ids up to `next` (the table's next one) are reserved durably, with
    /// room to spare: a reservation record, `fdatasync`ed, when fewer than half a block are
    /// left. Call before the reply that hands an id to the kernel.
    pub fn reserve(&self, next: u64) {
        if next + RESERVE_BLOCK / 2 <= self.reserved.load(Ordering::Acquire) {
            return;
        }
        let mut st = self.state.lock();
        if next + RESERVE_BLOCK / 2 <= self.reserved.load(Ordering::Acquire) {
            return;
        }
        let Some(f) = &mut st.file else {
            return;
        };
        let bound = next + RESERVE_BLOCK;
        let rec = reserve_record(bound);
        match f.write_all(&rec).and_then(|()| f.sync_data()) {
            Ok(()) => {
                st.len += rec.len() as u64;
                self.reserved.store(bound, Ordering::Release);
            }
            Err(e) => self.stop(&mut st, &e),
        }
    }

    /// Replaces the journal by `snapshot()` (taken while no record is appended), with the
    /// current reservation bound at least.
    pub fn compact(&self, snapshot: impl FnOnce() -> io::Result<Index>) {
        let mut st = self.state.lock();
        if st.file.is_none() || st.len <= st.compact_at {
            return;
        }
        let res = snapshot().and_then(|mut index| {
            index.next = index.next.max(self.reserved.load(Ordering::Acquire));
            write(self.work, &index)
        });
        match res {
            Ok((file, len)) => {
                tracing::debug!(bytes = len, was = st.len, "node index compacted");
                st.file = Some(file);
                st.len = len;
                st.compact_at = self.compact_min.max(2 * len);
            }
            Err(e) => self.stop(&mut st, &e),
        }
    }

    /// Stops recording after error `e`: the journal is removed (it may lack a reservation).
    fn stop(&self, st: &mut JournalState, e: &io::Error) {
        st.file = None;
        match remove(self.work) {
            Ok(()) => tracing::warn!(
                "node index: {e}: no longer kept; file handles of this mount will not \
                 survive a remount"
            ),
            Err(e2) => tracing::error!(
                "node index: {e}, and removing it failed: {e2}; remove {INDEX:?} from the \
                 workdir before the next mount"
            ),
        }
    }
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
pub(super) fn path_via(
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

pub(super) fn root_memo() -> HashMap<u64, CString> {
    HashMap::from([(ROOT, c".".to_owned())])
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
        assert_eq!(Index::decode(&bytes), Some(idx.clone()));
        // Every single-byte change is caught (checksums, lengths, magic).
        for i in 0..bytes.len() {
            let mut b = bytes.clone();
            b[i] ^= 0x40;
            assert_eq!(Index::decode(&b), None, "byte {i} flipped");
        }
        // A cut inside a record is refused; a cut between records is what a crash between
        // two appends leaves: the records before it.
        let header_end = MAGIC.len() + 4 + idx_header_len(&idx) + SUM_LEN;
        let first_end = header_end + 4 + 1 + idx.entries[0].encode().len() + SUM_LEN;
        for n in 0..bytes.len() {
            let got = Index::decode(&bytes[..n]);
            match n {
                n if n == header_end => assert_eq!(got.map(|i| i.entries.len()), Some(0)),
                n if n == first_end => assert_eq!(got.map(|i| i.entries.len()), Some(1)),
                _ => assert_eq!(got, None, "cut at {n}"),
            }
        }
        // A well-formed record with a bad name is refused even with a right checksum.
        let mut bad = sample();
        bad.entries[0].name = OsStr::new("a/b").into();
        assert_eq!(Index::decode(&bad.encode()), None);
        let mut root = sample();
        root.entries[1].id = 1;
        assert_eq!(Index::decode(&root.encode()), None);
        // A second header is not a journal.
        let mut two = bytes.clone();
        two.extend_from_slice(&bytes[MAGIC.len()..]);
        assert_eq!(Index::decode(&two), None);
    }

    /// Bytes of the header record's body of `idx`.
    fn idx_header_len(idx: &Index) -> usize {
        4 + 8 + 16 + 4 + 16 * idx.roots.lowers.len() + 1
    }

    #[test]
    fn appended_records_update_the_index() {
        let mut bytes = sample().encode();
        // The file moves: its last record wins and goes last.
        let mut moved = sample().entries[1].clone();
        moved.name = OsStr::new("renamed").into();
        moved.parent = 1;
        bytes.extend_from_slice(&moved.record());
        // A counter id above the reservation raises `next` (it was given).
        let late = Entry {
            id: 5000,
            parent: 1,
            name: OsStr::new("late").into(),
            shown: 5000,
            upper: None,
        };
        bytes.extend_from_slice(&late.record());
        let idx = Index::decode(&bytes).unwrap();
        assert_eq!(idx.entries.len(), 3);
        assert_eq!(idx.entries[0].name.as_ref(), OsStr::new("dir"));
        assert_eq!(idx.entries[1], moved);
        assert_eq!(idx.next, 5001);
        bytes.extend_from_slice(&reserve_record(1 << 30));
        assert_eq!(Index::decode(&bytes).unwrap().next, 1 << 30);
        // A torn last record makes the whole journal unusable.
        let rec = reserve_record(1 << 40);
        bytes.extend_from_slice(&rec[..rec.len() - 1]);
        assert_eq!(Index::decode(&bytes), None);
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
    fn a_journal_is_written_appended_read_and_removed() {
        let d = tempfile::tempdir().unwrap();
        let dir = std::fs::File::open(d.path()).unwrap();
        let fd = dir.as_raw_fd();
        assert_eq!(read(fd).unwrap(), None, "none yet");
        let idx = sample();
        let (mut f, len) = write(fd, &idx).unwrap();
        assert_eq!(len, idx.encode().len() as u64);
        assert!(!d.path().join("node-index.tmp").exists());
        assert_eq!(read(fd).unwrap(), Some(idx.clone()));
        assert_eq!(read(fd).unwrap(), Some(idx.clone()), "reading leaves it");
        // The file `write` returns appends to the journal.
        f.write_all(&reserve_record(99_999)).unwrap();
        assert_eq!(read(fd).unwrap().map(|i| i.next), Some(99_999));
        remove(fd).unwrap();
        assert!(!d.path().join("node-index").exists());
        remove(fd).unwrap();
        std::fs::write(d.path().join("node-index"), b"LCNODES2 garbage").unwrap();
        assert_eq!(read(fd).unwrap(), None, "corrupt: not used");
        let held = IndexLock::acquire(fd, Duration::ZERO).unwrap();
        assert!(held.is_some());
        // flock is per open file: another open of the lock file waits, then gives up.
        let again = IndexLock::acquire(fd, Duration::from_millis(30)).unwrap();
        assert!(again.is_none(), "held by the first");
        drop(held);
        assert!(IndexLock::acquire(fd, Duration::ZERO).unwrap().is_some());
    }
}
