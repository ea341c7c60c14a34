//! A big object served piece by piece while it arrives (`remote/pieces.rs`): its bytes go into
//! a sparse file of the object's size in the partial directory, each [`PIECE_LEN`] piece
//! written only after it matched its CV; a read waits for the pieces it covers
//! ([`ReadGate`]) and starts their fetch, with read-ahead that doubles on sequential reads (up
//! to [`MAX_AHEAD`] pieces). One fetch per piece, shared by every waiter (a demand read, the
//! whole-object fill of a copy-up or of background completion), and one GET per object in
//! flight: the kernel's read-ahead sends several READs at once, and GETs of one reader that
//! competed for the link would each stall (a slow link then cut them off). The file is one
//! per object (`.fetch-<id>.pieces`) for every daemon of the layer: a daemon fetches pieces
//! only while it holds the object's piece claim (a byte lock in the fetch locks) and takes a
//! piece another daemon wrote once it matched its CV. Once every piece is
//! here the file is renamed into `held/` (the same inode: the fds readers hold see the same
//! bytes) and the object is local like any other.

use std::collections::HashMap;
use std::fs::File;
use std::io;
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering::Relaxed};
use std::time::{Duration, Instant};

use blake3::hazmat::ChainingValue;
use object_store::{GetOptions, GetRange};
use parking_lot::{Condvar, Mutex};

use super::{Shared, retrying};
use crate::error::{Error, RemoteKind, Result};
use crate::overlay::ReadGate;
use crate::remote::pieces::{PIECE_LEN, piece_cv};

/// Pieces a sequential reader's read-ahead reaches at most past what it asked for (8 MiB).
pub(in crate::remote::lazy) const MAX_AHEAD: u32 = 8;

/// Pieces one GET of the whole-object fill asks for (a request never carries more, so the
/// progress deadline never cuts a steady transfer).
const FILL_PIECES: u32 = 4;

/// One big object arriving piece by piece (see the module docs).
pub(in crate::remote::lazy) struct Pieced {
    shared: Arc<Shared>,
    /// The object's index in the fetcher.
    o: u32,
    size: u64,
    cvs: Vec<ChainingValue>,
    /// The sparse file in the partial directory, until it is renamed into `held/`.
    tmp: PathBuf,
    file: File,
    state: Mutex<State>,
    changed: Condvar,
    /// Every piece is here and the file is in `held/` (set just before it is moved there,
    /// under [`Pieced::finishing`]).
    done: AtomicBool,
    /// Held by [`Pieced::finish`] while it moves the file into `held/`.
    finishing: Mutex<()>,
}

#[derive(Default)]
struct State {
    have: Vec<bool>,
    /// A fetch holds the piece.
    busy: Vec<bool>,
    /// Why and when the last fetch of a piece failed (cleared when one starts again).
    failed: HashMap<u32, (String, Instant)>,
    /// The last piece a reader asked for, and the read-ahead it got.
    last: Option<u32>,
    ahead: u32,
    /// Fetches of this object in flight (at most one).
    inflight: u32,
    /// Another daemon of the layer holds the object's piece claim: no fetch starts before
    /// this instant (pieces it writes are looked for meanwhile).
    retry_at: Option<Instant>,
    /// Since when the pieces have been another daemon's to fetch (after the fetcher's bound
    /// this one fetches them all the same).
    foreign_since: Option<Instant>,
    /// Another daemon held the claim past the bound once: this one no longer waits for it
    /// (a stopped daemon would otherwise cost every piece the bound).
    forced: bool,
}

/// How a fetch of pieces ended.
enum Run {
    /// It ran (with its error, if it failed).
    Done(Option<Error>),
    /// Another daemon of the layer holds the object's piece claim: nothing was fetched.
    Foreign,
}

