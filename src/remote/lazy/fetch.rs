//! Fetching a lazy layer's content: one scheduler for demand reads (a FUSE request waits on
//! them), the replay of a recorded access trace and background completion.
//!
//! * **Units.** A packed object comes with its pack neighbours that are not local yet: one
//!   ranged GET of a window of the pack (at most [`DEMAND_WINDOW`] bytes for a demand read,
//!   [`BACKGROUND_WINDOW`] in the background), split object by object as its bytes arrive
//!   and handed to the store queue (below): a reader of the window's first object does not
//!   wait for the rest, and the unit ends with its last byte, not its last file. An object
//!   stored alone is fetched whole, streamed into a temporary file and hashed on arrival (the
//!   manifest records one digest per object: a reader sees none of its bytes before all of
//!   them are verified).
//! * **One fetch per object.** Every object of a unit in flight has a [`Flight`]; a demand
//!   read of any of them waits for that flight instead of starting another, and each flight
//!   ends as soon as its object is here (the object a reader asked for is stored first).
//!   Across the daemons of one partial layer (concurrent runs on one store) the same holds
//!   through [`FETCH_LOCKS`]: a unit claims each of its objects with a byte lock there (never
//!   waiting for one), fetches only what it claimed, and then waits, holding no lock, for the
//!   objects another daemon claimed to arrive in `held/` — or for their locks to go free (that
//!   daemon failed or was killed: the kernel drops its locks), when it claims them itself. A
//!   claimed object is looked for in `held/` again before it is fetched. After
//!   [`Limits::bound`] a unit stops waiting and fetches what is left regardless.
//! * **Verified before seen.** Bytes are written (to a temporary file in the partial
//!   directory, `.fetch-*`, flocked by its writer until it is renamed; [`remove_stale_temps`]
//!   removes those of a killed daemon; renamed to `held/<hex>`) only after their length and
//!   blake3 match the manifest; `held/<hex>` is what a reader opens. Nothing goes into the store's `objects/`
//!   while the layer is partial (so gc has nothing of it to race with): the pull that
//!   completes the layer moves each held file into place as the store's object, with the
//!   metadata of its files. A later run finds `held/` and never fetches an object twice.
//! * **Stores.** A packed object's bytes wait in a queue (`fetch/queue.rs`) for one of two
//!   blocking threads to verify and write them: first those a reader waits for, then the
//!   traced ones in the order the recorded run opened them, then the rest; the objects a
//!   trace replay unit brought between traced ones that no reader asked for yet wait in
//!   memory (their fetch locks given up) until the run is quiet (as completion does) or the
//!   queue grows past half of [`STORE_BACKLOG`], since creating their files takes CPU from a
//!   run that may never open them. No trace or completion unit starts while the queue holds more
//!   than [`STORE_BACKLOG`] bytes.
//! * **Classes.** Demand units start at once. One background task then replays the trace
//!   (at most [`TRACE_UNITS`] units of at most [`TRACE_WINDOW`] bytes at once; none starts
//!   while a reader waits for a unit in flight or for a piece, whose GET then gets the link as
//!   the others end; the units are planned from the whole
//!   trace before the first starts ([`Shared::trace_plan`]): per pack, stretches of traced
//!   objects with gaps of at most [`TRACE_GAP`] between them, not whole windows, started in
//!   the order of their first-opened object, so a package whose files the run opened out of
//!   pack order costs one GET, not one per file; a demand read starts no
//!   read-ahead meanwhile) and completes the layer (at most
//!   [`BACKGROUND_UNITS`] units, none started while a demand read is in flight or within
//!   [`COMPLETION_QUIET`] of the mount, of the last one or of the run's last open of a file,
//!   so a reader's request does not share the link with bulk transfers, a run busy reading
//!   what the trace brought does not share the CPU with them, and a run that only walks its
//!   tree fetches nothing).
//! * **Faults.** Every attempt has a progress deadline (no byte for [`Limits::progress`]: it
//!   is abandoned) and is retried with backoff until [`Limits::bound`] has passed since the
//!   first; then the waiters get the error (EIO to the reader). A missing object, or bytes that
//!   do not match their digest, is not retried: the layer is marked broken (the run's log and
//!   the next mount say so) and nothing wrong is ever served.

use std::collections::HashMap;
use std::fs::{self, File};
use std::io::{self, Write};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{
    AtomicBool, AtomicU8, AtomicU32, AtomicU64, AtomicUsize, Ordering::Relaxed,
};
use std::time::{Duration, Instant};

use futures::StreamExt;
use object_store::{GetOptions, GetRange, ObjectStoreExt};
use parking_lot::{Condvar, Mutex};

mod health;
mod pieced;
mod queue;

use health::Health;

use super::prefetch::{PREFETCH_UNITS, Prefetched, slower_than};

use super::super::Remote;
use super::super::compact::Wire;
use super::tree::Tree;
use crate::error::{Error, RemoteKind, Result};
use crate::ids::{ObjectId, ProjectId};
use crate::store::ObjectStore as LocalObjects;

/// Bytes of pack a demand read fetches around the object it needs (its neighbours are
/// usually the files read next: a package's other modules).
pub(super) const DEMAND_WINDOW: u64 = 512 << 10;

/// Bytes of pack one background unit fetches.
pub(super) const BACKGROUND_WINDOW: u64 = 1 << 20;

/// Completion units in flight at most (none is started while a demand read waits).
pub(super) const BACKGROUND_UNITS: usize = 2;

/// Bytes one GET of an object stored alone asks for (a request never carries more, so the
/// per-request timeout never cuts a steady transfer of a big object).
pub(super) const PIECE: u64 = 4 << 20;

/// Failed reads a report names.
pub(super) const FAILED_KEPT: usize = 5;

/// Trace replay units in flight at most (none starts while a reader waits). A unit is mostly
/// the traced files of a package or a few (tens of KiB to [`TRACE_WINDOW`]): several in flight
/// keep a link with 20 ms to the first byte busy.
pub(super) const TRACE_UNITS: usize = 6;

/// Bytes of pack between two traced objects that a trace replay unit fetches (and keeps,
/// or drops when they are local or in flight already) to bring both with one GET (as
/// `object_store::coalesce_ranges` joins ranges): at 200 Mbit/s a gap this size is ~10 ms of
/// link time, less than a request's delay to its first byte (20 ms in the benchmark's link,
/// more from a busy server; a SeaweedFS on the same two cores spends 15-30 ms of CPU per GET).
pub(super) const TRACE_GAP: u64 = 256 << 10;

/// How long after the mount completion starts, and how long after the last demand read it
/// resumes: a run that only lists or stats its tree (`ls -lR`, `find`) fetches nothing, and a
/// reader is not competing with bulk transfers while it is busy.
pub(super) const COMPLETION_QUIET: Duration = Duration::from_millis(1500);

/// Bytes of pack one trace replay unit fetches.
pub(super) const TRACE_WINDOW: u64 = 1 << 20;

/// `fetch-locks` of a partial directory: an empty file whose bytes stand for the layer's
/// objects (at [`lock_offset`] of each id); a daemon holds an open file description lock on
/// an object's byte while it fetches that object (see the module docs).
pub(super) const FETCH_LOCKS: &str = "fetch-locks";

/// The first bytes of the name of a fetch's temporary file in the partial directory.
pub(super) const TEMP_PREFIX: &str = ".fetch-";

/// How often a unit looks whether the objects another daemon claimed have arrived.
const CLAIM_POLL: Duration = Duration::from_millis(20);

/// How old a temporary file must be before [`remove_stale_temps`] takes it for a dead fetch's
/// (its writer locks it right after creating it: this covers that moment).
const TEMP_GRACE: Duration = Duration::from_secs(5);

/// The byte of [`FETCH_LOCKS`] that stands for object `id`: 62 bits of the id (every daemon
/// of a layer agrees on it; two objects sharing one only wait for each other).
fn lock_offset(id: &ObjectId) -> u64 {
    let mut b = [0u8; 8];
    b.copy_from_slice(&id.0[..8]);
    u64::from_le_bytes(b) >> 2
}

/// Removes the temporary files of fetches (`.fetch-*`) in partial directory `dir` that no
/// fetch is writing: a fetch holds a flock on its file from just after creating it until it
/// has renamed it into `held/`, so a file whose flock is free and that is older than
/// [`TEMP_GRACE`] is what a daemon killed mid-fetch left. Returns how many went; best effort
/// (what cannot be read or removed is left for gc).
pub(super) fn remove_stale_temps(dir: &Path) -> usize {
    let Ok(entries) = fs::read_dir(dir) else {
        return 0;
    };
    let mut n = 0;
    for e in entries.flatten() {
        if !e
            .file_name()
            .as_encoded_bytes()
            .starts_with(TEMP_PREFIX.as_bytes())
        {
            continue;
        }
        let path = e.path();
        let Ok(f) = fs::OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC | libc::O_NONBLOCK)
            .open(&path)
        else {
            continue;
        };
        let old = (f.metadata().and_then(|m| m.modified()).ok())
            .and_then(|t| t.elapsed().ok())
            .is_some_and(|age| age >= TEMP_GRACE);
        if !old || crate::sys::flock(&f, libc::LOCK_EX | libc::LOCK_NB).is_err() {
            continue;
        }
        // Still the file we locked (not renamed away and replaced meanwhile).
        let same = |a: &fs::Metadata, b: &fs::Metadata| {
            use std::os::unix::fs::MetadataExt;
            a.ino() == b.ino() && a.dev() == b.dev()
        };
        let ours = f.metadata().ok();
        let named = fs::symlink_metadata(&path).ok();
        if let (Some(a), Some(b)) = (&ours, &named)
            && same(a, b)
            && fs::remove_file(&path).is_ok()
        {
            n += 1;
        }
    }
    if n > 0 {
        let what = "lazy layer: removed stale fetch temporary files";
        tracing::info!(dir = %dir.display(), removed = n, "{what}");
    }
    n
}

