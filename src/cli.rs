//! Command-line definitions (clap). Raw flags only: validation happens where the library turns
//! them into its own configuration types.

use std::path::PathBuf;

use clap::{Args, Parser, Subcommand};

// The numeric and size/duration options accept a leading '-' as their value
// (allow_negative_numbers / allow_hyphen_values), so `--max-inodes -1` gets the same message
// naming the value as `--max-inodes=-1` instead of clap's "unexpected argument '-1'".

/// A count or a number of seconds: a whole number, 0 or more.
fn whole_number(s: &str) -> Result<u64, String> {
    s.parse()
        .map_err(|_| format!("{s:?} is not a whole number (want 0, 1, 2, …)"))
}

/// layercache — immutable dependency-cache layers mounted through a FUSE copy-on-write overlay.
#[derive(Debug, Parser)]
#[command(name = "layercache", version, about, max_term_width = 100)]
pub struct Cli {
    /// Options every subcommand accepts.
    #[command(flatten)]
    pub global: GlobalArgs,
    /// The subcommand.
    #[command(subcommand)]
    pub command: Command,
}

/// Options every subcommand accepts.
#[derive(Debug, Args, Clone)]
pub struct GlobalArgs {
    /// The store root (default /var/lib/layercache as root, $XDG_CACHE_HOME/layercache
    /// otherwise) [env: LAYERCACHE_STORE]
    #[arg(long, global = true)]
    pub store: Option<PathBuf>,
    /// Machine-readable JSON output.
    #[arg(long, global = true)]
    pub json: bool,
    /// Remote tier: s3://bucket/prefix or file:///dir (overrides [remote] url of config.toml;
    /// credentials from AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY) [env: LAYERCACHE_REMOTE]
    #[arg(long, global = true, value_name = "URL")]
    pub remote: Option<String>,
}

impl Cli {
    /// Fills the options a variable may give from the environment when the command line did
    /// not: `--store` from `LAYERCACHE_STORE`, `--remote` from `LAYERCACHE_REMOTE`, `run`'s and
    /// `key`'s `--image` from `LAYERCACHE_IMAGE` (an empty variable counts as unset). Done
    /// here rather than with clap's `env`, whose error usage lines list an option a variable
    /// gave as if it were required (`--store <STORE>`).
    pub fn with_env_defaults(mut self) -> Cli {
        fn var(name: &str) -> Option<String> {
            std::env::var(name).ok().filter(|v| !v.is_empty())
        }
        let g = &mut self.global;
        if g.store.is_none() {
            g.store = std::env::var_os("LAYERCACHE_STORE")
                .filter(|v| !v.is_empty())
                .map(PathBuf::from);
        }
        if g.remote.is_none() {
            g.remote = var("LAYERCACHE_REMOTE");
        }
        match &mut self.command {
            Command::Run(a) if a.image.is_none() => a.image = var("LAYERCACHE_IMAGE"),
            Command::Key(a) if a.image.is_none() => a.image = var("LAYERCACHE_IMAGE"),
            _ => {}
        }
        self
    }
}

