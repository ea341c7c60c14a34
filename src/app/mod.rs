//! Wires parsed CLI arguments to the library: one function per subcommand, returning the
//! process exit status. The store's subcommands (`mount`, `commit`, `umount`, `ls`, `gc`,
//! `clear`, `verify`) are in `app/store_cmds.rs`; the store itself knows nothing of the CLI.

use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::cli::{Cli, Command, GlobalArgs, KeyArgs, LsArgs, PathArgs, RunArgs, SandboxArgs};
use crate::error::{Error, Result};
use crate::ids::ProjectId;
use crate::key::{self, CacheKeys, Environment, KeySalt};
use crate::overlay::options::{PassthroughChoice, Squash};
use crate::run::preflight::{PathFlags, Prepared, Request};
use crate::run::{self, NoMounts, RunConfig, StoreMounter, rootless};
use crate::sandbox::{self, Binds, Driver, Sandbox};
use crate::store::{self, Lookup, ProjectDirs, Store};
use crate::{overlay, remote, serve, spec, sys, telemetry, why};

mod remote_cmds;
pub(crate) mod store_cmds;

/// Runs the parsed command line and returns the exit status (see [`crate::error`]).
///
/// Errors: whatever the subcommand returns; the binary prints it and exits with
/// [`Error::exit_code`].
pub fn dispatch(cli: Cli) -> Result<i32> {
    init_tracing();
    let cli = cli.with_env_defaults();
    // Commands that only print (and hold nothing that needs undoing) end on SIGPIPE like any
    // Unix listing tool when their reader goes away (`layercache ls | head`), instead of a
    // panic on the failed print (Rust starts with SIGPIPE ignored).
    if matches!(
        cli.command,
        Command::Presets | Command::Key(_) | Command::Stats(_) | Command::Ls(_)
    ) {
        sys::default_sigpipe();
    }
    match cli.command {
        Command::Overlay(args) => {
            overlay::cli_overlay(&args.options, &args.mountpoint, args.foreground)
        }
        Command::OverlayDaemon(args) => {
            overlay::set_layer_maker(remote::lazy::make_layer);
            overlay::cli_daemon(
                args.config_fd,
                args.ready_fd,
                args.owner_pid,
                &args.mountpoint,
            )
        }
        Command::Run(args) => cmd_run(&cli.global, &args),
        Command::Presets => {
            print!("{}", spec::presets_text(cli.global.json));
            Ok(0)
        }
        Command::Key(args) => cmd_key(&cli.global, &args),
        Command::Stats(args) => cmd_stats(&cli.global, &args),
        Command::SandboxArgs(args) => cmd_sandbox_args(&cli.global, &args),
        Command::Mount(args) => store_cmds::mount(&cli.global, &args),
        Command::Commit(args) => store_cmds::commit(&cli.global, &args),
        Command::Umount(args) => store_cmds::umount(&cli.global, &args),
        Command::Ls(args) => store_cmds::ls(&cli.global, &args),
        Command::Gc(args) => store_cmds::gc(&cli.global, &args),
        Command::Clear(args) => store_cmds::clear(&cli.global, &args),
        Command::Verify(args) => store_cmds::verify(&cli.global, &args),
        Command::Serve(args) => {
            // The flags first, then the existing store (serve never creates one).
            let cfg = serve::Config::new(&args.listen, args.token_file.as_deref())?;
            serve::serve(
                store_cmds::open_existing(&cli.global)?,
                cfg,
                cli.global.json,
            )
        }
        Command::Remote(c) => remote_cmds::dispatch(&cli.global, &c),
    }
}