/// Who waits for a unit.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Class {
    /// A reader (a FUSE request).
    Demand,
    /// Trace replay: a unit holds traced objects (and small gaps between them) only.
    Trace,
    /// The likely-mmapped traced files fetched before COMMAND (`prefetch.rs`): started at
    /// once and counted as demand reads are (no trace replay or completion unit starts
    /// meanwhile), no read-ahead, stored right after what a reader waits for.
    Prefetch,
    /// Completion (and a demand read's read-ahead).
    Background,
}

/// How long a fetch may go without progress, and in all, before its readers get EIO.
#[derive(Clone, Copy, Debug)]
pub struct Limits {
    /// No byte for this long abandons an attempt (it is retried).
    pub progress: Duration,
    /// No retry starts after this long since the first attempt.
    pub bound: Duration,
}

impl Limits {
    /// 10 s of no progress, 60 s in all; `LAYERCACHE_LAZY_TIMEOUT` ([`super::lazy_timeout`])
    /// sets the bound (and a progress deadline of a third of it, at most 10 s).
    pub fn from_env() -> Limits {
        let bound = (super::lazy_timeout().ok().flatten()).unwrap_or(Duration::from_secs(60));
        Limits {
            progress: (bound / 3).min(Duration::from_secs(10)),
            bound,
        }
    }
}

/// A lazily fetched object's file (and, while its pieces arrive, the gate its READs wait on) as
/// the overlay reads it: its `fstat` is never the file's metadata (held files are the store's
/// objects, mode 0400).
fn lower_data(
    file: fs::File,
    gate: Option<Arc<dyn crate::overlay::ReadGate>>,
) -> crate::overlay::LowerData {
    crate::overlay::LowerData {
        file,
        gate,
        fstat_is_meta: false,
    }
}

/// Where an object's bytes are in the remote.
#[derive(Clone, Copy, Debug)]
enum Loc {
    /// In pack `pack` (index into [`Shared::packs`]) at byte `offset`, `len` bytes, position
    /// `pos` in that pack's list.
    Packed {
        pack: u32,
        offset: u64,
        len: u64,
        pos: u32,
    },
    /// Stored alone under `objects/`.
    Alone,
}

/// An object's state: not known to be local, …
const UNKNOWN: u8 = 0;
/// … in `held/`, …
const LOCAL: u8 = 1;
/// … or its bytes are here, waiting in [`Shared::stores`] to be verified and stored (its
/// flight ends when they are).
const QUEUED: u8 = 2;

/// The [`Shared::rank`] of an object neither traced nor asked for by a reader, and the
/// priority in [`Shared::stores`] of such an object a trace replay unit brought: it may wait
/// for the run to be quiet ([`Shared::store_limit`]).
const DEFERRED: u32 = u32::MAX;

/// Bytes waiting in [`Shared::stores`] above which no trace replay or completion unit starts
/// (bounds the memory a link faster than the disk's file creation fills).
const STORE_BACKLOG: u64 = 32 << 20;

/// One unit in flight: its result, once known, for every waiter.
struct Flight {
    done: Mutex<Option<std::result::Result<(), String>>>,
    cv: Condvar,
}

impl Flight {
    fn new() -> Arc<Flight> {
        Arc::new(Flight {
            done: Mutex::new(None),
            cv: Condvar::new(),
        })
    }

    fn finish(&self, r: std::result::Result<(), String>) {
        *self.done.lock() = Some(r);
        self.cv.notify_all();
    }

    /// Waits for the result, at most `limit`.
    fn wait(&self, limit: Duration) -> std::result::Result<(), String> {
        let deadline = Instant::now() + limit;
        let mut d = self.done.lock();
        while d.is_none() {
            if self.cv.wait_until(&mut d, deadline).timed_out() {
                return Err("no answer from the fetch in time".into());
            }
        }
        d.clone().expect("checked")
    }
}

/// What the fetcher counts (for the run's report).
#[derive(Default)]
pub(super) struct Counts {
    /// Bytes of the objects fetched (each counted once, retried transfers not again).
    pub bytes: AtomicU64,
    /// GET requests sent (attempts, retries included).
    pub gets: AtomicU64,
    /// Objects fetched.
    pub objects: AtomicU64,
}

/// A timeout error of `remote` for `what` (no byte for the progress deadline of `limits`):
/// "no answer within 3.3 s fetching …".
fn stalled(remote: &Remote, limits: Limits, what: &str) -> Error {
    super::super::RemoteError::Timeout {
        url: remote.cfg.url.clone(),
        what: what.to_string(),
        secs: limits.progress.as_secs_f64(),
        source: None,
    }
    .into()
}

/// The whole object at `path` of `remote` (`what` names it in errors): each attempt is
/// abandoned after no byte for the progress deadline of `limits`; attempts that fail
/// transiently are retried with backoff (200 ms doubling, at most 5 s) until the bound of
/// `limits` has passed since the first.
///
/// Errors: the remote's error (`NotFound` for a missing object) or a timeout once the
/// retries are over.
pub(super) fn get_retrying(
    remote: &Remote,
    path: &object_store::path::Path,
    what: &str,
    limits: Limits,
) -> Result<Vec<u8>> {
    let health = Health::new(&remote.cfg.url, limits.bound);
    remote.block_on(None, async {
        retrying(limits, &health, || async {
            let mut out = Vec::new();
            get_progressing(
                remote,
                (limits, &health),
                what,
                remote.store.get(path),
                |c| {
                    out.extend_from_slice(c);
                    Ok(())
                },
            )
            .await?;
            Ok(out)
        })
        .await
    })
}

/// Runs `attempt` again while it fails transiently, until the next try would start later
/// than the bound of `limits` after the first; the waits between tries start at 200 ms and
/// double up to 5 s. Asks `health` first: while the remote is down, no attempt is made
/// (but for the probe, which is not retried); giving up on a transient failure marks it down,
/// any answer up.
///
/// Errors: the last attempt's; [`Health::down_error`] when none was made.
async fn retrying<T, F: std::future::Future<Output = Result<T>>>(
    limits: Limits,
    health: &Health,
    mut attempt: impl FnMut() -> F,
) -> Result<T> {
    let (t0, mut backoff) = (Instant::now(), Duration::from_millis(200));
    loop {
        if !health.may_try() {
            return Err(health.down_error());
        }
        match attempt().await {
            Err(Error::Remote { kind, .. })
                if kind.is_transient()
                    && !health.is_down()
                    && t0.elapsed() + backoff < limits.bound =>
            {
                tracing::warn!(
                    elapsed_ms = t0.elapsed().as_millis() as u64,
                    "lazy fetch: no progress from the remote; retrying"
                );
                tokio::time::sleep(backoff).await;
                backoff = (backoff * 2).min(Duration::from_secs(5));
            }
            Err(e @ Error::Remote { kind, .. }) if kind.is_transient() => {
                health.gave_up();
                return Err(e);
            }
            r => {
                health.answered();
                return r;
            }
        }
    }
}

/// Awaits the GET `request` of `remote` (`what` names it in errors) and hands each chunk of
/// its body to `each` (telling `health` the remote made progress), abandoning it when the
/// answer or a chunk takes longer than the progress deadline of `limits`.
///
/// Errors: a timeout ([`stalled`]); the remote's error; `each`'s.
async fn get_progressing(
    remote: &Remote,
    (limits, health): (Limits, &Health),
    what: &str,
    request: impl std::future::Future<
        Output = std::result::Result<object_store::GetResult, object_store::Error>,
    >,
    mut each: impl FnMut(&[u8]) -> Result<()>,
) -> Result<()> {
    let got = tokio::time::timeout(limits.progress, request)
        .await
        .map_err(|_| stalled(remote, limits, what))?
        .map_err(|e| remote.error(what, e))?;
    let mut stream = got.into_stream();
    loop {
        let next = tokio::time::timeout(limits.progress, stream.next())
            .await
            .map_err(|_| stalled(remote, limits, what))?;
        match next {
            Some(chunk) => {
                health.progressed();
                each(&chunk.map_err(|e| remote.error(what, e))?)?
            }
            None => return Ok(()),
        }
    }
}