/// The subcommands (the CLI contract: docs/commands.md; code map: docs/ARCHITECTURE.md).
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Mount a copy-on-write overlay of any directories (fuse-overlayfs compatible options).
    Overlay(OverlayArgs),
    /// Internal: the daemon started by `overlay`/`mount` (config in a memfd, readiness on a pipe).
    #[command(hide = true)]
    OverlayDaemon(OverlayDaemonArgs),
    /// Mount the layer for a key (hit, restore or miss) with a private upper layer.
    Mount(MountArgs),
    /// Promote a store mount's merged view (lower + upper) into a new layer under its key.
    Commit(MountpointArg),
    /// Unmount a mount: a store mount's private upper is discarded, an overlay's upperdir kept.
    ///
    /// A store mount (made by `mount` or `run` with this store) is unmounted and its private
    /// upper layer discarded. Any other mount — a plain `layercache overlay` mount — is unmounted
    /// and its upperdir left as it is. A missing store is never created: the mount is then
    /// treated as a plain one.
    Umount(MountpointArg),
    /// The main job: prepare the spec's caches (setup or maintenance), then run COMMAND.
    Run(RunArgs),
    /// Show each cache's key and what it would match, without mounting.
    Key(KeyArgs),
    /// Print the bind/env arguments a sandbox driver needs for the spec's mounts.
    SandboxArgs(SandboxArgs),
    /// List layers.
    Ls(LsArgs),
    /// Hits, misses, restores and time saved, from the event log.
    Stats(LsArgs),
    /// Evict least-recently-used layers until the store is under its limits.
    Gc(GcArgs),
    /// Remove a project's layers (or one cache's).
    Clear(ClearArgs),
    /// Re-hash objects and quarantine layers whose files do not match.
    Verify(LsArgs),
    /// List the cache presets.
    Presets,
    /// Serve the HTTP API and web pages over the store until SIGINT/SIGTERM.
    Serve(ServeArgs),
    /// Operate on the remote tier (S3-compatible object store): ls, push, pull, gc.
    #[command(subcommand)]
    Remote(RemoteCommand),
}

/// `layercache remote …`.
#[derive(Debug, Subcommand)]
pub enum RemoteCommand {
    /// List the keys on the remote (and whether this store has them).
    Ls(LsArgs),
    /// Push a locally published key (its objects, manifest, then the key; create-only).
    Push(RemoteKeyArgs),
    /// Pull a key from the remote and publish it in this store.
    Pull(RemoteKeyArgs),
    /// Remove unreferenced objects and manifests (older than --grace) and broken keys.
    Gc(RemoteGcArgs),
}

/// `layercache remote push|pull`.
#[derive(Debug, Args)]
pub struct RemoteKeyArgs {
    /// Project id.
    #[arg(long)]
    pub project: String,
    /// Cache id within the project.
    #[arg(long)]
    pub cache: String,
    /// The key.
    pub key: String,
}

/// `layercache remote gc`.
#[derive(Debug, Args)]
pub struct RemoteGcArgs {
    /// Keep unreferenced objects and manifests younger than this (a push in flight writes them
    /// before its key), e.g. 24h, 30m, 0.
    #[arg(long, default_value = "24h", allow_hyphen_values = true)]
    pub grace: String,
    /// Print what would be removed without removing anything.
    #[arg(long)]
    pub dry_run: bool,
}

/// `layercache overlay`.
#[derive(Debug, Args)]
pub struct OverlayArgs {
    /// Comma-separated options: lowerdir=DIR[:DIR…][,upperdir=DIR[,workdir=DIR]] (no upperdir:
    /// read-only) plus generic mount options (ro, rw, dev, suid, noatime, lazytime, allow_other…). May
    /// be given more than once.
    #[arg(short = 'o', required = true)]
    pub options: Vec<String>,
    /// Stay in the foreground instead of returning once the mount is ready.
    #[arg(short = 'f')]
    pub foreground: bool,
    /// Where to mount.
    pub mountpoint: PathBuf,
}

/// `layercache overlay-daemon` (internal).
#[derive(Debug, Args)]
pub struct OverlayDaemonArgs {
    /// Descriptor of a memfd holding the validated overlay configuration as JSON.
    #[arg(long)]
    pub config_fd: i32,
    /// Descriptor to write one byte to once the mount is ready.
    #[arg(long)]
    pub ready_fd: i32,
    /// End the mount when this process exits.
    #[arg(long)]
    pub owner_pid: Option<u32>,
    /// Where to mount.
    pub mountpoint: PathBuf,
}

