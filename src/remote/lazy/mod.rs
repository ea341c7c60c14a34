//! Lazy remote layers: a run on a runner that lacks a layer mounts it from the remote
//! manifest at once and fetches file content on first open (compare stargz and SOCI, which do
//! this for container images; docs/remote.md has the user's view).
//!
//! * The run's side ([`Remote::prepare_lazy`], in the run's process): on an exact remote hit,
//!   fetch the key record, the layer's tree manifest (its entries without the object table)
//!   and the key's recorded access trace, and lay out the layer's *partial* directory in the
//!   local store ([`crate::store::ProjectDirs::partial`]): [`TREE`], `replay` (the trace to
//!   replay) and `held/` (the verified objects of the layer that are here).
//! * The daemon's side ([`make_layer`], the overlay's [`crate::overlay::LayerMaker`]): a
//!   [`LazyLayer`] answers lookups, attributes, listings, symlinks and xattrs from the
//!   manifest's entries ([`tree`]; it writes [`LINKS`], the link groups as a pulled layer has
//!   them), fetches the compact manifest (the object table) once mounted, and fetches a file's
//!   object on its first open ([`fetch`]); the trace is replayed and the rest fetched in the
//!   background. It writes what it did to the run's
//!   directory ([`LazyReport`], and the order in which the run first opened files).
//! * The end ([`Remote::finish_lazy`], in the run's process after the unmount): the run's
//!   trace is stored beside the key in the remote for the next fresh runner, and when every
//!   object is local the layer is published through the normal pull path (which now fetches
//!   nothing) — from then on it is a local layer like any other, and the partial directory
//!   goes. A run that ends first leaves its verified objects for the next.

mod fetch;
mod finish;
mod prefetch;
mod tree;

use std::ffi::CStr;
use std::fs::File;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering::Relaxed};

use parking_lot::Mutex;
use serde::{Deserialize, Serialize};

use super::Remote;
use super::config::RemoteConfig;
use crate::ids::ProjectId;
use crate::overlay::{Layer, LayerDir};
use crate::store::ObjectStore as LocalObjects;
pub use fetch::Limits;
use fetch::Shared;
pub use prefetch::{Prefetched, prefetch_deadline, prefetch_wait, start_clock, wait_prefetched};
use tree::Tree;

/// `manifest` of a partial directory: the remote manifest (compact form; the JSON form of an
/// older push is kept re-encoded), fetched by the run for a layer pushed without a tree
/// manifest, else by the daemon after the mount.
pub const MANIFEST: &str = "manifest";

/// What partial directories of an earlier version hold instead of [`MANIFEST`] (JSON).
pub const OLD_MANIFEST: &str = "manifest.json";
/// `tree` of a partial directory: the layer's tree manifest (`compact::TreeHead`), what a
/// fresh runner fetches before the mount; the daemon then fetches the compact manifest (the
/// object table) and keeps it as [`MANIFEST`].
pub const TREE: &str = "tree";
/// `broken` of a partial directory: why a run found the layer unusable (it is not used
/// again).
pub const BROKEN: &str = "broken";
/// `held/` of a partial directory: the verified bytes of each object of the layer that is
/// here, by hex id (a fetched file, or a link to a store object with those bytes).
pub const HELD: &str = "held";
/// `replay` of a partial directory: the access trace to replay (paths, one per line).
pub const REPLAY: &str = "replay";
/// `pieces` of a partial directory: the layer's piece table as the remote has it
/// (`remote/pieces.rs`), kept for the next run.
pub const PIECES: &str = "pieces";
/// `links` of a partial directory: the layer's link groups (`overlay::links` format).
pub const LINKS: &str = "links";
/// `lazy-report.json` in the run's directory: what the daemon fetched ([`LazyReport`]).
pub const REPORT: &str = "lazy-report.json";

/// How long a daemon's exit spends storing the objects it fetched and still holds in memory
/// ([`fetch::Shared::store_held`]); what is left after it is fetched again by a later run.
const STORE_AT_EXIT: std::time::Duration = std::time::Duration::from_secs(3);

/// `LAYERCACHE_LAZY_TIMEOUT`: how long a lazy read may wait for its bytes before it fails with
/// EIO (default 60 s; a third of it, at most 10 s, without progress retries the GET).
/// `Ok(None)` when unset.
///
/// The value is exactly one of ([`parse_lazy_timeout`]): a number of seconds, digits with an
/// optional fraction (`8`, `2.5`), or such a number followed at once by a unit, `ms`, `s`,
/// `m` or `h` (`8s`, `1500ms`, `1m`, `0.5h`); no sign, space, exponent or second unit. The
/// bound must be at least [`LAZY_TIMEOUT_MIN`] (1 s) and at most [`LAZY_TIMEOUT_MAX`] (1 day).
///
/// Errors: [`crate::error::Error::Invalid`] (exit 2) naming the variable, its value and what
/// is valid (a run checks it before it mounts anything: the daemons only read it).
pub fn lazy_timeout() -> crate::error::Result<Option<std::time::Duration>> {
    match std::env::var("LAYERCACHE_LAZY_TIMEOUT") {
        Ok(v) => parse_lazy_timeout(&v).map(Some),
        Err(_) => Ok(None),
    }
}

/// The shortest [`lazy_timeout`] accepted: 1 s. Its progress deadline is a third of it, and
/// a GET on a healthy link with a busy server takes tens of ms to its first byte: a bound of
/// 100 ms would fail every read.
pub const LAZY_TIMEOUT_MIN: std::time::Duration = std::time::Duration::from_secs(1);

/// The longest [`lazy_timeout`] accepted: 1 day (a longer one is a typo, not a bound).
pub const LAZY_TIMEOUT_MAX: std::time::Duration = std::time::Duration::from_secs(24 * 3600);

