//! Warm mounts, the store's side: a run's mount of an exact local hit may outlive the run as
//! an **idle** mount, and the next run of the same layer **adopts** it instead of mounting the
//! layer again. The kernel's dentries, inodes and page cache of the layer then survive from
//! one run to the next, so run 2..N pay no first pass (`overlay/warm.rs` is the daemon's
//! side; the round-4 contract "Warm mounts" in DESIGN.md says what must hold).
//!
//! **Privacy.** A mount is handed back only as it was made. A run that changed nothing leaves
//! it so: its upper dir is empty, the upper root's ctime and mtime are those recorded right
//! after the mount was made (a create, unlink, rename, copy-up, chmod or xattr change in the
//! view leaves an entry in the upper root or changes its times) and the work dir holds exactly
//! what it held then (no orphan of an unlinked open file). A run that changed something has its
//! daemon drop it all first (`reset`, `overlay/fs/reset.rs`: the kernel drops every name and
//! node the upper holds, the upper and work dirs are emptied, the daemon forgets what it knew
//! of them; a node the kernel still holds fails the reset), and the mount is then checked the
//! same way. Any failure ends the mount as before. The check is made again when a run adopts
//! the mount. The run's processes are gone when this runs (every step is a PID namespace of
//! its own, `run/pidns.rs`): nothing of it holds a file in the mount.
//!
//! **Layout.** A warm-capable mount is an ordinary run directory (`runs/<run>/`) whose record
//! says `warm` and which holds the daemon's control socket ([`CONTROL`]) and the
//! [`BASELINE`]. While idle it also holds [`IDLE`]; a run claims it by renaming that file
//! (one winner), then asks the daemon to take its pid as the new owner (`adopt`). The daemon
//! holds the run's and the layer's leases for its whole life, so an idle mount pins its layer:
//! `gc` ends every idle mount first ([`Store::reap_warm`]).
//!
//! **Visibility.** A mount lives in the mount namespace it was made in. A run adopts only a
//! mount its own namespace shows at the recorded mountpoint (its mountinfo names the run's
//! upper); one it cannot see (made by a run under `unshare -m`, or in another container sharing
//! the store) is ended instead, since no later run of another namespace can use it either.
//!
//! **Bounds.** An idle mount ends itself after [`warm_idle`] (`LAYERCACHE_WARM_IDLE`, default
//! [`DEFAULT_WARM_IDLE`]; `0` turns warm mounts off); at most [`WARM_PER_LAYER`] idle mounts of
//! a layer are kept. Only the mounts `layercache run` makes in the initial user namespace
//! (root) are warm-capable: a rootless run's mounts live in the run's own namespaces, which
//! end with it.

use std::fs;
use std::io;
use std::path::Path;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::lease::{Lease, Mode};
use super::paths::{ProjectDirs, read_names, remove_tree};
use super::runs::{MountResult, RunRecord, read_record, write_record};
use super::{Store, UNMOUNT_WAIT};
use crate::ids::LayerId;
use crate::overlay;
use crate::units::now_ms;

/// `control`: the overlay daemon's control socket in a warm-capable run's directory.
pub(super) const CONTROL: &str = "control";
/// `idle`: present while the run's mount waits to be adopted; a run claims it by renaming it.
const IDLE: &str = "idle";
/// `adopting-<pid>`: `idle` renamed by the run adopting the mount, until its record says so.
const ADOPTING: &str = "adopting-";
/// `ending-<pid>`: `idle` renamed by the `gc` or `clear` ending the mount.
const ENDING: &str = "ending-";
/// `baseline.json`: the upper root's times and the work dir's entries right after the mount.
const BASELINE: &str = "baseline.json";
/// How long an idle mount waits to be adopted by default (2 min).
pub const DEFAULT_WARM_IDLE: Duration = Duration::from_secs(120);
/// Idle mounts kept per layer and kind of mount (ownership mapping, passthrough choice): a
/// burst of concurrent runs leaves at most this many warm.
pub const WARM_PER_LAYER: usize = 4;
/// How long a run's end waits for the project lock to hand its mount back (else it unmounts).
const LOCK_WAIT: Duration = Duration::from_millis(500);

