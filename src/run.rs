//! The main job, `layercache run`: compute keys → mount every cache → on a hit run the
//! maintenance script (or nothing), on a restore or miss run the setup script and promote the
//! result if it exits 0 → run COMMAND with the caches' environment → unmount everything (also on
//! Ctrl-C/SIGTERM) → one telemetry event per cache and a short summary.
//!
//! Outside references: GitHub `actions/cache` (exact key, then restore-key prefixes; a key is
//! immutable once published) and Codex cloud environments (setup script for a fresh environment,
//! maintenance script for a resumed cached one).
//!
//! Output: setup and maintenance write to stderr (their stdout too), the summary goes to stderr
//! (`--json`: one JSON object on a line), so standard output belongs to COMMAND alone. With no
//! caches declared, `run` only runs COMMAND: same stdio, same exit status, no output of its own.

use std::collections::BTreeMap;
use std::ffi::OsString;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use crate::error::{Error, IoContext, Result};
use crate::ids::{CacheId, CacheKey, ProjectId};
use crate::key::{self, CacheKeys, Environment};
use crate::sandbox::{self, Binds};
use crate::spec::{Paths, Spec};
use crate::telemetry::{self, CacheResult, Event};

/// What mounting a key found.
#[derive(Debug, Clone)]
pub struct Mounted {
    /// hit, restore or miss.
    pub result: CacheResult,
    /// The key of the layer that was mounted (the key itself on a hit, the restore match on a
    /// restore, `None` on a miss).
    pub matched_key: Option<String>,
    /// The mount's private upper directory, if known (progress shows its size).
    pub upper: Option<PathBuf>,
    /// Bytes in the mounted layer, when known.
    pub bytes: u64,
    /// Files in the mounted layer, when known.
    pub files: u64,
}

/// What a promotion published.
#[derive(Debug, Clone, Default)]
pub struct Committed {
    /// Whether this run's layer was published (false when another run published the key
    /// first; its layer is mounted instead).
    pub published: bool,
    /// Bytes in the new layer.
    pub bytes: u64,
    /// Files in the new layer.
    pub files: u64,
    /// Files stored as new objects (the rest reused stored objects).
    pub new_files: u64,
    /// Bytes stored as new objects.
    pub new_bytes: u64,
}

/// The store operations the run needs (implemented over [`crate::store`]; a plain-directory
/// fake in the unit tests).
pub trait Mounter {
    /// Mounts the layer for `key` (or the newest matching a restore-key prefix, or nothing) at
    /// `mountpoint` with a private upper layer.
    fn mount(
        &self,
        project: &ProjectId,
        cache: &CacheId,
        key: &CacheKey,
        restore_keys: &[CacheKey],
        mountpoint: &Path,
    ) -> Result<Mounted>;
    /// Promotes the mount's lower ⊕ upper under its key and remounts the new layer as a hit.
    fn commit(&self, mountpoint: &Path) -> Result<Committed>;
    /// Unmounts and discards the private upper.
    fn umount(&self, mountpoint: &Path) -> Result<()>;
}

/// Whether scripts and COMMAND run directly or inside bubblewrap.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SandboxMode {
    /// Run directly.
    None,
    /// Run inside `bwrap` (see [`sandbox::bwrap_command`]).
    Bwrap,
}

impl SandboxMode {
    /// Parses `none` or `bwrap`. Errors: [`Error::Invalid`] naming `--sandbox`.
    pub fn parse(s: &str) -> Result<Self> {
        match s {
            "none" => Ok(SandboxMode::None),
            "bwrap" | "bubblewrap" => Ok(SandboxMode::Bwrap),
            _ => Err(Error::invalid(format!(
                "--sandbox: unknown sandbox {s:?} (use none or bwrap)"
            ))),
        }
    }
}

/// The validated configuration of one run.
#[derive(Debug, Clone)]
pub struct RunConfig {
    /// The spec.
    pub spec: Spec,
    /// Workdir and mount root.
    pub paths: Paths,
    /// The sandbox image id (environment fingerprint).
    pub image: Option<String>,
    /// Sandbox for setup, maintenance and COMMAND.
    pub sandbox: SandboxMode,
    /// COMMAND and its arguments (may be empty).
    pub command: Vec<OsString>,
    /// The store root (events go to `<store>/events.jsonl`).
    pub store: PathBuf,
    /// Summary as JSON.
    pub json: bool,
}