impl Pieced {
    /// The object `o` of `shared` (`size` bytes, its pieces' `cvs` checked against its id),
    /// with a new sparse file of its size in the partial directory.
    ///
    /// Errors: [`Error::Io`] creating the file.
    pub(super) fn new(
        shared: Arc<Shared>,
        o: u32,
        size: u64,
        cvs: Vec<ChainingValue>,
    ) -> Result<Pieced> {
        // One file per object for every daemon of the layer: pieces another daemon wrote
        // are found there (each checked against its CV before it counts), also those a
        // killed run left.
        let dir = shared.held.parent().unwrap_or(&shared.held);
        let tmp = dir.join(format!(
            "{}{}.pieces",
            super::TEMP_PREFIX,
            shared.ids[o as usize].to_hex()
        ));
        let file = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .mode(0o600)
            .custom_flags(libc::O_CLOEXEC | libc::O_NOFOLLOW)
            .open(&tmp)
            .and_then(|f| {
                if f.metadata()?.len() != size {
                    f.set_len(size)?;
                }
                Ok(f)
            })
            .map_err(|e| Error::io(&tmp, e))?;
        // Flocked (shared) while any fd of it is open, readers' dups too: a daemon cleaning
        // stale `.fetch-*` files of the partial directory leaves it alone.
        if let Err(e) = crate::sys::flock(&file, libc::LOCK_SH | libc::LOCK_NB) {
            tracing::debug!(path = %tmp.display(), "lazy fetch: locking a temporary file: {e}");
        }
        let n = cvs.len();
        Ok(Pieced {
            shared,
            o,
            size,
            cvs,
            tmp,
            file,
            state: Mutex::new(State {
                have: vec![false; n],
                busy: vec![false; n],
                ..Default::default()
            }),
            changed: Condvar::new(),
            done: AtomicBool::new(false),
            finishing: Mutex::new(()),
        })
    }

    /// A read-only handle on the object's file (the same inode before and after it is
    /// renamed into `held/`).
    ///
    /// Errors: the `dup` errno.
    pub(super) fn reader(&self) -> io::Result<File> {
        self.file.try_clone()
    }

    /// The bytes piece `p` covers.
    fn span(&self, p: u32) -> (u64, u64) {
        let at = p as u64 * PIECE_LEN;
        (at, (at + PIECE_LEN).min(self.size))
    }

    /// Starts a fetch of the first run of pieces in `from..to` that are neither here nor held
    /// by another fetch (`demand`: a reader waits for it) — unless a fetch of this object is
    /// in flight: one GET per object at a time, so a reader's requests never compete with each
    /// other for the link (the kernel's read-ahead sends several READs at once); waiters start
    /// the next when it ends. Caller holds `st`.
    fn start(self: &Arc<Self>, st: &mut State, from: u32, to: u32, demand: bool) {
        if st.inflight > 0 || st.retry_at.is_some_and(|t| Instant::now() < t) {
            return;
        }
        let free = |st: &State, p: u32| !st.have[p as usize] && !st.busy[p as usize];
        let Some(first) = (from..to).find(|&p| free(st, p)) else {
            return;
        };
        let mut end = first;
        while end < to && free(st, end) {
            st.busy[end as usize] = true;
            st.failed.remove(&end);
            end += 1;
        }
        st.inflight += 1;
        if st
            .foreign_since
            .is_some_and(|t| t.elapsed() >= self.shared.limits.bound)
        {
            st.forced = true;
        }
        let force = st.forced;
        let me = Arc::clone(self);
        self.shared.remote.rt.spawn(async move {
            let r = me.claimed_run(first, end, force).await;
            me.ended(first, end, r);
            if demand {
                me.shared.opened();
            }
        });
    }

    /// Pieces `first..end` (busy for this fetch): fetched unless another daemon of the layer
    /// fetches this object's pieces now (its claim, a byte lock in the partial directory's
    /// fetch locks, is taken without waiting; with `force`, or without the lock file, the
    /// fetch goes ahead regardless). Pieces found in the shared file already (another daemon
    /// wrote them) are taken after their check; one GET covers the first run still missing.
    async fn claimed_run(&self, first: u32, end: u32, force: bool) -> Run {
        let s = &self.shared;
        let at = super::lock_offset(&s.ids[self.o as usize]) + 1;
        let held = match (&s.locks, force) {
            (Some(f), false) => match crate::sys::ofd_lock_byte(f, at, true) {
                Ok(got) => got,
                Err(e) => {
                    tracing::debug!("lazy fetch: a piece claim: {e}");
                    true
                }
            },
            _ => true,
        };
        let claimed = held && !force && s.locks.is_some();
        let release = || {
            if let (true, Some(f)) = (claimed, &s.locks) {
                let _ = crate::sys::ofd_lock_byte(f, at, false);
            }
        };
        for p in first..end {
            if self.found(p) {
                self.mark(p);
            }
        }
        if !held {
            return Run::Foreign;
        }
        let (missing, stop) = {
            let st = self.state.lock();
            let missing = (first..end).find(|&p| !st.have[p as usize]);
            let stop = missing.map(|m| (m..end).find(|&p| st.have[p as usize]).unwrap_or(end));
            (missing, stop)
        };
        let r = match (missing, stop) {
            (Some(m), Some(e)) => self.fetch_run(m, e).await,
            _ => Ok(()),
        };
        release();
        Run::Done(r.err())
    }