/// [`lazy_timeout`] of the value `v`: `DIGITS[.DIGITS][ms|s|m|h]`, from
/// [`LAZY_TIMEOUT_MIN`] to [`LAZY_TIMEOUT_MAX`]; digits past nanoseconds are dropped.
///
/// Errors: [`crate::error::Error::Invalid`] naming the variable, `v` and what is valid.
fn parse_lazy_timeout(v: &str) -> crate::error::Result<std::time::Duration> {
    let bad = || {
        crate::error::Error::invalid(format!(
            "LAYERCACHE_LAZY_TIMEOUT={v:?}: want a number of seconds (8, 2.5) or one with a \
             unit ms, s, m or h (1500ms, 8s, 1m), at least 1s and at most 24h"
        ))
    };
    match parse_seconds(v) {
        Some(d) if (LAZY_TIMEOUT_MIN..=LAZY_TIMEOUT_MAX).contains(&d) => Ok(d),
        _ => Err(bad()),
    }
}

/// A duration written as a number of seconds (`8`, `2.5`) or as one with a unit `ms`, `s`,
/// `m` or `h` (`1500ms`, `8s`, `1m`): `DIGITS[.DIGITS][UNIT]`, nothing else (no sign, no
/// space, no exponent), at most 12 whole digits; `None` when `v` is not that.
fn parse_seconds(v: &str) -> Option<std::time::Duration> {
    const NANOS: u128 = 1_000_000_000;
    let end = (v.find(|c: char| !c.is_ascii_digit() && c != '.')).unwrap_or(v.len());
    let (number, unit) = v.split_at(end);
    let unit_nanos = match unit {
        "ms" => NANOS / 1000,
        "" | "s" => NANOS,
        "m" => 60 * NANOS,
        "h" => 3600 * NANOS,
        _ => return None,
    };
    // DIGITS or DIGITS.DIGITS (at most 12 whole digits: no overflow below), the fraction
    // taken to 9 places, so the number is exact in billionths of the unit.
    let (whole, frac) = number.split_once('.').unwrap_or((number, "0"));
    let digits = |s: &str| !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit());
    if !digits(whole) || !digits(frac) || whole.len() > 12 {
        return None;
    }
    let frac: String = frac.chars().chain(std::iter::repeat('0')).take(9).collect();
    let billionths = whole.parse::<u128>().ok()? * NANOS + frac.parse::<u128>().ok()?;
    let nanos = billionths * unit_nanos / NANOS;
    Some(std::time::Duration::from_nanos(u64::try_from(nanos).ok()?))
}
/// `lazy-trace` in the run's directory: the paths of the layer's files in the order the run
/// first opened them, one per line.
pub const TRACE: &str = "lazy-trace";

/// What the overlay daemon needs to make a lazy layer ([`crate::overlay::options::MadeLower`]'s
/// spec, as JSON).
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct LazySpec {
    /// The remote (credentials come from the daemon's environment, as the run's).
    pub remote: RemoteConfig,
    /// The project.
    pub project: ProjectId,
    /// The layer's partial directory.
    pub dir: PathBuf,
    /// The project's objects directory.
    pub objects: PathBuf,
    /// The run's directory (where the report and the trace are written).
    pub run_dir: PathBuf,
    /// Milliseconds left, when the spec was made, until the run starts its first step at the
    /// latest ([`prefetch::prefetch_deadline`]): how long the daemon's prefetch of the traced
    /// files likely to be mmapped may take from its start. `None` (a spec of an earlier
    /// version): [`prefetch::prefetch_wait`].
    #[serde(default)]
    pub prefetch_ms: Option<u64>,
    /// Bytes per second the link gave the run's GET of the layer's manifest, at least (its
    /// time includes the request's delay), when the manifest was fetched and big enough to
    /// tell ([`prefetch::RATE_SAMPLE`]): a prefetch that could not arrive in its time at that
    /// rate is skipped at once, before the object table comes.
    #[serde(default)]
    pub link_rate: Option<u64>,
}

/// What a lazy layer's daemon did, written to the run's directory ([`REPORT`]).
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq, Eq)]
pub struct LazyReport {
    /// Distinct objects of the layer.
    pub objects: u64,
    /// Their bytes.
    pub bytes: u64,
    /// Objects local when the daemon ended.
    pub local_objects: u64,
    /// Their bytes.
    pub local_bytes: u64,
    /// Objects fetched by this daemon.
    pub fetched_objects: u64,
    /// Bytes fetched by this daemon.
    pub fetched_bytes: u64,
    /// GET requests sent (retries included).
    pub gets: u64,
    /// Files the run opened (each counted once).
    pub opened: u64,
    /// Every object is local.
    pub complete: bool,
    /// Why the layer must not be used again (a missing or corrupt object), if so.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub broken: Option<String>,
    /// Reads that got EIO, "path: why" (the first few).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub failed: Vec<String>,
    /// The remote was down for the daemon when it wrote this (a fetch got no answer within
    /// the bound and no probe has had one since).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub remote_down: bool,
    /// Objects of likely-mmapped traced files fetched before COMMAND (`prefetch.rs`).
    #[serde(default)]
    pub prefetched_objects: u64,
    /// Their bytes.
    #[serde(default)]
    pub prefetched_bytes: u64,
}