/// The state shared by the readers' threads and the fetch tasks.
pub(super) struct Shared {
    remote: Remote,
    project: ProjectId,
    tree: Arc<Tree>,
    objects: LocalObjects,
    /// `held/`: the verified bytes of every object of the layer that is here, by hex id.
    held: PathBuf,
    ids: Vec<ObjectId>,
    loc: Vec<Loc>,
    /// Pack name and its objects by offset.
    packs: Vec<(String, Vec<u32>)>,
    state: Vec<AtomicU8>,
    flights: Mutex<HashMap<u32, Arc<Flight>>>,
    /// Packed objects whose bytes arrived, waiting to be verified and stored (each holds its
    /// unit's claims until it is).
    stores: queue::Queue<Arc<Claim>>,
    /// Per object, where it goes in [`Shared::stores`]: [`queue::URGENT`] once a reader
    /// waited for it, its place in the replayed trace (from 1), else [`DEFERRED`].
    rank: Vec<AtomicU32>,
    limits: Limits,
    /// Whether the remote answers: while it does not, fetches fail at once.
    health: Health,
    /// Demand units in flight.
    demand: AtomicUsize,
    /// Background units in flight.
    background: AtomicUsize,
    /// Readers waiting for a unit in flight ([`Shared::fetch`]; a reader of an object with
    /// pieces counts in [`Shared::demand`]): no trace replay unit starts meanwhile.
    waiting: AtomicUsize,
    /// When the fetcher started, and (ms after that) when the last demand unit ended or the
    /// run last opened a file ([`Shared::opened`]).
    started: Instant,
    last_demand_ms: AtomicU64,
    pub counts: Counts,
    /// The first error that makes the layer unusable (a corrupt or missing object).
    pub broken: Mutex<Option<String>>,
    /// Reads that got EIO: "path: why", the first [`FAILED_KEPT`].
    pub failed: Mutex<Vec<String>>,
    /// Set once every object is local.
    pub complete: AtomicBool,
    /// Set when the fetcher is dropped: the background task stops.
    stop: AtomicBool,
    /// The pieces' CVs of the objects stored alone that the layer's piece table describes
    /// (checked against their ids): those are served piece by piece.
    pieces: HashMap<u32, Vec<blake3::hazmat::ChainingValue>>,
    /// The objects arriving piece by piece now.
    pieced: Mutex<HashMap<u32, Arc<pieced::Pieced>>>,
    /// While the trace is replayed: a demand read starts no read-ahead (the trace says what
    /// comes next).
    replaying: AtomicBool,
    /// [`FETCH_LOCKS`], open for writing (its own open file description: the locks of this
    /// daemon); `None` where it cannot be had (objects are then fetched without claiming).
    locks: Option<File>,
    /// Random hex that names this fetcher's temporary files, and how many it has named
    /// ([`Shared::temp`]).
    temp_tag: String,
    temps: AtomicU64,
}