    /// Whether piece `p` is in the file already (another daemon, or a run before, wrote it):
    /// its bytes there match its CV.
    fn found(&self, p: u32) -> bool {
        let (at, to) = self.span(p);
        let mut buf = vec![0u8; (to - at) as usize];
        self.file.read_exact_at(&mut buf, at).is_ok() && piece_cv(at, &buf) == self.cvs[p as usize]
    }

    /// Piece `p` is in the file and checked: readers may have it.
    fn mark(&self, p: u32) {
        let mut st = self.state.lock();
        st.have[p as usize] = true;
        st.busy[p as usize] = false;
        drop(st);
        self.changed.notify_all();
    }

    /// GETs pieces `first..end` in one ranged request (a retry asks from the first piece not
    /// here yet), writing each as soon as it arrived whole and matched its CV.
    ///
    /// Errors: the remote's (transient ones once the bound has passed since the last piece
    /// arrived); a piece that does not match
    /// its CV, or an object that is shorter than its pieces, is [`RemoteKind::Corrupt`].
    async fn fetch_run(&self, first: u32, end: u32) -> Result<()> {
        let next = AtomicU32::new(first);
        // The bound counts from the last piece that arrived, not from the first request: a
        // slow but steady transfer is never cut off (a stall is retried from where it stopped).
        loop {
            let before = next.load(Relaxed);
            let r = self.fetch_from(&next, end).await;
            match r {
                Err(Error::Remote { kind, .. })
                    if kind.is_transient() && next.load(Relaxed) > before => {}
                r => return r,
            }
        }
    }

    /// One [`retrying`] round of [`Pieced::fetch_run`]: GETs from piece `next` (advanced as
    /// pieces arrive) to `end`.
    ///
    /// Errors: as [`Pieced::fetch_run`].
    async fn fetch_from(&self, next: &AtomicU32, end: u32) -> Result<()> {
        let s = &self.shared;
        let id = s.ids[self.o as usize];
        let path = s.remote.layout.object(&s.project, &id);
        retrying(s.limits, &s.health, || async {
            let from = next.load(Relaxed);
            if from >= end {
                return Ok(());
            }
            let (start, _) = self.span(from);
            let (_, stop) = self.span(end - 1);
            let what = format!("fetching object {id} bytes {start}..{stop}");
            let opts = GetOptions {
                range: Some(GetRange::Bounded(start..stop)),
                ..Default::default()
            };
            let mut buf: Vec<u8> = Vec::with_capacity(PIECE_LEN as usize);
            s.get_into(&what, s.remote.store.get_opts(&path, opts), |chunk| {
                let mut chunk = chunk;
                while !chunk.is_empty() {
                    let p = next.load(Relaxed);
                    if p >= end {
                        return Err(s.corrupt(
                            &format!("object {id}"),
                            format!("more than the {} bytes asked for", stop - start),
                        ));
                    }
                    let (at, to) = self.span(p);
                    let want = (to - at) as usize - buf.len();
                    let take = want.min(chunk.len());
                    buf.extend_from_slice(&chunk[..take]);
                    chunk = &chunk[take..];
                    if buf.len() == (to - at) as usize {
                        self.put(p, &buf)?;
                        buf.clear();
                        next.store(p + 1, Relaxed);
                    }
                }
                Ok(())
            })
            .await?;
            if next.load(Relaxed) < end {
                return Err(s.corrupt(
                    &format!("object {id}"),
                    format!(
                        "its bytes end before byte {stop} (a GET of {start}..{stop} ended early)"
                    ),
                ));
            }
            Ok(())
        })
        .await
    }