/// A layer served from its remote manifest, its file content fetched on first open (see the
/// module docs).
pub struct LazyLayer {
    tree: Arc<Tree>,
    /// The fetcher: at once when the partial directory has the compact manifest, else once
    /// a thread has fetched it after the mount ([`TableSlot`]).
    shared: TableSlot,
    limits: Limits,
    /// Per entry: opened by this run already.
    opened: Vec<AtomicBool>,
    /// Entries in the order this run first opened them.
    trace: Mutex<Vec<u32>>,
    /// `held/`, open: what STATFS answers from (the store's filesystem).
    held: File,
    run_dir: PathBuf,
    /// What was fetched before COMMAND, once that is over ([`prefetch::PREFETCHED`]).
    prefetched: Mutex<Option<Prefetched>>,
    /// Bytes per second the compact manifest's GET got at least (0: unknown), for the
    /// prefetch's guess of whether its files can arrive in time.
    table_rate: std::sync::atomic::AtomicU64,
}

/// The prefetch a layer's fetcher is to start (`prefetch.rs`).
struct PrefetchPlan {
    /// The objects of the traced files likely to be mmapped, in trace order.
    candidates: Vec<u32>,
    /// When the daemon started, and when the prefetch gives up.
    started: std::time::Instant,
    deadline: std::time::Instant,
}

/// The overlay's [`crate::overlay::LayerMaker`] for [`LazySpec`]s: reads the manifest, starts
/// the fetcher (and its background replay and completion) and registers the report's writing
/// at the daemon's exit. A partial directory with only the tree manifest ([`TREE`]) is served
/// at once; a thread fetches the compact manifest (its object table) meanwhile and starts
/// the fetcher then.
///
/// Errors: `EINVAL` for a spec or manifest that does not parse or breaks the rules (the
/// partial directory is then marked [`BROKEN`]: the run that mounts it falls back to a local
/// miss); the errno of opening the partial directory.
pub fn make_layer(spec: &serde_json::Value) -> io::Result<Box<dyn Layer>> {
    let bad = |what: &str, e: &dyn std::fmt::Display| {
        io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("lazy layer: {what}: {e}"),
        )
    };
    let started = std::time::Instant::now();
    let spec: LazySpec = serde_json::from_value(spec.clone()).map_err(|e| bad("spec", &e))?;
    let (layer, table) = LazyLayer::open(&spec).map_err(|e| {
        if let crate::error::Error::Failed(why) = &e {
            let _ = finish::replace_file(&spec.dir.join(BROKEN), why.as_bytes());
        }
        bad("opening", &e)
    })?;
    let layer = Arc::new(layer);
    let traced = layer.replay_entries(&spec.dir.join(REPLAY));
    let object = |&i: &u32| layer.tree.nodes[i as usize].object;
    let replay: Vec<u32> = traced.iter().filter_map(object).collect();
    let mmapped: Vec<u32> = (traced.iter())
        .filter(|&&i| prefetch::likely_mmapped(&layer.tree.nodes[i as usize].path))
        .filter_map(object)
        .collect();
    let wait = match spec.prefetch_ms {
        Some(ms) => std::time::Duration::from_millis(ms),
        None => prefetch::prefetch_wait().unwrap_or(prefetch::DEFAULT_WAIT),
    };
    let plan = match (traced.is_empty(), mmapped.is_empty() || wait.is_zero()) {
        (true, _) => {
            layer.prefetched(Prefetched::skipped("no trace", 0));
            None
        }
        (false, true) => {
            let why = "no traced file likely to be mmapped, or no time left for it";
            layer.prefetched(Prefetched::skipped(why, 0));
            None
        }
        (false, false) => {
            match prefetch::too_slow(&mmapped_sizes(&layer, &mmapped), spec.link_rate, wait) {
                Some(why) => {
                    layer.prefetched(Prefetched::skipped(&why, 0));
                    None
                }
                None => Some(PrefetchPlan {
                    candidates: mmapped,
                    started,
                    deadline: started + wait,
                }),
            }
        }
    };
    match table {
        Table::Ready(shared) => {
            let shared = Arc::new(*shared);
            layer.start_fetching(&shared, replay, plan);
            layer.shared.set(Ok(shared));
        }
        Table::Pending(prefix) => {
            let l = layer.clone();
            std::thread::Builder::new()
                .name("lazy-table".into())
                .spawn(move || {
                    let r = l.fetch_table(&spec, &prefix).map(Arc::new);
                    match &r {
                        Ok(s) => l.start_fetching(s, replay, plan),
                        Err(e) if plan.is_some() => {
                            let why = format!("no object table: {}", e.why);
                            l.prefetched(Prefetched::skipped(&why, ms_since(started)));
                        }
                        Err(_) => {}
                    }
                    l.shared.set(r);
                })?;
        }
    }
    let bg = layer.clone();
    crate::overlay::on_daemon_exit(Box::new(move || {
        // What a trace replay brought along and held in memory for a quiet run is stored
        // before the report counts the local objects: it is never fetched twice.
        if let Some(Ok(s)) = bg.shared.get() {
            let n = s.store_held(STORE_AT_EXIT);
            if n > 0 {
                tracing::info!(objects = n, "stored at exit what waited for a quiet run");
            }
        }
        bg.write_report()
    }));
    // Also written every second, so a daemon killed outright leaves a recent one.
    let periodic = Arc::downgrade(&layer);
    std::thread::Builder::new()
        .name("lazy-report".into())
        .spawn(move || {
            while let Some(l) = periodic.upgrade() {
                l.write_report();
                drop(l);
                std::thread::sleep(std::time::Duration::from_secs(1));
            }
        })?;
    Ok(Box::new(ArcLayer(layer)))
}

/// The fetcher [`LazyLayer::open`] made, or what the layer waits for to make one.
enum Table {
    Ready(Box<Shared>),
    /// The tree manifest's prefix: it names the compact manifest to fetch.
    Pending(super::compact::TreePrefix),
}

/// Why a lazy layer has no fetcher: its compact manifest could not be had.
#[derive(Clone, Debug)]
struct TableError {
    /// The manifest is missing or wrong (not a transient failure): the layer is broken.
    broken: bool,
    why: String,
}