impl Shared {
    /// The fetcher of the layer `tree` (made from `wire`, or from the tree manifest of the
    /// compact manifest `wire`) of `project`, its objects kept in `objects` and linked into
    /// `held`.
    ///
    /// `pieces` is the layer's piece table (`remote/pieces.rs`), empty when it has none; an
    /// entry whose CVs do not merge to its object's id is left out (that object is fetched
    /// whole) with a warning.
    ///
    /// Errors: [`Error::Failed`] for an object index of `tree` that `wire`'s object table
    /// lacks.
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        remote: Remote,
        project: ProjectId,
        wire: &Wire,
        tree: Arc<Tree>,
        objects: LocalObjects,
        held: PathBuf,
        limits: Limits,
        pieces: crate::remote::pieces::Table,
    ) -> Result<Shared> {
        let ids: Vec<ObjectId> = (tree.objects.iter())
            .map(|&(w, _)| {
                let id = wire.objects.get(w as usize).ok_or_else(|| {
                    Error::Failed(format!(
                        "remote manifest: object index {w} out of range (its object table has {})",
                        wire.objects.len()
                    ))
                })?;
                Ok(ObjectId(*id))
            })
            .collect::<Result<_>>()?;
        // The tree's index of each of the manifest's objects (its files' objects; a pack may
        // hold others, which no file needs).
        let index: HashMap<&[u8; 32], u32> = (ids.iter().enumerate())
            .map(|(i, id)| (&id.0, i as u32))
            .collect();
        let mut loc = vec![Loc::Alone; ids.len()];
        let mut packs = Vec::new();
        for (name, objs) in &wire.packs {
            let mut list: Vec<(u64, u64, u32)> = objs
                .iter()
                .filter_map(|&(o, off, len)| {
                    let id = wire.objects.get(o as usize)?;
                    index.get(id).map(|&i| (off, len, i))
                })
                .collect();
            if list.is_empty() {
                continue;
            }
            list.sort_unstable();
            let p = packs.len() as u32;
            for (pos, &(offset, len, i)) in list.iter().enumerate() {
                loc[i as usize] = Loc::Packed {
                    pack: p,
                    offset,
                    len,
                    pos: pos as u32,
                };
            }
            packs.push((name.clone(), list.into_iter().map(|(_, _, i)| i).collect()));
        }
        let state: Vec<AtomicU8> = (0..ids.len()).map(|_| AtomicU8::new(UNKNOWN)).collect();
        let rank = (0..ids.len()).map(|_| AtomicU32::new(DEFERRED)).collect();
        // What an earlier run fetched is here already: never fetched again, not even as a
        // neighbour in a pack window.
        if let Ok(dir) = fs::read_dir(&held) {
            for name in dir.flatten().map(|e| e.file_name()) {
                let id = name.to_str().and_then(|n| ObjectId::from_hex(n).ok());
                if let Some(&i) = id.as_ref().and_then(|id| index.get(&id.0)) {
                    state[i as usize].store(LOCAL, Relaxed);
                }
            }
        }
        let mut by_object = HashMap::new();
        for (id, cvs) in pieces {
            let Some(&i) = index.get(&id) else { continue };
            let size = tree.objects[i as usize].1;
            if !matches!(loc[i as usize], Loc::Alone) {
                continue;
            }
            if crate::remote::pieces::matches(&cvs, size, &id) {
                by_object.insert(i, cvs);
            } else {
                tracing::warn!(
                    object = %ObjectId(id),
                    "lazy layer: the piece table's digests do not make the object's id; it is fetched whole"
                );
            }
        }
        let lock_path = held.parent().unwrap_or(&held).join(FETCH_LOCKS);
        let locks = fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .mode(0o600)
            .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
            .open(&lock_path)
            .inspect_err(|e| {
                let what = "lazy layer: no fetch locks (daemons of this layer may fetch an \
                            object twice)";
                tracing::warn!(path = %lock_path.display(), "{what}: {e}");
            })
            .ok();
        let health = Health::new(&remote.cfg.url, limits.bound);
        Ok(Shared {
            remote,
            project,
            tree,
            objects,
            held,
            ids,
            loc,
            packs,
            state,
            flights: Mutex::new(HashMap::new()),
            stores: queue::Queue::new(),
            rank,
            limits,
            health,
            demand: AtomicUsize::new(0),
            background: AtomicUsize::new(0),
            waiting: AtomicUsize::new(0),
            started: Instant::now(),
            last_demand_ms: AtomicU64::new(0),
            counts: Counts::default(),
            broken: Mutex::new(None),
            failed: Mutex::new(Vec::new()),
            complete: AtomicBool::new(false),
            stop: AtomicBool::new(false),
            replaying: AtomicBool::new(false),
            pieces: by_object,
            pieced: Mutex::new(HashMap::new()),
            locks,
            temp_tag: crate::sys::random_hex(8),
            temps: AtomicU64::new(0),
        })
    }

    /// `held/<hex>` of object `o`.
    fn held_path(&self, o: u32) -> PathBuf {
        self.held.join(self.ids[o as usize].to_hex())
    }

    /// Opens object `o`'s local file read-only, if it is local: its link in `held/`, else the
    /// object the store has with the metadata of its first file (a pull or an earlier layer
    /// made it), which is then linked into `held/`.
    ///
    /// Errors: the `open`/`link` errno other than `ENOENT`.
    fn open_local(&self, o: u32) -> io::Result<Option<File>> {
        let open = |p: &Path| {
            fs::OpenOptions::new()
                .read(true)
                .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
                .open(p)
        };
        let held = self.held_path(o);
        match open(&held) {
            Ok(f) => {
                self.state[o as usize].store(LOCAL, Relaxed);
                return Ok(Some(f));
            }
            Err(e) if e.kind() == io::ErrorKind::NotFound => {}
            Err(e) => return Err(e),
        }
        match fs::hard_link(self.object_path(o), &held) {
            Ok(()) => {}
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {}
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(e),
        }
        self.state[o as usize].store(LOCAL, Relaxed);
        open(&held).map(Some)
    }

    /// The store's object of `o` with its first file's metadata (`objects/<aa>/<hex>-<tag>`).
    fn object_path(&self, o: u32) -> PathBuf {
        let tag = self.tree.meta_tag(self.tree.object_entry[o as usize]);
        self.objects.path_for(&self.ids[o as usize], tag)
    }

    /// Whether object `o` is local (checked on disk once, then remembered); a store object
    /// with its bytes and metadata is linked into `held/` on the way.
    fn is_local(&self, o: u32) -> bool {
        if self.state[o as usize].load(Relaxed) == LOCAL {
            return true;
        }
        let held = self.held_path(o);
        let here = held.exists()
            || match fs::hard_link(self.object_path(o), &held) {
                Ok(()) => true,
                Err(e) => e.kind() == io::ErrorKind::AlreadyExists,
            };
        if here {
            self.state[o as usize].store(LOCAL, Relaxed);
        }
        here
    }

    /// The data of object `o` for a reader: local at once, else after a demand fetch.
    ///
    /// Errors: `EIO` when the fetch failed (the reason is logged and kept for the report).
    pub fn open(self: &Arc<Self>, o: u32, path: &[u8]) -> io::Result<File> {
        // A fetch that ended well leaves the object local; a second round covers a unit that
        // another reader's fetch had just finished.
        for _ in 0..3 {
            if let Some(f) = self.open_local(o)? {
                return Ok(f);
            }
            if let Err(why) = self.fetch(o, DEMAND_WINDOW) {
                self.note_failed(&String::from_utf8_lossy(path), &why);
                return Err(io::Error::from_raw_os_error(libc::EIO));
            }
        }
        tracing::error!(
            file = %String::from_utf8_lossy(path),
            "reading a lazily fetched file: fetched, yet not in held/"
        );
        Err(io::Error::from_raw_os_error(libc::EIO))
    }

    /// The data of object `o` for a reader's READs: local at once; an object with pieces
    /// ([`Shared::pieces`]) at once too, its bytes arriving while it is read (with the gate
    /// READs wait on); any other after a demand fetch ([`Shared::open`]). Its `fstat` is never
    /// the file's metadata (held files are the store's objects, mode 0400).
    ///
    /// Errors: `EIO` when the fetch failed or the sparse file cannot be made; the errno of
    /// opening a local file.
    pub fn open_data(
        self: &Arc<Self>,
        o: u32,
        path: &[u8],
    ) -> io::Result<crate::overlay::LowerData> {
        if let Some(f) = self.open_local(o)? {
            tracing::debug!(
                file = %String::from_utf8_lossy(path),
                at_ms = self.started.elapsed().as_millis() as u64,
                "lazy open local"
            );
            return Ok(lower_data(f, None));
        }
        let t0 = Instant::now();
        let r = self.open_fetching(o, path);
        tracing::debug!(
            file = %String::from_utf8_lossy(path),
            at_ms = self.started.elapsed().saturating_sub(t0.elapsed()).as_millis() as u64,
            ms = t0.elapsed().as_millis() as u64,
            "lazy open waited"
        );
        r
    }

    /// [`Shared::open_data`] of an object that is not local.
    fn open_fetching(
        self: &Arc<Self>,
        o: u32,
        path: &[u8],
    ) -> io::Result<crate::overlay::LowerData> {
        if self.pieces.contains_key(&o) {
            let p = self.pieced(o).map_err(|e| {
                tracing::error!(file = %String::from_utf8_lossy(path), "reading a lazily fetched file: {e}");
                io::Error::from_raw_os_error(libc::EIO)
            })?;
            let gate: Arc<dyn crate::overlay::ReadGate> = Arc::new(pieced::Gate(p.clone()));
            return Ok(lower_data(p.reader()?, Some(gate)));
        }
        self.open(o, path).map(|f| lower_data(f, None))
    }

    /// The [`pieced::Pieced`] of object `o` (which has pieces), made on first use.
    ///
    /// Errors: [`Error::Io`] making its sparse file.
    fn pieced(self: &Arc<Self>, o: u32) -> Result<Arc<pieced::Pieced>> {
        let mut map = self.pieced.lock();
        if let Some(p) = map.get(&o) {
            return Ok(p.clone());
        }
        let cvs = self.pieces[&o].clone();
        let size = self.tree.objects[o as usize].1;
        let p = Arc::new(pieced::Pieced::new(self.clone(), o, size, cvs)?);
        map.insert(o, p.clone());
        Ok(p)
    }

    /// A read of object `o` got EIO because of `why`: logged, and kept for the report.
    fn read_failed(&self, o: u32, why: &str) {
        let e = self.tree.object_entry[o as usize];
        self.note_failed(
            &String::from_utf8_lossy(&self.tree.nodes[e as usize].path),
            why,
        );
    }

    /// A read of `file` got EIO because of `why`: logged, and kept for the report (the first
    /// [`FAILED_KEPT`] distinct ones: the kernel's read-ahead retries a failed range, and one
    /// failure is said once).
    fn note_failed(&self, file: &str, why: &str) {
        tracing::error!(%file, "reading a lazily fetched file: {why}");
        let line = format!("{file}: {why}");
        let mut failed = self.failed.lock();
        if failed.len() < FAILED_KEPT && !failed.contains(&line) {
            failed.push(line);
        }
    }

    /// Makes object `o` local for a reader: joins the unit in flight that holds it, or starts
    /// one of at most `window` bytes (a demand unit). Returns once that unit ended.
    ///
    /// Errors: the unit's error, as a message.
    fn fetch(self: &Arc<Self>, o: u32, window: u64) -> std::result::Result<(), String> {
        // Its bytes, once here, are stored before those of objects nobody waits for.
        self.rank[o as usize].store(queue::URGENT, Relaxed);
        if self.stores.urge(o) {
            self.start_store_worker();
        }
        match self.join_or_start(o, window, Class::Demand) {
            Some(flight) => {
                // No trace replay unit starts meanwhile: the link is this reader's.
                self.waiting.fetch_add(1, Relaxed);
                // The unit always ends: every step of it has a progress deadline.
                let r = flight.wait(Duration::from_secs(3600));
                self.waiting.fetch_sub(1, Relaxed);
                r
            }
            None => Ok(()),
        }
    }

    /// The flight of `o` (a new unit of `class` started with `o` first when none holds it);
    /// `None` when `o` is local already. Every object of a unit has its own flight, ended as
    /// soon as that object is local, so a reader waits for its own file only.
    fn join_or_start(self: &Arc<Self>, o: u32, window: u64, class: Class) -> Option<Arc<Flight>> {
        let mut flights = self.flights.lock();
        if let Some(f) = flights.get(&o) {
            return Some(f.clone());
        }
        if self.state[o as usize].load(Relaxed) == LOCAL {
            return None;
        }
        let unit = self.unit(o, window, &flights);
        for &u in &unit {
            flights.insert(u, Flight::new());
        }
        let mine = flights[&o].clone();
        // Read-ahead: a reader's next files are usually the pack's next ones (a package's
        // other modules; packs hold files in path order), and every byte is fetched once the
        // layer completes anyway: the window after this one starts too.
        let ahead = match (class, self.loc[*unit.last().expect("never empty") as usize]) {
            (Class::Demand, Loc::Packed { pack, pos, .. }) if !self.replaying.load(Relaxed) => {
                let list = &self.packs[pack as usize].1;
                list.get(pos as usize + 1).copied().filter(|&n| {
                    self.state[n as usize].load(Relaxed) != LOCAL && !flights.contains_key(&n)
                })
            }
            _ => None,
        };
        drop(flights);
        self.launch(o, unit, class);
        if let Some(n) = ahead {
            self.join_or_start(n, window, Class::Background);
        }
        Some(mine)
    }

    /// Starts the unit `planned` ([`Shared::trace_plan`]) for `class` (a trace replay's or
    /// the prefetch's): its objects that are neither local nor in flight (the others' bytes
    /// are dropped), `first` (the one the run opened first) made local first when it is among
    /// them. Returns whether a unit started.
    fn start_planned(self: &Arc<Self>, first: u32, planned: &[u32], class: Class) -> bool {
        let mut flights = self.flights.lock();
        let unit: Vec<u32> = (planned.iter().copied())
            .filter(|&u| self.state[u as usize].load(Relaxed) != LOCAL && !flights.contains_key(&u))
            .collect();
        let Some(&head) = unit.first() else {
            return false;
        };
        for &u in &unit {
            flights.insert(u, Flight::new());
        }
        drop(flights);
        let first = if unit.contains(&first) { first } else { head };
        self.launch(first, unit, class);
        true
    }

    /// Runs `unit` (whose objects have flights) for `class` on the runtime, `o` first, counting
    /// it as in flight for its class until it ends; what it did not make local then gets its
    /// error, and a missing or corrupt object marks the layer broken.
    fn launch(self: &Arc<Self>, o: u32, unit: Vec<u32>, class: Class) {
        let counter = match class {
            Class::Demand | Class::Prefetch => &self.demand,
            Class::Trace | Class::Background => &self.background,
        };
        counter.fetch_add(1, Relaxed);
        let me = Arc::clone(self);
        self.remote.rt.spawn(async move {
            let r = me.clone().run_unit(o, &unit, class).await;
            if let Err(e) = &r
                && matches!(
                    e,
                    Error::Remote {
                        kind: RemoteKind::NotFound | RemoteKind::Corrupt,
                        ..
                    }
                )
            {
                me.broken.lock().get_or_insert_with(|| e.to_string());
            }
            // What the unit did not make local gets its error (a queued object's flight ends
            // when it is stored).
            let why = r.err().map(|e| e.to_string());
            for &u in &unit {
                if me.state[u as usize].load(Relaxed) != QUEUED {
                    me.done(u, Err(why.clone().unwrap_or_else(|| "not fetched".into())));
                }
            }
            match class {
                Class::Demand | Class::Prefetch => {
                    let now = me.started.elapsed().as_millis() as u64;
                    me.last_demand_ms.store(now, Relaxed);
                    &me.demand
                }
                Class::Trace | Class::Background => &me.background,
            }
            .fetch_sub(1, Relaxed);
        });
    }

    /// Ends the flight of `o` (if it still has one) with `r`; `Ok` when `o` is local.
    fn done(&self, o: u32, r: std::result::Result<(), String>) {
        let f = self.flights.lock().remove(&o);
        if let Some(f) = f {
            let local = self.state[o as usize].load(Relaxed) == LOCAL;
            f.finish(if local { Ok(()) } else { r });
        }
    }

    /// The objects one unit fetches with `o`: `o` alone when stored alone; otherwise `o` and
    /// its pack neighbours that are neither local nor in flight, contiguous, at most `window`
    /// bytes in all.
    fn unit(&self, o: u32, window: u64, flights: &HashMap<u32, Arc<Flight>>) -> Vec<u32> {
        let Loc::Packed { pack, len, pos, .. } = self.loc[o as usize] else {
            return vec![o];
        };
        let list = &self.packs[pack as usize].1;
        let free =
            |i: u32| self.state[i as usize].load(Relaxed) != LOCAL && !flights.contains_key(&i);
        let size = |i: u32| match self.loc[i as usize] {
            Loc::Packed { len, .. } => len,
            Loc::Alone => 0,
        };
        let (mut lo, mut hi, mut total) = (pos as usize, pos as usize + 1, len);
        while hi < list.len() && free(list[hi]) && total + size(list[hi]) <= window {
            total += size(list[hi]);
            hi += 1;
        }
        while lo > 0 && free(list[lo - 1]) && total + size(list[lo - 1]) <= window {
            total += size(list[lo - 1]);
            lo -= 1;
        }
        list[lo..hi].to_vec()
    }

    /// The trace replay's units for the traced objects `order` (in the order the recorded run
    /// first opened their files), in the order to start them: per pack, the traced objects in
    /// pack order are cut into stretches where one ends at most [`TRACE_GAP`] bytes before the
    /// next starts and the stretch spans at most `window` bytes; a unit is a stretch with every
    /// object in it (the untraced ones between come with the same GET), or one traced object
    /// stored alone. Units start in the order of their first-opened object, which goes with
    /// each: `(first, objects in pack order)`. Planned at once rather than object by object,
    /// so the objects of a package the run opened out of pack order come with one GET, not
    /// one per object that a unit ahead of them left out.
    fn trace_plan(&self, order: &[u32], window: u64) -> Vec<(u32, Vec<u32>)> {
        let mut rank: HashMap<u32, usize> = HashMap::new();
        for (r, &o) in order.iter().enumerate() {
            rank.entry(o).or_insert(r);
        }
        let mut units: Vec<(usize, u32, Vec<u32>)> = Vec::new();
        let mut by_pack: HashMap<u32, Vec<u32>> = HashMap::new();
        for (&o, &r) in &rank {
            match self.loc[o as usize] {
                Loc::Packed { pack, pos, .. } => by_pack.entry(pack).or_default().push(pos),
                Loc::Alone => units.push((r, o, vec![o])),
            }
        }
        let span = |list: &[u32], p: u32| match self.loc[list[p as usize] as usize] {
            Loc::Packed { offset, len, .. } => (offset, offset + len),
            Loc::Alone => unreachable!("a packed object"),
        };
        for (pack, mut poss) in by_pack {
            poss.sort_unstable();
            let list = &self.packs[pack as usize].1;
            let mut stretches: Vec<(u32, u32)> = Vec::new();
            for p in poss {
                let (start, end) = span(list, p);
                match stretches.last_mut() {
                    Some((a, b))
                        if start.saturating_sub(span(list, *b).1) <= TRACE_GAP
                            && end - span(list, *a).0 <= window =>
                    {
                        *b = p
                    }
                    _ => stretches.push((p, p)),
                }
            }
            for (a, b) in stretches {
                let objects = list[a as usize..=b as usize].to_vec();
                let (r, first) = (objects.iter())
                    .filter_map(|o| rank.get(o).map(|&r| (r, *o)))
                    .min()
                    .expect("a stretch starts and ends on traced objects");
                units.push((r, first, objects));
            }
        }
        units.sort_unstable_by_key(|u| u.0);
        units.into_iter().map(|(_, f, u)| (f, u)).collect()
    }

    /// Fetches `unit` (objects of one pack in pack order, or one object stored alone; the
    /// GET holding `first` goes first) for `class`, retrying transient failures until the
    /// bound; every object of it is local or queued to be stored ([`Shared::stores`]: its
    /// flight then ends once it is) when this returns `Ok`. Shares the work with the
    /// other daemons of the layer: fetches only the objects it claims ([`Shared::claim`]), in
    /// runs of one GET each ([`Shared::runs`]), and waits (holding no claim) for the rest to arrive from the daemon
    /// that claimed them, claiming what that daemon lets go of; after [`Limits::bound`] it
    /// fetches what is left without claiming.
    ///
    /// Errors: the remote's error (transient after the bound; a missing object or a corrupt
    /// one at once).
    async fn run_unit(self: Arc<Self>, first: u32, unit: &[u32], class: Class) -> Result<()> {
        let t0 = Instant::now();
        let _done = scopeguard_log(unit.len(), class, t0, self.started);
        let mut todo = unit.to_vec();
        // The unit's objects were neither local nor in flight when it started: what the first
        // round claims is looked for on disk once (after the claim), not twice.
        let mut first_round = true;
        let queued = |u: u32| self.state[u as usize].load(Relaxed) == QUEUED;
        loop {
            if first_round {
                todo.retain(|&u| self.state[u as usize].load(Relaxed) == UNKNOWN);
            } else {
                todo.retain(|&u| !queued(u) && !self.arrived(u));
            }
            first_round = false;
            if todo.is_empty() {
                return Ok(());
            }
            // Held until the objects fetched under it are stored (queued ones hold it too).
            let claim = Arc::new(self.claim(&todo, t0.elapsed() >= self.limits.bound));
            // Looked for again once claimed: the daemon that held the claim may have just
            // placed it.
            let mine: Vec<u32> = (claim.objects.iter().copied())
                .filter(|&u| !self.arrived(u))
                .collect();
            if mine.is_empty() {
                drop(claim);
                tokio::time::sleep(CLAIM_POLL).await;
                continue;
            }
            for run in self.runs(first, &mine) {
                retrying(self.limits, &self.health, || async {
                    match self.loc[run[0] as usize] {
                        Loc::Alone => self.fetch_alone(run[0], class).await,
                        Loc::Packed { .. } => self.clone().fetch_packed(&run, &claim, class).await,
                    }
                })
                .await?;
            }
            drop(claim);
            // Every fetch above that ended well stored or queued what it claimed (a queued
            // object that could not be stored got its error); one that did not would make this
            // loop fetch again at once, for ever.
            let lost = (mine.iter())
                .filter(|&&u| self.state[u as usize].load(Relaxed) == UNKNOWN)
                .count();
            if lost > 0 {
                return Err(Error::Failed(format!(
                    "lazy fetch: {lost} object(s) fetched but not stored"
                )));
            }
        }
    }

    /// Whether object `o` is local, ending its flight (`Ok`) when it has just become so
    /// (another daemon of the layer placed it in `held/`).
    fn arrived(&self, o: u32) -> bool {
        let was = self.state[o as usize].load(Relaxed) == LOCAL;
        let now = was || self.is_local(o);
        if now && !was {
            self.done(o, Ok(()));
        }
        now
    }

    /// Claims for this daemon the objects of `todo` no other daemon of the layer claims (a
    /// byte lock each in [`FETCH_LOCKS`], taken without waiting); all of them with `force` or
    /// without the lock file. The claims go when the result is dropped.
    fn claim(self: &Arc<Self>, todo: &[u32], force: bool) -> Claim {
        let mut c = Claim {
            shared: Arc::clone(self),
            objects: Vec::new(),
            offsets: Vec::new(),
        };
        for &u in todo {
            let at = lock_offset(&self.ids[u as usize]);
            match (&self.locks, force) {
                (Some(f), false) => match crate::sys::ofd_lock_byte(f, at, true) {
                    Ok(true) => {
                        c.objects.push(u);
                        c.offsets.push(at);
                    }
                    Ok(false) => {} // another daemon fetches it
                    Err(e) => {
                        tracing::debug!("lazy fetch: a fetch lock: {e}");
                        c.objects.push(u);
                    }
                },
                _ => c.objects.push(u),
            }
        }
        c
    }

    /// `objects` (of one unit) as runs to fetch one GET each: each object stored alone on
    /// its own, packed ones in runs of objects of one pack with at most [`TRACE_GAP`] bytes
    /// between one and the next (bytes the GET brings and drops: objects local already, in
    /// flight in another unit or claimed by another daemon); the run holding `first` comes
    /// first.
    fn runs(&self, first: u32, objects: &[u32]) -> Vec<Vec<u32>> {
        let mut runs: Vec<Vec<u32>> = Vec::new();
        let key = |o: u32| match self.loc[o as usize] {
            Loc::Packed { pack, pos, .. } => Some((pack, pos)),
            Loc::Alone => None,
        };
        let mut sorted = objects.to_vec();
        sorted.sort_by_key(|&o| key(o));
        for o in sorted {
            let joins = match (runs.last().and_then(|r| r.last()), self.loc[o as usize]) {
                (Some(&prev), Loc::Packed { pack, offset, .. }) => match self.loc[prev as usize] {
                    Loc::Packed {
                        pack: pp,
                        offset: po,
                        len: pl,
                        ..
                    } => pp == pack && offset.saturating_sub(po + pl) <= TRACE_GAP,
                    Loc::Alone => false,
                },
                _ => false,
            };
            match joins {
                true => runs.last_mut().expect("joined a run").push(o),
                false => runs.push(vec![o]),
            }
        }
        if let Some(i) = runs.iter().position(|r| r.contains(&first)) {
            runs.swap(0, i);
        }
        runs
    }

    /// One GET of the pack range of `unit` (objects made local or queued by an earlier
    /// attempt are skipped; bytes between its objects are dropped), each object queued to be
    /// verified and stored ([`Shared::queue_store`], holding `claim` until it is) as soon as
    /// its bytes are in, so a reader waiting for one of the first objects of a long range
    /// does not wait for the rest of it. Ends when the last byte is in.
    ///
    /// Errors: as [`Shared::get_into`]; [`RemoteError::Corrupt`](super::super::RemoteError)
    /// when the remote sends more or fewer bytes than asked for.
    async fn fetch_packed(
        self: Arc<Self>,
        unit: &[u32],
        claim: &Arc<Claim>,
        class: Class,
    ) -> Result<()> {
        let (pack, start) = match self.loc[unit[0] as usize] {
            Loc::Packed { pack, offset, .. } => (pack, offset),
            Loc::Alone => unreachable!("a packed unit"),
        };
        let end = match self.loc[*unit.last().expect("a unit is never empty") as usize] {
            Loc::Packed { offset, len, .. } => offset + len,
            Loc::Alone => unreachable!("a packed unit"),
        };
        let name = &self.packs[pack as usize].0;
        let what = format!("fetching pack {name} bytes {start}..{end}");
        // The objects to store, in pack order, and the next one whose bytes are awaited.
        let todo: Vec<(u32, u64, u64)> = (unit.iter())
            .filter(|&&u| self.state[u as usize].load(Relaxed) == UNKNOWN)
            .filter_map(|&u| match self.loc[u as usize] {
                Loc::Packed { offset, len, .. } => Some((u, offset - start, len)),
                Loc::Alone => None,
            })
            .collect();
        let mut next = 0;
        // Queues the objects of `todo` from `next` on whose bytes are all in `buf` (an empty
        // object needs no byte).
        let store_ready = |buf: &[u8], next: &mut usize| {
            while let Some(&(o, at, len)) = todo.get(*next)
                && at + len <= buf.len() as u64
            {
                let bytes = buf[at as usize..(at + len) as usize].to_vec();
                self.queue_store(o, bytes, claim, class);
                *next += 1;
            }
        };
        let mut buf = Vec::with_capacity((end - start) as usize);
        if end > start {
            let path = self.remote.layout.pack(&self.project, name);
            let opts = GetOptions {
                range: Some(GetRange::Bounded(start..end)),
                ..Default::default()
            };
            self.get_into(&what, self.remote.store.get_opts(&path, opts), |c| {
                if (buf.len() + c.len()) as u64 > end - start {
                    return Err(self.corrupt(
                        &format!("pack {name}"),
                        format!("more than the {} bytes asked for", end - start),
                    ));
                }
                buf.extend_from_slice(c);
                store_ready(&buf, &mut next);
                Ok(())
            })
            .await?;
        }
        // A range of empty objects only sends no GET; empty ones at its end come with no chunk.
        store_ready(&buf, &mut next);
        if buf.len() as u64 != end - start {
            return Err(self.corrupt(
                &format!("pack {name}"),
                format!("{} bytes received of {}", buf.len(), end - start),
            ));
        }
        Ok(())
    }

    /// Queues the (not yet verified) `bytes` of packed object `o`, fetched by a unit of
    /// `class`, in [`Shared::stores`] at its [`Shared::rank`], unless it is local or queued
    /// already; starts a worker ([`Shared::start_store_worker`]) when the queue wants one. The
    /// item holds `claim`. An object a trace replay unit brought that neither the trace names
    /// nor a reader asked for goes last ([`DEFERRED`]: it may wait for the run to be quiet),
    /// and its fetch lock goes at once: another daemon of the layer that needs it meanwhile
    /// fetches it itself rather than wait for this run to be quiet.
    fn queue_store(self: &Arc<Self>, o: u32, bytes: Vec<u8>, claim: &Arc<Claim>, class: Class) {
        let s = &self.state[o as usize];
        if s.compare_exchange(UNKNOWN, QUEUED, Relaxed, Relaxed)
            .is_err()
        {
            return;
        }
        let mut priority = self.rank[o as usize].load(Relaxed);
        if priority == DEFERRED {
            match (class, &self.locks) {
                (Class::Trace, Some(f)) => {
                    let _ = crate::sys::ofd_lock_byte(f, lock_offset(&self.ids[o as usize]), false);
                }
                (Class::Trace, None) => {}
                _ => priority = DEFERRED - 1,
            }
        }
        let item = queue::Item {
            bytes,
            _hold: Arc::clone(claim),
        };
        if self.stores.push(o, priority, item) {
            self.start_store_worker();
        }
    }

    /// Starts a worker of [`Shared::stores`] (the queue counts it already): it verifies and
    /// stores queued objects, most wanted first ([`Shared::store_queued`]), until none is left
    /// that may be stored now ([`Shared::store_limit`]).
    fn start_store_worker(self: &Arc<Self>) {
        let me = Arc::clone(self);
        self.remote.rt.spawn_blocking(move || {
            while let Some((o, item)) = me.stores.next(me.store_limit()) {
                me.store_queued(o, item);
            }
        });
    }

    /// The lowest priority [`Shared::stores`] stores now: every object once the run is quiet
    /// ([`Shared::quiet`]) or the queue holds more than half of [`STORE_BACKLOG`]; until then
    /// not the [`DEFERRED`] ones (a trace replay unit's objects between the traced ones):
    /// creating their files would take CPU from the run, which may never open them. Those
    /// wait in memory; [`Shared::background`] starts a worker for them when the run is quiet,
    /// and a reader's open stores one at once.
    fn store_limit(&self) -> u32 {
        if self.quiet() || self.stores.bytes() > STORE_BACKLOG / 2 {
            DEFERRED
        } else {
            DEFERRED - 1
        }
    }

    /// Checks the queued `item` of object `o` against its id and stores it
    /// ([`Shared::store_bytes`]), ending its flight: `Ok`, or its error (bytes that do not
    /// match mark the layer broken; the object is then not local and may be fetched again).
    fn store_queued(&self, o: u32, item: queue::Item<Arc<Claim>>) {
        let id = &self.ids[o as usize];
        let r = if blake3::hash(&item.bytes).as_bytes() != &id.0 {
            let pack = match self.loc[o as usize] {
                Loc::Packed { pack, .. } => self.packs[pack as usize].0.as_str(),
                Loc::Alone => "",
            };
            let e = self.corrupt(
                &format!("object {id} in pack {pack}"),
                "its bytes do not match its id".into(),
            );
            self.broken.lock().get_or_insert_with(|| e.to_string());
            Err(e)
        } else {
            self.store_bytes(o, &item.bytes)
        };
        // Stored (or not): the claim on it may go.
        drop(item);
        match r {
            Ok(()) => self.done(o, Ok(())),
            Err(e) => {
                let _ = self.state[o as usize].compare_exchange(QUEUED, UNKNOWN, Relaxed, Relaxed);
                self.done(o, Err(e.to_string()));
            }
        }
    }

    /// Sends one GET (`request`) and hands each chunk of its body to `each`, abandoning it
    /// when the answer or a chunk takes longer than the progress deadline; counts the GET.
    ///
    /// Errors: as [`get_progressing`].
    async fn get_into(
        &self,
        what: &str,
        request: impl std::future::Future<
            Output = std::result::Result<object_store::GetResult, object_store::Error>,
        >,
        each: impl FnMut(&[u8]) -> Result<()>,
    ) -> Result<()> {
        self.counts.gets.fetch_add(1, Relaxed);
        get_progressing(
            &self.remote,
            (self.limits, &self.health),
            what,
            request,
            each,
        )
        .await
    }

    /// Streams object `o` (stored alone) into a temporary file, hashing it, and makes it
    /// local once it is verified ([`Shared::place`]); an object with pieces is filled piece
    /// by piece instead, joining the pieces readers fetch ([`pieced::Pieced::fill`]).
    async fn fetch_alone(self: &Arc<Self>, o: u32, class: Class) -> Result<()> {
        if self.pieces.contains_key(&o) {
            // A prefetch counts as a demand read: it must not wait for demand reads to end.
            let background = matches!(class, Class::Trace | Class::Background);
            return self.pieced(o)?.fill(background).await;
        }
        let tmp = self.temp();
        let r = match create_temp(&tmp, 0o600) {
            // Held open (and flocked) until placed.
            Ok(mut f) => (self.stream_to(o, &mut f, &tmp).await).and_then(|()| self.place(o, &tmp)),
            Err(e) => Err(e),
        };
        if r.is_err() {
            let _ = fs::remove_file(&tmp);
        }
        r
    }

    /// GETs object `o` into `f` (the new file `tmp`) in ranges of [`PIECE`] bytes, one after the
    /// other, each retried on its own after a stall (until the bound has passed since the last
    /// piece that arrived), hashing as it goes; checks length and blake3 at the end. A big
    /// object arriving slowly but steadily is never cut off: no request carries more than a
    /// piece.
    ///
    /// Errors: as [`Shared::get_into`] once a piece's retries are over;
    /// [`RemoteError::Corrupt`](super::super::RemoteError) when the bytes do not match.
    async fn stream_to(&self, o: u32, f: &mut File, tmp: &Path) -> Result<()> {
        let id = self.ids[o as usize];
        let size = self.tree.objects[o as usize].1;
        let what = format!("fetching object {id}");
        let path = self.remote.layout.object(&self.project, &id);
        let mut h = blake3::Hasher::new();
        let mut n = 0u64;
        while n < size {
            let end = (n + PIECE).min(size);
            let piece = retrying(self.limits, &self.health, || async {
                let mut piece = Vec::with_capacity((end - n) as usize);
                let opts = GetOptions {
                    range: Some(GetRange::Bounded(n..end)),
                    ..Default::default()
                };
                let get = self.remote.store.get_opts(&path, opts);
                self.get_into(&what, get, |c| {
                    piece.extend_from_slice(c);
                    Ok(())
                })
                .await?;
                Ok(piece)
            })
            .await?;
            if piece.is_empty() {
                break; // the object is shorter than the manifest says: caught below
            }
            h.update(&piece);
            f.write_all(&piece).map_err(|e| Error::io(tmp, e))?;
            n += piece.len() as u64;
        }
        if n != size || h.finalize().as_bytes() != &id.0 {
            return Err(self.corrupt(
                &format!("object {id}"),
                format!("{n} of {size} bytes received, not matching its id"),
            ));
        }
        Ok(())
    }

    /// Writes the verified `bytes` of object `o` to a new file and makes it local
    /// ([`Shared::place`]).
    fn store_bytes(&self, o: u32, bytes: &[u8]) -> Result<()> {
        let tmp = self.temp();
        // Held open (and flocked) until placed.
        let r = create_temp(&tmp, 0o400).and_then(|mut f| {
            f.write_all(bytes).map_err(|e| Error::io(&tmp, e))?;
            self.place(o, &tmp)
        });
        if r.is_err() {
            let _ = fs::remove_file(&tmp);
        }
        r
    }

    /// A fresh temporary name in the partial directory (the store's filesystem; gc never
    /// sweeps a partial directory a run holds, so a file being written there is safe from it).
    /// Its name is this fetcher's random tag and a count (one `getrandom` per daemon, not one
    /// per object stored).
    fn temp(&self) -> PathBuf {
        let dir = self.held.parent().unwrap_or(&self.held);
        let n = self.temps.fetch_add(1, Relaxed);
        dir.join(format!("{TEMP_PREFIX}{}-{n}", self.temp_tag))
    }

    /// Makes the verified file `tmp` object `o`'s bytes: renames it to `held/<hex>` (what
    /// readers open; the pull that completes the layer makes the store's objects of it, with
    /// their metadata). When another run put it there meanwhile, that file (the same bytes)
    /// stands and `tmp` goes. Nothing is written in the store's `objects/` while the layer is
    /// partial, so gc has nothing of it to race with.
    ///
    /// Errors: [`Error::Io`] renaming.
    fn place(&self, o: u32, tmp: &Path) -> Result<()> {
        self.place_counted(o, tmp, true)
    }

    /// [`Shared::place`], adding the object's bytes to the fetched bytes when `count_bytes`
    /// (an object fetched piece by piece counted each piece as it came).
    ///
    /// Errors: [`Error::Io`] renaming.
    fn place_counted(&self, o: u32, tmp: &Path, count_bytes: bool) -> Result<()> {
        let held = self.held_path(o);
        match crate::sys::rename_noreplace(tmp, &held) {
            Ok(()) => {}
            Err(e) if e.raw_os_error() == Some(libc::EEXIST) => {
                let _ = fs::remove_file(tmp);
            }
            // A big object's file is shared by the daemons of the layer: the first to see
            // every piece renamed it.
            Err(e) if e.raw_os_error() == Some(libc::ENOENT) && held.exists() => {}
            Err(e) => return Err(Error::io(&held, e)),
        }
        self.state[o as usize].store(LOCAL, Relaxed);
        self.counts.objects.fetch_add(1, Relaxed);
        if count_bytes {
            (self.counts.bytes).fetch_add(self.tree.objects[o as usize].1, Relaxed);
        }
        Ok(())
    }

    /// A corrupt-object error naming `what`.
    fn corrupt(&self, what: &str, detail: String) -> Error {
        super::super::RemoteError::Corrupt {
            url: self.remote.cfg.url.clone(),
            what: what.to_string(),
            detail,
        }
        .into()
    }

    /// The background classes: first the objects of `first` (the replayed trace, in order:
    /// what the run will likely open next, stored in that order: at most [`TRACE_UNITS`]
    /// units at once, none started while a reader waits), then every other object in pack
    /// order (completion: at most [`BACKGROUND_UNITS`] at once, and none started while a
    /// demand read is in flight). Neither starts a unit while [`Shared::stores`] holds more
    /// than [`STORE_BACKLOG`] bytes. Sets [`Shared::complete`] when every object is local.
    pub async fn background(self: Arc<Self>, first: Vec<u32>) {
        let rest: Vec<u32> = (self.packs.iter().flat_map(|(_, l)| l.iter().copied()))
            .chain(
                (0..self.ids.len() as u32).filter(|&o| matches!(self.loc[o as usize], Loc::Alone)),
            )
            .collect();
        // The traced objects are stored in the order the run will open them.
        for (r, &o) in first.iter().enumerate() {
            let r = u32::try_from(r + 1)
                .unwrap_or(DEFERRED - 2)
                .min(DEFERRED - 2);
            self.rank[o as usize].fetch_min(r, Relaxed);
        }
        let plan = self.trace_plan(&first, TRACE_WINDOW);
        self.replaying.store(!plan.is_empty(), Relaxed);
        tracing::info!(
            units = plan.len(),
            at_ms = self.started.elapsed().as_millis() as u64,
            "lazy layer: replaying the trace"
        );
        for (o, unit) in plan {
            if self.stop.load(Relaxed) || self.broken.lock().is_some() {
                break;
            }
            // A reader that waits (for a file the replay did not bring in time, or one
            // arriving piece by piece) gets the link to itself as the units in flight end.
            self.until_probe_due().await;
            while self.background.load(Relaxed) >= TRACE_UNITS
                || self.stores.bytes() > STORE_BACKLOG
                || self.waiting.load(Relaxed) + self.demand.load(Relaxed) > 0
            {
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
            self.start_planned(o, &unit, Class::Trace);
        }
        while self.background.load(Relaxed) > 0 {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        self.replaying.store(false, Relaxed);
        tracing::info!(
            at_ms = self.started.elapsed().as_millis() as u64,
            "lazy layer: trace replayed"
        );
        for o in rest {
            if self.stop.load(Relaxed) || self.broken.lock().is_some() {
                break;
            }
            if self.is_local(o) || self.flights.lock().contains_key(&o) {
                continue;
            }
            loop {
                self.store_left();
                let busy = self.background.load(Relaxed) >= BACKGROUND_UNITS
                    || (self.health.is_down() && !self.health.probe_due())
                    || self.demand.load(Relaxed) > 0
                    || self.stores.bytes() > STORE_BACKLOG
                    || !self.quiet();
                if !busy {
                    break;
                }
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
            self.join_or_start(o, BACKGROUND_WINDOW, Class::Background);
        }
        while self.background.load(Relaxed) > 0 || self.stores.busy() {
            self.store_left();
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        let all = (0..self.ids.len() as u32).all(|o| self.state[o as usize].load(Relaxed) == LOCAL);
        self.complete.store(all, Relaxed);
        tracing::info!(complete = all, "lazy layer: background fetching ended");
    }

    /// Returns at once while the remote answers; while it is down, once a probe is due or the
    /// fetcher stops (background units would fail at once, dropping the objects they hold for
    /// this run).
    async fn until_probe_due(&self) {
        while self.health.is_down() && !self.health.probe_due() && !self.stop.load(Relaxed) {
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// Starts a worker for the objects [`Shared::store_limit`] left in [`Shared::stores`] once
    /// the run is quiet.
    fn store_left(self: &Arc<Self>) {
        if self.quiet() && self.stores.kick() {
            self.start_store_worker();
        }
    }

    /// The run opened one of the layer's files (fetched or not): completion waits for a quiet
    /// moment after it as after a demand read ([`Shared::quiet`]), so bulk transfers (their
    /// GETs, the server's and this daemon's CPU) do not compete with a run busy reading files
    /// a trace replay already brought.
    pub fn opened(&self) {
        let now = self.started.elapsed().as_millis() as u64;
        self.last_demand_ms.fetch_max(now, Relaxed);
    }

    /// Whether completion may start a unit: [`COMPLETION_QUIET`] has passed since the start
    /// and since the last demand read ended or file was opened.
    fn quiet(&self) -> bool {
        let now = self.started.elapsed();
        let last = Duration::from_millis(self.last_demand_ms.load(Relaxed));
        now >= COMPLETION_QUIET && now.saturating_sub(last) >= COMPLETION_QUIET
    }

    /// Holds off the trace replay as a waiting reader does (no replay unit starts) until the
    /// result is dropped: taken before the prefetch ([`Shared::prefetch`]) is started, so no
    /// replay unit gets ahead of it on the link.
    pub fn hold_replay(self: &Arc<Self>) -> ReplayHold {
        self.waiting.fetch_add(1, Relaxed);
        ReplayHold(Arc::clone(self))
    }

    /// The prefetch before COMMAND (`prefetch.rs`): fetches the objects of `candidates` (the
    /// likely-mmapped traced files' objects, in trace order) that are not local, as many as
    /// fit in `budget` bytes, in units of [`Class::Prefetch`] (per pack, the chosen objects
    /// close together: one GET each; at most [`PREFETCH_UNITS`] at once, in the order of
    /// their first-opened object), each verified and stored as a reader's is; returns when all
    /// of them are local or failed, or at `deadline` (what is in flight then goes on
    /// arriving). Blocks the calling thread. Nothing is fetched while the remote is down, or
    /// when `rate` (bytes per second the link gave at least, if known) could not bring the
    /// chosen objects before the deadline. `started`: the daemon's start (the result's `ms`
    /// counts from it).
    pub fn prefetch(
        self: &Arc<Self>,
        candidates: &[u32],
        budget: u64,
        (deadline, rate): (Instant, Option<u64>),
        started: Instant,
    ) -> Prefetched {
        let ms = || started.elapsed().as_millis() as u64;
        let (mut chosen, mut wanted_bytes) = (Vec::new(), 0u64);
        for &o in candidates {
            let size = self.tree.objects[o as usize].1;
            if chosen.contains(&o) || wanted_bytes + size > budget || self.is_local(o) {
                continue;
            }
            wanted_bytes += size;
            chosen.push(o);
        }
        if chosen.is_empty() {
            let why = "the traced files likely to be mmapped are local (or over the budget)";
            return Prefetched::skipped(why, ms());
        }
        if self.health.is_down() {
            return Prefetched::skipped("the remote is down", ms());
        }
        let left = deadline.saturating_duration_since(Instant::now());
        let slow = rate.and_then(|r| slower_than(wanted_bytes, r, left, "the object table"));
        if let Some(why) = slow {
            return Prefetched::skipped(&why, ms());
        }
        // Stored right after what a reader waits for ([`queue::URGENT`]).
        for &o in &chosen {
            self.rank[o as usize].fetch_min(1, Relaxed);
        }
        let set: std::collections::HashSet<u32> = chosen.iter().copied().collect();
        // Per pack, stretches of chosen objects close together (one GET each, the bytes
        // between dropped); the objects between them are not fetched.
        let mut plan = (self.trace_plan(&chosen, TRACE_WINDOW).into_iter()).map(|(f, u)| {
            (
                f,
                u.into_iter()
                    .filter(|o| set.contains(o))
                    .collect::<Vec<_>>(),
            )
        });
        let mut active: std::collections::VecDeque<Vec<u32>> = Default::default();
        loop {
            while active.len() < PREFETCH_UNITS && Instant::now() < deadline {
                let Some((first, unit)) = plan.next() else {
                    break;
                };
                if self.start_planned(first, &unit, Class::Prefetch) {
                    active.push_back(unit);
                }
            }
            let Some(unit) = active.pop_front() else {
                break;
            };
            for o in unit {
                let flight = self.flights.lock().get(&o).cloned();
                let left = deadline.saturating_duration_since(Instant::now());
                if let Some(f) = flight
                    && !left.is_zero()
                {
                    let _ = f.wait(left);
                }
            }
            if Instant::now() >= deadline {
                break;
            }
        }
        let here: Vec<u32> = (chosen.iter().copied())
            .filter(|&o| self.state[o as usize].load(Relaxed) == LOCAL)
            .collect();
        Prefetched {
            objects: here.len() as u64,
            bytes: here.iter().map(|&o| self.tree.objects[o as usize].1).sum(),
            wanted_objects: chosen.len() as u64,
            wanted_bytes,
            ms: ms(),
            skipped: None,
        }
    }

    /// Starts [`Shared::background`] with the replayed trace `first`.
    pub fn spawn_background(self: &Arc<Self>, first: Vec<u32>) {
        let me = Arc::clone(self);
        self.remote.rt.spawn(me.background(first));
    }

    /// At the daemon's exit: verifies and stores what the queue still holds — the objects a
    /// trace replay brought along that waited for a quiet run — for up to `within`, so the
    /// next run finds them in `held/` and never fetches them again. Returns how many were
    /// stored (or failed to be: a mismatch marks the layer broken, as any store does).
    pub fn store_held(&self, within: Duration) -> usize {
        let start = Instant::now();
        let mut n = 0;
        while start.elapsed() < within
            && let Some((o, item)) = self.stores.take()
        {
            self.store_queued(o, item);
            n += 1;
        }
        n
    }

    /// Tells the background task to stop starting units.
    pub fn stop(&self) {
        self.stop.store(true, Relaxed);
    }

    /// Whether the remote is down for this fetcher (a fetch got no answer within the bound and
    /// no probe has had one since).
    pub fn remote_down(&self) -> bool {
        self.health.is_down()
    }

    /// Objects local now (by the remembered state).
    pub fn local_count(&self) -> (u64, u64) {
        let mut n = 0;
        let mut bytes = 0;
        for (o, s) in self.state.iter().enumerate() {
            if s.load(Relaxed) == LOCAL {
                n += 1;
                bytes += self.tree.objects[o].1;
            }
        }
        (n, bytes)
    }
}

/// The trace replay held off ([`Shared::hold_replay`]) until this is dropped.
pub(super) struct ReplayHold(Arc<Shared>);

impl Drop for ReplayHold {
    fn drop(&mut self) {
        self.0.waiting.fetch_sub(1, Relaxed);
    }
}

/// The objects a unit claimed ([`Shared::claim`]): their fetch locks go when it is dropped.
struct Claim {
    shared: Arc<Shared>,
    /// The objects this unit fetches.
    objects: Vec<u32>,
    /// The bytes of [`FETCH_LOCKS`] it holds.
    offsets: Vec<u64>,
}

impl Drop for Claim {
    fn drop(&mut self) {
        if let Some(f) = &self.shared.locks {
            for &at in &self.offsets {
                let _ = crate::sys::ofd_lock_byte(f, at, false);
            }
        }
    }
}

/// Creates the temporary file `path` (mode `mode`, failing if it exists) and flocks it, so
/// [`remove_stale_temps`] leaves it alone while it is open.
///
/// Errors: [`Error::Io`] creating it.
fn create_temp(path: &Path, mode: u32) -> Result<File> {
    let f = fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(mode)
        .custom_flags(libc::O_CLOEXEC)
        .open(path)
        .map_err(|e| Error::io(path, e))?;
    if let Err(e) = crate::sys::flock(&f, libc::LOCK_EX | libc::LOCK_NB) {
        tracing::debug!(path = %path.display(), "lazy fetch: locking a temporary file: {e}");
    }
    Ok(f)
}

/// Logs a unit's class and size when it starts and its duration when it ends (debug), with
/// the time since the fetcher `started` (ms).
fn scopeguard_log(objects: usize, class: Class, t0: Instant, started: Instant) -> impl Drop {
    struct G(usize, Class, Instant, Instant);
    impl Drop for G {
        fn drop(&mut self) {
            tracing::debug!(
                class = ?self.1,
                objects = self.0,
                ms = self.2.elapsed().as_millis() as u64,
                at_ms = self.3.elapsed().as_millis() as u64,
                "lazy unit done"
            );
        }
    }
    let at_ms = started.elapsed().as_millis() as u64;
    tracing::debug!(?class, objects, at_ms, "lazy unit starts");
    G(objects, class, t0, started)
}
