//! Wires parsed CLI arguments to the library: one function per subcommand, returning the
//! process exit status.

use crate::cli::{Cli, Command};
use crate::error::{Error, Result};

/// Runs the parsed command line and returns the exit status (see [`crate::error`]).
///
/// Errors: whatever the subcommand returns; the binary prints it and exits with
/// [`Error::exit_code`].
pub fn dispatch(cli: Cli) -> Result<i32> {
    init_tracing();
    match cli.command {
        Command::Overlay(args) => {
            crate::overlay::cli_overlay(&args.options, &args.mountpoint, args.foreground)
        }
        Command::Presets => {
            print!("{}", crate::spec::presets_text(cli.global.json));
            Ok(0)
        }
        Command::Key(args) => cmd_key(&cli.global, &args),
        Command::Stats(args) => cmd_stats(&cli.global, &args),
        Command::SandboxArgs(args) => cmd_sandbox_args(&cli.global, &args),
        other => Err(Error::Failed(format!("{other:?}: not implemented yet"))),
    }
}

fn init_tracing() {
    let filter = tracing_subscriber::EnvFilter::try_from_env("LAYERCACHE_LOG")
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn"));
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .try_init();
}

/// The store root: `--store`/`LAYERCACHE_STORE`, else /var/lib/layercache as root, else
/// `$XDG_CACHE_HOME/layercache` (`~/.cache/layercache`).
pub fn store_root(global: &crate::cli::GlobalArgs) -> std::path::PathBuf {
    if let Some(s) = &global.store {
        return s.clone();
    }
    if nix::unistd::geteuid().is_root() {
        return "/var/lib/layercache".into();
    }
    let base = std::env::var_os("XDG_CACHE_HOME")
        .map(std::path::PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| std::path::Path::new(&h).join(".cache")))
        .unwrap_or_else(|| "/tmp".into());
    base.join("layercache")
}

/// The project directory: `--workdir` or the current directory, made absolute.
fn workdir(arg: &Option<std::path::PathBuf>) -> Result<std::path::PathBuf> {
    use crate::error::IoContext;
    let dir = match arg {
        Some(d) => d.clone(),
        None => std::env::current_dir().at(".")?,
    };
    std::fs::canonicalize(&dir)
        .map_err(|e| Error::invalid(format!("--workdir {}: {e}", dir.display())))
}

/// `layercache key`: each cache's key, restore keys, key files and mountpoint.
fn cmd_key(global: &crate::cli::GlobalArgs, args: &crate::cli::KeyArgs) -> Result<i32> {
    let spec = crate::spec::load(&args.spec)?;
    let paths = crate::spec::Paths {
        workdir: workdir(&args.workdir)?,
        mount_root: args.mount_root.clone(),
    };
    let env = crate::key::Environment::host(args.image.clone());
    let mut all = Vec::new();
    for cache in &spec.caches {
        all.push(crate::key::compute(cache, &paths, &env)?);
    }
    if global.json {
        let v = serde_json::json!({ "project": spec.project.as_str(), "caches": all });
        println!("{v}");
        return Ok(0);
    }
    for k in &all {
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
    }
    Ok(0)
}

/// `layercache stats [--project P]`.
fn cmd_stats(global: &crate::cli::GlobalArgs, args: &crate::cli::LsArgs) -> Result<i32> {
    let events = crate::telemetry::read(&store_root(global))?;
    let stats = crate::telemetry::stats(&events, args.project.as_deref());
    if global.json {
        let v = serde_json::to_string(&stats).map_err(|e| Error::Failed(e.to_string()))?;
        println!("{v}");
    } else {
        print!("{}", crate::telemetry::stats_text(&stats));
    }
    Ok(0)
}

/// `layercache sandbox-args --driver bwrap|docker --spec FILE`.
fn cmd_sandbox_args(
    global: &crate::cli::GlobalArgs,
    args: &crate::cli::SandboxArgs,
) -> Result<i32> {
    let driver = crate::sandbox::Driver::parse(&args.driver)?;
    let spec = crate::spec::load(&args.spec)?;
    let paths = crate::spec::Paths {
        workdir: workdir(&args.workdir)?,
        mount_root: args.mount_root.clone(),
    };
    let mut binds = crate::sandbox::Binds {
        workdir: paths.workdir.clone(),
        ..Default::default()
    };
    for cache in &spec.caches {
        let mp = cache.mountpoint(&paths)?;
        binds.env.extend(cache.env_for(&paths, &mp));
        binds.mounts.push(mp);
    }
    let words = crate::sandbox::args(driver, &binds);
    if global.json {
        println!("{}", serde_json::Value::from(words));
    } else {
        println!("{}", crate::sandbox::shell_quote(&words));
    }
    Ok(0)
}