/// The fetcher of a [`LazyLayer`], once there is one (or why there is none).
#[derive(Default)]
struct TableSlot {
    slot: Mutex<Option<std::result::Result<Arc<Shared>, TableError>>>,
    ready: parking_lot::Condvar,
}

impl TableSlot {
    fn set(&self, r: std::result::Result<Arc<Shared>, TableError>) {
        *self.slot.lock() = Some(r);
        self.ready.notify_all();
    }

    /// The fetcher or why there is none, if that is known.
    fn get(&self) -> Option<std::result::Result<Arc<Shared>, TableError>> {
        self.slot.lock().clone()
    }

    /// [`TableSlot::get`], waiting up to `limit` for it to be known.
    fn wait(&self, limit: std::time::Duration) -> std::result::Result<Arc<Shared>, TableError> {
        let mut slot = self.slot.lock();
        let deadline = std::time::Instant::now() + limit;
        while slot.is_none() {
            if self.ready.wait_until(&mut slot, deadline).timed_out() {
                break;
            }
        }
        slot.clone().unwrap_or_else(|| {
            Err(TableError {
                broken: false,
                why: format!(
                    "the layer's compact manifest did not arrive within {} s",
                    limit.as_secs()
                ),
            })
        })
    }
}

/// The sizes (bytes) of the distinct `objects` of `layer`'s tree, in order.
fn mmapped_sizes(layer: &LazyLayer, objects: &[u32]) -> Vec<u64> {
    let mut seen = std::collections::HashSet::new();
    (objects.iter())
        .filter(|&&o| seen.insert(o))
        .map(|&o| layer.tree.objects[o as usize].1)
        .collect()
}

/// Milliseconds since `t`.
fn ms_since(t: std::time::Instant) -> u64 {
    t.elapsed().as_millis() as u64
}

impl LazyLayer {
    /// Starts the fetcher's work besides readers: the prefetch of `plan` first (on a thread of
    /// its own; the trace replay waits for it), then the replay of `replay` (the traced
    /// objects, in order) and completion ([`Shared::spawn_background`]). A plan whose time is
    /// over already (the object table came late) fetches nothing first.
    fn start_fetching(
        self: &Arc<Self>,
        shared: &Arc<Shared>,
        replay: Vec<u32>,
        plan: Option<PrefetchPlan>,
    ) {
        if let Some(p) = plan {
            if std::time::Instant::now() >= p.deadline {
                let why = "the object table came after the prefetch's time";
                self.prefetched(Prefetched::skipped(why, ms_since(p.started)));
            } else {
                let hold = shared.hold_replay();
                let (l, s) = (Arc::clone(self), Arc::clone(shared));
                let spawned = std::thread::Builder::new()
                    .name("lazy-prefetch".into())
                    .spawn(move || {
                        let rate = Some(l.table_rate.load(Relaxed)).filter(|&r| r > 0);
                        let r = s.prefetch(
                            &p.candidates,
                            prefetch::PREFETCH_BYTES,
                            (p.deadline, rate),
                            p.started,
                        );
                        drop(hold);
                        l.prefetched(r);
                    });
                if let Err(e) = spawned {
                    let why = format!("no thread for it: {e}");
                    self.prefetched(Prefetched::skipped(&why, ms_since(p.started)));
                }
            }
        }
        shared.spawn_background(replay);
    }

    /// The prefetch before COMMAND ended with `r`: kept for the report and written to the
    /// run's directory ([`prefetch::PREFETCHED`]), which the run waits for.
    fn prefetched(&self, r: Prefetched) {
        tracing::info!(
            objects = r.objects,
            bytes = r.bytes,
            wanted_objects = r.wanted_objects,
            wanted_bytes = r.wanted_bytes,
            ms = r.ms,
            skipped = r.skipped.as_deref().unwrap_or(""),
            "lazy layer: fetched before COMMAND"
        );
        let body = serde_json::to_vec(&r).unwrap_or_default();
        *self.prefetched.lock() = Some(r);
        let p = self.run_dir.join(prefetch::PREFETCHED);
        if let Err(e) = finish::replace_file(&p, &body) {
            tracing::warn!(path = %p.display(), "writing the lazy prefetch's report: {e}");
        }
    }