/// Logging to stderr, filtered by `LAYERCACHE_LOG`, else `RUST_LOG` (tracing-subscriber's
/// `EnvFilter` syntax, e.g. `debug` or `layercache::fuse=debug`), else `warn`.
///
/// A line that cannot be written (a daemon log on a full filesystem: ENOSPC) is dropped.
/// tracing-subscriber would otherwise report it with `eprintln!`, which panics when stderr
/// cannot be written either, and a panic in a FUSE handler's log line took the request down.
fn init_tracing() {
    let asked = tracing_subscriber::EnvFilter::try_from_env("LAYERCACHE_LOG")
        .or_else(|_| tracing_subscriber::EnvFilter::try_from_default_env());
    let builder = tracing_subscriber::fmt()
        .log_internal_errors(false)
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()));
    let _ = match asked {
        // A log the user asked for keeps its full form (time, level, target, spans).
        Ok(filter) => builder.with_env_filter(filter).try_init(),
        // Otherwise only warnings and errors, as the tool's own lines: `layercache: warning: …`.
        Err(_) => builder
            .with_env_filter(tracing_subscriber::EnvFilter::new("warn"))
            .event_format(ToolLine)
            .try_init(),
    };
}

/// The format of a warning or error logged without `LAYERCACHE_LOG`/`RUST_LOG`: one line
/// starting `layercache: warning: ` (or `error: `) like every other line of the tool's own, then
/// the message and its fields.
struct ToolLine;

impl<S, N> tracing_subscriber::fmt::FormatEvent<S, N> for ToolLine
where
    S: tracing::Subscriber + for<'a> tracing_subscriber::registry::LookupSpan<'a>,
    N: for<'a> tracing_subscriber::fmt::FormatFields<'a> + 'static,
{
    fn format_event(
        &self,
        ctx: &tracing_subscriber::fmt::FmtContext<'_, S, N>,
        mut writer: tracing_subscriber::fmt::format::Writer<'_>,
        event: &tracing::Event<'_>,
    ) -> std::fmt::Result {
        let level = match *event.metadata().level() {
            tracing::Level::ERROR => "error",
            tracing::Level::WARN => "warning",
            _ => "note",
        };
        write!(writer, "layercache: {level}: ")?;
        ctx.field_format().format_fields(writer.by_ref(), event)?;
        writeln!(writer)
    }
}

/// `layercache key`: each cache's key, restore keys, key files and mountpoint.
fn cmd_key(global: &GlobalArgs, args: &KeyArgs) -> Result<i32> {
    let spec = spec::load(&args.spec)?;
    let paths = run::preflight::paths(path_flags(&args.paths), None)?;
    if spec.caches.is_empty() {
        // Not an error (a run of such a spec just runs COMMAND), but worth saying.
        eprintln!(
            "layercache: spec {} declares no caches (add a [[cache]]): nothing to key",
            args.spec
        );
    }
    // What each key would match now; the keys are keyed with the project's salt, read only:
    // `key` never writes (a project without one yet gets its salt from its first run).
    let store = KeyStore::open(global, &spec.project)?;
    let mut env = Environment::host(args.image.clone());
    let salt = match (KeySalt::from_env()?, &store) {
        (Some(s), _) => Some(s),
        (None, KeyStore::Open(_, Some(pd))) => pd.read_salt()?.map(KeySalt),
        _ => None,
    };
    if let Some(s) = salt {
        env = env.with_salt(s);
    }
    let mut all = Vec::new();
    for cache in &spec.caches {
        all.push(key::compute(cache, &paths, &env)?);
    }
    if salt.is_none() && !spec.caches.is_empty() {
        eprintln!(
            "layercache: project {} has no key salt in this store yet: its first run makes one \
             (or adopts its remote's), and its keys then differ from these",
            spec.project
        );
    }
    let mut matches = Vec::new();
    for k in &all {
        matches.push(match &store {
            KeyStore::Open(st, pd) => would_match(st, pd.as_ref(), &spec.project, k)?,
            KeyStore::Answer(answer) => answer.clone(),
        });
    }
    if global.json {
        let caches: Vec<serde_json::Value> = all
            .iter()
            .zip(&matches)
            .map(|(k, m)| {
                let mut v = serde_json::to_value(k).unwrap_or_default();
                v["would_match"] = m.clone();
                v
            })
            .collect();
        let v = serde_json::json!({ "project": spec.project.as_str(), "caches": caches });
        println!("{v}");
        return Ok(0);
    }
    for (k, m) in all.iter().zip(&matches) {
        print_key(k, m);
    }
    Ok(0)
}

