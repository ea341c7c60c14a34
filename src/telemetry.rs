//! Run telemetry: one JSON line per cache per run in `<store>/events.jsonl`, and `stats`.
//!
//! Each event is appended with a single `write(2)` on an `O_APPEND` descriptor, so concurrent
//! runs never interleave partial lines (POSIX appends are atomic with respect to the offset; a
//! line is far below any filesystem's short-write threshold). Unreadable lines are skipped by
//! `stats`, so a torn write after a crash costs one event, not the log.

#![forbid(unsafe_code)]

use std::collections::BTreeMap;
use std::fs::OpenOptions;
use std::io::Write;
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::error::{Error, IoContext, Result};

/// The event log's file name inside the store root.
pub(crate) const EVENTS_FILE: &str = "events.jsonl";

/// What the mount found for the key (GitHub `actions/cache`: exact hit, restore-key hit, miss):
/// the store's [`crate::store::MountResult`], under the name the events and the run use.
pub(crate) type CacheResult = crate::store::MountResult;

/// One cache's preparation in one run. Durations in milliseconds; `bytes`/`files` are the size
/// of the published layer (or of the mounted one on a hit).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub(crate) struct Event {
    /// Unix time of the event in milliseconds.
    pub time_ms: u64,
    /// The run's id (`layercache run`), empty in events written before run ids.
    #[serde(default)]
    pub run: String,
    /// The project.
    pub project: String,
    /// The cache id.
    pub cache: String,
    /// The exact key.
    pub key: String,
    /// hit, restore or miss.
    pub result: CacheResult,
    /// The key of the layer a restore key matched (or the key itself on a hit).
    #[serde(default)]
    pub matched_key: Option<String>,
    /// Time to mount, ms.
    pub mount_ms: u64,
    /// Time the setup script ran, ms (0 on a hit).
    #[serde(default)]
    pub setup_ms: u64,
    /// Time the maintenance script ran, ms (0 unless a hit).
    #[serde(default)]
    pub maintenance_ms: u64,
    /// Time to promote the new layer, ms (0 when nothing was promoted).
    #[serde(default)]
    pub promote_ms: u64,
    /// Bytes in the layer, when known.
    #[serde(default)]
    pub bytes: u64,
    /// Files in the layer, when known.
    #[serde(default)]
    pub files: u64,
    /// Exit status of setup or maintenance (0 = success).
    #[serde(default)]
    pub exit_status: i32,
    /// Whether a new layer was published.
    #[serde(default)]
    pub published: bool,
    /// Remote tier: the mounted layer was pulled from the remote for this run.
    #[serde(default)]
    pub remote_hit: bool,
    /// Remote tier: object bytes downloaded for this run's mount.
    #[serde(default)]
    pub pulled_bytes: u64,
    /// Remote tier: objects downloaded for this run's mount.
    #[serde(default)]
    pub pulled_objects: u64,
    /// Remote tier: milliseconds the pull of this run's mount took (0 when nothing was
    /// pulled), so a consumer of the events or of `run --json` can say
    /// "pulled N objects, B in T" as the run's summary line does.
    #[serde(default)]
    pub pulled_ms: u64,
    /// Remote tier: the layer was mounted lazily (only its manifest was fetched before the
    /// run; file content comes on first open), and the bytes of its objects that were not
    /// local then.
    #[serde(default)]
    pub remote_lazy: bool,
    /// See [`Event::remote_lazy`]: bytes still to fetch when the layer was mounted.
    #[serde(default)]
    pub lazy_bytes: u64,
    /// The run adopted an idle warm mount of the layer (one an earlier run of it left,
    /// `store/warm.rs`): the kernel's caches of the layer were warm.
    #[serde(default)]
    pub warm: bool,
    /// Regular files the promotion stored as new objects (`files - new_files` reused objects
    /// already in the store: the lower layer's or another version's).
    #[serde(default)]
    pub new_files: u64,
    /// Bytes the promotion added to the store as new objects.
    #[serde(default)]
    pub new_bytes: u64,
    /// On a miss or restore: what differs from the nearest layer's key inputs
    /// ([`crate::why::explain`]); empty on a hit.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub why: Vec<String>,
    /// `save = "success"`: this event is not a preparation but the save after COMMAND of a
    /// newer layer of the key (`published`, `promote_ms`, `files`, `bytes`, `new_*` tell it;
    /// `result` is the run's preparation's). `stats` and the time saved leave it out.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub saved: bool,
    /// This event is not a preparation but what the run's lazily mounted layer
    /// ([`Event::remote_lazy`]) fetched from the remote tier while the run lasted, logged at
    /// its end: `pulled_bytes` and `pulled_objects` say it (`result`, the key and the
    /// layer's `files`/`bytes` are the preparation's). `stats` counts its bytes as
    /// downloaded and leaves it out of the preparations and the time saved.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub lazy_fetch: bool,
}