    /// Reads the partial directory of `spec`: its compact manifest when it has one (the tree
    /// and the fetcher come from it), else its tree manifest (the fetcher waits for
    /// [`LazyLayer::fetch_table`]). Writes the layer's link groups ([`LINKS`]) when missing,
    /// and removes the temporary files of fetches a killed daemon left there.
    ///
    /// Errors: [`crate::error::Error::Failed`] for a manifest that does not parse or breaks the
    /// rules; [`crate::error::Error`] reading it, opening the remote.
    fn open(spec: &LazySpec) -> crate::error::Result<(LazyLayer, Table)> {
        use crate::error::{Error, IoContext};
        let held_dir = spec.dir.join(HELD);
        let held = File::open(&held_dir).at(&held_dir)?;
        let dev = std::os::unix::fs::MetadataExt::dev(&held.metadata().at(&held_dir)?);
        let limits = Limits::from_env();
        // What fetches of a daemon killed meanwhile left (another daemon's own are kept).
        fetch::remove_stale_temps(&spec.dir);
        let tpath = spec.dir.join(TREE);
        let (tree, table) = match std::fs::read(&tpath) {
            Ok(bytes) => {
                let head = super::compact::decode_tree(&bytes)
                    .map_err(|e| Error::Failed(format!("{}: {e}", tpath.display())))?;
                drop(bytes);
                let objects = head.prefix.objects as usize;
                let tree = Tree::build(&head.entries, &head.links, objects, dev)
                    .map_err(|e| Error::Failed(format!("{}: {e}", tpath.display())))?;
                let tree = Arc::new(tree);
                write_links(&spec.dir, &tree, &head.links)?;
                let prefix = head.prefix.clone();
                std::thread::spawn(move || drop(head));
                (tree, Table::Pending(prefix))
            }
            // A layer pushed without a tree manifest: the run fetched the compact one.
            Err(e) if e.kind() == io::ErrorKind::NotFound => {
                let mpath = spec.dir.join(MANIFEST);
                let bytes = std::fs::read(&mpath).at(&mpath)?;
                let wire = super::compact::wire(&bytes)
                    .map_err(|e| Error::Failed(format!("{}: {e}", mpath.display())))?;
                drop(bytes);
                let tree = Tree::new(&wire, dev)
                    .map_err(|e| Error::Failed(format!("{}: {e}", mpath.display())))?;
                let tree = Arc::new(tree);
                write_links(&spec.dir, &tree, &wire.links)?;
                let shared = Shared::new(
                    Remote::open(spec.remote.clone())?,
                    spec.project.clone(),
                    &wire,
                    tree.clone(),
                    LocalObjects::new(&spec.objects),
                    held_dir,
                    limits,
                    // Layers pushed without a tree manifest have no piece table either.
                    Vec::new(),
                )?;
                // Its 100k strings take tens of ms to free: not on the way to the mount.
                std::thread::spawn(move || drop(wire));
                (tree, Table::Ready(Box::new(shared)))
            }
            Err(e) => return Err(Error::io(&tpath, e)),
        };
        let opened = (0..tree.nodes.len())
            .map(|_| AtomicBool::new(false))
            .collect();
        let layer = LazyLayer {
            tree,
            shared: TableSlot::default(),
            limits,
            opened,
            trace: Mutex::new(Vec::new()),
            held,
            run_dir: spec.run_dir.clone(),
            prefetched: Mutex::new(None),
            table_rate: Default::default(),
        };
        Ok((layer, table))
    }

    /// The compact manifest the tree manifest's `prefix` names — its [`MANIFEST`]
    /// when an earlier run kept it, else fetched (retried with backoff while the remote fails
    /// transiently, until the bound of [`Limits`]) and kept — checked by its length and
    /// digest; makes the fetcher from it. When the remote has no compact manifest, the JSON
    /// one stands in ([`LazyLayer::table_from_json`]), as it does for a full pull.
    ///
    /// Errors: a [`TableError`], broken when no manifest form is there, or one does not
    /// match or does not parse.
    fn fetch_table(
        &self,
        spec: &LazySpec,
        prefix: &super::compact::TreePrefix,
    ) -> std::result::Result<Shared, TableError> {
        let fail = |broken: bool| {
            move |e: &dyn std::fmt::Display| TableError {
                broken,
                why: e.to_string(),
            }
        };
        let header: crate::store::Manifest =
            serde_json::from_str(&prefix.layer).map_err(|e| fail(true)(&e))?;
        let remote = Remote::open(spec.remote.clone()).map_err(|e| fail(false)(&e))?;
        let path = remote.layout.compact_manifest(&spec.project, &header.layer);
        let named = |b: &[u8]| {
            b.len() as u64 == prefix.compact_len
                && blake3::hash(b).as_bytes() == &prefix.compact_digest
        };
        let mpath = spec.dir.join(MANIFEST);
        let kept = std::fs::read(&mpath).ok().filter(|b| named(b));
        let fetched = kept.is_none();
        let not_found = |e: &crate::error::Error| {
            matches!(e, crate::error::Error::Remote { kind, .. }
                if *kind == crate::error::RemoteKind::NotFound)
        };
        let bytes = match kept {
            Some(b) => b,
            None => {
                let what = "reading the compact manifest";
                let t0 = std::time::Instant::now();
                match fetch::get_retrying(&remote, &path, what, self.limits) {
                    Ok(b) => {
                        // What the link gave it, at least (the time includes the request's
                        // delay): the prefetch's guess of its own time. A small manifest's
                        // time is mostly delay: no guess from it.
                        let secs = t0.elapsed().as_secs_f64();
                        if b.len() as u64 >= prefetch::RATE_SAMPLE && secs > 0.0 {
                            let rate = (b.len() as f64 / secs) as u64;
                            self.table_rate.store(rate, Relaxed);
                        }
                        b
                    }
                    // As a full pull does: the JSON form when the compact one is missing.
                    Err(e) if not_found(&e) => {
                        return self.table_from_json(spec, prefix, &header, remote);
                    }
                    Err(e) => return Err(fail(false)(&e)),
                }
            }
        };
        if !named(&bytes) {
            return Err(fail(true)(&format!(
                "{path}: {} bytes that are not the compact manifest its tree manifest names",
                bytes.len()
            )));
        }
        let wire = super::compact::wire(&bytes).map_err(|e| fail(true)(&format!("{path}: {e}")))?;
        if wire.entries.len() != self.tree.nodes.len()
            || wire.objects.len() != prefix.objects as usize
        {
            return Err(fail(true)(&format!(
                "{path}: it does not describe the tree its tree manifest has"
            )));
        }
        if fetched && let Err(e) = finish::replace_file(&mpath, &bytes) {
            tracing::warn!("lazy layer: keeping the compact manifest: {e}");
        }
        drop(bytes);
        let shared = self
            .fetcher(spec, remote, &wire, &header.layer)
            .map_err(|e| fail(true)(&e))?;
        std::thread::spawn(move || drop(wire));
        tracing::info!("lazy layer: the object table is here");
        Ok(shared)
    }