/// `layercache mount`.
#[derive(Debug, Args)]
pub struct MountArgs {
    /// Project id (the unit of isolation: letters, digits, `._-+=@,`).
    #[arg(long)]
    pub project: String,
    /// Cache id within the project, e.g. `npm`.
    #[arg(long)]
    pub cache: String,
    /// The cache key to look up and to publish under.
    #[arg(long)]
    pub key: String,
    /// Prefixes tried in order when the key itself has no layer.
    #[arg(long = "restore-key")]
    pub restore_keys: Vec<String>,
    /// Seconds to wait for another run that is filling the same key.
    #[arg(long, default_value_t = 300, allow_negative_numbers = true, value_parser = whole_number)]
    pub fill_wait: u64,
    /// Where to mount (an existing directory).
    pub mountpoint: PathBuf,
}

/// A single RUN|MOUNTPOINT argument.
#[derive(Debug, Args)]
pub struct MountpointArg {
    /// The run id (`layercache mount` prints it) or the mountpoint of a layercache mount.
    #[arg(value_name = "RUN|MOUNTPOINT")]
    pub mountpoint: PathBuf,
}

/// Where a run's paths are: the flags `run`, `key` and `sandbox-args` share.
#[derive(Debug, Args)]
pub struct PathArgs {
    /// The project directory key files are read from (default: the current directory).
    #[arg(long)]
    pub workdir: Option<PathBuf>,
    /// Where caches are mounted (`<mount-root>/<id>`); enters path-bound caches' keys.
    #[arg(long, default_value = "/cache")]
    pub mount_root: PathBuf,
    /// Where setup, maintenance and COMMAND see the workdir (bound there in the run's own mount
    /// namespace; COMMAND starts there). Path-bound caches (venv, cargo-target) key on their
    /// view path, so per-run workspaces seen at one path share their layers.
    #[arg(long)]
    pub workdir_view: Option<PathBuf>,
}

/// `layercache run`.
#[derive(Debug, Args)]
pub struct RunArgs {
    /// The spec (TOML or JSON); `-` reads standard input. Without --spec and --project:
    /// `layercache.toml` of the workdir (--workdir, else the current directory).
    #[arg(long)]
    pub spec: Option<String>,
    /// Use the spec stored for this project in the store (saved by `layercache serve`'s spec
    /// page or `PUT /api/v1/projects/P/spec`) instead of --spec.
    #[arg(long, conflicts_with = "spec")]
    pub project: Option<String>,
    /// Where the workdir and the caches are.
    #[command(flatten)]
    pub paths: PathArgs,
    /// Run setup, maintenance and COMMAND directly, inside bubblewrap, or each in a Docker
    /// container of --image (`none`, `bwrap`, `docker`; docker: the workdir is seen at
    /// --workdir-view, default /workspace).
    #[arg(long, default_value = "none")]
    pub sandbox: String,
    /// An extra `docker run` argument for --sandbox docker's containers, one word each
    /// (repeatable), e.g. `--docker-arg=--network=host` so setup reaches the registries.
    #[arg(long = "docker-arg", allow_hyphen_values = true, value_name = "ARG")]
    pub docker_args: Vec<String>,
    /// The user setup, maintenance and COMMAND run as: `UID:GID`, `UID`, `NAME` or
    /// `NAME:GROUP` (overrides the spec's `user`). none/bwrap: resolved from this host's
    /// passwd/group, the caches are mounted owned by that user (squash_to_uid/gid) and the
    /// children drop to it; docker: passed to `docker run --user` (a user of the image).
    #[arg(long)]
    pub user: Option<String>,
    /// Seconds to wait for another run that is filling the same key (then hit its layer).
    #[arg(long, default_value_t = 300, allow_negative_numbers = true, value_parser = whole_number)]
    pub fill_wait: u64,
    /// FUSE passthrough for every cache's mount: `auto` (decide from the layer), `on` or `off`
    /// (overrides the spec's `passthrough`; only root gets passthrough, others keep no-open
    /// mode).
    #[arg(long)]
    pub passthrough: Option<String>,
    /// Mount a layer found only in the remote tier lazily (`true`: at once, file content
    /// fetched on first open) or pull it whole first (`false`); overrides `[remote] lazy` and
    /// LAYERCACHE_LAZY for this run.
    #[arg(long, value_name = "BOOL")]
    pub lazy: Option<bool>,
    /// The sandbox image id that enters the key's environment fingerprint [env:
    /// LAYERCACHE_IMAGE]
    #[arg(long)]
    pub image: Option<String>,
    /// The command to run once the caches are ready.
    #[arg(last = true)]
    pub command: Vec<String>,
}