/// Where `layercache key` looks keys up.
enum KeyStore {
    /// The store, and the project's directories if they exist (a project the store has never
    /// seen matches nothing).
    Open(Box<Store>, Option<ProjectDirs>),
    /// No store to look in: what every key would match (a miss "no store yet", or
    /// "unknown" with the reason the store cannot be read).
    Answer(serde_json::Value),
}

impl KeyStore {
    /// The store of `global` and `project`'s directories in it. Never creates a store or a
    /// project: without a store each key reports a miss, "no store yet" (a run would create
    /// it); with one that cannot be read, "unknown" with the reason.
    ///
    /// Errors: [`Error::Io`] listing the store's projects.
    fn open(global: &GlobalArgs, project: &ProjectId) -> Result<KeyStore> {
        let opened =
            store_root(global).and_then(|r| Store::open_existing(&r).map(|st| st.ok_or(r)));
        Ok(match opened {
            Ok(Ok(st)) => {
                let pd = st.projects(Some(project))?.pop();
                KeyStore::Open(Box::new(st), pd)
            }
            Ok(Err(root)) => KeyStore::Answer(serde_json::json!({
                "result": "miss",
                "reason": format!("no store yet at {} (a run creates it)", root.display()),
            })),
            Err(e) => {
                KeyStore::Answer(serde_json::json!({"result": "unknown", "error": e.to_string()}))
            }
        })
    }
}

/// What `k` would match in `st` now (`pd`: `project`'s directories, if they exist): `hit`,
/// `restore` (with the matched key and layer) or `miss`, and unless a hit, `why`: the diff
/// against the nearest layer's recorded inputs.
///
/// Errors: [`Error::Io`] reading the keys.
fn would_match(
    st: &Store,
    pd: Option<&ProjectDirs>,
    project: &ProjectId,
    k: &CacheKeys,
) -> Result<serde_json::Value> {
    let lookup = match pd {
        Some(pd) => st.lookup(pd, &k.id, &k.key, &k.restore_keys)?,
        None => Lookup::Miss,
    };
    let mut found = match lookup {
        Lookup::Hit { layer } => {
            serde_json::json!({"result": "hit", "matched_key": k.key, "layer": layer})
        }
        Lookup::Restore { matched_key, layer } => {
            serde_json::json!({"result": "restore", "matched_key": matched_key, "layer": layer})
        }
        Lookup::Miss => serde_json::json!({"result": "miss"}),
    };
    // Why not a hit: the diff against the nearest layer's recorded inputs.
    if found["result"] != "hit" {
        let matched = found["matched_key"].as_str().map(str::to_string);
        found["why"] = serde_json::json!(why::explain(
            st.root(),
            project,
            &k.id,
            matched.as_deref(),
            &k.inputs,
        ));
    }
    Ok(found)
}

/// Prints `layercache key`'s text form of one cache's keys `k` and what they would match
/// (`m`, from [`would_match`]).
fn print_key(k: &CacheKeys, m: &serde_json::Value) {
    println!("{}", k.id);
    println!("  key:          {}", k.key);
    let rks: Vec<&str> = k.restore_keys.iter().map(|r| r.as_str()).collect();
    println!("  restore keys: {}", rks.join(", "));
    let files: Vec<String> = k
        .key_files
        .iter()
        .map(|f| f.display().to_string())
        .collect();
    println!("  key files:    {}", files.join(", "));
    println!("  mountpoint:   {}", k.mountpoint.display());
    let result = m["result"].as_str().unwrap_or("unknown");
    match (m["matched_key"].as_str())
        .or(m["reason"].as_str())
        .or(m["error"].as_str())
    {
        Some(mk) => println!("  would match:  {result} ({mk})"),
        None => println!("  would match:  {result}"),
    }
    if let Some(why) = m["why"].as_array() {
        let why: Vec<&str> = why.iter().filter_map(|w| w.as_str()).collect();
        println!("  why:          {}", why.join("; "));
    }
}

