//! The store subcommands (`mount`, `commit`, `umount`, `ls`, `gc`, `clear`, `verify`): raw CLI
//! flags → validated ids → [`Store`] calls → output. Each returns the exit status
//! (see [`crate::error`]): 0, or 1 when `clear` refused a layer in use or `verify` found
//! corruption.

use std::path::{Path, PathBuf};
use std::time::Duration;

use super::{emit, json, store_root};
use crate::cli::{ClearArgs, GcArgs, GlobalArgs, LsArgs, MountArgs, MountpointArg};
use crate::error::{Error, Result};
use crate::ids::{CacheId, CacheKey, ProjectId};
use crate::store::{self as st, GcOptions, MountRequest, Store};
use crate::units;

/// Opens (creating) the store of `global`; its notices (waiting for another run's fill…) go
/// to stderr. The remote tier is attached when one is configured.
///
/// Errors: as [`Store::open`] and [`crate::remote::attach`].
pub fn open(global: &GlobalArgs) -> Result<Store> {
    let mut store = Store::open(Some(&store_root(global)?))?.with_notify(stderr_notices());
    crate::remote::attach(&mut store, global.remote.as_deref(), None)?;
    Ok(store)
}

/// A [`st::Notify`] printing each notice on stderr as `layercache: <notice>`.
pub fn stderr_notices() -> st::Notify {
    std::sync::Arc::new(|n: &st::Notice| eprintln!("layercache: {n}"))
}

/// Opens the store for a command that only reads or trims it (`ls`, `stats`, `gc`, `clear`,
/// `verify`): a store that does not exist yet is not created (see [`Store::open_existing`]).
///
/// Errors: [`Error::Invalid`] naming the path when no store is there.
pub fn open_existing(global: &GlobalArgs) -> Result<Store> {
    let root = store_root(global)?;
    let store = Store::open_existing(&root)?.ok_or_else(|| {
        Error::invalid(format!(
            "no layercache store at {} (one is created by the first `mount` or `run`; check \
             --store / LAYERCACHE_STORE)",
            root.display()
        ))
    })?;
    Ok(store.with_notify(stderr_notices()))
}

fn project_opt(p: &Option<String>) -> Result<Option<ProjectId>> {
    p.as_deref().map(ProjectId::new).transpose()
}

/// `layercache mount`: prints the [`st::MountOutcome`] as one JSON line.
///
/// Errors: [`Error::Invalid`] (exit 2) for bad ids, or a mountpoint that is `/`, a system
/// directory or a symlink to one ([`crate::spec::check_root`], checked before anything is
/// mounted); store/mount errors.
pub fn mount(global: &GlobalArgs, a: &MountArgs) -> Result<i32> {
    // Refused before anything is mounted: `/`, a system directory, or a symlink to one.
    let mp = std::path::absolute(&a.mountpoint)
        .map_err(|e| Error::invalid(format!("mountpoint {}: {e}", a.mountpoint.display())))?;
    crate::spec::check_root("mountpoint", &mp)?;
    let req = MountRequest {
        project: ProjectId::new(a.project.as_str())?,
        cache: CacheId::new(a.cache.as_str())?,
        key: CacheKey::new(a.key.as_str())?,
        restore_keys: a
            .restore_keys
            .iter()
            .map(|k| {
                CacheKey::new(k.as_str()).map_err(|e| Error::invalid(format!("--restore-key: {e}")))
            })
            .collect::<Result<_>>()?,
        fill_wait: Duration::from_secs(a.fill_wait),
        mountpoint: Some(a.mountpoint.clone()),
        squash: Default::default(),
        owner: None,
        // Its view may be committed later: the layer must be local.
        lazy: false,
        passthrough: Default::default(),
    };
    let store = open(global)?;
    let out = store.mount(&req)?.outcome;
    emit(&json(&out));
    Ok(0)
}

