//! Phase 3 of a run, per cache: setup (miss, restore) or maintenance (hit) — the line saying
//! what runs, the script in the step's sandbox, its time and status in the cache's event —
//! and what a failed setup leaves: a full store told from the tool's words, the logs it wrote
//! kept in the store's `failed/<run>/<cache>`.

use std::collections::BTreeMap;
use std::path::Path;
use std::time::Instant;

use super::child::{Views, stopped};
use super::mounts::Mounts;
use super::progress::{self, Progress};
use super::steps::Steps;
use super::{Prep, interrupted_error};
use crate::error::{Error, Result};
use crate::ids::ProjectId;
use crate::spec::Cache;
use crate::telemetry::CacheResult;

/// Phase 3, setup (miss, restore) or maintenance (hit) of cache `preps[ci]`, in `views` with
/// `run_env` plus `$LAYERCACHE_MOUNT`; its time and status go into its event.
///
/// Returns `Some(error)` when the run must stop — interrupted, a mount's daemon died, the
/// script exited non-zero — for the caller to log the event and unmount everything;
/// `Err` when the script could not be started.
pub(super) fn setup_or_maintenance(
    steps: &Steps<'_>,
    mounts: &Mounts<'_>,
    cache: &Cache,
    (preps, ci): (&mut [Prep], usize),
    run_env: &BTreeMap<String, String>,
    views: &Views,
    json: bool,
) -> Result<Option<Error>> {
    let (what, script) = match preps[ci].mounted.result {
        CacheResult::Hit => ("maintenance", cache.maintenance.as_deref()),
        // A restore brings the old tree up to date in place.
        CacheResult::Restore => (
            "setup",
            cache.restore_setup.as_deref().or(Some(&cache.setup)),
        ),
        CacheResult::Miss => ("setup", Some(cache.setup.as_str())),
    };
    let Some(script) = script else {
        return Ok(None);
    };
    // A maintenance that tests for a directory this run mounts a cache at would do nothing:
    // not started (a shell and `mountpoint` cost a hit ~4 ms). The steps' working directory
    // is the workdir's view, where the caches' view paths are.
    if what == "maintenance"
        && let Some(dir) = crate::spec::unless_mounted_dir(script)
        && let mounted = steps.paths.view_workdir().join(dir)
        && let Some(other) = preps.iter().find(|q| q.keys.mountpoint == mounted)
    {
        eprintln!(
            "layercache: {}: hit, maintenance not needed ({dir} is cache {:?} of this run)",
            cache.id.as_str(),
            other.keys.id.as_str()
        );
        return Ok(None);
    }
    let p = &mut preps[ci];
    let label = format!("{what} of cache {:?}", cache.id.as_str());
    // Say what is about to run before it does: a setup can be silent for minutes.
    eprintln!(
        "{}",
        progress::start_line(
            cache.id.as_str(),
            p.mounted.result,
            p.mounted.matched_key.as_deref(),
            what,
            script,
            &steps.paths.workdir,
        )
    );
    let progress = Progress::start(
        json,
        &format!("{}: {what}", cache.id.as_str()),
        p.mounted.upper.clone().filter(|_| what == "setup"),
    );
    // The script may name its own mount as `{mount}` (and `{workdir}`, `{mount_root}`,
    // `{env:NAME}`, as in `env`), shell-quoted; it also gets it as $LAYERCACHE_MOUNT.
    let view = p.keys.mountpoint.clone();
    let script = crate::spec::expand_script(script, steps.paths, Some(&view));
    let mut env = run_env.clone();
    env.insert("LAYERCACHE_MOUNT".into(), view.display().to_string());
    let t = Instant::now();
    let (status, output) = steps.script(&env, views, &script, &label)?;
    drop(progress);
    let ms = t.elapsed().as_millis() as u64;
    if what == "setup" {
        p.event.setup_ms = ms;
    } else {
        p.event.maintenance_ms = ms;
    }
    p.event.exit_status = status;
    if let Some(sig) = stopped() {
        return Ok(Some(interrupted_error(sig)));
    }
    if let Err(e) = mounts.check_all() {
        return Ok(Some(e));
    }
    if status != 0 && what == "setup" && setup_filled_store(mounts.store, output.as_deref()) {
        // No room to keep its logs either; the line says what happened.
        return Ok(Some(Error::StoreFull {
            // Measured now: the setup's files are all still there.
            message: crate::store::store_full_message(mounts.store, &label, None),
            status,
        }));
    }
    if status != 0 {
        let kept = (what == "setup")
            .then(|| keep_failed_logs(mounts, preps, ci, &script, status, output.as_deref()))
            .flatten();
        let where_logs = kept.map_or(String::new(), |k| kept_note(cache, &k));
        return Ok(Some(Error::Child {
            what: format!("{label} (nothing published{where_logs})"),
            status,
        }));
    }
    Ok(None)
}