/// `layercache stats [--project P]`: like `ls`, exit 2 when there is no store or when `P` is
/// neither in the event log nor in the store.
fn cmd_stats(global: &GlobalArgs, args: &LsArgs) -> Result<i32> {
    let store = store_cmds::open_existing(global)?;
    let events = telemetry::read(store.root())?;
    let project = args.project.as_deref().map(ProjectId::new).transpose()?;
    if let Some(p) = &project
        && !events.iter().any(|e| e.project == p.as_str())
        && store.projects(Some(p))?.is_empty()
    {
        // A cleared project keeps its events, so the names come from both places.
        let mut known: std::collections::BTreeSet<String> =
            events.iter().map(|e| e.project.clone()).collect();
        known.extend(
            store
                .projects(None)?
                .iter()
                .map(|pd| pd.project.to_string()),
        );
        let known: Vec<String> = known.into_iter().collect();
        return Err(store::no_such_project(store.root(), p, &known));
    }
    let stats = telemetry::stats(&events, project.as_ref().map(|p| p.as_str()));
    if global.json {
        let v = serde_json::to_string(&stats).map_err(|e| Error::Failed(e.to_string()))?;
        println!("{v}");
    } else {
        print!("{}", telemetry::stats_text(&stats));
    }
    Ok(0)
}

/// `layercache sandbox-args --driver bwrap|docker --spec FILE`.
fn cmd_sandbox_args(global: &GlobalArgs, args: &SandboxArgs) -> Result<i32> {
    let driver = Driver::parse(&args.driver)?;
    let spec = args.spec.as_deref().map(spec::load).transpose()?;
    let paths = run::preflight::paths(path_flags(&args.paths), None)?;
    let mut binds = Binds {
        workdir: paths.workdir.clone(),
        workdir_view: paths.workdir_view.clone(),
        ..Default::default()
    };
    if args.run.is_empty() {
        for cache in spec.iter().flat_map(|s| &s.caches) {
            let mp = cache.mountpoint(&paths)?;
            binds.env.extend(cache.env_for(&paths, &mp));
            binds.mounts.push((mp.clone(), mp));
        }
    } else {
        // The mounts of existing `layercache mount` runs, seen where the spec's
        // cache of the same id is seen (and with its environment), else at their mountpoint.
        let store = store_cmds::open_existing(global)?;
        for id in &args.run {
            let sm = store.find_run_id(id)?.ok_or_else(|| {
                Error::invalid(format!(
                    "--run {id}: no such run in the store (layercache mount prints its id)"
                ))
            })?;
            let rec = sm.record();
            let cache = spec.iter().flat_map(|s| &s.caches).find(|c| {
                c.id == rec.cache && spec.as_ref().is_some_and(|s| s.project == rec.project)
            });
            let view = match cache {
                Some(c) => {
                    let v = c.mountpoint(&paths)?;
                    binds.env.extend(c.env_for(&paths, &v));
                    v
                }
                None => sm.mountpoint().to_path_buf(),
            };
            binds.mounts.push((sm.mountpoint().to_path_buf(), view));
        }
        // The mounts are in the store: a bubblewrap given these words covers it after binding
        // them, as `run --sandbox bwrap` does.
        binds.hidden.push(store.root().to_path_buf());
    }
    let mut words = sandbox::args(driver, &binds);
    if driver == Driver::Bwrap && !binds.hidden.is_empty() {
        // As `run --sandbox bwrap` does when root starts bubblewrap: without CAP_SYS_ADMIN a
        // step cannot unmount the store's cover (ignored by an unprivileged bubblewrap).
        words.extend(["--cap-drop".to_string(), "CAP_SYS_ADMIN".to_string()]);
    }
    if global.json {
        println!("{}", serde_json::Value::from(words));
    } else {
        println!("{}", sandbox::shell_quote(&words)?);
    }
    Ok(0)
}

/// The spec `run` reads when given neither `--spec` nor `--project`: `layercache.toml` in the
/// workdir (`--workdir`, else the current directory), as `cargo` finds `Cargo.toml`.
///
/// Errors: [`Error::Invalid`] (exit 2) when there is none, naming the file looked for and the
/// two flags.
fn default_spec(paths: &PathArgs) -> Result<String> {
    let dir = match &paths.workdir {
        Some(d) => d.clone(),
        None => std::env::current_dir().map_err(|e| Error::io(".", e))?,
    };
    let file = dir.join("layercache.toml");
    if file.is_file() {
        return Ok(file.to_string_lossy().into_owned());
    }
    Err(Error::invalid(format!(
        "no spec: {} does not exist; pass --spec FILE (TOML or JSON, - for stdin), or --project P \
         to run the spec stored for project P in the store (`layercache serve`'s spec page)",
        file.display()
    )))
}