impl Event {
    /// Preparation time in ms: mount + setup + maintenance + promote.
    pub fn prep_ms(&self) -> u64 {
        self.mount_ms + self.setup_ms + self.maintenance_ms + self.promote_ms
    }

    /// Whether the layer it mounted or published holds nothing (0 files, 0 bytes): a setup
    /// that wrote outside its mount. A hit of it saves no time.
    pub fn empty_layer(&self) -> bool {
        self.files == 0 && self.bytes == 0
    }
}

/// The event log path for a store root.
pub(crate) fn events_path(store: &Path) -> PathBuf {
    store.join(EVENTS_FILE)
}

/// A new run id: the start time in ms as 12 hex digits, `-`, 12 random hex digits (sorts by
/// time, like the store's run directory names).
pub(crate) fn new_run_id() -> String {
    format!("{:012x}-{}", now_ms(), crate::sys::random_hex(6))
}

/// Whether `s` has the shape [`new_run_id`] gives: 12 hex digits, `-`, 12 hex digits.
pub(crate) fn is_run_id(s: &str) -> bool {
    let hex = |p: &str| p.len() == 12 && p.bytes().all(|b| b.is_ascii_hexdigit());
    s.split_once('-').is_some_and(|(t, r)| hex(t) && hex(r))
}

/// The run id of this process's `layercache run`, once it has one (for its `--json` error line).
static CURRENT_RUN: std::sync::OnceLock<String> = std::sync::OnceLock::new();

/// Records `id` as the run this process is doing (the first call wins; a process does one run).
pub(crate) fn set_current_run(id: &str) {
    let _ = CURRENT_RUN.set(id.to_string());
}

/// The run id [`set_current_run`] recorded, if any.
pub fn current_run() -> Option<&'static str> {
    CURRENT_RUN.get().map(String::as_str)
}

pub(crate) use crate::units::now_ms;

/// Appends `event` as one line to `<store>/events.jsonl` (created 0600 if missing) with one
/// `write(2)`.
///
/// Errors: [`Error::Io`] naming the log; [`Error::Failed`] on a short write.
pub(crate) fn append(store: &Path, event: &Event) -> Result<()> {
    let path = events_path(store);
    let mut line = serde_json::to_vec(event).map_err(|e| Error::Failed(e.to_string()))?;
    line.push(b'\n');
    let mut f = OpenOptions::new()
        .append(true)
        .create(true)
        .mode(0o600)
        .open(&path)
        .at(&path)?;
    let n = f.write(&line).at(&path)?;
    if n != line.len() {
        return Err(Error::Failed(format!(
            "{}: short append ({n} of {} bytes)",
            path.display(),
            line.len()
        )));
    }
    Ok(())
}

/// Space set aside on the store's filesystem for a run's events, so a setup that fills the
/// disk still has its event recorded: `<store>/events-reserve/<run>`, 64 KiB allocated with
/// `fallocate(2)` and held with an exclusive flock(2) while the run lives. [`EventReserve::append`]
/// gives the space back and retries when an append meets `ENOSPC`/`EDQUOT`. Drop removes the
/// file; one a killed run left is removed by the next reserve made (its flock is free).
#[derive(Debug)]
pub(crate) struct EventReserve {
    path: Option<PathBuf>,
    _file: Option<std::fs::File>,
}

/// Bytes an [`EventReserve`] sets aside (a run's events are a few hundred bytes per cache).
pub(crate) const EVENT_RESERVE_BYTES: i64 = 64 << 10;