    /// Checks piece `p` against its CV and writes it.
    ///
    /// Errors: [`RemoteKind::Corrupt`] when it does not match; [`Error::Io`] writing.
    fn put(&self, p: u32, bytes: &[u8]) -> Result<()> {
        let s = &self.shared;
        let (at, _) = self.span(p);
        if piece_cv(at, bytes) != self.cvs[p as usize] {
            return Err(s.corrupt(
                &format!("object {} piece {p}", s.ids[self.o as usize]),
                "its bytes do not match the piece's digest".into(),
            ));
        }
        self.file
            .write_all_at(bytes, at)
            .map_err(|e| Error::io(&self.tmp, e))?;
        s.counts.bytes.fetch_add(bytes.len() as u64, Relaxed);
        self.mark(p);
        Ok(())
    }

    /// A fetch of pieces `first..end` ended (with `err` if it failed): the pieces it did not
    /// write are free again and carry its error; a missing or corrupt object breaks the layer.
    /// When every piece is here the object becomes local.
    fn ended(&self, first: u32, end: u32, run: Run) {
        let (err, foreign) = match run {
            Run::Done(e) => (e, false),
            Run::Foreign => (None, true),
        };
        if let Some(e) = &err
            && matches!(
                e,
                Error::Remote {
                    kind: RemoteKind::NotFound | RemoteKind::Corrupt,
                    ..
                }
            )
        {
            self.shared
                .broken
                .lock()
                .get_or_insert_with(|| e.to_string());
        }
        let why = err.map(|e| e.to_string());
        let mut st = self.state.lock();
        st.inflight -= 1;
        if foreign {
            st.retry_at = Some(Instant::now() + super::CLAIM_POLL);
            st.foreign_since.get_or_insert_with(Instant::now);
        } else {
            st.retry_at = None;
            st.foreign_since = None;
        }
        let now = Instant::now();
        for p in first..end {
            if !st.have[p as usize] {
                st.busy[p as usize] = false;
                if !foreign {
                    let why = why.clone().unwrap_or_else(|| "not fetched".into());
                    st.failed.insert(p, (why, now));
                }
            }
        }
        let all = st.have.iter().all(|&h| h);
        drop(st);
        if all {
            self.finish();
        }
        self.changed.notify_all();
    }

    /// Every piece is here: the file goes into `held/` (once) and the object is local.
    fn finish(&self) {
        // One at a time: a second caller (the reader whose READ brought the last piece, and a
        // copy-up's or completion's fill) returns once the first has placed the file, so the
        // object is local when `done` says so to it.
        let _one = self.finishing.lock();
        if self.done.swap(true, Relaxed) {
            return;
        }
        let _ = self
            .file
            .set_permissions(std::os::unix::fs::PermissionsExt::from_mode(0o400));
        match self.shared.place_counted(self.o, &self.tmp, false) {
            Ok(()) => {
                self.shared.pieced.lock().remove(&self.o);
            }
            Err(e) => {
                tracing::error!("lazy layer: keeping a fetched object: {e}");
                self.done.store(false, Relaxed);
            }
        }
    }

    /// Waits until pieces `from..to` are here, starting fetches of those nobody fetches (up
    /// to `ahead_to`: the read-ahead; `demand` for a reader) whenever no fetch of the object is
    /// in flight. Every fetch ends (each GET has a progress deadline and a bound), so this
    /// does too.
    ///
    /// Errors: the message of a failed fetch of a piece this waiter started or waited for (or
    /// one that failed within the progress deadline before it came), or of a missing or
    /// corrupt object (the layer is broken).
    fn wait(
        self: &Arc<Self>,
        from: u32,
        to: u32,
        ahead_to: u32,
        demand: bool,
    ) -> std::result::Result<(), String> {
        let mut st = self.state.lock();
        let mut started = false;
        let entered = Instant::now();
        loop {
            if let Some(why) = self.shared.broken.lock().clone() {
                return Err(why);
            }
            let Some(p) = (from..to).find(|&p| !st.have[p as usize]) else {
                return Ok(());
            };
            if !st.busy[p as usize] {
                // The fetch this waiter started or waited for failed (after its retries,
                // within the bound), or one failed a moment ago: the error, not another round
                // of retries (a reader gets EIO within about the bound).
                if let Some((why, at)) = st.failed.get(&p)
                    && (started || *at >= entered || at.elapsed() < self.shared.limits.progress)
                {
                    return Err(why.clone());
                }
                self.start(&mut st, p, ahead_to.max(to), demand);
                started |= st.busy[p as usize];
            }
            // Deferred (another daemon's claim): look again soon; else the fetch's end wakes.
            let nap = match st.busy[p as usize] || st.inflight > 0 {
                true => Duration::from_secs(3600),
                false => super::CLAIM_POLL,
            };
            self.changed.wait_for(&mut st, nap);
        }
    }