    /// The fetcher of this layer from its object table `wire` (compact or JSON form) and its
    /// piece table ([`LazyLayer::piece_table`]).
    ///
    /// Errors: as [`Shared::new`].
    fn fetcher(
        &self,
        spec: &LazySpec,
        remote: Remote,
        wire: &super::compact::Wire,
        layer: &crate::ids::LayerId,
    ) -> crate::error::Result<Shared> {
        let pieces = self.piece_table(spec, &remote, wire, layer);
        Shared::new(
            remote,
            spec.project.clone(),
            wire,
            self.tree.clone(),
            LocalObjects::new(&spec.objects),
            spec.dir.join(HELD),
            self.limits,
            pieces,
        )
    }

    /// The layer's piece table (`remote/pieces.rs`): the partial directory's [`PIECES`] when
    /// an earlier run kept it, else fetched from the remote (retried as the compact manifest
    /// is) and kept; empty when the layer stores no object alone (in no pack of `wire`) that
    /// is longer than one piece, when the remote
    /// has none (a layer pushed by an older version: its big objects are fetched whole), or
    /// when it cannot be had or read (logged).
    fn piece_table(
        &self,
        spec: &LazySpec,
        remote: &Remote,
        wire: &super::compact::Wire,
        layer: &crate::ids::LayerId,
    ) -> crate::remote::pieces::Table {
        use crate::remote::pieces;
        // Only objects stored alone (in no pack of `wire`) have pieces: no GET without one.
        let packed: std::collections::HashSet<u32> = (wire.packs.iter())
            .flat_map(|(_, l)| l.iter().map(|&(o, _, _)| o))
            .collect();
        let alone = (self.tree.objects.iter())
            .any(|&(w, size)| size > pieces::PIECE_LEN && !packed.contains(&w));
        if !alone {
            return Vec::new();
        }
        let kept = spec.dir.join(PIECES);
        let (bytes, fetched) = match std::fs::read(&kept) {
            Ok(b) => (b, false),
            Err(_) => {
                let path = remote.layout.pieces(&spec.project, layer);
                let what = "reading the piece table";
                match fetch::get_retrying(remote, &path, what, self.limits) {
                    Ok(b) => (b, true),
                    Err(crate::error::Error::Remote {
                        kind: crate::error::RemoteKind::NotFound,
                        ..
                    }) => return Vec::new(),
                    Err(e) => {
                        tracing::warn!(
                            "lazy layer: no piece table, big objects are fetched whole: {e}"
                        );
                        return Vec::new();
                    }
                }
            }
        };
        match pieces::decode(&bytes) {
            Ok(t) => {
                if fetched && let Err(e) = finish::replace_file(&kept, &bytes) {
                    tracing::warn!("lazy layer: keeping the piece table: {e}");
                }
                t
            }
            Err(e) => {
                tracing::warn!("lazy layer: big objects are fetched whole: {e}");
                Vec::new()
            }
        }
    }

    /// The fetcher made from the layer's JSON manifest, for a layer whose compact manifest is
    /// missing from the remote (fetched with retries as [`LazyLayer::fetch_table`] fetches the
    /// compact one). Its tree manifest names the compact form by digest, which cannot be
    /// checked then; instead the JSON is checked as a full pull checks a manifest (it parses,
    /// [`super::manifest::RemoteManifest::validate`]'s rules hold, its header is the tree
    /// manifest's `header`: the same project, cache and layer) and must describe the tree
    /// the daemon serves: the same entries and link groups as the tree manifest kept in the
    /// partial directory ([`TREE`]), the same number of objects as `prefix` says. Nothing of
    /// it is kept (the next run asks again).
    ///
    /// Errors: a [`TableError`], broken when the manifest is missing or fails those checks.
    fn table_from_json(
        &self,
        spec: &LazySpec,
        prefix: &super::compact::TreePrefix,
        header: &crate::store::Manifest,
        remote: Remote,
    ) -> std::result::Result<Shared, TableError> {
        use super::compact;
        let path = remote.layout.manifest(&spec.project, &header.layer);
        let what = "reading the JSON manifest (the compact one is missing)";
        let bytes = fetch::get_retrying(&remote, &path, what, self.limits).map_err(|e| {
            let broken = matches!(&e, crate::error::Error::Remote { kind, .. }
                if *kind == crate::error::RemoteKind::NotFound);
            TableError {
                broken,
                why: e.to_string(),
            }
        })?;
        let url = remote.cfg.url.clone();
        let corrupt = |detail: String| TableError {
            broken: true,
            why: crate::error::Error::from(super::RemoteError::Corrupt {
                url: url.clone(),
                what: format!("manifest {path}"),
                detail,
            })
            .to_string(),
        };
        let m = compact::parse(&bytes).map_err(|e| corrupt(format!("it does not parse: {e}")))?;
        drop(bytes);
        m.validate().map_err(|e| corrupt(e.to_string()))?;
        if &m.layer != header {
            return Err(corrupt(format!(
                "its header (layer {} of {}/{}) is not its tree manifest's (layer {} of {}/{})",
                m.layer.layer,
                m.layer.project,
                m.layer.cache,
                header.layer,
                header.project,
                header.cache
            )));
        }
        let wire = compact::to_wire(&m).map_err(|e| corrupt(e.to_string()))?;
        drop(m);
        let tpath = spec.dir.join(TREE);
        let tree = std::fs::read(&tpath)
            .map_err(|e| e.to_string())
            .and_then(|b| compact::decode_tree(&b).map_err(|e| e.to_string()))
            .map_err(|e| TableError {
                broken: false,
                why: format!("{}: {e}", tpath.display()),
            })?;
        let same = postcard::to_stdvec(&wire.entries).ok()
            == postcard::to_stdvec(&tree.entries).ok()
            && wire.links == tree.links
            && wire.objects.len() == prefix.objects as usize
            && wire.entries.len() == self.tree.nodes.len();
        drop(tree);
        if !same {
            return Err(corrupt(
                "it does not describe the tree its tree manifest has".into(),
            ));
        }
        let shared = (self.fetcher(spec, remote, &wire, &header.layer))
            .map_err(|e| corrupt(e.to_string()))?;
        std::thread::spawn(move || drop(wire));
        tracing::info!("lazy layer: the object table is here (from the JSON manifest)");
        Ok(shared)
    }