impl EventReserve {
    /// Reserves [`EVENT_RESERVE_BYTES`] for run `run`'s events in the store at `store`; best
    /// effort (an empty reserve when the space or the directory cannot be had, e.g. on a
    /// filesystem already full). Removes the reserves of runs that are gone.
    pub fn make(store: &Path, run: &str) -> EventReserve {
        let empty = EventReserve {
            path: None,
            _file: None,
        };
        let dir = store.join("events-reserve");
        if std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(&dir)
            .is_err()
            || !crate::ids::is_run_path_safe(run)
        {
            return empty;
        }
        // Reserves of runs that ended without removing theirs (killed): nobody holds them.
        for ent in std::fs::read_dir(&dir).into_iter().flatten().flatten() {
            if let Ok(f) = std::fs::File::open(ent.path())
                && crate::sys::flock(&f, libc::LOCK_EX | libc::LOCK_NB).is_ok()
            {
                let _ = std::fs::remove_file(ent.path());
            }
        }
        let path = dir.join(run);
        let Ok(file) = OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .mode(0o600)
            .open(&path)
        else {
            return empty;
        };
        if crate::sys::flock(&file, libc::LOCK_EX | libc::LOCK_NB).is_err()
            || crate::sys::fallocate(&file, 0, 0, EVENT_RESERVE_BYTES).is_err()
        {
            let _ = std::fs::remove_file(&path);
            return empty;
        }
        EventReserve {
            path: Some(path),
            _file: Some(file),
        }
    }

    /// Whether space is held.
    pub fn held(&self) -> bool {
        self.path.is_some()
    }

    /// [`append`]s `event`; when that fails for space, the reserve is given back and the
    /// append retried once.
    ///
    /// Errors: as [`append`].
    pub fn append(&mut self, store: &Path, event: &Event) -> Result<()> {
        match append(store, event) {
            Err(e) if e.is_no_space() && self.held() => {
                self.release();
                append(store, event)
            }
            r => r,
        }
    }

    fn release(&mut self) {
        if let Some(p) = self.path.take() {
            let _ = std::fs::remove_file(p);
        }
        self._file = None;
    }
}

impl Drop for EventReserve {
    fn drop(&mut self) {
        self.release();
    }
}

/// Reads every parseable event (a missing log is empty).
///
/// Errors: [`Error::Io`] naming the log when it exists but cannot be read.
pub(crate) fn read(store: &Path) -> Result<Vec<Event>> {
    let path = events_path(store);
    let text = match std::fs::read_to_string(&path) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(Error::io(&path, e)),
    };
    Ok(text
        .lines()
        .filter_map(|l| serde_json::from_str(l).ok())
        .collect())
}

/// Per-result counts and median preparation times.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub(crate) struct ResultStats {
    /// Number of events with this result.
    pub count: u64,
    /// Median preparation time (mount + setup + maintenance + promote), ms.
    pub median_prep_ms: u64,
}

/// What `layercache stats` reports.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub(crate) struct Stats {
    /// Successful preparations by result (`hit`, `restore`, `miss`).
    pub results: BTreeMap<String, ResultStats>,
    /// Preparations whose setup or maintenance failed.
    pub failed: u64,
    /// Time saved by hits and restores versus the median miss of the same project and cache, ms.
    pub saved_ms: u64,
    /// Remote tier: successful preparations whose layer was pulled from the remote.
    pub remote_hits: u64,
    /// Remote tier: object bytes pulled by those preparations, and fetched lazily while
    /// their runs lasted ([`Stats::lazy_bytes`]).
    pub pulled_bytes: u64,
    /// Remote tier: of [`Stats::pulled_bytes`], the bytes lazily mounted layers fetched while
    /// their runs lasted ([`Event::lazy_fetch`]).
    pub lazy_bytes: u64,
    /// Per project and cache (one miss median over several caches says nothing),
    /// in name order.
    pub caches: Vec<CacheStats>,
}

/// One cache's numbers in [`Stats`]. Durations in ms.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub(crate) struct CacheStats {
    /// The project.
    pub project: String,
    /// The cache id.
    pub cache: String,
    /// Successful hits.
    pub hits: u64,
    /// Successful restores.
    pub restores: u64,
    /// Successful misses.
    pub misses: u64,
    /// Failed preparations (setup or maintenance exited non-zero).
    pub failed: u64,
    /// Median preparation time of the successful misses (0 without any), ms.
    pub median_miss_ms: u64,
    /// Median preparation time of the successful hits (0 without any), ms.
    pub median_hit_ms: u64,
    /// Time its hits and restores saved against its median miss, ms.
    pub saved_ms: u64,
}