/// How long an idle warm mount waits to be adopted: `LAYERCACHE_WARM_IDLE` (a duration such as
/// `90s`, `2m`; `0` or `none` turns warm mounts off), else [`DEFAULT_WARM_IDLE`]. `None`: off.
/// An unreadable value is warned about and the default used.
pub fn warm_idle() -> Option<Duration> {
    let Ok(v) = std::env::var("LAYERCACHE_WARM_IDLE") else {
        return Some(DEFAULT_WARM_IDLE);
    };
    match crate::units::parse_duration(&v) {
        Ok(d) => d.filter(|d| !d.is_zero()),
        Err(e) => {
            tracing::warn!(value = %v, error = %e, "LAYERCACHE_WARM_IDLE: using the default");
            Some(DEFAULT_WARM_IDLE)
        }
    }
}

/// What a mount's upper and work dirs looked like right after it was made.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
struct Baseline {
    /// The upper root's ctime (s, ns): any change to the directory moves it.
    upper_ctime: [i64; 2],
    /// What the cache's root directory shows of the upper root: mode, uid, gid, size, mtime
    /// (s, ns).
    upper_shown: [i64; 6],
    /// The upper root's xattrs (ACLs too), names and values, hex, sorted.
    upper_xattrs: Vec<(String, String)>,
    /// Every path in the work dir (relative), sorted.
    work: Vec<String>,
}

impl Baseline {
    /// Equal but for the ctime (what a reset cannot set back).
    fn same_but_ctime(&self, other: &Baseline) -> bool {
        self.upper_shown == other.upper_shown
            && self.upper_xattrs == other.upper_xattrs
            && self.work == other.work
    }
}

/// The [`Baseline`] of `run_dir` now; `None` when its upper root holds any entry.
///
/// Errors: the `stat`/`readdir` errors.
fn snapshot(run_dir: &Path) -> io::Result<Option<Baseline>> {
    use std::os::unix::fs::MetadataExt;
    let upper = run_dir.join("upper");
    if fs::read_dir(&upper)?.next().is_some() {
        return Ok(None);
    }
    let m = fs::symlink_metadata(&upper)?;
    let hex = |b: &[u8]| b.iter().map(|x| format!("{x:02x}")).collect::<String>();
    let mut upper_xattrs = crate::sys::list_xattrs(&upper)?
        .into_iter()
        .map(|n| crate::sys::get_xattr(&upper, &n).map(|v| (hex(&n), hex(&v))))
        .collect::<io::Result<Vec<_>>>()?;
    upper_xattrs.sort();
    let mut work = Vec::new();
    let root = run_dir.join("work");
    let mut stack = vec![root.clone()];
    while let Some(dir) = stack.pop() {
        for e in fs::read_dir(&dir)? {
            let e = e?;
            let p = e.path();
            if e.file_type()?.is_dir() {
                stack.push(p.clone());
            }
            let rel = p.strip_prefix(&root).unwrap_or(&p);
            work.push(rel.to_string_lossy().into_owned());
        }
    }
    work.sort();
    Ok(Some(Baseline {
        upper_ctime: [m.ctime(), m.ctime_nsec()],
        upper_shown: [
            i64::from(m.mode()),
            i64::from(m.uid()),
            i64::from(m.gid()),
            m.size() as i64,
            m.mtime(),
            m.mtime_nsec(),
        ],
        upper_xattrs,
        work,
    }))
}

/// Records the [`Baseline`] of a warm-capable mount just made in `run_dir`. A mount without
/// one is never handed back.
pub(super) fn record_baseline(run_dir: &Path) {
    let written = snapshot(run_dir).and_then(|b| match b {
        Some(b) => fs::write(
            run_dir.join(BASELINE),
            serde_json::to_vec(&b).unwrap_or_default(),
        ),
        None => Err(io::Error::other("the upper is not empty")),
    });
    if let Err(e) = written {
        tracing::warn!(run = %run_dir.display(), error = %e, "no warm baseline: the mount ends with its run");
    }
}

/// The [`Baseline`] recorded for `run_dir`, if any.
fn baseline(run_dir: &Path) -> Option<Baseline> {
    serde_json::from_slice(&fs::read(run_dir.join(BASELINE)).ok()?).ok()
}