    /// The entries of the files `replay` lists (one path per line) that the layer has, in
    /// its order; an absent or unreadable file is an empty trace.
    fn replay_entries(&self, replay: &Path) -> Vec<u32> {
        let Ok(text) = std::fs::read(replay) else {
            return Vec::new();
        };
        text.split(|&b| b == b'\n')
            .filter_map(|p| std::ffi::CString::new(p).ok())
            .filter_map(|p| self.tree.find(&p).ok())
            .filter(|&i| self.tree.nodes[i as usize].object.is_some())
            .collect()
    }

    /// The object of the file `rel`, its path and the fetcher, for an open: the open goes
    /// into the trace (first time only), and waits for the fetcher within the bound.
    ///
    /// Errors: `ENOENT` for a name the layer lacks; `EISDIR`, `ELOOP` or `ENXIO` for a
    /// directory, a symlink or a special file; `EIO` when the object table cannot be had.
    fn object_of(&self, rel: &CStr) -> io::Result<(u32, &[u8], Arc<Shared>)> {
        let i = self.tree.find(rel)?;
        let n = &self.tree.nodes[i as usize];
        let Some(o) = n.object else {
            let errno = match n.mode & libc::S_IFMT {
                libc::S_IFDIR => libc::EISDIR,
                libc::S_IFLNK => libc::ELOOP,
                _ => libc::ENXIO,
            };
            return Err(io::Error::from_raw_os_error(errno));
        };
        if !self.opened[i as usize].swap(true, Relaxed) {
            self.trace.lock().push(i);
        }
        let t0 = std::time::Instant::now();
        let shared = self.shared.wait(self.limits.bound).map_err(|e| {
            let file = String::from_utf8_lossy(&n.path);
            tracing::error!(%file, "reading a lazily fetched file: {}", e.why);
            io::Error::from_raw_os_error(libc::EIO)
        })?;
        if t0.elapsed() >= std::time::Duration::from_millis(1) {
            tracing::debug!(
                file = %String::from_utf8_lossy(&n.path),
                ms = t0.elapsed().as_millis() as u64,
                "lazy open waited for the object table"
            );
        }
        shared.opened();
        Ok((o, &n.path, shared))
    }

    /// Writes [`REPORT`] and [`TRACE`] into the run's directory (each replaced whole).
    fn write_report(&self) {
        let trace = self.trace.lock().clone();
        let objects = self.tree.objects.len() as u64;
        let mut r = LazyReport {
            objects,
            bytes: self.tree.objects.iter().map(|(_, s)| s).sum(),
            opened: trace.len() as u64,
            ..Default::default()
        };
        match self.shared.get() {
            Some(Ok(s)) => {
                (r.local_objects, r.local_bytes) = s.local_count();
                r.fetched_objects = s.counts.objects.load(Relaxed);
                r.fetched_bytes = s.counts.bytes.load(Relaxed);
                r.gets = s.counts.gets.load(Relaxed);
                r.complete = r.local_objects == objects;
                r.broken = s.broken.lock().clone();
                r.failed = s.failed.lock().clone();
                r.remote_down = s.remote_down();
            }
            Some(Err(e)) if e.broken => r.broken = Some(e.why),
            Some(Err(e)) => {
                r.failed = vec![format!("the layer's object table: {}", e.why)];
                r.remote_down = true;
            }
            None => {}
        }
        if let Some(p) = &*self.prefetched.lock() {
            (r.prefetched_objects, r.prefetched_bytes) = (p.objects, p.bytes);
        }
        let mut lines = Vec::new();
        for i in trace {
            lines.extend_from_slice(&self.tree.nodes[i as usize].path);
            lines.push(b'\n');
        }
        let json = serde_json::to_vec(&r).unwrap_or_default();
        for (name, body) in [(REPORT, json), (TRACE, lines)] {
            let p = self.run_dir.join(name);
            if let Err(e) = finish::replace_file(&p, &body) {
                tracing::warn!(path = %p.display(), "writing the lazy layer's report: {e}");
            }
        }
    }
}

impl Drop for LazyLayer {
    fn drop(&mut self) {
        if let Some(Ok(s)) = self.shared.get() {
            s.stop();
        }
    }
}

/// Writes the link groups `links` (entry indexes of `tree`) to the partial directory `dir`
/// ([`LINKS`], what the overlay reads next) unless it has them.
///
/// Errors: [`crate::error::Error::Io`] writing the file.
fn write_links(dir: &Path, tree: &Tree, links: &[Vec<u32>]) -> crate::error::Result<()> {
    use crate::error::IoContext;
    let path = dir.join(LINKS);
    if links.is_empty() || path.exists() {
        return Ok(());
    }
    let groups: Vec<Vec<&[u8]>> = (links.iter())
        .map(|g| g.iter().map(|&i| &*tree.nodes[i as usize].path).collect())
        .collect();
    crate::overlay::links::LinkGroups::write(&path, &groups).at(&path)?;
    Ok(())
}

/// A [`LazyLayer`] shared with its report writers.
struct ArcLayer(Arc<LazyLayer>);

impl Layer for ArcLayer {
    fn stat(&self, rel: &CStr) -> io::Result<libc::stat> {
        let t = &self.0.tree;
        t.find(rel).map(|i| t.stat(i))
    }

    fn whited_out(&self, _rel: &CStr, _st: Option<&libc::stat>) -> io::Result<bool> {
        // A published layer is a whole tree: it records no whiteouts.
        Ok(false)
    }