fn median(mut v: Vec<u64>) -> u64 {
    if v.is_empty() {
        return 0;
    }
    v.sort_unstable();
    let n = v.len();
    if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2
    }
}

/// Summarises `events`, optionally only one project's.
pub(crate) fn stats(events: &[Event], project: Option<&str>) -> Stats {
    let mut out = Stats::default();
    // What lazily mounted layers fetched while their runs lasted counts as downloaded.
    for e in events
        .iter()
        .filter(|e| e.lazy_fetch && project.is_none_or(|p| e.project == p))
    {
        out.pulled_bytes += e.pulled_bytes;
        out.lazy_bytes += e.pulled_bytes;
    }
    // Preparations only: a save after COMMAND ([`Event::saved`]) is not one, nor a lazy fetch.
    let events: Vec<Event> = (events.iter())
        .filter(|e| !e.saved && !e.lazy_fetch)
        .cloned()
        .collect();
    let events = events.as_slice();
    let ok: Vec<&Event> = events
        .iter()
        .filter(|e| project.is_none_or(|p| e.project == p))
        .filter(|e| {
            if e.exit_status != 0 {
                out.failed += 1;
            }
            e.exit_status == 0
        })
        .collect();
    for e in ok.iter().filter(|e| e.remote_hit) {
        out.remote_hits += 1;
        out.pulled_bytes += e.pulled_bytes;
    }
    for r in [CacheResult::Hit, CacheResult::Restore, CacheResult::Miss] {
        let preps: Vec<u64> = ok
            .iter()
            .filter(|e| e.result == r)
            .map(|e| e.prep_ms())
            .collect();
        out.results.insert(
            r.as_str().to_string(),
            ResultStats {
                count: preps.len() as u64,
                median_prep_ms: median(preps),
            },
        );
    }
    let mine: Vec<Event> = events
        .iter()
        .filter(|e| project.is_none_or(|p| e.project == p))
        .cloned()
        .collect();
    let saved = saved_ms(&mine);
    out.saved_ms = saved.iter().sum();
    // (project, cache) → its stats, the prep times of its misses and of its hits.
    type Acc = (CacheStats, Vec<u64>, Vec<u64>);
    let mut by_cache: BTreeMap<(&str, &str), Acc> = BTreeMap::new();
    for (e, s) in mine.iter().zip(&saved) {
        let (c, misses, hits) = by_cache.entry((&e.project, &e.cache)).or_insert_with(|| {
            let c = CacheStats {
                project: e.project.clone(),
                cache: e.cache.clone(),
                ..CacheStats::default()
            };
            (c, Vec::new(), Vec::new())
        });
        c.saved_ms += s;
        match (e.exit_status, e.result) {
            (0, CacheResult::Hit) => {
                c.hits += 1;
                hits.push(e.prep_ms());
            }
            (0, CacheResult::Restore) => c.restores += 1,
            (0, CacheResult::Miss) => {
                c.misses += 1;
                misses.push(e.prep_ms());
            }
            _ => c.failed += 1,
        }
    }
    out.caches = (by_cache.into_values())
        .map(|(mut c, misses, hits)| {
            c.median_miss_ms = median(misses);
            c.median_hit_ms = median(hits);
            c
        })
        .collect();
    out
}

/// The time each event saved, ms, in the order of `events`: for a successful hit or restore,
/// the median preparation time of the successful misses of the same project and cache minus
/// its own (saturating at 0); 0 for misses, failures, caches that never missed and the hits and
/// restores of an empty layer ([`Event::empty_layer`]) and saves ([`Event::saved`]). `stats`
/// sums these, so the runs page and `layercache stats` never disagree.
pub(crate) fn saved_ms(events: &[Event]) -> Vec<u64> {
    let mut miss_by_cache: BTreeMap<(&str, &str), Vec<u64>> = BTreeMap::new();
    for e in events
        .iter()
        .filter(|e| e.exit_status == 0 && e.result == CacheResult::Miss && !e.saved)
    {
        miss_by_cache
            .entry((&e.project, &e.cache))
            .or_default()
            .push(e.prep_ms());
    }
    let miss_median: BTreeMap<_, u64> = miss_by_cache
        .into_iter()
        .map(|(k, v)| (k, median(v)))
        .collect();
    events
        .iter()
        .map(|e| {
            // An empty layer spared no work (its setup wrote outside the mount): no saving.
            if e.exit_status != 0
                || e.result == CacheResult::Miss
                || e.empty_layer()
                || e.saved
                || e.lazy_fetch
            {
                return 0;
            }
            miss_median
                .get(&(e.project.as_str(), e.cache.as_str()))
                .map_or(0, |m| m.saturating_sub(e.prep_ms()))
        })
        .collect()
}