/// `layercache commit`: prints the [`st::CommitOutcome`] as one JSON line (credential files
/// dropped are also listed on stderr).
///
/// Errors: see [`Store::commit`].
pub fn commit(global: &GlobalArgs, a: &MountpointArg) -> Result<i32> {
    let root = store_root(global)?;
    // Only when this store has no such mount: is it a mount of another store (a wrong
    // --store)? That costs a scan of /proc, which a normal commit does not pay.
    let not_ours = |fallback: Error| match other_store_of(&a.mountpoint, Some(&root)) {
        Some(theirs) => Error::invalid(format!(
            "{mnt} is a mount of the store at {theirs}, not of {root}: commit it with \
             `layercache --store {theirs} commit {mnt}`",
            mnt = a.mountpoint.display(),
            theirs = theirs.display(),
            root = root.display(),
        )),
        None => fallback,
    };
    // Committing never creates a store: without one there is no store mount to commit.
    let Some(store) = Store::open_existing(&root)? else {
        return Err(not_ours(Error::NotAStoreMount {
            mountpoint: a.mountpoint.clone(),
            detail: format!(" (there is no store at {})", root.display()),
        }));
    };
    let mut store = store.with_notify(stderr_notices());
    crate::remote::attach(&mut store, global.remote.as_deref(), None)?;
    let out = match store.commit(&a.mountpoint) {
        Err(e @ Error::NotAStoreMount { .. }) => return Err(not_ours(e)),
        r => r?,
    };
    // Remote tier: commit returns once its push (started by the publish) is done.
    if let Some(r) = store.remote() {
        r.wait_pushes(&store);
    }
    store.wait_background();
    if out.result == st::CommitResult::Exists {
        eprintln!(
            "layercache: key {} was already published (keys are immutable); this mount's changes \
             were discarded and the mount now shows the published layer",
            out.key
        );
    }
    if !out.dropped.is_empty() {
        eprintln!(
            "layercache: credential files kept out of the layer: {}",
            out.dropped.join(", ")
        );
    }
    emit(&json(&out));
    Ok(0)
}

/// `layercache umount`: a store mount (one recorded in this store's runs) is unmounted and its
/// private upper discarded; anything else is unmounted as a plain `layercache overlay` mount,
/// its upperdir left as it is. Never creates a store: when there is none at `--store` (or no
/// store root can be derived) the mount cannot be a store mount, so the plain path is taken.
///
/// A store that exists but cannot be read (another format, a bad config.toml) is reported on
/// stderr and the mount is unmounted as a plain overlay, so a broken store never pins a mount.
///
/// Errors: see [`Store::umount_run`] and [`crate::overlay::unmount`] (exit 2, nothing changed,
/// when nothing is mounted there).
pub fn umount(global: &GlobalArgs, a: &MountpointArg) -> Result<i32> {
    let given = store_root(global).ok();
    let store = match &given {
        // A store that cannot be read (another format, a broken config.toml) must not keep a
        // mount in place: unmount it as a plain overlay and say why. A run's private upper, if
        // this was a store mount, stays in the store's run directory.
        Some(root) => Store::open_existing(root).unwrap_or_else(|e| {
            eprintln!(
                "layercache: cannot read the store ({e}); unmounting {} as a plain overlay (a \
                 run's files, if it was a store mount, stay in the store)",
                a.mountpoint.display()
            );
            None
        }),
        None => None,
    };
    let found = match &store {
        Some(st) => st.resolve(&a.mountpoint)?,
        None => None,
    };
    let leftovers = match (&store, &found) {
        // No record names it, but a killed mount or commit may have left mounts of this
        // store's runs there: those go.
        (Some(st), None) => st.clear_leftover_mounts(&a.mountpoint, true)?,
        _ => 0,
    };
    match (store, found) {
        (Some(st), Some(m)) => st.umount_run(m)?,
        _ if leftovers > 0 => {}
        _ => {
            // A plain `layercache overlay` mount — or a store mount of another store (a wrong
            // --store): say so, since its run directory then stays behind.
            if let Some(root) = other_store_of(&a.mountpoint, given.as_deref()) {
                eprintln!(
                    "layercache: {mnt} is a mount of the store at {root}; unmounting it without \
                     that store leaves its run directory, which `layercache --store {root} umount \
                     {mnt}` or `gc` removes",
                    mnt = a.mountpoint.display(),
                    root = root.display(),
                );
            }
            crate::overlay::unmount(&a.mountpoint, None, std::time::Duration::from_secs(30))?;
        }
    }
    if global.json {
        emit(&json(&serde_json::json!({"unmounted": a.mountpoint})));
    }
    Ok(0)
}