/// Whether the run of `run_dir` left its mount as it was made (see the module docs).
fn pristine(run_dir: &Path) -> bool {
    let Some(base) = baseline(run_dir) else {
        return false;
    };
    matches!(snapshot(run_dir), Ok(Some(now)) if now == base)
}

/// After a reset: whether the mount of `run_dir` is as it was made but for the upper root's
/// ctime, which is then recorded (the next check compares with it). False when the reset could
/// not set the root back (a directory that grew stays large: its size differs).
fn pristine_after_reset(run_dir: &Path) -> bool {
    let (Some(base), Ok(Some(now))) = (baseline(run_dir), snapshot(run_dir)) else {
        return false;
    };
    if !now.same_but_ctime(&base) {
        tracing::info!(?base, ?now, "the reset left the upper root changed");
        return false;
    }
    fs::write(
        run_dir.join(BASELINE),
        serde_json::to_vec(&now).unwrap_or_default(),
    )
    .is_ok()
}

/// Whether a mount of `result` over `layer` (local, not lazy) at the run's own mountpoint
/// (`private`) with an `owner` may be warm-capable; `tracing_opens`: its daemon records an
/// open trace (kept for the remote tier once; such a mount is not shared).
pub(super) fn capable(
    result: MountResult,
    layer: bool,
    private: bool,
    owner: bool,
    tracing_opens: bool,
) -> bool {
    result == MountResult::Hit
        && layer
        && private
        && owner
        && !tracing_opens
        && warm_idle().is_some()
        && crate::sys::in_initial_user_ns()
}

/// The control socket of run directory `run_dir`.
fn control(run_dir: &Path) -> std::path::PathBuf {
    run_dir.join(CONTROL)
}

/// Every run of `pd` with a record: its directory, its record and whether it is an idle warm
/// mount.
fn runs_of(pd: &ProjectDirs) -> impl Iterator<Item = (std::path::PathBuf, RunRecord, bool)> {
    let runs = pd.runs();
    read_names(&runs)
        .unwrap_or_default()
        .into_iter()
        .filter_map(move |name| {
            let dir = runs.join(&name);
            let rec = read_record(&dir)?;
            let idle = dir.join(IDLE).exists() || reclaim_abandoned(&dir, &rec);
            Some((dir, rec, idle))
        })
}

/// Hands an idle mount back when the process that claimed it (an `adopting-<pid>` or
/// `ending-<pid>` file: [`Store::adopt_warm`], [`Store::reap_warm`]) died before it adopted or
/// ended it: the claim becomes `idle` again, so the next run may adopt it and `gc` end it
/// (before, only its idle time ended it). Only a mount whose daemon lives and whose recorded
/// owner is gone is looked at (a held mount's owner is alive). Returns whether it is idle now.
fn reclaim_abandoned(dir: &Path, rec: &RunRecord) -> bool {
    let pid_alive = crate::sys::pid_alive;
    if rec.owner_pid.is_none_or(pid_alive) || !pid_alive(rec.daemon_pid) {
        return false;
    }
    let Ok(entries) = fs::read_dir(dir) else {
        return false;
    };
    for entry in entries.flatten() {
        let name = entry.file_name();
        let Some(name) = name.to_str() else { continue };
        let claimer = (name.strip_prefix(ADOPTING))
            .or_else(|| name.strip_prefix(ENDING))
            .and_then(|pid| pid.parse::<u32>().ok());
        if let Some(pid) = claimer
            && !pid_alive(pid)
            && fs::rename(entry.path(), dir.join(IDLE)).is_ok()
        {
            tracing::info!(run = %dir.display(), claimer = pid, "an abandoned claim of a warm mount: idle again");
            return true;
        }
    }
    false
}

/// Idle warm mounts of `pd` (their run directories and records), optionally of one layer.
fn idle_runs(pd: &ProjectDirs, layer: Option<&LayerId>) -> Vec<(std::path::PathBuf, RunRecord)> {
    runs_of(pd)
        .filter(|(_, rec, idle)| *idle && layer.is_none_or(|l| rec.lower.as_ref() == Some(l)))
        .map(|(dir, rec, _)| (dir, rec))
        .collect()
}