/// The human form of [`Stats`].
pub(crate) fn stats_text(s: &Stats) -> String {
    let mut out = String::new();
    for (name, r) in &s.results {
        out.push_str(&format!(
            "{name:<8} {:>6}   median preparation {}\n",
            r.count,
            fmt_ms(r.median_prep_ms)
        ));
    }
    out.push_str(&format!("{:<8} {:>6}\n", "failed", s.failed));
    if s.remote_hits > 0 {
        let lazily = match s.lazy_bytes {
            0 => String::new(),
            b => format!(" ({b} of them fetched lazily while runs lasted)"),
        };
        out.push_str(&format!(
            "{:<8} {:>6}   layers pulled from the remote, {} bytes downloaded{lazily}\n",
            "remote", s.remote_hits, s.pulled_bytes
        ));
    }
    out.push_str(&format!("time saved vs misses: {}\n", fmt_ms(s.saved_ms)));
    if !s.caches.is_empty() {
        out.push_str(&format!(
            "\n{:<24} {:>6} {:>8} {:>6} {:>6}   {:>11} {:>10} {:>10}\n",
            "CACHE", "HITS", "RESTORES", "MISSES", "FAILED", "MEDIAN MISS", "MEDIAN HIT", "SAVED"
        ));
    }
    for c in &s.caches {
        out.push_str(&format!(
            "{:<24} {:>6} {:>8} {:>6} {:>6}   {:>11} {:>10} {:>10}\n",
            format!("{}/{}", c.project, c.cache),
            c.hits,
            c.restores,
            c.misses,
            c.failed,
            fmt_ms(c.median_miss_ms),
            fmt_ms(c.median_hit_ms),
            fmt_ms(c.saved_ms)
        ));
    }
    out
}

/// Formats milliseconds for humans (`850 ms`, `12.3 s`, `4m 05s`).
pub(crate) fn fmt_ms(ms: u64) -> String {
    if ms < 1000 {
        format!("{ms} ms")
    } else if ms < 60_000 {
        format!("{:.1} s", ms as f64 / 1000.0)
    } else {
        format!("{}m {:02}s", ms / 60_000, (ms % 60_000) / 1000)
    }
}