/// [`Mounter`] over the layer store ([`crate::store::Store`]). Keeps the [`crate::store::Mount`]
/// handle of every mount it made (and so its leases) until it commits or unmounts it.
pub struct StoreMounter {
    store: crate::store::Store,
    fill_wait: Duration,
    mounts: parking_lot::Mutex<BTreeMap<PathBuf, crate::store::Mount>>,
}

impl StoreMounter {
    /// Wraps an open store; a mount waits up to `fill_wait` for another run filling the same
    /// key.
    pub fn new(store: crate::store::Store, fill_wait: Duration) -> Self {
        StoreMounter {
            store,
            fill_wait,
            mounts: parking_lot::Mutex::new(BTreeMap::new()),
        }
    }
}

impl Mounter for StoreMounter {
    fn mount(
        &self,
        project: &ProjectId,
        cache: &CacheId,
        key: &CacheKey,
        restore_keys: &[CacheKey],
        mountpoint: &Path,
    ) -> Result<Mounted> {
        use crate::store::{MountRequest, MountResult};
        let m = self.store.mount(&MountRequest {
            project: project.clone(),
            cache: cache.clone(),
            key: key.clone(),
            restore_keys: restore_keys.to_vec(),
            fill_wait: self.fill_wait,
            mountpoint: mountpoint.to_path_buf(),
        })?;
        let upper = Some(m.upper(&self.store));
        let out = m.outcome.clone();
        self.mounts.lock().insert(out.mountpoint.clone(), m);
        Ok(Mounted {
            result: match out.result {
                MountResult::Hit => CacheResult::Hit,
                MountResult::Restore => CacheResult::Restore,
                MountResult::Miss => CacheResult::Miss,
            },
            matched_key: out.matched_key.map(|k| k.to_string()),
            upper,
            bytes: out.bytes,
            files: out.files,
        })
    }

    fn commit(&self, mountpoint: &Path) -> Result<Committed> {
        let canon = std::fs::canonicalize(mountpoint).unwrap_or_else(|_| mountpoint.to_path_buf());
        let held = self.mounts.lock().remove(&canon);
        let out = match held {
            Some(m) => {
                let (out, remount) = self.store.commit_mount(m)?;
                if let Some(r) = remount {
                    self.mounts.lock().insert(canon, r);
                }
                out
            }
            None => self.store.commit(mountpoint)?,
        };
        if !out.dropped.is_empty() {
            eprintln!(
                "layercache: kept out of the layer (credentials): {}",
                out.dropped.join(", ")
            );
        }
        Ok(Committed {
            published: out.result == crate::store::CommitResult::Published,
            bytes: out.bytes,
            files: out.files,
            new_files: out.new_objects,
            new_bytes: out.new_bytes,
        })
    }

    fn umount(&self, mountpoint: &Path) -> Result<()> {
        let canon = std::fs::canonicalize(mountpoint).unwrap_or_else(|_| mountpoint.to_path_buf());
        let held = self.mounts.lock().remove(&canon);
        let r = self.store.umount(mountpoint);
        // issue 11: once unmounted, a discarded fill's lock file goes.
        match (held, &r) {
            (Some(m), Ok(())) => m.end_fill(),
            (held, _) => drop(held),
        }
        r
    }
}

/// A [`Mounter`] for runs that declare no caches: every operation fails.
pub struct NoMounts;

impl Mounter for NoMounts {
    fn mount(
        &self,
        _: &ProjectId,
        c: &CacheId,
        _: &CacheKey,
        _: &[CacheKey],
        _: &Path,
    ) -> Result<Mounted> {
        Err(Error::Failed(format!("cache {c}: no store opened")))
    }
    fn commit(&self, mp: &Path) -> Result<Committed> {
        Err(Error::Failed(format!("{}: no store opened", mp.display())))
    }
    fn umount(&self, mp: &Path) -> Result<()> {
        Err(Error::Failed(format!("{}: no store opened", mp.display())))
    }
}

mod child;
mod progress;

use child::{SignalGuard, run_child, stopped};
use progress::Progress;

// ---- mounts ----------------------------------------------------------------------------------