    fn is_opaque(&self, _rel: &CStr) -> io::Result<bool> {
        Ok(false)
    }

    fn open(&self, rel: &CStr, _flags: libc::c_int) -> io::Result<File> {
        let (o, path, shared) = self.0.object_of(rel)?;
        shared.open(o, path)
    }

    fn open_data(&self, rel: &CStr, _flags: libc::c_int) -> io::Result<crate::overlay::LowerData> {
        let (o, path, shared) = self.0.object_of(rel)?;
        shared.open_data(o, path)
    }

    fn readlink(&self, rel: &CStr) -> io::Result<Vec<u8>> {
        let t = &self.0.tree;
        let i = t.find(rel)?;
        match &t.nodes[i as usize].target {
            Some(target) => Ok(target.to_vec()),
            None => Err(io::Error::from_raw_os_error(libc::EINVAL)),
        }
    }

    fn xattr(&self, rel: &CStr, name: &CStr, buf: &mut [u8]) -> io::Result<usize> {
        let t = &self.0.tree;
        let i = t.find(rel)?;
        let (_, v) = (t.nodes[i as usize].xattrs.iter())
            .find(|(n, _)| n.as_c_str() == name)
            .ok_or_else(|| io::Error::from_raw_os_error(libc::ENODATA))?;
        if buf.is_empty() {
            return Ok(v.len());
        }
        if buf.len() < v.len() {
            return Err(io::Error::from_raw_os_error(libc::ERANGE));
        }
        buf[..v.len()].copy_from_slice(v);
        Ok(v.len())
    }

    fn xattr_names(&self, rel: &CStr) -> io::Result<Vec<Vec<u8>>> {
        let t = &self.0.tree;
        let i = t.find(rel)?;
        Ok((t.nodes[i as usize].xattrs.iter())
            .map(|(n, _)| n.as_bytes().to_vec())
            .collect())
    }

    fn statx(&self, rel: &CStr, _mask: u32) -> io::Result<libc::statx> {
        let t = &self.0.tree;
        t.find(rel).map(|i| t.statx(i))
    }

    fn statvfs(&self) -> io::Result<libc::statvfs> {
        crate::sys::fstatvfs(&self.0.held)
    }

    fn open_dir(&self, rel: &CStr) -> io::Result<Option<Box<dyn LayerDir>>> {
        let t = &self.0.tree;
        Ok(t.find(rel).ok().filter(|&i| t.is_dir(i)).map(|i| {
            Box::new(Dir {
                tree: t.clone(),
                dir: i,
            }) as Box<dyn LayerDir>
        }))
    }

    fn noatime_view(&self) -> io::Result<Option<(std::os::fd::OwnedFd, Box<dyn Layer>)>> {
        // Its files are the store's objects, opened by the daemon only.
        Ok(None)
    }
}

/// A directory of a [`LazyLayer`] (see [`LayerDir`]).
struct Dir {
    tree: Arc<Tree>,
    dir: u32,
}

impl LayerDir for Dir {
    fn stat(&self, name: &CStr) -> io::Result<Option<libc::stat>> {
        Ok(self.tree.child(self.dir, name).map(|i| self.tree.stat(i)))
    }

    fn marked(&self, _name: &CStr) -> io::Result<bool> {
        Ok(false)
    }

    fn is_opaque(&self, _name: &CStr) -> io::Result<bool> {
        Ok(false)
    }

    fn names(&self, _again: bool) -> io::Result<Vec<(std::ffi::OsString, u8)>> {
        Ok(self.tree.names(self.dir))
    }
}

#[cfg(test)]
mod tests {
    use super::parse_lazy_timeout;
    use std::time::Duration;

    #[test]
    fn the_lazy_timeout_takes_seconds_or_a_duration_and_names_a_bad_value() {
        let ok = |v: &str| parse_lazy_timeout(v).unwrap();
        assert_eq!(ok("8"), Duration::from_secs(8));
        assert_eq!(ok("8s"), Duration::from_secs(8));
        assert_eq!(ok("2.5"), Duration::from_millis(2500));
        assert_eq!(ok("2.5s"), Duration::from_millis(2500));
        assert_eq!(ok("1500ms"), Duration::from_millis(1500));
        assert_eq!(ok("1m"), Duration::from_secs(60));
        assert_eq!(ok("0.5h"), Duration::from_secs(1800));
        assert_eq!(ok("24h"), Duration::from_secs(86_400));
        assert_eq!(ok("86400"), Duration::from_secs(86_400));
        assert_eq!(ok("1"), Duration::from_secs(1));
        assert_eq!(ok("1000ms"), Duration::from_secs(1));
        assert_eq!(ok("007"), Duration::from_secs(7));
        for bad in [
            "0.001",
            "100ms",
            "0.999",
            "0",
            "0s",
            "0.0",
            "0.0000000001",
            "-3",
            "+3",
            "eight",
            "",
            " ",
            "NaN",
            "nan",
            "inf",
            "infinity",
            "8 s",
            " 8",
            "8 ",
            "1e3",
            "1E3",
            "8.",
            ".5",
            "8..5",
            "1.2.3",
            "8sec",
            "8S",
            "1h 30m",
            "1h30m",
            "2d",
            "1w",
            "86401",
            "25h",
            "1441m",
            "99999999999999999999",
            "none",
            "8_000",
            "0x10",
            "８",
        ] {
            let e = parse_lazy_timeout(bad).unwrap_err();
            assert_eq!(e.exit_code(), 2, "{bad:?}");
            let e = e.to_string();
            assert!(
                e.contains("LAYERCACHE_LAZY_TIMEOUT")
                    && e.contains(&format!("{bad:?}"))
                    && e.contains("1500ms, 8s, 1m")
                    && e.contains("at most 24h"),
                "{bad:?}: {e}"
            );
        }
    }
}