/// `layercache run`: parses the flags into a [`run::preflight::Request`], has the run check
/// it ([`run::preflight::preflight`]) and runs the job over the store.
fn cmd_run(global: &GlobalArgs, args: &RunArgs) -> Result<i32> {
    // A lazy mount's prefetch before COMMAND counts from here.
    remote::lazy::start_clock();
    let sandbox = Sandbox::parse(&args.sandbox)?;
    // The run's variables are input too (exit 2 before anything): LAYERCACHE_LAZY even when
    // no remote is configured; the timeout and the prefetch's budget are read by the lazy
    // mounts' daemons, where a bad value could only be logged.
    remote::lazy_env()?;
    remote::lazy::lazy_timeout()?;
    remote::lazy::prefetch_wait()?;
    let flag = args
        .passthrough
        .as_deref()
        .map(|v| PassthroughChoice::parse("--passthrough", v))
        .transpose()?;
    let (spec, stored_spec) = match (&args.spec, &args.project) {
        (Some(source), _) => (spec::load(source)?, None),
        (None, None) => (spec::load(&default_spec(&args.paths)?)?, None),
        (None, Some(project)) => {
            let (spec, origin) = spec::load_stored(&store_root(global)?, project)?;
            // Which saved version runs, before anything does (also in --json's summary).
            eprintln!("{}", origin.notice());
            (spec, Some(origin))
        }
    };
    let Prepared { cfg, squash } = run::preflight::preflight(Request {
        spec,
        stored_spec,
        sandbox,
        engine_args: args.docker_args.clone(),
        user: args.user.clone(),
        image: args.image.clone(),
        paths: path_flags(&args.paths),
        store: store_root(global)?,
        command: args.command.iter().map(OsString::from).collect(),
        json: global.json,
    })?;
    // A failing run's `--json` error line names it.
    telemetry::set_current_run(&cfg.run_id);
    if cfg.spec.caches.is_empty() {
        return run::run(&cfg, &NoMounts);
    }
    let fill_wait = Duration::from_secs(args.fill_wait);
    let remote = (global.remote.as_deref(), args.lazy);
    run_over_store(&cfg, remote, flag, squash, fill_wait)
}

/// The path flags of `args` as [`run::preflight::paths`] takes them.
fn path_flags(args: &PathArgs) -> PathFlags<'_> {
    PathFlags {
        workdir: args.workdir.as_deref(),
        mount_root: &args.mount_root,
        workdir_view: args.workdir_view.as_deref(),
    }
}