/// `layercache key`.
#[derive(Debug, Args)]
pub struct KeyArgs {
    /// The spec (TOML or JSON); `-` reads standard input.
    #[arg(long)]
    pub spec: String,
    /// Where the workdir and the caches are.
    #[command(flatten)]
    pub paths: PathArgs,
    /// The sandbox image id that enters the key's environment fingerprint [env:
    /// LAYERCACHE_IMAGE]
    #[arg(long)]
    pub image: Option<String>,
}

/// `layercache sandbox-args`.
#[derive(Debug, Args)]
pub struct SandboxArgs {
    /// bwrap or docker.
    #[arg(long)]
    pub driver: String,
    /// The spec (TOML or JSON); `-` reads standard input. With --run: where each run's cache
    /// is seen and its environment (without: at its host mountpoint, no environment).
    #[arg(long, required_unless_present = "run")]
    pub spec: Option<String>,
    /// The id of an existing `layercache mount` run (repeatable): bind that run's mount
    /// instead of the spec's caches at /cache/<id>.
    #[arg(long = "run", value_name = "RUN_ID")]
    pub run: Vec<String>,
    /// Where the workdir and the caches are.
    #[command(flatten)]
    pub paths: PathArgs,
}

/// `layercache ls`, `stats`, `verify`.
#[derive(Debug, Args)]
pub struct LsArgs {
    /// Only this project (default: all).
    #[arg(long)]
    pub project: Option<String>,
    /// Print sizes as byte counts (for scripts) instead of binary units (`12.3 MiB`).
    #[arg(long)]
    pub bytes: bool,
}

/// `layercache gc`.
#[derive(Debug, Args)]
pub struct GcArgs {
    /// Maximum bytes the store may hold, e.g. 10G, 512M (binary units); `none` or 0: no limit.
    #[arg(long, allow_hyphen_values = true)]
    pub max_size: Option<String>,
    /// Maximum number of inodes (files, directories, symlinks) the store may hold; `none` or 0:
    /// no limit.
    #[arg(long, allow_hyphen_values = true)]
    pub max_inodes: Option<String>,
    /// Evict layers not mounted for this long, e.g. 30d, 12h, 90m, 3600s; `none` or 0: no limit.
    #[arg(long, allow_hyphen_values = true)]
    pub max_age: Option<String>,
    /// Print what would be evicted without removing anything.
    #[arg(long)]
    pub dry_run: bool,
    /// Print sizes as byte counts (for scripts) instead of binary units (`12.3 MiB`).
    #[arg(long)]
    pub bytes: bool,
}

/// `layercache clear`.
#[derive(Debug, Args)]
pub struct ClearArgs {
    /// The project whose layers are removed.
    #[arg(long)]
    pub project: String,
    /// Only this cache of the project (default: every cache).
    #[arg(long)]
    pub cache: Option<String>,
}

/// `layercache serve`: every page and API call needs a token (see `--token-file`).
#[derive(Debug, Args)]
pub struct ServeArgs {
    /// Address to listen on (IP:PORT; port 0 picks a free one). Anything but a loopback
    /// address needs --token-file.
    #[arg(long, default_value = "127.0.0.1:7878")]
    pub listen: String,
    /// A file whose first line is the token every request must carry (Authorization: Bearer
    /// TOKEN, or the cookie the login page sets); at least 16 characters, readable by nobody
    /// else. Without it the store's own token is used (<store>/v1/serve-token, 0600, made on
    /// the first start), and serve prints a login URL holding it.
    #[arg(long)]
    pub token_file: Option<PathBuf>,
}