/// Who holds each layer of `pd` that some run record names as its lower and whose daemon
/// is alive: how many idle warm mounts and how many runs.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Holders {
    /// Idle warm mounts.
    pub idle: u32,
    /// Mounts a run (or `layercache mount`) holds.
    pub runs: u32,
}

/// The [`Holders`] of each layer of `pd`, by layer (a layer no live mount names is absent).
pub(super) fn holders(pd: &ProjectDirs) -> std::collections::HashMap<LayerId, Holders> {
    let mut n: std::collections::HashMap<LayerId, Holders> = std::collections::HashMap::new();
    for (_, rec, idle) in runs_of(pd) {
        let Some(l) = rec.lower else { continue };
        if !crate::sys::pid_alive(rec.daemon_pid) {
            continue;
        }
        let h = n.entry(l).or_default();
        match idle {
            true => h.idle += 1,
            false => h.runs += 1,
        }
    }
    n
}

/// What a run wants of the warm mount it would adopt (from its mount request).
pub(super) struct Wanted<'a> {
    /// The run's process (the mount's new owner).
    pub(super) owner: u32,
    /// The ownership mapping the mount must have.
    pub(super) squash: crate::overlay::options::Squash,
    /// The passthrough choice the mount was made with.
    pub(super) passthrough: crate::overlay::options::PassthroughChoice,
    /// The run's key and restore keys (recorded for it).
    pub(super) key: &'a crate::ids::CacheKey,
    /// See `key`.
    pub(super) restore_keys: &'a [crate::ids::CacheKey],
}

/// A warm mount a run adopted ([`Store::adopt_warm`]): its record, rewritten for the adopting
/// run.
pub(super) struct Adopted {
    pub(super) rec: RunRecord,
}

impl Store {
    /// At the end of a run: hands the mount `m` back as an idle warm mount if it is
    /// warm-capable, fewer than [`WARM_PER_LAYER`] of its layer are idle, it is as it was made
    /// (after its daemon's `reset` when the run changed something, see the module docs) and its
    /// daemon takes it (`idle`). Returns whether it did; when not, the caller unmounts as always.
    pub(super) fn release_warm(&self, m: &super::runs::StoreMount) -> bool {
        let rec = &m.rec;
        let (Some(idle), true, Some(layer)) = (warm_idle(), rec.warm, rec.lower.as_ref()) else {
            return false;
        };
        // Idle mounts this one's kind (ownership mapping, passthrough): only such a mount can
        // be adopted in its place.
        let full = || {
            idle_runs(&m.pd, Some(layer))
                .iter()
                .filter(|(_, r)| r.squash == rec.squash && r.passthrough == rec.passthrough)
                .count()
                >= WARM_PER_LAYER
        };
        if !crate::sys::pid_alive(rec.daemon_pid) || full() {
            return false;
        }
        // A run that changed something: its daemon drops it all (`overlay/fs/reset.rs`),
        // then the mount must be as made but for the upper root's ctime.
        if !pristine(&m.run_dir) {
            if let Err(e) = overlay::warm::request(&control(&m.run_dir), "reset") {
                tracing::info!(error = %e, "not kept warm");
                return false;
            }
            if !pristine_after_reset(&m.run_dir) {
                return false;
            }
        }
        // Counted again under the project lock (gc holds it while it ends idle mounts), so
        // that runs ending together keep at most WARM_PER_LAYER.
        let lock = Lease::acquire_timeout(&m.pd.lock(), Mode::Exclusive, LOCK_WAIT);
        let Ok(Some(_lock)) = lock else {
            return false;
        };
        if full() {
            return false;
        }
        let ms = idle.as_millis().min(u64::MAX as u128) as u64;
        if let Err(e) = overlay::warm::request(&control(&m.run_dir), &format!("idle {ms}")) {
            tracing::info!(error = %e, "not kept warm");
            return false;
        }
        if let Err(e) = fs::write(m.run_dir.join(IDLE), b"") {
            tracing::warn!(error = %e, "not kept warm");
            let _ = overlay::warm::request(&control(&m.run_dir), "end");
            return false;
        }
        tracing::info!(run = %rec.run, layer = %layer, "kept warm");
        true
    }