/// The root of the store `mountpoint` is a run of, when that is another store than `root`
/// (read from the serving daemon's upperdir, `<store>/v1/projects/P/runs/R/upper`); `None` for
/// a mount of `root` itself, a plain overlay, or a mount whose daemon is not ours.
fn other_store_of(mountpoint: &Path, root: Option<&Path>) -> Option<PathBuf> {
    let mnt = std::fs::canonicalize(mountpoint).unwrap_or(mountpoint.to_path_buf());
    let theirs = crate::overlay::upperdir_of(&mnt)
        .as_deref()
        .and_then(st::store_of_run_upper)?;
    let canon = |p: &Path| std::fs::canonicalize(p).unwrap_or_else(|_| p.to_path_buf());
    let same = root.is_some_and(|r| canon(r) == canon(&theirs));
    (!same).then_some(theirs)
}

/// `layercache ls`: a table, or one JSON array with `--json`.
///
/// Errors: [`Error::Invalid`] for a bad project id; store read errors.
pub fn ls(global: &GlobalArgs, a: &LsArgs) -> Result<i32> {
    let store = open_existing(global)?;
    let rows = store.list(project_opt(&a.project)?.as_ref())?;
    if global.json {
        emit(&json(&rows));
        return Ok(0);
    }
    emit(&format!(
        "{:<16} {:<14} {:<30} {:>10} {:>8} {:<6} KEYS",
        "PROJECT",
        "CACHE",
        "LAYER",
        if a.bytes { "BYTES" } else { "SIZE" },
        "FILES",
        "IN-USE"
    ));
    for r in rows {
        let keys: Vec<&str> = r.keys.iter().map(|k| k.as_str()).collect();
        emit(&format!(
            "{:<16} {:<14} {:<30} {:>10} {:>8} {:<6} {}",
            r.project.as_str(),
            r.cache.as_str(),
            r.layer.as_str(),
            size(r.bytes, a.bytes),
            r.files,
            in_use_cell(&r),
            match (r.partial_bytes, keys.is_empty()) {
                (Some(_), _) if r.broken.is_some() => broken_note(r.broken.as_deref()),
                (Some(b), _) => format!(
                    "(remote, mounted lazily: {} of {} here)",
                    size(b, a.bytes),
                    size(r.bytes, a.bytes)
                ),
                (None, true) => "(unpublished)".to_string(),
                (None, false) => keys.join(","),
            }
        ));
    }
    // Remote tier: one line on what the remote holds, when one is configured.
    if let Some(line) = super::remote_cmds::ls_note(global, &store, project_opt(&a.project)?) {
        emit(&line);
    }
    Ok(0)
}

/// The IN-USE cell of `ls`: `yes` while a run mounts the layer, `warm` when only idle warm
/// mounts (`store/warm.rs`) hold it, `no` otherwise.
fn in_use_cell(r: &crate::store::LayerInfo) -> &'static str {
    match (r.in_use, r.warm) {
        (true, _) => "yes",
        (false, 1..) => "warm",
        (false, 0) => "no",
    }
}

/// What `ls` says of a partial layer a run found broken (`why`, its first line, shortened):
/// that it is broken and not used again (a lazy run of its key goes on as a local miss; a full
/// pull does not read the partial layer).
fn broken_note(why: Option<&str>) -> String {
    let why = why.and_then(|w| w.lines().next()).unwrap_or_default();
    let why: String = match why.chars().count() > 120 {
        true => why.chars().take(119).chain(['…']).collect(),
        false => why.to_string(),
    };
    match why.is_empty() {
        true => "(remote, broken; not used again)".to_string(),
        false => format!("(remote, broken: {why}; not used again)"),
    }
}

#[cfg(test)]
#[test]
fn a_broken_partial_layer_is_listed_as_broken_and_unused() {
    let n = broken_note(Some("object abc: missing\nmore"));
    assert_eq!(n, "(remote, broken: object abc: missing; not used again)");
    assert!(broken_note(Some(&"x".repeat(500))).chars().count() < 200);
    assert_eq!(broken_note(None), "(remote, broken; not used again)");
}