/// A test event: project `p`, cache `npm`, key `k`, time 1 ms, a layer of 3 files and 4096
/// bytes, everything else zero or empty.
#[cfg(test)]
pub(crate) fn sample_event(result: CacheResult) -> Event {
    Event {
        run: String::new(),
        time_ms: 1,
        project: "p".into(),
        cache: "npm".into(),
        key: "k".into(),
        result,
        matched_key: None,
        mount_ms: 0,
        setup_ms: 0,
        maintenance_ms: 0,
        promote_ms: 0,
        bytes: 4096,
        files: 3,
        exit_status: 0,
        published: false,
        remote_hit: false,
        pulled_bytes: 0,
        pulled_objects: 0,
        pulled_ms: 0,
        remote_lazy: false,
        lazy_bytes: 0,
        warm: false,
        new_files: 0,
        new_bytes: 0,
        why: Vec::new(),
        saved: false,
        lazy_fetch: false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_event_reserve_holds_space_gives_it_back_when_full_and_goes() {
        use std::os::unix::fs::MetadataExt;
        let t = tempfile::tempdir().unwrap();
        let store = t.path();
        // A reserve a killed run left: nobody holds its flock, the next reserve removes it.
        std::fs::create_dir_all(store.join("events-reserve")).unwrap();
        std::fs::write(store.join("events-reserve/dead-run"), b"").unwrap();
        let mut r = EventReserve::make(store, "run-1");
        let path = store.join("events-reserve/run-1");
        assert!(r.held());
        assert!(!store.join("events-reserve/dead-run").exists());
        let m = std::fs::metadata(&path).unwrap();
        assert!(m.blocks() * 512 >= EVENT_RESERVE_BYTES as u64, "{m:?}");
        // An append that meets ENOSPC (the log on /dev/full) gives the space back.
        std::os::unix::fs::symlink("/dev/full", store.join(EVENTS_FILE)).unwrap();
        let ev = sample_event(CacheResult::Miss);
        assert!(r.append(store, &ev).unwrap_err().is_no_space());
        assert!(!r.held() && !path.exists());
        std::fs::remove_file(store.join(EVENTS_FILE)).unwrap();
        r.append(store, &ev).unwrap();
        // Drop removes it.
        let r2 = EventReserve::make(store, "run-2");
        assert!(store.join("events-reserve/run-2").exists());
        drop(r2);
        assert!(!store.join("events-reserve/run-2").exists());
        // A bad run id reserves nothing.
        assert!(!EventReserve::make(store, "../x").held());
    }

    #[test]
    fn run_ids_have_one_shape() {
        let id = new_run_id();
        assert!(is_run_id(&id), "{id}");
        for bad in [
            "",
            "r",
            "../../etc",
            "01a2335c-x",
            "01a23392b9a1-550dd4a599dz",
            "01a23392b9a1550dd4a599da",
        ] {
            assert!(!is_run_id(bad), "{bad}");
        }
    }

    fn ev(project: &str, cache: &str, result: CacheResult, prep: u64, status: i32) -> Event {
        Event {
            run: "r".into(),
            project: project.into(),
            cache: cache.into(),
            setup_ms: prep,
            exit_status: status,
            ..sample_event(result)
        }
    }

    /// A save after COMMAND is an event but not a preparation: stats count the run's hit
    /// once and no time saved by the save.
    #[test]
    fn saves_are_not_counted_as_preparations() {
        let miss = ev("p", "npm", CacheResult::Miss, 1000, 0);
        let hit = ev("p", "npm", CacheResult::Hit, 10, 0);
        let save = Event {
            saved: true,
            published: true,
            promote_ms: 50,
            ..hit.clone()
        };
        let events = [miss, hit, save];
        let s = stats(&events, None);
        assert_eq!((s.caches[0].hits, s.caches[0].misses), (1, 1));
        assert_eq!(s.results["hit"].count, 1);
        assert_eq!(saved_ms(&events), [0, 990, 0]);
        assert_eq!(s.saved_ms, 990);
        let line = serde_json::to_string(&events[0]).unwrap();
        assert!(!line.contains("saved"), "only a save says so: {line}");
    }

    /// What a lazily mounted layer fetched while its run lasted is downloaded bytes, not a
    /// preparation: stats count the lazy hit once, its fetch in the remote's bytes.
    #[test]
    fn lazy_fetches_count_as_downloaded_bytes_only() {
        let miss = ev("p", "npm", CacheResult::Miss, 1000, 0);
        let lazy_hit = Event {
            remote_hit: true,
            remote_lazy: true,
            pulled_bytes: 300,
            ..ev("p", "npm", CacheResult::Hit, 10, 0)
        };
        let fetched = Event {
            lazy_fetch: true,
            pulled_bytes: 5_000,
            pulled_objects: 40,
            ..lazy_hit.clone()
        };
        let other = Event {
            project: "q".into(),
            ..fetched.clone()
        };
        let events = [miss, lazy_hit, fetched, other];
        let s = stats(&events, Some("p"));
        assert_eq!((s.caches[0].hits, s.caches[0].misses), (1, 1));
        assert_eq!(
            (s.remote_hits, s.pulled_bytes, s.lazy_bytes),
            (1, 5_300, 5_000)
        );
        assert_eq!(saved_ms(&events), [0, 990, 0, 0]);
        assert_eq!(s.saved_ms, 990);
        assert!(stats_text(&s).contains("5300 bytes downloaded (5000 of them fetched lazily"));
        assert_eq!(stats(&events, None).lazy_bytes, 10_000);
        let line = serde_json::to_string(&events[1]).unwrap();
        assert!(!line.contains("lazy_fetch"), "only a fetch says so: {line}");
    }

    #[test]
    fn append_and_read_back() {
        let d = tempfile::tempdir().unwrap();
        let a = ev("p", "npm", CacheResult::Miss, 60_000, 0);
        let b = ev("p", "npm", CacheResult::Hit, 100, 0);
        append(d.path(), &a).unwrap();
        append(d.path(), &b).unwrap();
        // a torn line is skipped, not fatal
        let mut f = OpenOptions::new()
            .append(true)
            .open(events_path(d.path()))
            .unwrap();
        f.write_all(b"{\"time_ms\":").unwrap();
        assert_eq!(read(d.path()).unwrap(), vec![a, b]);
        let text = std::fs::read_to_string(events_path(d.path())).unwrap();
        assert!(text.contains("\"result\":\"miss\""), "{text}");
    }

    #[test]
    fn concurrent_appends_never_interleave() {
        let d = tempfile::tempdir().unwrap();
        std::thread::scope(|s| {
            for t in 0..4 {
                let dir = d.path();
                s.spawn(move || {
                    for i in 0..200 {
                        let mut e = ev("p", &format!("c{t}"), CacheResult::Hit, i, 0);
                        e.key = "x".repeat(500);
                        append(dir, &e).unwrap();
                    }
                });
            }
        });
        assert_eq!(read(d.path()).unwrap().len(), 800);
    }

    #[test]
    fn stats_medians_and_savings() {
        let events = vec![
            ev("p", "npm", CacheResult::Miss, 60_000, 0),
            ev("p", "npm", CacheResult::Miss, 40_000, 0),
            ev("p", "npm", CacheResult::Hit, 1_000, 0),
            ev("p", "npm", CacheResult::Hit, 3_000, 0),
            ev("p", "npm", CacheResult::Restore, 20_000, 0),
            ev("p", "npm", CacheResult::Miss, 5, 1),
            ev("q", "npm", CacheResult::Hit, 10, 0),
        ];
        let s = stats(&events, Some("p"));
        assert_eq!(s.results["miss"].count, 2);
        assert_eq!(s.results["miss"].median_prep_ms, 50_000);
        assert_eq!(s.results["hit"].median_prep_ms, 2_000);
        assert_eq!(s.results["restore"].count, 1);
        assert_eq!(s.failed, 1);
        assert_eq!((s.remote_hits, s.pulled_bytes), (0, 0));
        let mut pulled = ev("p", "npm", CacheResult::Hit, 10, 0);
        (pulled.remote_hit, pulled.pulled_bytes) = (true, 4096);
        let r = stats(&[pulled], None);
        assert_eq!((r.remote_hits, r.pulled_bytes), (1, 4096));
        assert!(stats_text(&r).contains("4096 bytes downloaded"));
        assert_eq!(s.saved_ms, 49_000 + 47_000 + 30_000);
        // q has no misses: its hit saves nothing measurable
        assert_eq!(stats(&events, None).saved_ms, s.saved_ms);
        assert!(stats_text(&s).contains("time saved"));
        assert_eq!(fmt_ms(1500), "1.5 s");
    }

    /// Each cache has its own miss median, and a hit of an empty layer saves nothing.
    #[test]
    fn per_cache_medians_and_no_saving_for_an_empty_layer() {
        let mut empty_hit = ev("p", "pip", CacheResult::Hit, 10, 0);
        (empty_hit.files, empty_hit.bytes) = (0, 0);
        let events = vec![
            ev("p", "npm", CacheResult::Miss, 60_000, 0),
            ev("p", "pip", CacheResult::Miss, 8_000, 0),
            ev("p", "npm", CacheResult::Hit, 1_000, 0),
            empty_hit,
            ev("p", "pip", CacheResult::Miss, 5, 2),
        ];
        let s = stats(&events, Some("p"));
        let c: Vec<_> = s
            .caches
            .iter()
            .map(|c| (c.cache.as_str(), c.misses, c.median_miss_ms, c.saved_ms))
            .collect();
        assert_eq!(c, [("npm", 1, 60_000, 59_000), ("pip", 1, 8_000, 0)]);
        assert_eq!((s.caches[1].hits, s.caches[1].failed), (1, 1));
        assert_eq!(s.saved_ms, 59_000);
        let text = stats_text(&s);
        assert!(text.contains("p/pip") && text.contains("8.0 s"), "{text}");
    }
}