    /// Adopts an idle warm mount of `layer` in `pd` for the mount `req` wants (the same
    /// ownership mapping and passthrough choice): claims it, checks it is still as made, makes
    /// `req.owner` its owner and rewrites its record for this run. `None` when there is none
    /// to adopt (the caller mounts the layer as always).
    pub(super) fn adopt_warm(
        &self,
        pd: &ProjectDirs,
        layer: &LayerId,
        req: Wanted<'_>,
    ) -> Option<Adopted> {
        let owner = req.owner;
        for (dir, mut rec) in idle_runs(pd, Some(layer)) {
            if rec.squash != req.squash || rec.passthrough != req.passthrough {
                continue;
            }
            // The claim stays until the mount is ours (record rewritten) or ended: a run killed
            // in between leaves it, and whoever looks next finds its claimer dead and hands the
            // mount back ([`runs_of`]).
            let claimed = dir.join(format!("{ADOPTING}{}", std::process::id()));
            if fs::rename(dir.join(IDLE), &claimed).is_err() {
                continue; // another run took it, or it ended
            }
            // Seen here: a mount made in another mount namespace (a run under `unshare -m`, in
            // another container) is not at its mountpoint in this one — only an empty dir is.
            let here = overlay::upperdir_of(&rec.mountpoint) == Some(dir.join("upper"));
            let usable = here && crate::sys::pid_alive(rec.daemon_pid) && pristine(&dir);
            let adopted = usable
                && overlay::warm::request(&control(&dir), &format!("adopt {owner}"))
                    .inspect_err(|e| tracing::info!(error = %e, "warm mount not adopted"))
                    .is_ok();
            if !adopted {
                end_idle(&dir, &rec);
                continue;
            }
            rec.key = req.key.clone();
            rec.restore_keys = req.restore_keys.to_vec();
            rec.result = MountResult::Hit;
            rec.matched_key = Some(req.key.clone());
            rec.owner_pid = Some(owner);
            rec.mounted_ms = now_ms();
            let written = write_record(&dir, &rec);
            let _ = fs::remove_file(&claimed);
            if let Err(e) = written {
                // The daemon is ours now and ends with this process; nothing records it.
                tracing::warn!(error = %e, "warm mount adopted but its record not written");
                continue;
            }
            tracing::info!(run = %rec.run, layer = %layer, "adopted a warm mount");
            return Some(Adopted { rec });
        }
        None
    }

    /// Ends every idle warm mount of `pd` (`gc`, `clear`): claims each, asks its daemon to end,
    /// waits for it and removes its run directory. Returns how many ended.
    pub fn reap_warm(&self, pd: &ProjectDirs) -> u64 {
        let mut n = 0;
        for (dir, rec) in idle_runs(pd, None) {
            let claimed = dir.join(format!("{ENDING}{}", std::process::id()));
            if fs::rename(dir.join(IDLE), &claimed).is_err() {
                continue;
            }
            end_idle(&dir, &rec);
            n += 1;
        }
        n
    }
}

/// Ends the idle mount of `dir` that this process claimed: asks its daemon to end (or, when
/// it does not answer, unmounts it), waits for the daemon and removes the run directory.
fn end_idle(dir: &Path, rec: &RunRecord) {
    let pid = rec.daemon_pid;
    let pidfd = crate::sys::pidfd_open(pid).ok();
    let asked = overlay::warm::request(&control(dir), "end").is_ok();
    let gone = match (&pidfd, asked) {
        (Some(fd), true) => overlay::wait_pidfd(fd, pid, UNMOUNT_WAIT),
        _ => false,
    };
    // A daemon that did not answer (or is gone, its mount dead): detach what is still
    // mounted; a live daemon then sees its session end and exits.
    if !gone && overlay::is_mountpoint_busy(&rec.mountpoint).unwrap_or(false) {
        let _ = rustix::mount::unmount(&rec.mountpoint, rustix::mount::UnmountFlags::DETACH);
    }
    if let Err(e) = remove_tree(dir) {
        tracing::warn!(run = %dir.display(), error = %e, "could not remove an ended warm mount");
    }
}