/// Runs `cfg` (a spec with caches) over its store: enters the rootless namespace first
/// (before the store is opened and any thread starts), opens the store with the remote tier
/// (`remote`, `--remote`) attached, mounts each cache with `passthrough` (`--passthrough`,
/// else the cache's own), `squash` and `fill_wait`, reaps what a killed run left, and at the
/// end waits (bounded) for the remote pushes and the background removals.
///
/// Errors: as [`run::run`], and opening the store or the remote tier.
fn run_over_store(
    cfg: &RunConfig,
    (remote, lazy): (Option<&str>, Option<bool>),
    passthrough: Option<PassthroughChoice>,
    squash: Squash,
    fill_wait: Duration,
) -> Result<i32> {
    if let Some(r) = &cfg.rootless {
        // Before the store is opened and before any thread starts (the remote tier's runtime).
        rootless::enter(r)?;
    }
    // The tools' `--version` runs while the store is opened and old runs are reaped; the key
    // computation takes its output (a container's tools are the image's: nothing to probe).
    if !cfg.sandbox.tools_in_image() {
        crate::key::start_probes(
            cfg.spec
                .caches
                .iter()
                .flat_map(|c| c.tools().iter().copied()),
        );
    }
    let mut store = Store::open(Some(&cfg.store))?.with_notify(store_cmds::stderr_notices());
    remote::attach(&mut store, remote, lazy)?;
    let remote = store.remote().cloned();
    let passthrough = cfg
        .spec
        .caches
        .iter()
        .map(|c| (c.id.clone(), passthrough.unwrap_or(c.passthrough)))
        .collect();
    let whole = (cfg.spec.caches.iter())
        .filter(|c| c.save == crate::spec::SaveWhen::Success)
        .map(|c| c.id.clone())
        .collect();
    let mounter = StoreMounter::new(store, fill_wait)
        .with_key_salt(KeySalt::from_env()?)
        .with_squash(squash)
        .with_passthrough(passthrough)
        .with_whole_layers(whole);
    // Runs a killed `layercache run` left behind (its daemons end with it) are reaped here.
    if let Ok(pd) = mounter.store().project(&cfg.spec.project) {
        let _ = mounter.store().reap_runs(&pd);
    }
    // …and the empty view directories such a run made on the host.
    let _ = store::reap_made_views(&cfg.store);
    let status = run::run(cfg, &mounter);
    // Remote tier: the run's exit waits (bounded) for pushes started after its publishes.
    if let Some(r) = remote {
        r.wait_pushes(mounter.store());
    }
    mounter.store().wait_background();
    status
}

/// `p` made absolute with its longest existing ancestor canonical (`..` and symlinks
/// resolved) and the rest appended: the form the kernel shows mount points in
/// (`/proc/self/mountinfo`), which a run compares with its own mounts' paths.
///
/// Errors: as [`std::path::absolute`].
fn resolved(p: &Path) -> std::io::Result<PathBuf> {
    let abs = std::path::absolute(p)?;
    let mut rest = Vec::new();
    let mut cur = abs.as_path();
    loop {
        if let Ok(mut c) = cur.canonicalize() {
            c.extend(rest.iter().rev());
            return Ok(c);
        }
        match (cur.parent(), cur.file_name()) {
            (Some(parent), Some(name)) => {
                rest.push(name.to_os_string());
                cur = parent;
            }
            _ => return Ok(abs),
        }
    }
}

/// The store root: `--store`/`LAYERCACHE_STORE` (made absolute and canonical, see
/// [`resolved`]), else [`store::default_root`].
///
/// Errors: [`Error::Invalid`] when no default can be derived, or when the given path exists
/// and is not a directory (naming it).
pub(crate) fn store_root(global: &GlobalArgs) -> Result<PathBuf> {
    match &global.store {
        // Made absolute here, once: the run's steps, daemons and views work in other
        // directories, where a relative store path would name another (empty) store; and
        // canonical: a run tells its own mounts from others' by their paths in mountinfo.
        Some(s) => {
            let root = resolved(s).map_err(|e| {
                Error::invalid(format!(
                    "--store / LAYERCACHE_STORE {}: cannot make it an absolute path: {e}",
                    s.display()
                ))
            })?;
            // A store is a directory: a file there is a mistyped path, said as such.
            match std::fs::metadata(&root) {
                Ok(m) if !m.is_dir() => Err(Error::invalid(format!(
                    "--store / LAYERCACHE_STORE {}: not a directory (a store is a directory, \
                     made by the first `mount` or `run` where none exists)",
                    s.display()
                ))),
                _ => Ok(root),
            }
        }
        // ($XDG_CACHE_HOME or /var/lib may be, or lie under, a symlink.)
        None => store::default_root().map(|r| resolved(&r).unwrap_or(r)),
    }
}

/// Prints one line to stdout; a closed stdout (EPIPE) is not an error.
pub(super) fn emit(line: &str) {
    use std::io::Write;
    let mut out = std::io::stdout().lock();
    let _ = writeln!(out, "{line}");
    let _ = out.flush();
}

/// `v` as one line of JSON (an `{"error": …}` object if it cannot be serialised).
pub(super) fn json<T: serde::Serialize>(v: &T) -> String {
    serde_json::to_string(v).unwrap_or_else(|e| format!("{{\"error\":\"{e}\"}}"))
}