/// Every mount of this run; Drop unmounts what is left, in reverse order.
struct Mounts<'a> {
    mounter: &'a dyn Mounter,
    points: Vec<PathBuf>,
}

impl Mounts<'_> {
    fn unmount_all(&mut self) -> Result<()> {
        let mut first_err = None;
        while let Some(mp) = self.points.pop() {
            if let Err(e) = self.mounter.umount(&mp) {
                tracing::warn!("unmounting {}: {e}", mp.display());
                first_err.get_or_insert(e);
            }
        }
        first_err.map_or(Ok(()), Err)
    }
}

impl Drop for Mounts<'_> {
    fn drop(&mut self) {
        let _ = self.unmount_all();
    }
}

// ---- the job ---------------------------------------------------------------------------------

/// One cache's preparation as it happens.
struct Prep {
    keys: CacheKeys,
    mounted: Mounted,
    event: Event,
}

/// Runs the job. Returns COMMAND's exit status (0 without a COMMAND).
///
/// Errors: [`Error::Invalid`] for a bad spec/key file (nothing mounted); [`Error::Child`] with
/// the script's status when setup or maintenance fails (nothing published, everything
/// unmounted); [`Error::Child`] with 128 + signal when interrupted; store and I/O errors.
pub fn run(cfg: &RunConfig, mounter: &dyn Mounter) -> Result<i32> {
    let _signals = SignalGuard::install();
    if cfg.spec.caches.is_empty() {
        return run_command(cfg, &BTreeMap::new(), &[]);
    }

    let env = Environment::host(cfg.image.clone());
    let run_id = telemetry::new_run_id();
    let mut all_keys = Vec::new();
    for cache in &cfg.spec.caches {
        all_keys.push(key::compute(cache, &cfg.paths, &env)?);
    }
    let mut seen = BTreeMap::new();
    for k in &all_keys {
        if let Some(other) = seen.insert(k.mountpoint.clone(), k.id.clone()) {
            return Err(Error::invalid(format!(
                "cache {:?}: mountpoint {} is also cache {:?}'s",
                k.id.as_str(),
                k.mountpoint.display(),
                other.as_str()
            )));
        }
    }

    let mut mounts = Mounts {
        mounter,
        points: Vec::new(),
    };
    let mut preps: Vec<Prep> = Vec::new();
    for k in all_keys {
        if let Some(sig) = stopped() {
            return interrupted(&mut mounts, sig);
        }
        std::fs::create_dir_all(&k.mountpoint).at(&k.mountpoint)?;
        let t = Instant::now();
        let mounted = mounter.mount(
            &cfg.spec.project,
            &k.id,
            &k.key,
            &k.restore_keys,
            &k.mountpoint,
        )?;
        mounts.points.push(k.mountpoint.clone());
        let event = Event {
            run: Some(run_id.clone()),
            time_ms: telemetry::now_ms(),
            project: cfg.spec.project.to_string(),
            cache: k.id.to_string(),
            key: k.key.to_string(),
            result: mounted.result,
            matched_key: mounted.matched_key.clone(),
            mount_ms: t.elapsed().as_millis() as u64,
            setup_ms: 0,
            maintenance_ms: 0,
            promote_ms: 0,
            bytes: mounted.bytes,
            files: mounted.files,
            exit_status: 0,
            published: false,
            new_files: 0,
            new_bytes: 0,
            // issue 11: why a miss or restore, against the nearest layer's recorded inputs.
            why: match mounted.result {
                CacheResult::Hit => Vec::new(),
                _ => crate::why::explain(
                    &cfg.store,
                    cfg.spec.project.as_str(),
                    k.id.as_str(),
                    mounted.matched_key.as_deref(),
                    &k.inputs,
                ),
            },
        };
        preps.push(Prep {
            keys: k,
            mounted,
            event,
        });
    }

    // Every script and COMMAND sees every cache's environment.
    let mut run_env = BTreeMap::new();
    for (cache, p) in cfg.spec.caches.iter().zip(&preps) {
        run_env.extend(cache.env_for(&cfg.paths, &p.keys.mountpoint));
    }
    let mountpoints: Vec<PathBuf> = preps.iter().map(|p| p.keys.mountpoint.clone()).collect();

    for (cache, p) in cfg.spec.caches.iter().zip(preps.iter_mut()) {
        let (what, script) = match p.mounted.result {
            CacheResult::Hit => ("maintenance", cache.maintenance.as_deref()),
            // issue 11 (restore helper): a restore brings the old tree up to date in place.
            CacheResult::Restore => (
                "setup",
                cache.restore_setup.as_deref().or(Some(&cache.setup)),
            ),
            CacheResult::Miss => ("setup", Some(cache.setup.as_str())),
        };
        if let Some(script) = script {
            let label = format!("{what} of cache {:?}", cache.id.as_str());
            let progress = Progress::start(
                cfg.json,
                &label,
                p.mounted.upper.clone().filter(|_| what == "setup"),
            );
            // The script may name its own mount as `{mount}` (and `{workdir}`, `{mount_root}`,
            // `{env:NAME}`, as in `env`); it also gets it as $LAYERCACHE_MOUNT.
            let script = crate::spec::expand(script, &cfg.paths, Some(&p.keys.mountpoint));
            let mut env = run_env.clone();
            env.insert(
                "LAYERCACHE_MOUNT".into(),
                p.keys.mountpoint.display().to_string(),
            );
            let t = Instant::now();
            let status = run_script(cfg, &env, &mountpoints, &script, &label)?;
            drop(progress);
            let ms = t.elapsed().as_millis() as u64;
            if what == "setup" {
                p.event.setup_ms = ms;
            } else {
                p.event.maintenance_ms = ms;
            }
            p.event.exit_status = status;
            if let Some(sig) = stopped() {
                log_event(cfg, &p.event);
                return interrupted(&mut mounts, sig);
            }
            if status != 0 {
                log_event(cfg, &p.event);
                mounts.unmount_all()?;
                return Err(Error::Child {
                    what: format!("{label} (nothing published)"),
                    status,
                });
            }
        }
        if p.mounted.result != CacheResult::Hit {
            remove_excluded(&p.keys.mountpoint, &cache.exclude)?;
            let t = Instant::now();
            let committed = mounter.commit(&p.keys.mountpoint)?;
            p.event.promote_ms = t.elapsed().as_millis() as u64;
            p.event.published = committed.published;
            p.event.bytes = committed.bytes;
            p.event.files = committed.files;
            p.event.new_files = committed.new_files;
            p.event.new_bytes = committed.new_bytes;
            if committed.published {
                let (project, id) = (cfg.spec.project.as_str(), p.keys.id.as_str());
                crate::why::record(&cfg.store, project, id, p.keys.key.as_str(), &p.keys.inputs);
            }
        }
        log_event(cfg, &p.event);
    }
    print_summary(cfg, &preps);

    let status = run_command(cfg, &run_env, &mountpoints)?;
    mounts.unmount_all()?;
    if let Some(sig) = stopped() {
        return Err(Error::Child {
            what: format!("run (interrupted by signal {sig})"),
            status: 128 + sig,
        });
    }
    Ok(status)
}

