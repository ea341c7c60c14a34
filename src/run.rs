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
use std::io::{IsTerminal, Write};
use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitStatus, Stdio};
use std::sync::atomic::{AtomicI32, Ordering};
use std::sync::mpsc;
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
    /// Remote tier: what was pulled for this mount, if it came from the remote.
    pub pulled: Option<crate::remote::pull::PullReport>,
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

/// [`Mounter`] over the layer store ([`crate::store::Store`]).
pub struct StoreMounter {
    store: crate::store::Store,
    fill_wait: Duration,
}

impl StoreMounter {
    /// Wraps an open store; a mount waits up to `fill_wait` for another run filling the same
    /// key.
    pub fn new(store: crate::store::Store, fill_wait: Duration) -> Self {
        StoreMounter { store, fill_wait }
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
        let out = self.store.mount(&MountRequest {
            project: project.clone(),
            cache: cache.clone(),
            key: key.clone(),
            restore_keys: restore_keys.to_vec(),
            fill_wait: self.fill_wait,
            mountpoint: mountpoint.to_path_buf(),
        })?;
        let upper = self
            .store
            .project(project)
            .ok()
            .map(|pd| pd.runs().join(&out.run).join("upper"));
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
            pulled: out.remote,
        })
    }

    fn commit(&self, mountpoint: &Path) -> Result<Committed> {
        let out = self.store.commit(mountpoint)?;
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
        })
    }

    fn umount(&self, mountpoint: &Path) -> Result<()> {
        self.store.umount(mountpoint)
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

// ---- signals ---------------------------------------------------------------------------------

/// The signal that asked the run to stop (0 = none).
static STOP_SIGNAL: AtomicI32 = AtomicI32::new(0);
/// The running child, which receives forwarded signals (0 = none).
static CHILD_PID: AtomicI32 = AtomicI32::new(0);

extern "C" fn on_signal(sig: libc::c_int) {
    STOP_SIGNAL.store(sig, Ordering::SeqCst);
    let child = CHILD_PID.load(Ordering::SeqCst);
    if child > 0 {
        // SAFETY: kill(2) is async-signal-safe; the pid is our own child's.
        unsafe { libc::kill(child, sig) };
    }
}

/// Catches SIGINT/SIGTERM/SIGHUP while alive (they are recorded and forwarded to the running
/// child, and the run unwinds: unmount, exit 128 + signal); restores the previous handlers on
/// drop.
struct SignalGuard {
    old: Vec<(nix::sys::signal::Signal, nix::sys::signal::SigAction)>,
}

impl SignalGuard {
    fn install() -> Self {
        use nix::sys::signal::{SaFlags, SigAction, SigHandler, SigSet, Signal, sigaction};
        STOP_SIGNAL.store(0, Ordering::SeqCst);
        let action = SigAction::new(
            SigHandler::Handler(on_signal),
            SaFlags::SA_RESTART,
            SigSet::empty(),
        );
        let mut old = Vec::new();
        for sig in [Signal::SIGINT, Signal::SIGTERM, Signal::SIGHUP] {
            // SAFETY: the handler only touches atomics and calls kill(2).
            if let Ok(prev) = unsafe { sigaction(sig, &action) } {
                old.push((sig, prev));
            }
        }
        SignalGuard { old }
    }
}

impl Drop for SignalGuard {
    fn drop(&mut self) {
        for (sig, prev) in self.old.drain(..) {
            // SAFETY: restoring the handler that was installed before.
            let _ = unsafe { nix::sys::signal::sigaction(sig, &prev) };
        }
    }
}

fn stopped() -> Option<i32> {
    match STOP_SIGNAL.load(Ordering::SeqCst) {
        0 => None,
        s => Some(s),
    }
}

/// Exit status like a shell reports it: the code, or 128 + signal number.
fn status_code(st: ExitStatus) -> i32 {
    st.code()
        .or_else(|| st.signal().map(|s| 128 + s))
        .unwrap_or(1)
}

/// Spawns `cmd` as the current child and waits; signals received meanwhile are forwarded.
fn run_child(mut cmd: Command, what: &str) -> Result<i32> {
    // glibc's posix_spawn (used by std, and by whatever started us) sets glibc's internal
    // signals 32 and 33 (SIGCANCEL, SIGSETXID) to SIG_IGN in the child, and SIG_IGN survives
    // exec: COMMAND would start with two real-time signals ignored (a Go or musl program sees
    // that). With a pre_exec hook std forks instead, and the hook resets both to SIG_DFL —
    // through the raw system call, since glibc's sigaction refuses its internal signals.
    // SAFETY: rt_sigaction(2) is async-signal-safe; the struct is the kernel's sigaction
    // layout (handler, flags, restorer, 64-bit mask) on x86_64 and aarch64.
    unsafe {
        use std::os::unix::process::CommandExt;
        cmd.pre_exec(|| {
            #[repr(C)]
            struct KernelSigaction {
                handler: usize,
                flags: libc::c_ulong,
                restorer: usize,
                mask: u64,
            }
            let dfl = KernelSigaction {
                handler: libc::SIG_DFL,
                flags: 0,
                restorer: 0,
                mask: 0,
            };
            for sig in [32, 33] {
                libc::syscall(
                    libc::SYS_rt_sigaction,
                    sig,
                    &dfl as *const KernelSigaction,
                    std::ptr::null_mut::<KernelSigaction>(),
                    8usize,
                );
            }
            Ok(())
        });
    }
    let mut child = match cmd.spawn() {
        Ok(c) => c,
        Err(e) => {
            let code = match e.kind() {
                std::io::ErrorKind::NotFound => 127,
                std::io::ErrorKind::PermissionDenied => 126,
                _ => 1,
            };
            eprintln!("layercache: {what}: {e}");
            return Ok(code);
        }
    };
    CHILD_PID.store(child.id() as i32, Ordering::SeqCst);
    if let Some(sig) = stopped() {
        // SAFETY: kill(2) on our own child.
        unsafe { libc::kill(child.id() as i32, sig) };
    }
    let status = child.wait();
    CHILD_PID.store(0, Ordering::SeqCst);
    Ok(status_code(status.at(what)?))
}

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
            remote_hit: mounted.pulled.is_some(),
            pulled_bytes: mounted.pulled.as_ref().map_or(0, |p| p.pulled_bytes),
            pulled_objects: mounted.pulled.as_ref().map_or(0, |p| p.pulled_objects),
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
            CacheResult::Restore | CacheResult::Miss => ("setup", Some(cache.setup.as_str())),
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
                " (setup {}, promote {}: {} files, {})",
                telemetry::fmt_ms(e.setup_ms),
                telemetry::fmt_ms(e.promote_ms),
                e.files,
                fmt_bytes(e.bytes)
            )),
        }
        if e.result == CacheResult::Restore
            && let Some(m) = &e.matched_key
        {
            line.push_str(&format!(" from {m}"));
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

// ---- progress --------------------------------------------------------------------------------

/// A stderr progress line (elapsed time, bytes written to the upper) while a script runs, only
/// when stderr is a terminal; stops on drop.
struct Progress {
    stop: Option<mpsc::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Progress {
    fn start(json: bool, label: &str, upper: Option<PathBuf>) -> Progress {
        if json || !std::io::stderr().is_terminal() {
            return Progress {
                stop: None,
                thread: None,
            };
        }
        let (tx, rx) = mpsc::channel::<()>();
        let label = label.to_string();
        let thread = std::thread::spawn(move || {
            let start = Instant::now();
            let mut next_size = Instant::now() + Duration::from_secs(3);
            let mut size = None;
            while let Err(mpsc::RecvTimeoutError::Timeout) = rx.recv_timeout(Duration::from_secs(1))
            {
                if let Some(up) = &upper
                    && Instant::now() >= next_size
                {
                    size = Some(dir_bytes(up));
                    next_size = Instant::now() + Duration::from_secs(3);
                }
                let mut line = format!(
                    "\r\x1b[2Klayercache: {label}: {}",
                    telemetry::fmt_ms(start.elapsed().as_millis() as u64)
                );
                if let Some(b) = size {
                    line.push_str(&format!(", {} written", fmt_bytes(b)));
                }
                let _ = std::io::stderr().write_all(line.as_bytes());
            }
            let _ = std::io::stderr().write_all(b"\r\x1b[2K");
        });
        Progress {
            stop: Some(tx),
            thread: Some(thread),
        }
    }
}

impl Drop for Progress {
    fn drop(&mut self) {
        drop(self.stop.take());
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// Apparent size of the regular files under `dir`, bytes (best effort).
fn dir_bytes(dir: &Path) -> u64 {
    let mut total = 0;
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        let Ok(entries) = std::fs::read_dir(&d) else {
            continue;
        };
        for e in entries.flatten() {
            match e.file_type() {
                Ok(t) if t.is_dir() => stack.push(e.path()),
                Ok(t) if t.is_file() => total += e.metadata().map(|m| m.len()).unwrap_or(0),
                _ => {}
            }
        }
    }
    total
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::cell::RefCell;
    use std::collections::HashMap;

    /// A fake store over plain directories: a "mount" copies the layer into the mountpoint,
    /// commit snapshots it, umount empties it.
    #[derive(Default)]
    struct Fake {
        layers: RefCell<HashMap<String, PathBuf>>,
        mounted: RefCell<HashMap<PathBuf, String>>,
        root: PathBuf,
        log: RefCell<Vec<String>>,
    }

    fn copy_tree(src: &Path, dst: &Path) {
        std::fs::create_dir_all(dst).unwrap();
        for e in std::fs::read_dir(src).unwrap().flatten() {
            let to = dst.join(e.file_name());
            if e.file_type().unwrap().is_dir() {
                copy_tree(&e.path(), &to);
            } else {
                std::fs::copy(e.path(), to).unwrap();
            }
        }
    }

    impl Mounter for Fake {
        fn mount(
            &self,
            project: &ProjectId,
            _cache: &CacheId,
            key: &CacheKey,
            restore: &[CacheKey],
            mp: &Path,
        ) -> Result<Mounted> {
            let full = format!("{project}/{key}");
            self.log.borrow_mut().push(format!("mount {key}"));
            self.mounted
                .borrow_mut()
                .insert(mp.to_path_buf(), full.clone());
            let layers = self.layers.borrow();
            let (result, matched) = if let Some(l) = layers.get(&full) {
                copy_tree(l, mp);
                (CacheResult::Hit, Some(key.to_string()))
            } else if let Some((k, l)) = restore.iter().find_map(|r| {
                layers
                    .iter()
                    .find(|(k, _)| k.starts_with(&format!("{project}/{r}")))
            }) {
                copy_tree(l, mp);
                (CacheResult::Restore, Some(k.clone()))
            } else {
                (CacheResult::Miss, None)
            };
            Ok(Mounted {
                result,
                matched_key: matched,
                upper: None,
                bytes: 0,
                files: 0,
                pulled: None,
            })
        }
        fn commit(&self, mp: &Path) -> Result<Committed> {
            let key = self.mounted.borrow()[mp].clone();
            let dst = self.root.join(key.replace('/', "_"));
            copy_tree(mp, &dst);
            self.layers.borrow_mut().insert(key.clone(), dst);
            self.log.borrow_mut().push(format!("commit {key}"));
            Ok(Committed {
                published: true,
                bytes: 1,
                files: 1,
            })
        }
        fn umount(&self, mp: &Path) -> Result<()> {
            self.mounted.borrow_mut().remove(mp);
            std::fs::remove_dir_all(mp).ok();
            std::fs::create_dir_all(mp).ok();
            self.log
                .borrow_mut()
                .push(format!("umount {}", mp.display()));
            Ok(())
        }
    }

    struct Env {
        _dir: tempfile::TempDir,
        work: PathBuf,
        cfg: RunConfig,
        fake: Fake,
    }

    fn env(spec: &str, command: &[&str]) -> Env {
        let dir = tempfile::tempdir().unwrap();
        let work = dir.path().join("work");
        std::fs::create_dir_all(&work).unwrap();
        std::fs::write(work.join("deps.lock"), "a=1\n").unwrap();
        let store = dir.path().join("store");
        std::fs::create_dir_all(&store).unwrap();
        let layers = dir.path().join("layers");
        std::fs::create_dir_all(&layers).unwrap();
        let cfg = RunConfig {
            spec: crate::spec::parse(spec).unwrap(),
            paths: Paths {
                workdir: work.clone(),
                mount_root: dir.path().join("mnt"),
            },
            image: None,
            sandbox: SandboxMode::None,
            command: command.iter().map(OsString::from).collect(),
            store,
            json: false,
        };
        Env {
            work,
            cfg,
            fake: Fake {
                root: layers,
                ..Default::default()
            },
            _dir: dir,
        }
    }

    const SPEC: &str = r#"project = "p"
[[cache]]
id = "deps"
key_files = ["deps.lock"]
env = { DEPS_DIR = "{mount}" }
setup = "echo built > \"$DEPS_DIR/out\" && echo setup-ran >> setup.log"
maintenance = "echo maint >> setup.log"
"#;

    /// A custom setup finds its mount through `{mount}` and `$LAYERCACHE_MOUNT`, without an
    /// `env` entry.
    #[test]
    fn scripts_see_their_mount() {
        let spec = r#"project = "p"
[[cache]]
id = "deps"
key_files = ["deps.lock"]
setup = "echo a > {mount}/a && test -n \"$LAYERCACHE_MOUNT\" && test -f \"$LAYERCACHE_MOUNT/a\""
"#;
        let e = env(spec, &[]);
        assert_eq!(run(&e.cfg, &e.fake).unwrap(), 0);
        let events = telemetry::read(&e.cfg.store).unwrap();
        assert_eq!(events[0].exit_status, 0, "setup failed");
        assert!(events[0].published);
    }

    #[test]
    fn miss_then_hit_then_restore() {
        let e = env(
            SPEC,
            &["sh", "-c", "test \"$(cat \"$DEPS_DIR/out\")\" = built"],
        );
        assert_eq!(run(&e.cfg, &e.fake).unwrap(), 0);
        let events = telemetry::read(&e.cfg.store).unwrap();
        assert_eq!(events.len(), 1);
        assert_eq!(events[0].result, CacheResult::Miss);
        assert!(events[0].published);

        assert_eq!(run(&e.cfg, &e.fake).unwrap(), 0);
        let events = telemetry::read(&e.cfg.store).unwrap();
        assert_eq!(events[1].result, CacheResult::Hit);
        assert!(!events[1].published);
        let log = std::fs::read_to_string(e.work.join("setup.log")).unwrap();
        assert_eq!(log, "setup-ran\nmaint\n");

        std::fs::write(e.work.join("deps.lock"), "a=2\n").unwrap();
        assert_eq!(run(&e.cfg, &e.fake).unwrap(), 0);
        let events = telemetry::read(&e.cfg.store).unwrap();
        assert_eq!(events[2].result, CacheResult::Restore);
        assert_eq!(
            events[2].matched_key.as_deref(),
            Some(format!("p/{}", events[0].key).as_str())
        );
        assert_ne!(events[2].key, events[0].key);
        // everything was unmounted after each run
        assert!(e.fake.mounted.borrow().is_empty());
    }

    #[test]
    fn setup_failure_publishes_nothing_and_passes_status() {
        let spec = SPEC.replace("echo built > \\\"$DEPS_DIR/out\\\" &&", "exit 7;");
        let e = env(&spec, &["true"]);
        let err = run(&e.cfg, &e.fake).unwrap_err();
        assert_eq!(err.exit_code(), 7, "{err}");
        assert!(e.fake.layers.borrow().is_empty());
        assert!(e.fake.mounted.borrow().is_empty());
        let log = e.fake.log.borrow();
        assert!(!log.iter().any(|l| l.starts_with("commit")), "{log:?}");
        let events = telemetry::read(&e.cfg.store).unwrap();
        assert_eq!(events[0].exit_status, 7);
        assert!(!events[0].published);
    }

    #[test]
    fn command_status_passes_through() {
        let e = env(SPEC, &["sh", "-c", "exit 3"]);
        assert_eq!(run(&e.cfg, &e.fake).unwrap(), 3);
        let e = env(SPEC, &["layercache-no-such-command"]);
        assert_eq!(run(&e.cfg, &e.fake).unwrap(), 127);
    }

    #[test]
    fn no_caches_just_runs_the_command() {
        let e = env("project = \"p\"\n", &["sh", "-c", "exit 5"]);
        assert_eq!(run(&e.cfg, &e.fake).unwrap(), 5);
        assert!(e.fake.log.borrow().is_empty());
        assert!(telemetry::read(&e.cfg.store).unwrap().is_empty());
        let e = env("project = \"p\"\n", &[]);
        assert_eq!(run(&e.cfg, &e.fake).unwrap(), 0);
    }

    #[test]
    fn excluded_paths_are_removed_before_commit() {
        let spec = SPEC
            .replace("maintenance =", "exclude = [\"secret*\"]\nmaintenance =")
            .replace(
                "echo built >",
                "touch \\\"$DEPS_DIR/secret.txt\\\" && echo built >",
            );
        let e = env(&spec, &[]);
        assert_eq!(run(&e.cfg, &e.fake).unwrap(), 0);
        let layers = e.fake.layers.borrow();
        let layer = layers.values().next().unwrap();
        assert!(layer.join("out").exists());
        assert!(!layer.join("secret.txt").exists());
    }

    #[test]
    fn duplicate_mountpoints_are_rejected() {
        let spec = format!(
            "{SPEC}[[cache]]\nid = \"b\"\nkey_files = [\"deps.lock\"]\nsetup = \"true\"\nmountpoint = \"{{mount_root}}/deps\"\n"
        );
        let e = env(&spec, &[]);
        let err = run(&e.cfg, &e.fake).unwrap_err().to_string();
        assert!(err.contains("mountpoint"), "{err}");
        assert!(e.fake.log.borrow().is_empty());
    }

    #[test]
    fn sandbox_mode_parses() {
        assert_eq!(SandboxMode::parse("bwrap").unwrap(), SandboxMode::Bwrap);
        assert!(
            SandboxMode::parse("x")
                .unwrap_err()
                .to_string()
                .contains("--sandbox")
        );
        assert_eq!(fmt_bytes(1536), "1.5 KiB");
    }
}