    /// Makes every piece here (for a copy-up or reader's whole-file open, or for background
    /// completion when `background`, which starts no GET while a demand read is in flight):
    /// [`FILL_PIECES`] at a time, joining fetches in flight; the object is local when this
    /// returns `Ok`.
    ///
    /// Errors: [`Error::Failed`] with the failed fetch's message (a missing or corrupt object
    /// has marked the layer broken already).
    pub(super) async fn fill(self: &Arc<Self>, background: bool) -> Result<()> {
        let n = self.cvs.len() as u32;
        let mut p = 0;
        while p < n {
            // Background completion starts no GET while a reader waits for one.
            while background
                && self.shared.demand.load(Relaxed) > 0
                && !self.shared.stop.load(Relaxed)
            {
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
            let to = (p + FILL_PIECES).min(n);
            let me = Arc::clone(self);
            let r = tokio::task::spawn_blocking(move || me.wait(p, to, to, false))
                .await
                .map_err(|e| Error::Failed(format!("lazy fetch: {e}")))?;
            if let Err(why) = r {
                let id = self.shared.ids[self.o as usize];
                return Err(Error::Failed(format!("fetching object {id}: {why}")));
            }
            p = to;
        }
        self.finish();
        if self.done.load(Relaxed) {
            Ok(())
        } else {
            Err(Error::Failed("a fetched object could not be kept".into()))
        }
    }
}

/// The [`ReadGate`] of a [`Pieced`] object, what the overlay's READs of it wait on.
pub(in crate::remote::lazy) struct Gate(pub(super) Arc<Pieced>);

impl ReadGate for Gate {
    fn ready(&self, offset: u64, len: u64) -> io::Result<()> {
        let me = &self.0;
        if me.done.load(Relaxed) || len == 0 || offset >= me.size {
            return Ok(());
        }
        let from = (offset / PIECE_LEN) as u32;
        let to = ((offset + len).min(me.size).div_ceil(PIECE_LEN)) as u32;
        let n = me.cvs.len() as u32;
        let ahead = {
            // Read-ahead: doubled while the reader goes on where it stopped, else one piece.
            let mut st = me.state.lock();
            st.ahead = match st.last {
                Some(l) if from == l || from == l + 1 => (st.ahead * 2).clamp(1, MAX_AHEAD),
                _ => 1,
            };
            st.last = Some(to - 1);
            st.ahead
        };
        // A reader waiting counts as a demand read: completion starts nothing meanwhile.
        let s = &me.shared;
        s.demand.fetch_add(1, Relaxed);
        // One GET for the pieces read and the read-ahead after them (the read's come first in
        // its body).
        let t0 = Instant::now();
        let r = me.wait(from, to, (to + ahead).min(n), true);
        tracing::debug!(
            object = me.o,
            offset,
            len,
            at_ms = s.started.elapsed().saturating_sub(t0.elapsed()).as_millis() as u64,
            ms = t0.elapsed().as_millis() as u64,
            "lazy read waited"
        );
        s.opened();
        s.demand.fetch_sub(1, Relaxed);
        r.map_err(|why| {
            me.shared.read_failed(me.o, &why);
            io::Error::from_raw_os_error(libc::EIO)
        })
    }

    fn complete(&self) -> bool {
        self.0.done.load(Relaxed)
    }
}