fn interrupted(mounts: &mut Mounts<'_>, sig: i32) -> Result<i32> {
    mounts.unmount_all()?;
    Err(Error::Child {
        what: format!("run (interrupted by signal {sig})"),
        status: 128 + sig,
    })
}

fn log_event(cfg: &RunConfig, event: &Event) {
    if let Err(e) = telemetry::append(&cfg.store, event) {
        tracing::warn!("telemetry: {e}");
    }
}

fn binds(cfg: &RunConfig, env: &BTreeMap<String, String>, mounts: &[PathBuf]) -> Binds {
    Binds {
        workdir: cfg.paths.workdir.clone(),
        mounts: mounts.to_vec(),
        env: env.clone(),
    }
}

/// Runs a setup or maintenance script (`sh -c`, cwd = workdir, stdin closed, stdout → stderr).
fn run_script(
    cfg: &RunConfig,
    env: &BTreeMap<String, String>,
    mounts: &[PathBuf],
    script: &str,
    label: &str,
) -> Result<i32> {
    let argv: Vec<OsString> = vec!["sh".into(), "-c".into(), script.into()];
    let mut cmd = match cfg.sandbox {
        SandboxMode::None => {
            let mut c = Command::new(&argv[0]);
            c.args(&argv[1..]).current_dir(&cfg.paths.workdir).envs(env);
            c
        }
        SandboxMode::Bwrap => sandbox::bwrap_command(&binds(cfg, env, mounts), &argv)?,
    };
    let stderr = std::io::stderr().as_fd_owned();
    cmd.stdin(Stdio::null());
    if let Some(fd) = stderr {
        cmd.stdout(Stdio::from(fd));
    }
    run_child(cmd, label)
}