/// Whether a setup failed for space: the store's filesystem is (nearly) full now, in bytes or
/// in inodes ([`crate::store::store_looks_full`]) and the end of its output, when captured, says so
/// ([`says_no_space`]; a setup that failed for another reason on a nearly full disk keeps its
/// own error and logs).
fn setup_filled_store(store: &Path, output: Option<&[u8]>) -> bool {
    crate::store::store_looks_full(store) && output.is_none_or(says_no_space)
}

/// Whether a tool's output tells of a full disk: `ENOSPC`, `No space left on device`
/// (strerror), `EDQUOT` or `Disk quota exceeded`.
pub(super) fn says_no_space(output: &[u8]) -> bool {
    let text = String::from_utf8_lossy(output);
    [
        "ENOSPC",
        "No space left on device",
        "EDQUOT",
        "Disk quota exceeded",
    ]
    .iter()
    .any(|m| text.contains(m))
}

/// The end of a failed setup's line when its logs were kept (`k`): where they are, after a
/// line on stderr for each of the first 5 log files (npm and others point at their log inside
/// the view, which goes with the run).
fn kept_note(cache: &Cache, k: &crate::store::KeptLogs) -> String {
    for (seen, now) in k.files.iter().take(5) {
        eprintln!(
            "layercache: {}: setup's log {} is kept as {}",
            cache.id.as_str(),
            seen.display(),
            now.display()
        );
    }
    format!(
        "; {} kept for 7 days in {} (`layercache gc` lists them)",
        match (k.output, k.files.is_empty()) {
            (true, true) => "the end of its output is",
            (true, false) => "the end of its output and the logs it wrote are",
            (false, _) => "the logs it wrote are",
        },
        k.dir.display()
    )
}

/// After a failed setup: copies the log files it wrote into its view (the run's private
/// upper, discarded when the run ends) to the store's `failed/<run>/<cache>`
/// ([`crate::store::keep_failed_logs`]); `None` when it wrote none or they could not be kept
/// (a warning says why).
fn keep_failed_logs(
    mounts: &Mounts<'_>,
    preps: &[Prep],
    ci: usize,
    script: &str,
    status: i32,
    output: Option<&[u8]>,
) -> Option<crate::store::KeptLogs> {
    let p = &preps[ci];
    let upper = p.mounted.upper.as_ref()?;
    let project = ProjectId::new(&p.event.project).ok()?;
    let pd = crate::store::ProjectDirs::at(mounts.store, &project);
    let view = &p.keys.mountpoint;
    // Every cache's (id, private upper, view path) as mounted now: a tool may log into
    // another cache's view (npm's `_logs` in the npm cache).
    let others: Vec<(&str, &Path, &Path)> = (preps.iter())
        .filter_map(|o| {
            let up = o.mounted.upper.as_deref()?;
            Some((o.keys.id.as_str(), up, o.keys.mountpoint.as_path()))
        })
        .collect();
    let failed = crate::store::FailedSetup {
        others: &others,
        run: mounts.run_id,
        cache: p.keys.id.as_str(),
        upper,
        view,
        script,
        status,
        output,
    };
    match crate::store::keep_failed_logs(&pd, &failed) {
        Ok(kept) => kept,
        Err(e) => {
            eprintln!("layercache: warning: the failed setup's logs could not be kept: {e}");
            None
        }
    }
}