/// `layercache gc`.
///
/// Errors: [`Error::Invalid`] for a bad size/duration; store errors.
pub fn gc(global: &GlobalArgs, a: &GcArgs) -> Result<i32> {
    let opts = GcOptions {
        max_size: a.max_size.as_deref().map(units::parse_size).transpose()?,
        max_inodes: a
            .max_inodes
            .as_deref()
            .map(|s| {
                units::parse_count(s).map_err(|e| Error::invalid(format!("--max-inodes: {e}")))
            })
            .transpose()?,
        max_age: a
            .max_age
            .as_deref()
            .map(units::parse_duration)
            .transpose()?,
        dry_run: a.dry_run,
    };
    let r = open_existing(global)?.gc(&opts)?;
    if global.json {
        emit(&json(&r));
    } else {
        let size = |b: u64| match a.bytes {
            true => format!("{b} bytes"),
            false => size(b, false),
        };
        if r.ended_warm > 0 {
            emit(&format!(
                "ended {} idle warm mount(s) (mounts kept for the next run of their layer)",
                r.ended_warm
            ));
        }
        // Each layer evicted (or that a dry run would evict), then the totals.
        for layer in &r.evicted {
            let verb = if r.dry_run { "would evict" } else { "evicted" };
            emit(&format!("{verb} {layer}"));
        }
        emit(&format!(
            "{}{} {} layer(s), removed {} object(s) ({}), {} stale run(s), {} staging entr(ies), {} orphan layer(s), {} partial layer(s), {} view dir(s); {} layer(s) in use kept; now {}, {} inodes, {} layers",
            if r.dry_run { "(dry run) " } else { "" },
            if r.dry_run { "would evict" } else { "evicted" },
            r.evicted.len(),
            r.removed_objects,
            size(r.freed_bytes),
            r.removed_runs,
            r.removed_staging,
            r.removed_orphans,
            r.removed_partial,
            r.removed_view_dirs,
            r.in_use,
            size(r.after.bytes),
            r.after.inodes,
            r.after.layers
        ));
        if r.removed_failed_logs > 0 || !r.failed_logs.is_empty() {
            emit(&format!(
                "failed setups' logs: {} {} (older than 7 days), {} kept:",
                if r.dry_run { "would remove" } else { "removed" },
                r.removed_failed_logs,
                r.failed_logs.len()
            ));
            for dir in &r.failed_logs {
                emit(&format!("  {}", dir.display()));
            }
        }
    }
    Ok(0)
}

/// A size for `ls` and `gc`: `12.3 MiB` ([`crate::units::fmt_bytes`]), or with `--bytes` (for
/// scripts) the bare count.
fn size(bytes: u64, raw: bool) -> String {
    if raw {
        bytes.to_string()
    } else {
        crate::units::fmt_bytes(bytes)
    }
}

/// `layercache clear`: exit 1 when a layer in use was refused.
///
/// Errors: [`Error::Invalid`] for bad ids or an unknown project; store errors.
pub fn clear(global: &GlobalArgs, a: &ClearArgs) -> Result<i32> {
    let project = ProjectId::new(a.project.as_str())?;
    let cache = a.cache.as_deref().map(CacheId::new).transpose()?;
    let r = open_existing(global)?.clear(&project, cache.as_ref())?;
    if global.json {
        emit(&json(&r));
    } else {
        emit(&format!(
            "removed {} layer(s), {} object(s)",
            r.removed.len(),
            r.removed_objects
        ));
    }
    if !r.in_use.is_empty() {
        let ids: Vec<&str> = r.in_use.iter().map(|l| l.as_str()).collect();
        eprintln!(
            "layercache: refused to clear {} layer(s) in use (mounted): {}; unmount them first",
            ids.len(),
            ids.join(", ")
        );
        return Ok(1);
    }
    Ok(0)
}

/// `layercache verify`: exit 1 when a corrupt object was found (and quarantined).
///
/// Errors: [`Error::Invalid`] for a bad project id; store errors.
pub fn verify(global: &GlobalArgs, a: &LsArgs) -> Result<i32> {
    let r = open_existing(global)?.verify(project_opt(&a.project)?.as_ref())?;
    if global.json {
        emit(&json(&r));
    } else {
        emit(&format!(
            "checked {} object(s): {} corrupt, {} layer(s) quarantined",
            r.objects_checked,
            r.bad_objects.len(),
            r.quarantined.len()
        ));
        for b in &r.bad_objects {
            emit(&format!("  corrupt object {b}"));
        }
        for q in &r.quarantined {
            emit(&format!("  quarantined layer {q}"));
        }
    }
    Ok(if r.bad_objects.is_empty() { 0 } else { 1 })
}