/// Runs COMMAND with stdio inherited; no COMMAND = status 0.
fn run_command(cfg: &RunConfig, env: &BTreeMap<String, String>, mounts: &[PathBuf]) -> Result<i32> {
    let Some(program) = cfg.command.first() else {
        return Ok(0);
    };
    let cmd = match cfg.sandbox {
        SandboxMode::None => {
            let mut c = Command::new(program);
            c.args(&cfg.command[1..]).envs(env);
            if !cfg.spec.caches.is_empty() {
                c.current_dir(&cfg.paths.workdir);
            }
            c
        }
        SandboxMode::Bwrap => sandbox::bwrap_command(&binds(cfg, env, mounts), &cfg.command)?,
    };
    run_child(cmd, &program.to_string_lossy())
}

trait StderrFd {
    fn as_fd_owned(&self) -> Option<std::os::fd::OwnedFd>;
}

impl StderrFd for std::io::Stderr {
    fn as_fd_owned(&self) -> Option<std::os::fd::OwnedFd> {
        use std::os::fd::AsFd;
        self.as_fd().try_clone_to_owned().ok()
    }
}

/// Deletes `exclude` matches from the mount before promotion (whiteouts in the upper, so the
/// new layer does not hold them).
fn remove_excluded(mount: &Path, exclude: &[String]) -> Result<()> {
    for pattern in exclude {
        for rel in key::find_matches(mount, pattern)? {
            let path = mount.join(&rel);
            let meta = std::fs::symlink_metadata(&path).at(&path)?;
            if meta.is_dir() {
                std::fs::remove_dir_all(&path).at(&path)?;
            } else {
                std::fs::remove_file(&path).at(&path)?;
            }
        }
    }
    Ok(())
}

fn print_summary(cfg: &RunConfig, preps: &[Prep]) {
    let mut err = std::io::stderr().lock();
    if cfg.json {
        let events: Vec<&Event> = preps.iter().map(|p| &p.event).collect();
        let v = serde_json::json!({
            "project": cfg.spec.project.as_str(),
            "caches": events,
            "prep_ms": preps.iter().map(|p| p.event.prep_ms()).sum::<u64>(),
        });
        let _ = writeln!(err, "{v}");
        return;
    }
    for p in preps {
        let e = &p.event;
        let mut line = format!(
            "layercache: {} {} in {}",
            e.cache,
            e.result.as_str(),
            telemetry::fmt_ms(e.prep_ms())
        );
        match e.result {
            CacheResult::Hit if e.maintenance_ms > 0 => line.push_str(&format!(
                " (maintenance {})",
                telemetry::fmt_ms(e.maintenance_ms)
            )),
            CacheResult::Hit => {}
            _ => line.push_str(&format!(
                " (setup {}, promote {}: {} files, {}; new {} files, {})",
                telemetry::fmt_ms(e.setup_ms),
                telemetry::fmt_ms(e.promote_ms),
                e.files,
                fmt_bytes(e.bytes),
                e.new_files,
                fmt_bytes(e.new_bytes)
            )),
        }
        if e.result == CacheResult::Restore
            && let Some(m) = &e.matched_key
        {
            line.push_str(&format!(" from {m}"));
        }
        // issue 11: what differs from the nearest layer (its key is in --json and events).
        let why: Vec<&str> = (e.why.iter().map(String::as_str))
            .filter(|w| !w.starts_with("nearest layer "))
            .collect();
        if !why.is_empty() {
            line.push_str(&format!("; why: {}", why.join(", ")));
        }
        let _ = writeln!(err, "{line}");
    }
}

/// Formats bytes in binary units (`12.3 MiB`).
pub fn fmt_bytes(b: u64) -> String {
    const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut v = b as f64;
    let mut i = 0;
    while v >= 1024.0 && i < UNITS.len() - 1 {
        v /= 1024.0;
        i += 1;
    }
    if i == 0 {
        format!("{b} B")
    } else {
        format!("{v:.1} {}", UNITS[i])
    }
}

#[cfg(test)]
mod tests;
