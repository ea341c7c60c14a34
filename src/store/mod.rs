//! The on-disk layer store (no FUSE in here: mounting goes through [`crate::overlay`]'s public
//! API only).
//!
//! ```text
//! <store>/v1/format.json                 {"format":1,"features":[…]}: refuse what we cannot read
//! <store>/v1/config.toml                 limits (see gc::DEFAULT_CONFIG_TOML)
//! <store>/v1/projects/<project>/         0700; nothing is shared across projects
//!     lock                               flock: shared while publishing, exclusive for gc/clear
//!     objects/<aa>/<blake3>-<meta>       immutable files (see object.rs)
//!     layers/<layer-id>/{tree,manifest.json,lease,used}
//!     caches/<cache>/keys/<key>          "<layer-id>\n", published with renameat2(NOREPLACE)
//!     caches/<cache>/fills/<key>.lock    fill lock of a key being filled
//!     runs/<run-id>/{upper,work,lease,run.json}   one mount's private state
//!     staging/                           layers being built; garbage after a crash
//!     quarantine/                        layers/objects `verify` found corrupt
//!     empty/                             the lowerdir of a miss
//! <store>/events.jsonl                   telemetry (written by crate::telemetry)
//! ```
//!
//! Keys follow GitHub actions/cache: a key is immutable once published (a second publish of
//! the same key reports `exists` and discards its copy); restore keys are prefixes tried in
//! order, the most recently created matching layer first.

pub mod cmd;
pub mod gc;
pub mod layer;
pub mod lease;
pub mod object;
pub mod promote;
use crate::sys;

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::fs;
use std::io;
use std::os::fd::OwnedFd;
use std::os::unix::fs::{DirBuilderExt, MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use parking_lot::Mutex;
use serde::{Deserialize, Serialize};

use crate::error::{Error, IoContext, Result};
use crate::ids::{CacheId, CacheKey, LayerId, ProjectId};
use crate::overlay;
use layer::{Layer, Manifest, now_ms, write_synced};
use lease::{Lease, Mode};
use object::ObjectStore;

/// On-disk format version of the store (the `v1/` directory and `format.json`).
pub const FORMAT: u32 = 1;
/// Feature flags recorded in `format.json`.
pub const FEATURES: &[&str] = &["blake3-objects", "meta-tagged-objects", "flock-leases"];
/// How long `commit`/`umount` wait for an overlay daemon to exit after unmounting.
pub const UNMOUNT_WAIT: Duration = Duration::from_secs(60);
/// A run directory whose lease is free is only treated as stale after this long (seconds since
/// its last change), so a `commit` in another process between unmount and promotion is safe.
pub const RUN_GRACE: Duration = Duration::from_secs(120);

/// The default store root: `/var/lib/layercache` as root, `$XDG_CACHE_HOME/layercache`
/// (falling back to `$HOME/.cache/layercache`) otherwise.
///
/// Errors: [`Error::Invalid`] when neither `XDG_CACHE_HOME` nor `HOME` is set for a non-root
/// user.
pub fn default_root() -> Result<PathBuf> {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } == 0 {
        return Ok(PathBuf::from("/var/lib/layercache"));
    }
    if let Some(x) = std::env::var_os("XDG_CACHE_HOME").filter(|x| !x.is_empty()) {
        return Ok(PathBuf::from(x).join("layercache"));
    }
    if let Some(h) = std::env::var_os("HOME").filter(|x| !x.is_empty()) {
        return Ok(PathBuf::from(h).join(".cache/layercache"));
    }
    Err(Error::invalid(
        "no store given: pass --store DIR or set LAYERCACHE_STORE (XDG_CACHE_HOME and HOME are unset)",
    ))
}

#[derive(Serialize, Deserialize)]
struct FormatFile {
    format: u32,
    features: Vec<String>,
}

/// An open store.
#[derive(Clone, Debug)]
pub struct Store {
    root: PathBuf,
    base: PathBuf,
    limits: gc::Limits,
    /// `[remote]` of config.toml, as written (remote tier, issue 14).
    remote_file: Option<crate::remote::config::RemoteFile>,
    /// The remote tier attached with [`Store::set_remote`], if any.
    remote: Option<std::sync::Arc<crate::remote::Remote>>,
}

/// The directories of one project inside the store.
#[derive(Clone, Debug)]
pub struct ProjectDirs {
    /// The project.
    pub project: ProjectId,
    /// `projects/<project>` (mode 0700).
    pub root: PathBuf,
}

impl ProjectDirs {
    fn sub(&self, s: &str) -> PathBuf {
        self.root.join(s)
    }
    /// The project's object store.
    pub fn objects(&self) -> ObjectStore {
        ObjectStore::new(self.sub("objects"))
    }
    /// `layers/`.
    pub fn layers(&self) -> PathBuf {
        self.sub("layers")
    }
    /// The layer `id` (may not exist).
    pub fn layer(&self, id: &LayerId) -> Layer {
        Layer::new(&self.layers(), id.clone())
    }
    /// `caches/<cache>/keys/`.
    pub fn keys_dir(&self, cache: &CacheId) -> PathBuf {
        self.sub("caches").join(cache.as_str()).join("keys")
    }
    /// `caches/<cache>/fills/<key>.lock`.
    pub fn fill_lock(&self, cache: &CacheId, key: &CacheKey) -> PathBuf {
        self.sub("caches")
            .join(cache.as_str())
            .join("fills")
            .join(format!("{key}.lock"))
    }
    /// `runs/`.
    pub fn runs(&self) -> PathBuf {
        self.sub("runs")
    }
    /// `staging/`.
    pub fn staging(&self) -> PathBuf {
        self.sub("staging")
    }
    /// `empty/`: the lowerdir of a miss.
    pub fn empty(&self) -> PathBuf {
        self.sub("empty")
    }
    /// `quarantine/`.
    pub fn quarantine(&self) -> PathBuf {
        self.sub("quarantine")
    }
    /// `lock`.
    pub fn lock(&self) -> PathBuf {
        self.sub("lock")
    }

    /// Reads the layer id published under `key` in `cache`, if any.
    ///
    /// Errors: [`Error::Io`] for an unreadable key file; [`Error::Failed`] for a corrupt one.
    pub fn read_key(&self, cache: &CacheId, key: &CacheKey) -> Result<Option<LayerId>> {
        let p = self.keys_dir(cache).join(key.as_str());
        match fs::read_to_string(&p) {
            Ok(s) => LayerId::new(s.trim())
                .map(Some)
                .map_err(|e| Error::Failed(format!("{}: corrupt key file: {e}", p.display()))),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(Error::io(&p, e)),
        }
    }

    /// All published keys of `cache`: `(key, layer id)`.
    ///
    /// Errors: [`Error::Io`] reading the keys directory.
    pub fn keys(&self, cache: &CacheId) -> Result<Vec<(CacheKey, LayerId)>> {
        let dir = self.keys_dir(cache);
        let mut out = Vec::new();
        for name in read_names(&dir)? {
            let Ok(key) = CacheKey::new(name) else {
                continue; // temporary files start with '.'
            };
            if let Some(id) = self.read_key(cache, &key)? {
                out.push((key, id));
            }
        }
        Ok(out)
    }

    /// All caches that have a directory under `caches/`.
    ///
    /// Errors: [`Error::Io`] reading `caches/`.
    pub fn caches(&self) -> Result<Vec<CacheId>> {
        Ok(read_names(&self.sub("caches"))?
            .into_iter()
            .filter_map(|n| CacheId::new(n).ok())
            .collect())
    }

    /// Every `(cache, key, layer)` of the project.
    ///
    /// Errors: as [`ProjectDirs::keys`].
    pub fn all_keys(&self) -> Result<Vec<(CacheId, CacheKey, LayerId)>> {
        let mut out = Vec::new();
        for c in self.caches()? {
            for (k, l) in self.keys(&c)? {
                out.push((c.clone(), k, l));
            }
        }
        Ok(out)
    }

    /// Ids of the layer directories under `layers/`.
    ///
    /// Errors: [`Error::Io`] reading `layers/`.
    pub fn layer_ids(&self) -> Result<Vec<LayerId>> {
        Ok(read_names(&self.layers())?
            .into_iter()
            .filter_map(|n| LayerId::new(n).ok())
            .collect())
    }

    /// Removes every key file that points at `id`; returns the keys removed.
    fn unpublish(&self, id: &LayerId) -> Result<Vec<CacheKey>> {
        let mut removed = Vec::new();
        for (c, k, l) in self.all_keys()? {
            if &l == id {
                let p = self.keys_dir(&c).join(k.as_str());
                match fs::remove_file(&p) {
                    Ok(()) => removed.push(k),
                    Err(e) if e.kind() == io::ErrorKind::NotFound => {}
                    Err(e) => return Err(Error::io(&p, e)),
                }
            }
        }
        Ok(removed)
    }

    /// Unpublishes and removes layer `id` under an exclusive lease on it; `false` (nothing
    /// changed) when the layer is mounted (its lease is held).
    ///
    /// Errors: [`Error::Io`] reading the keys or removing the layer.
    fn evict(&self, id: &LayerId) -> Result<bool> {
        let Some(_x) = Lease::try_acquire(&self.layer(id).lease_path(), Mode::Exclusive)? else {
            return Ok(false);
        };
        self.unpublish(id)?;
        self.remove_layer(id)?;
        Ok(true)
    }

    /// Moves layer `id` out of `layers/` (so no lookup can reach it) and deletes it.
    fn remove_layer(&self, id: &LayerId) -> Result<()> {
        let from = self.layers().join(id.as_str());
        let to = self.staging().join(format!("{id}.removing"));
        match fs::rename(&from, &to) {
            Ok(()) => remove_tree(&to),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
            Err(e) => Err(Error::io(&from, e)),
        }
    }
}

fn read_names(dir: &Path) -> Result<Vec<String>> {
    let rd = match fs::read_dir(dir) {
        Ok(r) => r,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(Error::io(dir, e)),
    };
    let mut out = Vec::new();
    for ent in rd {
        let ent = ent.at(dir)?;
        if let Some(n) = ent.file_name().to_str()
            && !n.starts_with('.')
        {
            out.push(n.to_string());
        }
    }
    out.sort();
    Ok(out)
}

/// `rm -rf` that tolerates a missing path and read-only directories inside.
fn remove_tree(p: &Path) -> Result<()> {
    match fs::remove_dir_all(p) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
        Err(e) if e.kind() == io::ErrorKind::PermissionDenied => {
            make_writable(p);
            fs::remove_dir_all(p).at(p)
        }
        Err(e) => Err(Error::io(p, e)),
    }
}

fn make_writable(p: &Path) {
    if let Ok(m) = fs::symlink_metadata(p)
        && m.is_dir()
    {
        let _ = fs::set_permissions(p, fs::Permissions::from_mode(m.mode() | 0o700));
        if let Ok(rd) = fs::read_dir(p) {
            for e in rd.flatten() {
                make_writable(&e.path());
            }
        }
    }
}

fn mkdir_mode(p: &Path, mode: u32) -> Result<()> {
    match fs::DirBuilder::new().mode(mode).create(p) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == io::ErrorKind::AlreadyExists => Ok(()),
        Err(e) => Err(Error::io(p, e)),
    }
}

/// What a lookup found (actions/cache semantics).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Lookup {
    /// The exact key is published.
    Hit {
        /// Its layer.
        layer: LayerId,
    },
    /// A restore-key prefix matched: the most recently created layer of the first prefix that
    /// matches anything.
    Restore {
        /// The published key that matched.
        matched_key: CacheKey,
        /// Its layer.
        layer: LayerId,
    },
    /// Nothing matched.
    Miss,
}

/// `hit`, `restore` or `miss`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum MountResult {
    /// The exact key's layer is mounted; nothing to fill.
    Hit,
    /// An older layer matched by a restore key is mounted; fill incrementally, then commit.
    Restore,
    /// An empty lower is mounted; fill, then commit.
    Miss,
}

/// Inputs of [`Store::mount`].
#[derive(Clone, Debug)]
pub struct MountRequest {
    /// Project (isolation unit).
    pub project: ProjectId,
    /// Cache id within the project.
    pub cache: CacheId,
    /// The primary key (published by a later commit).
    pub key: CacheKey,
    /// Restore-key prefixes, tried in order.
    pub restore_keys: Vec<CacheKey>,
    /// How long to wait for another run filling the same key before filling ourselves.
    pub fill_wait: Duration,
    /// Existing directory to mount on.
    pub mountpoint: PathBuf,
}

/// The JSON line `layercache mount` prints; also returned to `layercache run`.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct MountOutcome {
    /// hit | restore | miss.
    pub result: MountResult,
    /// Project.
    pub project: ProjectId,
    /// Cache id.
    pub cache: CacheId,
    /// The primary key.
    pub key: CacheKey,
    /// The key whose layer is mounted (the key itself on a hit), if any.
    pub matched_key: Option<CacheKey>,
    /// The mounted layer, if any (none on a miss).
    pub layer: Option<LayerId>,
    /// Apparent bytes of the mounted layer (0 on a miss).
    pub bytes: u64,
    /// Regular files in the mounted layer.
    pub files: u64,
    /// Canonical mountpoint.
    pub mountpoint: PathBuf,
    /// Run id (`runs/<run>`).
    pub run: String,
    /// True when this mount holds the key's fill lock (others wait for its commit).
    pub fill_lock: bool,
    /// What the remote tier pulled for this mount (a remote hit or restore), if anything.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub remote: Option<crate::remote::pull::PullReport>,
    /// Milliseconds spent waiting for another run's fill.
    pub waited_ms: u64,
    /// Milliseconds for the lookup (including any wait, and any remote pull).
    pub lookup_ms: u64,
    /// Milliseconds to mount (overlay ready).
    pub mount_ms: u64,
    /// Total milliseconds.
    pub total_ms: u64,
}

/// `published`, `exists` or `noop`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum CommitResult {
    /// A new layer was published under the key.
    Published,
    /// The key was already published (another run won); our copy was discarded and the
    /// published layer is mounted instead.
    Exists,
    /// The mount was a hit: nothing to promote.
    Noop,
}

/// The JSON line `layercache commit` prints; also returned to `layercache run`.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct CommitOutcome {
    /// published | exists | noop.
    pub result: CommitResult,
    /// The mount's primary key.
    pub key: CacheKey,
    /// The layer now published under the key (ours or the winner's).
    pub layer: Option<LayerId>,
    /// The lower layer promoted on top of (restore), if any.
    pub parent: Option<LayerId>,
    /// Apparent bytes of the promoted tree.
    pub bytes: u64,
    /// Regular files in the promoted tree.
    pub files: u64,
    /// Objects added to the store.
    pub new_objects: u64,
    /// Bytes added to the store.
    pub new_bytes: u64,
    /// Credential files dropped (paths relative to the mount).
    pub dropped: Vec<String>,
    /// Sockets/device nodes dropped.
    pub skipped: Vec<String>,
    /// The mount made afterwards (a hit on the published layer), when there was a remount.
    pub remount: Option<MountOutcome>,
    /// Milliseconds to unmount (daemon exit included).
    pub unmount_ms: u64,
    /// Milliseconds to build the new tree.
    pub promote_ms: u64,
    /// Milliseconds to sync and publish.
    pub publish_ms: u64,
    /// Total milliseconds.
    pub total_ms: u64,
    /// The automatic gc run, if the store was over a limit.
    pub gc: Option<GcReport>,
}

/// `runs/<run>/run.json`: how to find and undo a mount.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct RunRecord {
    /// Run id.
    pub run: String,
    /// Project.
    pub project: ProjectId,
    /// Cache.
    pub cache: CacheId,
    /// Primary key.
    pub key: CacheKey,
    /// Restore keys given at mount.
    pub restore_keys: Vec<CacheKey>,
    /// hit | restore | miss.
    pub result: MountResult,
    /// Key of the mounted layer.
    pub matched_key: Option<CacheKey>,
    /// Mounted (lower) layer.
    pub lower: Option<LayerId>,
    /// Canonical mountpoint.
    pub mountpoint: PathBuf,
    /// Overlay daemon pid (0 until mounted).
    pub daemon_pid: u32,
    /// The daemon's descriptor number holding the fill lock, if it holds one.
    pub fill_lock_fd: Option<i32>,
    /// Mount time, ms since the epoch.
    pub mounted_ms: u64,
}

impl RunRecord {
    /// The request of this run's mount, to mount again at once (no fill wait) at the same
    /// mountpoint.
    fn remount_request(&self) -> MountRequest {
        MountRequest {
            project: self.project.clone(),
            cache: self.cache.clone(),
            key: self.key.clone(),
            restore_keys: self.restore_keys.clone(),
            fill_wait: Duration::ZERO,
            mountpoint: self.mountpoint.clone(),
        }
    }
}

/// A store mount found by [`Store::store_mount`]: its canonical mountpoint and run record.
#[derive(Clone, Debug)]
pub struct StoreMount {
    mnt: PathBuf,
    rec: RunRecord,
    run_dir: PathBuf,
}

/// Result of a publish without a mount ([`Store::promote_dirs`]).
#[derive(Clone, Debug, Serialize)]
pub struct Published {
    /// published | exists.
    pub result: CommitResult,
    /// The layer published under the key (ours, or the winner's on `exists`).
    pub layer: LayerId,
    /// Our manifest (discarded on `exists`).
    pub manifest: Manifest,
    /// Sockets/devices skipped.
    pub skipped: Vec<String>,
    /// Milliseconds to build the tree.
    pub promote_ms: u64,
    /// Milliseconds to sync and publish.
    pub publish_ms: u64,
}

/// What [`Store::publish_built`] publishes.
#[derive(Clone, Debug)]
pub struct PublishSpec {
    /// Cache.
    pub cache: CacheId,
    /// The key to publish under.
    pub key: CacheKey,
    /// The layer id to use (a pulled layer keeps its remote id); `None` = a fresh one.
    pub layer: Option<LayerId>,
    /// The parent recorded in the manifest.
    pub parent: Option<LayerId>,
    /// Creation time for the manifest, ms since the epoch; `None` = now.
    pub created_ms: Option<u64>,
}

/// One row of `layercache ls`.
#[derive(Clone, Debug, Serialize)]
pub struct LayerInfo {
    /// Project.
    pub project: ProjectId,
    /// Cache.
    pub cache: CacheId,
    /// Layer id.
    pub layer: LayerId,
    /// Keys publishing it (empty: an orphan gc will remove).
    pub keys: Vec<CacheKey>,
    /// Parent layer.
    pub parent: Option<LayerId>,
    /// Created, ms since the epoch.
    pub created_ms: u64,
    /// Last mounted, ms since the epoch.
    pub last_used_ms: u64,
    /// Apparent bytes.
    pub bytes: u64,
    /// Regular files.
    pub files: u64,
    /// Mounted right now.
    pub in_use: bool,
}

/// Options of [`Store::gc`].
#[derive(Clone, Debug, Default)]
pub struct GcOptions {
    /// Override config.toml's byte limit (`Some(None)` = unlimited).
    pub max_size: Option<Option<u64>>,
    /// Override the inode limit.
    pub max_inodes: Option<Option<u64>>,
    /// Override the age limit.
    pub max_age: Option<Option<Duration>>,
    /// Report only.
    pub dry_run: bool,
}

/// What gc did (or would do, with `dry_run`).
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct GcReport {
    /// Report only.
    pub dry_run: bool,
    /// Usage before.
    pub before: UsageJson,
    /// Usage after.
    pub after: UsageJson,
    /// Layers evicted: `project/layer`.
    pub evicted: Vec<String>,
    /// Layers kept because mounted (that the limits would have evicted are not singled out).
    pub in_use: u64,
    /// Unreferenced objects removed.
    pub removed_objects: u64,
    /// Bytes freed by removing objects.
    pub freed_bytes: u64,
    /// Stale staging entries removed.
    pub removed_staging: u64,
    /// Stale run directories removed (daemon dead).
    pub removed_runs: u64,
    /// Unpublished (orphan) layers removed.
    pub removed_orphans: u64,
}

/// [`gc::Usage`] in a report.
#[derive(Clone, Copy, Debug, Default, Serialize, Deserialize)]
pub struct UsageJson {
    /// Bytes of objects.
    pub bytes: u64,
    /// Inodes.
    pub inodes: u64,
    /// Layers.
    pub layers: u64,
}

impl From<gc::Usage> for UsageJson {
    fn from(u: gc::Usage) -> Self {
        UsageJson {
            bytes: u.bytes,
            inodes: u.inodes,
            layers: u.layers,
        }
    }
}

/// What clear did.
#[derive(Clone, Debug, Default, Serialize)]
pub struct ClearReport {
    /// Layers removed.
    pub removed: Vec<LayerId>,
    /// Layers refused because mounted.
    pub in_use: Vec<LayerId>,
    /// Objects removed afterwards.
    pub removed_objects: u64,
}

/// What verify found.
#[derive(Clone, Debug, Default, Serialize)]
pub struct VerifyReport {
    /// Objects re-hashed.
    pub objects_checked: u64,
    /// Objects whose bytes do not match their name (`project/path`), moved to quarantine.
    pub bad_objects: Vec<String>,
    /// Layers that link a bad object: unpublished and moved to `quarantine/`.
    pub quarantined: Vec<String>,
}

/// Leases a mount holds in this process (in addition to the daemon's duplicates), by canonical
/// mountpoint, so an in-process commit keeps the fill lock through publish.
static HELD: Mutex<BTreeMap<PathBuf, HeldLeases>> = Mutex::new(BTreeMap::new());

#[derive(Debug, Default)]
struct HeldLeases {
    fill: Option<Lease>,
    others: Vec<Lease>,
}

fn ms_since(t: Instant) -> u64 {
    t.elapsed().as_millis() as u64
}

fn canonical_mountpoint(p: &Path) -> Result<PathBuf> {
    let c = fs::canonicalize(p).map_err(|e| {
        Error::invalid(format!(
            "mountpoint {}: {e} (want an existing directory)",
            p.display()
        ))
    })?;
    if !c.is_dir() {
        return Err(Error::invalid(format!(
            "mountpoint {}: not a directory",
            p.display()
        )));
    }
    Ok(c)
}

/// True when a layercache store (format file included) exists at `root`.
pub fn exists_at(root: &Path) -> bool {
    root.join("v1").join("format.json").is_file()
}

/// The store root of a run's private upper dir, `<root>/v1/projects/<project>/runs/<run>/upper`
/// (see the layout at the top of this module); `None` for any other path.
pub fn store_of_run_upper(upper: &Path) -> Option<PathBuf> {
    let names: Vec<&std::ffi::OsStr> = upper.iter().collect();
    let n = names.len();
    let shaped = n >= 7
        && names[n - 1] == "upper"
        && names[n - 3] == "runs"
        && names[n - 5] == "projects"
        && names[n - 6] == "v1";
    shaped.then(|| upper.ancestors().nth(6).map(Path::to_path_buf))?
}

/// The exit-2 error for a `--project` the store at `root` does not have: names it, the store
/// and the projects there are (`known`).
pub fn no_such_project(root: &Path, project: &ProjectId, known: &[String]) -> Error {
    Error::invalid(format!(
        "project {project}: no such project in the store at {} ({})",
        root.display(),
        one_of("projects", known)
    ))
}

/// `"<what>: a, b"`, or `"it has no <what> yet"` when `names` is empty.
fn one_of(what: &str, names: &[String]) -> String {
    if names.is_empty() {
        format!("it has no {what} yet")
    } else {
        format!("{what}: {}", names.join(", "))
    }
}

impl Store {
    /// Opens the store at `root` only if one exists there (see [`exists_at`]): `Ok(None)`
    /// instead of creating it, for commands that read or trim a store (a mistyped `--store`
    /// would otherwise look like an empty store).
    ///
    /// Errors: as [`Store::open`].
    pub fn open_existing(root: &Path) -> Result<Option<Store>> {
        if !exists_at(root) {
            return Ok(None);
        }
        Store::open(Some(root)).map(Some)
    }

    /// Opens (creating if needed) the store at `root`, or at [`default_root`] when `None`.
    /// Creates `v1/`, `format.json` and a default `config.toml`, and reads the limits.
    ///
    /// Errors: [`Error::Invalid`] for a store of another format or a bad config.toml (naming
    /// the file); [`Error::Io`] when the directories cannot be created.
    pub fn open(root: Option<&Path>) -> Result<Store> {
        let root = match root {
            Some(r) => r.to_path_buf(),
            None => default_root()?,
        };
        fs::create_dir_all(&root).at(&root)?;
        let base = root.join("v1");
        mkdir_mode(&base, 0o755)?;
        mkdir_mode(&base.join("projects"), 0o711)?;
        let fmt = base.join("format.json");
        if !fmt.exists() {
            let tmp = base.join(format!(".format-{}", sys::random_hex(6)));
            let body = serde_json::to_vec(&FormatFile {
                format: FORMAT,
                features: FEATURES.iter().map(|s| s.to_string()).collect(),
            })
            .map_err(|e| Error::Failed(e.to_string()))?;
            write_synced(&tmp, &body)?;
            match sys::rename_noreplace(&tmp, &fmt) {
                Ok(()) => {}
                Err(e) if e.raw_os_error() == Some(libc::EEXIST) => {
                    let _ = fs::remove_file(&tmp);
                }
                Err(e) => return Err(Error::io(&fmt, e)),
            }
        }
        let text = fs::read(&fmt).at(&fmt)?;
        let f: FormatFile = serde_json::from_slice(&text).map_err(|e| {
            Error::invalid(format!("{}: not a layercache store: {e}", fmt.display()))
        })?;
        if f.format != FORMAT {
            return Err(Error::invalid(format!(
                "{}: store format {} is not supported by this version (want {FORMAT})",
                fmt.display(),
                f.format
            )));
        }
        let cfg = base.join("config.toml");
        if !cfg.exists() {
            let tmp = base.join(format!(".config-{}", sys::random_hex(6)));
            write_synced(&tmp, gc::DEFAULT_CONFIG_TOML.as_bytes())?;
            if sys::rename_noreplace(&tmp, &cfg).is_err() {
                let _ = fs::remove_file(&tmp);
            }
        }
        let text = fs::read_to_string(&cfg).at(&cfg)?;
        let parsed: gc::ConfigFile =
            toml::from_str(&text).map_err(|e| Error::invalid(format!("{}: {e}", cfg.display())))?;
        let limits = parsed
            .limits
            .resolve()
            .map_err(|e| Error::invalid(format!("{}: {e}", cfg.display())))?;
        Ok(Store {
            root,
            base,
            limits,
            remote_file: parsed.remote,
            remote: None,
        })
    }

    /// `[remote]` of config.toml, if present (remote tier, issue 14).
    pub fn remote_file(&self) -> Option<&crate::remote::config::RemoteFile> {
        self.remote_file.as_ref()
    }

    /// Attaches the remote tier: `mount` then looks keys up there on a local miss and
    /// `commit` pushes what it publishes (see [`crate::remote`]).
    pub fn set_remote(&mut self, remote: std::sync::Arc<crate::remote::Remote>) {
        self.remote = Some(remote);
    }

    /// The attached remote tier, if any.
    pub fn remote(&self) -> Option<&std::sync::Arc<crate::remote::Remote>> {
        self.remote.as_ref()
    }

    /// The store root as given (`<store>`).
    pub fn root(&self) -> &Path {
        &self.root
    }

    /// The limits from config.toml.
    pub fn limits(&self) -> &gc::Limits {
        &self.limits
    }

    /// `<store>/events.jsonl`, for telemetry.
    pub fn events_path(&self) -> PathBuf {
        self.root.join("events.jsonl")
    }

    fn projects_dir(&self) -> PathBuf {
        self.base.join("projects")
    }

    /// The directories of `project`, created (mode 0700) if missing.
    ///
    /// Errors: [`Error::Io`] when they cannot be created.
    pub fn project(&self, project: &ProjectId) -> Result<ProjectDirs> {
        let pd = self.project_dirs(project);
        mkdir_mode(&pd.root, 0o700)?;
        for s in ["objects", "layers", "caches", "runs", "staging", "empty"] {
            mkdir_mode(&pd.root.join(s), 0o755)?;
        }
        Ok(pd)
    }

    fn project_dirs(&self, project: &ProjectId) -> ProjectDirs {
        ProjectDirs {
            project: project.clone(),
            root: self.projects_dir().join(project.as_str()),
        }
    }

    /// Existing projects (or just `only`, if it exists).
    ///
    /// Errors: [`Error::Io`] reading `projects/`.
    pub fn projects(&self, only: Option<&ProjectId>) -> Result<Vec<ProjectDirs>> {
        Ok(read_names(&self.projects_dir())?
            .into_iter()
            .filter_map(|n| ProjectId::new(n).ok())
            .filter(|p| only.is_none_or(|o| o == p))
            .map(|p| self.project_dirs(&p))
            .collect())
    }

    /// The projects a `--project` option selects: every project when `only` is `None`, else
    /// just `only`, which must exist.
    ///
    /// Errors: [`Error::Invalid`] naming `only` and listing the store's projects when it has
    /// no such project; [`Error::Io`] reading `projects/`.
    fn selected_projects(&self, only: Option<&ProjectId>) -> Result<Vec<ProjectDirs>> {
        let pds = self.projects(only)?;
        match only {
            Some(p) if pds.is_empty() => {
                let known: Vec<String> = self
                    .projects(None)?
                    .iter()
                    .map(|pd| pd.project.to_string())
                    .collect();
                Err(no_such_project(&self.root, p, &known))
            }
            _ => Ok(pds),
        }
    }

    /// Looks `key` up in (`project`, `cache`): exact key → [`Lookup::Hit`]; else each prefix
    /// of `restore_keys` in order, the most recently created matching layer first →
    /// [`Lookup::Restore`]; else [`Lookup::Miss`]. Scoped to the cache: a prefix never matches
    /// another cache's or project's keys. Keys whose layer is gone are ignored.
    ///
    /// Errors: [`Error::Io`] reading the keys directory.
    pub fn lookup(
        &self,
        pd: &ProjectDirs,
        cache: &CacheId,
        key: &CacheKey,
        restore_keys: &[CacheKey],
    ) -> Result<Lookup> {
        if let Some(id) = pd.read_key(cache, key)?
            && pd.layer(&id).tree().is_dir()
        {
            return Ok(Lookup::Hit { layer: id });
        }
        if restore_keys.is_empty() {
            return Ok(Lookup::Miss);
        }
        let keys = pd.keys(cache)?;
        for prefix in restore_keys {
            let best = keys
                .iter()
                .filter(|(k, _)| k.as_str().starts_with(prefix.as_str()))
                .filter_map(|(k, id)| {
                    let m = pd.layer(id).manifest().ok()?;
                    Some((m.created_ms, id.clone(), k.clone()))
                })
                .max();
            if let Some((_, layer, matched_key)) = best {
                return Ok(Lookup::Restore { matched_key, layer });
            }
        }
        Ok(Lookup::Miss)
    }

    /// Takes a shared lease on layer `id`; `None` if the layer is gone (evicted meanwhile).
    fn lease_layer(&self, pd: &ProjectDirs, id: &LayerId) -> Result<Option<Lease>> {
        let l = pd.layer(id);
        match Lease::acquire(&l.lease_path(), Mode::Shared) {
            Ok(lease) if l.tree().is_dir() => Ok(Some(lease)),
            Ok(_) => Ok(None),
            Err(Error::Io { source, .. }) if source.kind() == io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// `layercache mount`: looks the key up (see [`Store::lookup`]), waits up to
    /// `req.fill_wait` for a concurrent fill of the same key (then looks up again, usually a
    /// hit), and mounts the overlay (lower = the layer or an empty dir, upper = a fresh
    /// `runs/<run>/upper`). The mount is ready when this returns; its daemon holds the leases
    /// (shared on the lower layer, exclusive fill lock on a miss/restore) for its whole life.
    ///
    /// Errors: [`Error::Invalid`] for a bad or busy mountpoint; [`Error::Io`]/[`Error::Failed`]
    /// when the store or the mount fails (the run directory is removed then).
    pub fn mount(&self, req: &MountRequest) -> Result<MountOutcome> {
        let t0 = Instant::now();
        let mnt = canonical_mountpoint(&req.mountpoint)?;
        if overlay::is_mountpoint_busy(&mnt)? {
            return Err(Error::invalid(format!(
                "mountpoint {} is busy: something is already mounted there",
                mnt.display()
            )));
        }
        let pd = self.project(&req.project)?;
        let fill_path = pd.fill_lock(&req.cache, &req.key);
        if let Some(parent) = fill_path.parent() {
            fs::create_dir_all(parent).at(parent)?;
        }
        let deadline = t0 + req.fill_wait;
        let mut fill: Option<Lease> = None;
        let mut gave_up = false;
        let mut waited = Duration::ZERO;
        let (mut remote_tried, mut pulled) = (false, None);
        let (found, lower_lease) = loop {
            let found = self.lookup(&pd, &req.cache, &req.key, &req.restore_keys)?;
            if let Lookup::Hit { layer } = &found {
                match self.lease_layer(&pd, layer)? {
                    Some(l) => {
                        fill = None;
                        break (found, Some(l));
                    }
                    None => continue,
                }
            }
            if fill.is_none() && !gave_up {
                if let Some(l) = Lease::try_acquire(&fill_path, Mode::Exclusive)? {
                    fill = Some(l);
                    continue; // look up again under the lock: the filler may have published
                }
                let remaining = deadline.saturating_duration_since(Instant::now());
                if !remaining.is_zero() {
                    eprintln!(
                        "layercache: another run is filling {}/{} key {}; waiting up to {} s for it \
                         (--fill-wait)",
                        req.project,
                        req.cache,
                        req.key,
                        remaining.as_secs_f64().ceil()
                    );
                }
                let w = Instant::now();
                match Lease::acquire_timeout(&fill_path, Mode::Exclusive, remaining)? {
                    Some(l) => fill = Some(l),
                    None => {
                        eprintln!(
                            "layercache: the other fill of key {} did not finish in time; filling \
                             it here too (only one of the two is published)",
                            req.key
                        );
                        gave_up = true;
                    }
                }
                waited += w.elapsed();
                continue;
            }
            // Remote tier (issue 14): the exact key missed here; ask the remote once (under the
            // fill lock), and look up again once a pull has published the layer locally. A
            // local restore match is kept rather than pulling another restore match.
            if !remote_tried && let Some(r) = &self.remote {
                remote_tried = true;
                let restore: &[CacheKey] = match found {
                    Lookup::Restore { .. } => &[],
                    _ => &req.restore_keys,
                };
                pulled = r.fetch_for_mount(self, &pd, &req.cache, &req.key, restore);
                if pulled.is_some() {
                    continue;
                }
            }
            match &found {
                Lookup::Restore { layer, .. } => match self.lease_layer(&pd, layer)? {
                    Some(l) => break (found, Some(l)),
                    None => continue,
                },
                _ => break (found, None),
            }
        };
        let lookup_ms = ms_since(t0);
        let (result, matched_key, layer) = match found {
            Lookup::Hit { layer } => (MountResult::Hit, Some(req.key.clone()), Some(layer)),
            Lookup::Restore { matched_key, layer } => {
                (MountResult::Restore, Some(matched_key), Some(layer))
            }
            Lookup::Miss => (MountResult::Miss, None, None),
        };
        let mut out = self.mount_run(
            &pd,
            req,
            &mnt,
            result,
            matched_key,
            layer,
            lower_lease,
            fill,
            None,
        )?;
        out.waited_ms = waited.as_millis() as u64;
        out.remote = pulled;
        out.lookup_ms = lookup_ms;
        out.total_ms = ms_since(t0);
        Ok(out)
    }

    /// Creates (or reuses, when `reuse` names an existing run dir) a run and mounts it.
    #[allow(clippy::too_many_arguments)]
    fn mount_run(
        &self,
        pd: &ProjectDirs,
        req: &MountRequest,
        mnt: &Path,
        result: MountResult,
        matched_key: Option<CacheKey>,
        layer: Option<LayerId>,
        lower_lease: Option<Lease>,
        fill: Option<Lease>,
        reuse: Option<&Path>,
    ) -> Result<MountOutcome> {
        let t0 = Instant::now();
        let (run_id, run_dir) = match reuse {
            Some(d) => (
                d.file_name()
                    .map(|n| n.to_string_lossy().into_owned())
                    .unwrap_or_default(),
                d.to_path_buf(),
            ),
            None => {
                let id = format!("{:012x}-{}", now_ms(), sys::random_hex(6));
                let d = pd.runs().join(&id);
                mkdir_mode(&d, 0o700)?;
                (id, d)
            }
        };
        let cleanup = |e: Error| {
            if reuse.is_none() {
                let _ = remove_tree(&run_dir);
            }
            e
        };
        let upper = run_dir.join("upper");
        let work = run_dir.join("work");
        mkdir_mode(&upper, 0o755).map_err(cleanup)?;
        mkdir_mode(&work, 0o700).map_err(cleanup)?;
        let run_lease = Lease::acquire(&run_dir.join("lease"), Mode::Exclusive).map_err(cleanup)?;
        let (lower_dir, bytes, files) = match &layer {
            Some(id) => {
                let l = pd.layer(id);
                let m = l.manifest().map_err(cleanup)?;
                (l.tree(), m.counts.bytes, m.counts.files)
            }
            None => (pd.empty(), 0, 0),
        };
        let raw = overlay::options::RawOptions {
            lowerdirs: vec![lower_dir],
            upperdir: Some(upper),
            workdir: Some(work),
        };
        let cfg = overlay::options::validate(&raw, mnt).map_err(cleanup)?;
        let mut hold: Vec<OwnedFd> = Vec::new();
        let mut fill_lock_fd = None;
        if let Some(f) = &fill {
            let d = f.dup_fd().map_err(cleanup)?;
            fill_lock_fd = Some(std::os::fd::AsRawFd::as_raw_fd(&d));
            hold.push(d);
        }
        if let Some(l) = &lower_lease {
            hold.push(l.dup_fd().map_err(cleanup)?);
        }
        hold.push(run_lease.dup_fd().map_err(cleanup)?);
        let mut rec = RunRecord {
            run: run_id.clone(),
            project: pd.project.clone(),
            cache: req.cache.clone(),
            key: req.key.clone(),
            restore_keys: req.restore_keys.clone(),
            result,
            matched_key: matched_key.clone(),
            lower: layer.clone(),
            mountpoint: mnt.to_path_buf(),
            daemon_pid: 0,
            fill_lock_fd,
            mounted_ms: now_ms(),
        };
        write_record(&run_dir, &rec).map_err(cleanup)?;
        let tm = Instant::now();
        let pid = overlay::mount_daemon(&cfg, mnt, hold).map_err(cleanup)?;
        let mount_ms = ms_since(tm);
        rec.daemon_pid = pid;
        if let Err(e) = write_record(&run_dir, &rec) {
            let _ = overlay::unmount(mnt, Some(pid), UNMOUNT_WAIT);
            return Err(cleanup(e));
        }
        if let Some(id) = &layer
            && let Err(e) = pd.layer(id).touch_used()
        {
            tracing::warn!(error = %e, "could not record the layer's last use");
        }
        let mut others = vec![run_lease];
        others.extend(lower_lease);
        let has_fill = fill.is_some();
        HELD.lock()
            .insert(mnt.to_path_buf(), HeldLeases { fill, others });
        Ok(MountOutcome {
            result,
            project: pd.project.clone(),
            cache: req.cache.clone(),
            key: req.key.clone(),
            matched_key,
            layer,
            bytes,
            files,
            mountpoint: mnt.to_path_buf(),
            run: run_id,
            fill_lock: has_fill,
            remote: None,
            waited_ms: 0,
            lookup_ms: 0,
            mount_ms,
            total_ms: ms_since(t0),
        })
    }

    /// Finds the run mounted at `mnt` (canonical): the newest record naming it, preferring one
    /// whose daemon is alive.
    fn find_run(&self, mnt: &Path) -> Result<Option<(ProjectDirs, RunRecord, PathBuf)>> {
        let mut best: Option<(bool, u64, ProjectDirs, RunRecord, PathBuf)> = None;
        for pd in self.projects(None)? {
            for name in read_names(&pd.runs())? {
                let dir = pd.runs().join(&name);
                let Ok(text) = fs::read(dir.join("run.json")) else {
                    continue;
                };
                let Ok(rec) = serde_json::from_slice::<RunRecord>(&text) else {
                    continue;
                };
                if rec.mountpoint != mnt {
                    continue;
                }
                let alive = sys::pid_alive(rec.daemon_pid);
                let rank = (alive, rec.mounted_ms);
                if best.as_ref().is_none_or(|b| (b.0, b.1) < rank) {
                    best = Some((alive, rec.mounted_ms, pd.clone(), rec, dir));
                }
            }
        }
        Ok(best.map(|(_, _, pd, rec, dir)| (pd, rec, dir)))
    }

    /// `layercache commit`: promotes the merged view of the store mount at `mountpoint`
    /// (lower ⊕ upper) into a new layer published under the mount's key, then mounts the
    /// published layer there again as a hit (fresh upper), so the caller keeps a working
    /// mount. Sequence: syncfs, unmount (waits for the daemon), promote (hardlinks upper files
    /// into objects; no byte copies), publish (`renameat2(RENAME_NOREPLACE)`; `exists` when
    /// another run won), release the fill lock, gc if over a limit. After a hit: a no-op.
    ///
    /// Errors: [`Error::Invalid`] when `mountpoint` is not a store mount; [`Error::Failed`]
    /// when it is busy (nothing changed). If promotion fails (e.g. `ENOSPC`) nothing is
    /// published, the store is unchanged and the previous mount (same upper) is restored.
    pub fn commit(&self, mountpoint: &Path) -> Result<CommitOutcome> {
        let t0 = Instant::now();
        let mnt = canonical_mountpoint(mountpoint)?;
        let (pd, rec, run_dir) = self.find_run(&mnt)?.ok_or_else(|| {
            Error::invalid(format!(
                "{}: not a layercache store mount (see `layercache ls`)",
                mnt.display()
            ))
        })?;
        if rec.result == MountResult::Hit {
            return Ok(CommitOutcome {
                result: CommitResult::Noop,
                key: rec.key.clone(),
                layer: rec.lower.clone(),
                parent: None,
                bytes: 0,
                files: 0,
                new_objects: 0,
                new_bytes: 0,
                dropped: vec![],
                skipped: vec![],
                remount: None,
                unmount_ms: 0,
                promote_ms: 0,
                publish_ms: 0,
                total_ms: ms_since(t0),
                gc: None,
            });
        }
        let fill_path = pd.fill_lock(&rec.cache, &rec.key);
        // Keep the fill lock across unmount → publish: ours in-process, or the daemon's.
        let mut held = HELD.lock().remove(&mnt).unwrap_or_default();
        if held.fill.is_none()
            && let Some(fd) = rec.fill_lock_fd
        {
            held.fill = Lease::adopt(rec.daemon_pid, fd, &fill_path);
        }
        // Mark the run as recently active (gc's grace period).
        let _ = fs::File::open(run_dir.join("lease"))
            .and_then(|f| f.set_modified(std::time::SystemTime::now()));
        let _ = sys::syncfs(&mnt);
        let tu = Instant::now();
        if let Err(e) = unmount_and_wait(&mnt, rec.daemon_pid) {
            HELD.lock().insert(mnt.clone(), held);
            return Err(e);
        }
        let unmount_ms = ms_since(tu);
        if held.fill.is_none() && rec.fill_lock_fd.is_some() {
            held.fill = Lease::try_acquire(&fill_path, Mode::Exclusive)?;
        }
        let parent = rec.lower.as_ref().map(|id| pd.layer(id));
        let published = match self.promote_into(
            &pd,
            &rec.cache,
            &rec.key,
            parent.as_ref(),
            Some(&run_dir.join("upper")),
        ) {
            Ok(p) => p,
            Err(e) => {
                // Nothing was published: put the previous mount back (same lower and upper).
                let req = rec.remount_request();
                let lower_lease = match &rec.lower {
                    Some(id) => self.lease_layer(&pd, id)?,
                    None => None,
                };
                drop(held.others);
                if let Err(e2) = self.mount_run(
                    &pd,
                    &req,
                    &mnt,
                    rec.result,
                    rec.matched_key.clone(),
                    rec.lower.clone(),
                    lower_lease,
                    held.fill,
                    Some(&run_dir),
                ) {
                    eprintln!(
                        "layercache: the commit failed and {} could not be mounted again ({e2}); \
                         its files stay in the run directory until gc",
                        mnt.display()
                    );
                }
                return Err(e);
            }
        };
        // The old run is done: its upper's files now live in the store.
        drop(held.others);
        remove_tree(&run_dir)?;
        let req = rec.remount_request();
        let remount = match self.lease_layer(&pd, &published.layer)? {
            Some(lease) => Some(self.mount_run(
                &pd,
                &req,
                &mnt,
                MountResult::Hit,
                Some(rec.key.clone()),
                Some(published.layer.clone()),
                Some(lease),
                None,
                None,
            )?),
            None => None,
        };
        drop(held.fill);
        // Remote tier (issue 14): push what this commit published, in the background (a run's
        // exit or `layercache commit` waits for it: Remote::wait_pushes).
        if published.result == CommitResult::Published
            && let Some(r) = &self.remote
        {
            r.push_background(
                pd.clone(),
                rec.cache.clone(),
                rec.key.clone(),
                published.layer.clone(),
            );
        }
        let gc = self.auto_gc();
        let m = &published.manifest;
        Ok(CommitOutcome {
            result: published.result,
            key: rec.key,
            layer: Some(published.layer.clone()),
            parent: rec.lower,
            bytes: m.counts.bytes,
            files: m.counts.files,
            new_objects: m.counts.new_objects,
            new_bytes: m.counts.new_bytes,
            dropped: m.dropped.clone(),
            skipped: published.skipped.clone(),
            remount,
            unmount_ms,
            promote_ms: published.promote_ms,
            publish_ms: published.publish_ms,
            total_ms: ms_since(t0),
            gc,
        })
    }

    /// Runs gc when the store is over a byte or inode limit; logs and swallows errors.
    fn auto_gc(&self) -> Option<GcReport> {
        match self.quick_usage() {
            Ok(u) if gc::over_limits(&u, &self.limits) => match self.gc(&GcOptions::default()) {
                Ok(r) => Some(r),
                Err(e) => {
                    tracing::warn!(error = %e, "automatic gc failed");
                    None
                }
            },
            Ok(_) => None,
            Err(e) => {
                tracing::warn!(error = %e, "could not measure the store");
                None
            }
        }
    }

    /// Cheap usage estimate: object bytes and count (each once) plus the directories,
    /// symlinks and fifos recorded in the manifests.
    ///
    /// Errors: [`Error::Io`] reading the store.
    pub fn quick_usage(&self) -> Result<gc::Usage> {
        let mut u = gc::Usage::default();
        for pd in self.projects(None)? {
            for (_, _, meta) in pd.objects().list()? {
                u.bytes += meta.len();
                u.inodes += 1;
            }
            for id in pd.layer_ids()? {
                if let Ok(m) = pd.layer(&id).manifest() {
                    u.layers += 1;
                    u.inodes += m.counts.dirs + m.counts.symlinks + m.counts.other;
                }
            }
        }
        Ok(u)
    }

    /// Builds lower ⊕ `upper` into a new layer and publishes it under `key` — what `commit`
    /// does after unmounting, without any mount (for tests, benchmarks and tools). `parent`
    /// is the lower layer id, if any.
    ///
    /// The upper's regular files become objects **by hardlink** (same inode): the caller must
    /// not modify them afterwards (delete the upper, as `commit` does, or replace files by
    /// rename, never write in place).
    ///
    /// Errors: as [`Store::commit`]'s promotion: nothing is published on error.
    pub fn promote_dirs(
        &self,
        project: &ProjectId,
        cache: &CacheId,
        key: &CacheKey,
        parent: Option<&LayerId>,
        upper: Option<&Path>,
    ) -> Result<Published> {
        let pd = self.project(project)?;
        let parent = parent.map(|id| pd.layer(id));
        if let Some(p) = &parent
            && !p.tree().is_dir()
        {
            return Err(Error::invalid(format!(
                "layer {} does not exist in project {project}",
                p.id
            )));
        }
        self.promote_into(&pd, cache, key, parent.as_ref(), upper)
    }

    fn promote_into(
        &self,
        pd: &ProjectDirs,
        cache: &CacheId,
        key: &CacheKey,
        parent: Option<&Layer>,
        upper: Option<&Path>,
    ) -> Result<Published> {
        let spec = PublishSpec {
            cache: cache.clone(),
            key: key.clone(),
            layer: None,
            parent: parent.map(|p| p.id.clone()),
            created_ms: None,
        };
        let lower = parent.map(|p| p.tree());
        self.publish_built(pd, &spec, |objects, tree| {
            promote::build_tree(objects, lower.as_deref(), upper, tree)
        })
    }

    /// Builds a layer tree with `build` (given the project's objects and the tree path to
    /// create, `staging/<id>/tree`) and publishes it under `spec.key` the way every layer is
    /// published: manifest, syncfs, rename into `layers/`, key with `renameat2(NOREPLACE)`
    /// (`exists` when another run won; our copy is then discarded). The project lock is held
    /// shared throughout, so gc never sweeps objects `build` has created but not linked yet.
    /// Used by promotion and by the remote tier's pull (issue 14).
    ///
    /// Errors: whatever `build` returns (it must remove the objects it created, as
    /// `promote::build_tree` does) and [`Error::Io`] publishing; nothing is published on error
    /// and the staging directory is removed.
    pub fn publish_built(
        &self,
        pd: &ProjectDirs,
        spec: &PublishSpec,
        build: impl FnOnce(&ObjectStore, &Path) -> Result<promote::TreeStats>,
    ) -> Result<Published> {
        let (cache, key) = (&spec.cache, &spec.key);
        let _shared = Lease::acquire(&pd.lock(), Mode::Shared)?;
        let tp = Instant::now();
        let id = spec.layer.clone().unwrap_or_else(layer::new_layer_id);
        let stage = Layer::new(&pd.staging(), id.clone());
        mkdir_mode(&stage.dir, 0o755)?;
        let objects = pd.objects();
        let built = build(&objects, &stage.tree());
        let stats = match built {
            Ok(s) => s,
            Err(e) => {
                let _ = remove_tree(&stage.dir);
                // build_tree removed the objects it created.
                return Err(e);
            }
        };
        let undo = |e: Error, stats: &promote::TreeStats, dir: &Path| {
            let _ = remove_tree(dir);
            promote::undo_created_objects(stats);
            e
        };
        let promote_ms = ms_since(tp);
        let tpub = Instant::now();
        let manifest = Manifest {
            format: layer::MANIFEST_FORMAT,
            layer: id.clone(),
            project: pd.project.clone(),
            cache: cache.clone(),
            key: key.clone(),
            parent: spec.parent.clone(),
            created_ms: spec.created_ms.unwrap_or_else(now_ms),
            counts: stats.counts,
            dropped: stats.dropped.clone(),
        };
        let prep = (|| -> Result<()> {
            stage.write_manifest(&manifest)?;
            fs::File::create(stage.lease_path()).at(stage.lease_path())?;
            stage.touch_used()?;
            // One syncfs makes every new object, directory and the manifest durable.
            sys::syncfs(&stage.dir).at(&stage.dir)
        })();
        if let Err(e) = prep {
            return Err(undo(e, &stats, &stage.dir));
        }
        let final_layer = pd.layer(&id);
        if let Err(e) = fs::rename(&stage.dir, &final_layer.dir) {
            return Err(undo(Error::io(&final_layer.dir, e), &stats, &stage.dir));
        }
        let _ = sys::fsync_dir(&pd.layers());
        let published = (|| -> Result<Option<LayerId>> {
            let keys = pd.keys_dir(cache);
            fs::create_dir_all(&keys).at(&keys)?;
            let tmp = keys.join(format!(".tmp-{}", sys::random_hex(8)));
            write_synced(&tmp, format!("{id}\n").as_bytes())?;
            let dst = keys.join(key.as_str());
            match sys::rename_noreplace(&tmp, &dst) {
                Ok(()) => {
                    sys::fsync_dir(&keys).at(&keys)?;
                    Ok(None)
                }
                Err(e) if e.raw_os_error() == Some(libc::EEXIST) => {
                    let _ = fs::remove_file(&tmp);
                    let winner = pd
                        .read_key(cache, key)?
                        .ok_or_else(|| Error::Failed(format!("{}: vanished", dst.display())))?;
                    Ok(Some(winner))
                }
                Err(e) => {
                    let _ = fs::remove_file(&tmp);
                    Err(Error::io(&dst, e))
                }
            }
        })();
        let (result, layer) = match published {
            Ok(None) => (CommitResult::Published, id),
            Ok(Some(winner)) => {
                // Someone else published the key first: ours is discarded (actions/cache:
                // keys are immutable). Its new objects become unreferenced; gc sweeps them.
                remove_tree(&final_layer.dir)?;
                (CommitResult::Exists, winner)
            }
            Err(e) => return Err(undo(e, &stats, &final_layer.dir)),
        };
        Ok(Published {
            result,
            layer,
            manifest,
            skipped: stats.skipped,
            promote_ms,
            publish_ms: ms_since(tpub),
        })
    }

    /// The store mount at `mountpoint` (a mount made by `layercache mount`/`run` in this
    /// store), found by one scan of the run records; `None` when `mountpoint` is not one (or
    /// does not resolve to a directory). Unmount it with [`Store::umount_run`].
    ///
    /// Errors: [`Error::Io`] reading the store's run records.
    pub fn store_mount(&self, mountpoint: &Path) -> Result<Option<StoreMount>> {
        let Ok(mnt) = canonical_mountpoint(mountpoint) else {
            return Ok(None);
        };
        Ok(self
            .find_run(&mnt)?
            .map(|(_, rec, run_dir)| StoreMount { mnt, rec, run_dir }))
    }

    /// `layercache umount`: unmounts the store mount at `mountpoint` (waiting for its daemon)
    /// and deletes its run directory (the private upper is discarded).
    ///
    /// Errors: [`Error::Invalid`] when it is not a store mount; [`Error::Failed`] when busy.
    pub fn umount(&self, mountpoint: &Path) -> Result<()> {
        let m = self.store_mount(mountpoint)?.ok_or_else(|| {
            Error::invalid(format!(
                "{}: not a layercache store mount",
                mountpoint.display()
            ))
        })?;
        self.umount_run(m)
    }

    /// Unmounts a store mount found by [`Store::store_mount`] (waiting for its daemon) and
    /// deletes its run directory (the private upper is discarded).
    ///
    /// Errors: [`Error::Failed`] when busy (nothing changed); [`Error::Io`] removing the run.
    pub fn umount_run(&self, m: StoreMount) -> Result<()> {
        unmount_and_wait(&m.mnt, m.rec.daemon_pid)?;
        HELD.lock().remove(&m.mnt);
        remove_tree(&m.run_dir)
    }

    /// `layercache ls`: every layer (of `project`, or all), newest first.
    ///
    /// Errors: [`Error::Invalid`] for an unknown project; [`Error::Io`] reading the store.
    pub fn list(&self, project: Option<&ProjectId>) -> Result<Vec<LayerInfo>> {
        let mut out = Vec::new();
        for pd in self.selected_projects(project)? {
            let mut keys: HashMap<LayerId, Vec<CacheKey>> = HashMap::new();
            for (_, k, l) in pd.all_keys()? {
                keys.entry(l).or_default().push(k);
            }
            for id in pd.layer_ids()? {
                let l = pd.layer(&id);
                let Ok(m) = l.manifest() else { continue };
                let last = l
                    .last_used()
                    .duration_since(std::time::UNIX_EPOCH)
                    .map(|d| d.as_millis() as u64)
                    .unwrap_or(0);
                out.push(LayerInfo {
                    project: pd.project.clone(),
                    cache: m.cache,
                    keys: keys.remove(&id).unwrap_or_default(),
                    parent: m.parent,
                    created_ms: m.created_ms,
                    last_used_ms: last,
                    bytes: m.counts.bytes,
                    files: m.counts.files,
                    in_use: lease::is_held(&l.lease_path(), Mode::Exclusive)?,
                    layer: id,
                });
            }
        }
        out.sort_by_key(|l| std::cmp::Reverse(l.created_ms));
        Ok(out)
    }

    /// Takes every project's lock exclusively (sorted order), for gc/clear/verify.
    fn lock_projects(&self, pds: &[ProjectDirs]) -> Result<Vec<Lease>> {
        pds.iter()
            .map(|pd| Lease::acquire(&pd.lock(), Mode::Exclusive))
            .collect()
    }

    /// `layercache gc`: removes stale staging and run directories (daemon dead), unpublished
    /// layers, then evicts least-recently-mounted layers (never a mounted one) until under the
    /// limits (config.toml, overridden by `opts`), and removes objects no layer references.
    ///
    /// Errors: [`Error::Io`] when the store cannot be read or changed.
    pub fn gc(&self, opts: &GcOptions) -> Result<GcReport> {
        let limits = gc::Limits {
            max_size: opts.max_size.unwrap_or(self.limits.max_size),
            max_inodes: opts.max_inodes.unwrap_or(self.limits.max_inodes),
            max_age: opts.max_age.unwrap_or(self.limits.max_age),
        };
        let dry = opts.dry_run;
        let pds = self.projects(None)?;
        let _locks = self.lock_projects(&pds)?;
        let mut report = GcReport {
            dry_run: dry,
            ..GcReport::default()
        };
        // 1. Garbage from crashes: staging (no promotion runs: we hold the locks) and runs.
        for pd in &pds {
            for name in read_names(&pd.staging())? {
                report.removed_staging += 1;
                if !dry {
                    remove_tree(&pd.staging().join(name))?;
                }
            }
            for name in read_names(&pd.runs())? {
                let dir = pd.runs().join(&name);
                if self.run_is_stale(&dir)? {
                    report.removed_runs += 1;
                    if !dry {
                        remove_tree(&dir)?;
                    }
                }
            }
        }
        // 2. Candidates; unpublished layers are orphans of a crash between rename and publish.
        let mut cands = Vec::new();
        let mut where_: Vec<(usize, LayerId)> = Vec::new();
        for (pi, pd) in pds.iter().enumerate() {
            let published: HashSet<LayerId> =
                pd.all_keys()?.into_iter().map(|(_, _, l)| l).collect();
            for id in pd.layer_ids()? {
                let l = pd.layer(&id);
                let in_use = lease::is_held(&l.lease_path(), Mode::Exclusive)?;
                if !published.contains(&id) && !in_use {
                    report.removed_orphans += 1;
                    if !dry {
                        pd.remove_layer(&id)?;
                    }
                    continue;
                }
                let (objects, own_inodes) = tree_usage(&l.tree())?;
                cands.push(gc::Candidate {
                    index: where_.len(),
                    idle: l.idle(),
                    in_use,
                    objects,
                    own_inodes,
                    project: pi,
                });
                where_.push((pi, id));
            }
        }
        report.in_use = cands.iter().filter(|c| c.in_use).count() as u64;
        let before = gc::usage(&cands);
        report.before = before.into();
        let (evict, after) = gc::plan(&cands, &limits);
        report.after = after.into();
        for i in evict {
            let (pi, id) = &where_[i];
            let pd = &pds[*pi];
            // Re-check under an exclusive lease: a mount may have started meanwhile.
            if dry || pd.evict(id)? {
                report.evicted.push(format!("{}/{id}", pd.project));
            }
        }
        // 3. Objects no tree links any more.
        for pd in &pds {
            let (n, b) = pd.objects().sweep_unreferenced(dry)?;
            report.removed_objects += n;
            report.freed_bytes += b;
        }
        Ok(report)
    }

    /// A run dir is stale when nobody holds its lease, its daemon is gone, nothing is mounted
    /// at its mountpoint, and it has not changed for [`RUN_GRACE`].
    fn run_is_stale(&self, dir: &Path) -> Result<bool> {
        let lease_path = dir.join("lease");
        let recent = fs::metadata(&lease_path)
            .or_else(|_| fs::metadata(dir))
            .and_then(|m| m.modified())
            .map(|t| t.elapsed().unwrap_or_default() < RUN_GRACE)
            .unwrap_or(false);
        if recent || lease::is_held(&lease_path, Mode::Exclusive)? {
            return Ok(false);
        }
        if let Ok(text) = fs::read(dir.join("run.json"))
            && let Ok(rec) = serde_json::from_slice::<RunRecord>(&text)
            && (sys::pid_alive(rec.daemon_pid) || overlay::is_mountpoint_busy(&rec.mountpoint)?)
        {
            return Ok(false);
        }
        Ok(true)
    }

    /// `layercache clear`: removes the layers of `project` (or of one `cache` of it) and the
    /// objects only they used. Mounted layers are refused and listed in the report.
    ///
    /// Errors: [`Error::Invalid`] for an unknown project, or a cache the project has never had
    /// (no `caches/<cache>/` and no layer of it); [`Error::Io`] on store errors.
    pub fn clear(&self, project: &ProjectId, cache: Option<&CacheId>) -> Result<ClearReport> {
        let mut pds = self.selected_projects(Some(project))?;
        let pd = pds.remove(0);
        if let Some(c) = cache {
            let mut known: BTreeSet<CacheId> = pd.caches()?.into_iter().collect();
            for id in pd.layer_ids()? {
                if let Ok(m) = pd.layer(&id).manifest() {
                    known.insert(m.cache);
                }
            }
            if !known.contains(c) {
                let known: Vec<String> = known.iter().map(|c| c.to_string()).collect();
                return Err(Error::invalid(format!(
                    "cache {c}: project {project} has no such cache ({})",
                    one_of("caches", &known)
                )));
            }
        }
        let _lock = Lease::acquire(&pd.lock(), Mode::Exclusive)?;
        let mut report = ClearReport::default();
        for id in pd.layer_ids()? {
            let l = pd.layer(&id);
            if let Some(c) = cache {
                match l.manifest() {
                    Ok(m) if &m.cache == c => {}
                    _ => continue,
                }
            }
            if pd.evict(&id)? {
                report.removed.push(id);
            } else {
                report.in_use.push(id);
            }
        }
        // Keys whose layer is gone (a crash mid-eviction) go too.
        for (c, k, l) in pd.all_keys()? {
            if cache.is_none_or(|x| x == &c) && !pd.layer(&l).dir.exists() {
                let _ = fs::remove_file(pd.keys_dir(&c).join(k.as_str()));
            }
        }
        report.removed_objects = pd.objects().sweep_unreferenced(false)?.0;
        Ok(report)
    }

    /// `layercache verify`: re-hashes every object (of `project`, or all); an object whose
    /// bytes do not match its name is moved to `quarantine/objects/`, and every layer linking
    /// it is unpublished and moved to `quarantine/` (a later mount of its key misses and
    /// refills).
    ///
    /// Errors: [`Error::Invalid`] for an unknown project; [`Error::Io`] when the store cannot
    /// be read or changed.
    pub fn verify(&self, project: Option<&ProjectId>) -> Result<VerifyReport> {
        let pds = self.selected_projects(project)?;
        let _locks = self.lock_projects(&pds)?;
        let mut report = VerifyReport::default();
        for pd in &pds {
            let mut bad: HashSet<(u64, u64)> = HashSet::new();
            let mut bad_paths = Vec::new();
            for (path, id, meta) in pd.objects().list()? {
                report.objects_checked += 1;
                let ok = object::hash_file(&path).map(|h| h == id).unwrap_or(false);
                if !ok {
                    bad.insert((meta.dev(), meta.ino()));
                    bad_paths.push(path);
                }
            }
            if bad.is_empty() {
                continue;
            }
            let q = pd.quarantine();
            fs::create_dir_all(q.join("objects")).at(&q)?;
            for id in pd.layer_ids()? {
                let l = pd.layer(&id);
                if tree_links_any(&l.tree(), &bad)? {
                    pd.unpublish(&id)?;
                    let to = q.join(id.as_str());
                    fs::rename(&l.dir, &to).at(&l.dir)?;
                    report.quarantined.push(format!("{}/{id}", pd.project));
                }
            }
            for p in bad_paths {
                let name = p.file_name().map(|n| n.to_owned()).unwrap_or_default();
                fs::rename(&p, q.join("objects").join(&name)).at(&p)?;
                report
                    .bad_objects
                    .push(format!("{}/{}", pd.project, name.to_string_lossy()));
            }
        }
        Ok(report)
    }
}

/// Unmounts `mnt` (if mounted) and waits until its daemon `pid` has exited, so the upper dir
/// is quiescent. Waits on a pidfd: the daemon counts as gone once it exits, even while its
/// new parent (init) has not reaped it yet.
///
/// Errors: as [`overlay::unmount`] (EBUSY → [`Error::Failed`], nothing changed).
fn unmount_and_wait(mnt: &Path, pid: u32) -> Result<()> {
    let daemon = (pid != 0).then_some(pid);
    let gone = if overlay::is_mountpoint_busy(mnt)? {
        overlay::unmount(mnt, daemon, UNMOUNT_WAIT)?
    } else {
        // Already unmounted (by `umount`, say): its daemon may still be finishing.
        daemon
            .and_then(|pid| Some((pid, sys::pidfd_open(pid).ok()?)))
            .is_none_or(|(pid, fd)| overlay::wait_pidfd(&fd, pid, UNMOUNT_WAIT))
    };
    if !gone {
        return Err(Error::Failed(format!(
            "{}: overlay daemon {pid} did not exit within {}s of unmounting",
            mnt.display(),
            UNMOUNT_WAIT.as_secs()
        )));
    }
    Ok(())
}

/// Writes `run.json` atomically (temp file + rename).
fn write_record(run_dir: &Path, rec: &RunRecord) -> Result<()> {
    let tmp = run_dir.join(".run.json.tmp");
    let body = serde_json::to_vec_pretty(rec).map_err(|e| Error::Failed(e.to_string()))?;
    fs::write(&tmp, body).at(&tmp)?;
    let dst = run_dir.join("run.json");
    fs::rename(&tmp, &dst).at(&dst)
}

/// Regular files of a tree as `(inode, size)` and the count of its other inodes (directories,
/// symlinks, fifos).
fn tree_usage(root: &Path) -> Result<(Vec<(u64, u64)>, u64)> {
    let mut objs = Vec::new();
    let mut own = 0u64;
    let mut stack = vec![root.to_path_buf()];
    while let Some(dir) = stack.pop() {
        own += 1;
        let rd = match fs::read_dir(&dir) {
            Ok(r) => r,
            Err(e) if e.kind() == io::ErrorKind::NotFound => continue,
            Err(e) => return Err(Error::io(&dir, e)),
        };
        for ent in rd {
            let ent = ent.at(&dir)?;
            let m = ent.metadata().at(ent.path())?;
            if m.is_dir() {
                stack.push(ent.path());
            } else if m.is_file() {
                objs.push((m.ino(), m.len()));
            } else {
                own += 1;
            }
        }
    }
    Ok((objs, own))
}

fn tree_links_any(root: &Path, bad: &HashSet<(u64, u64)>) -> Result<bool> {
    let mut stack = vec![root.to_path_buf()];
    while let Some(dir) = stack.pop() {
        for ent in fs::read_dir(&dir).at(&dir)? {
            let ent = ent.at(&dir)?;
            let m = ent.metadata().at(ent.path())?;
            if m.is_dir() {
                stack.push(ent.path());
            } else if m.is_file() && bad.contains(&(m.dev(), m.ino())) {
                return Ok(true);
            }
        }
    }
    Ok(false)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn eight_threads_race_to_publish_one_key() {
        let t = tempfile::tempdir().unwrap();
        let store = Store::open(Some(&t.path().join("store"))).unwrap();
        let (p, c, k) = (
            ProjectId::new("p").unwrap(),
            CacheId::new("c").unwrap(),
            CacheKey::new("k").unwrap(),
        );
        let results: Vec<Published> = std::thread::scope(|s| {
            let hs: Vec<_> = (0..8)
                .map(|i| {
                    let (store, p, c, k) = (&store, &p, &c, &k);
                    let upper = t.path().join(format!("upper{i}"));
                    s.spawn(move || {
                        for f in 0..50 {
                            let d = upper.join(format!("d{}", f % 5));
                            fs::create_dir_all(&d).unwrap();
                            fs::write(d.join(format!("f{f}")), format!("{i}:{f}")).unwrap();
                        }
                        store.promote_dirs(p, c, k, None, Some(&upper)).unwrap()
                    })
                })
                .collect();
            hs.into_iter().map(|h| h.join().unwrap()).collect()
        });
        let winners: Vec<_> = results
            .iter()
            .filter(|r| r.result == CommitResult::Published)
            .collect();
        assert_eq!(winners.len(), 1);
        assert!(results.iter().all(|r| r.layer == winners[0].layer));
        let pd = store.project(&p).unwrap();
        assert_eq!(pd.layer_ids().unwrap(), vec![winners[0].layer.clone()]);
        assert_eq!(
            store.lookup(&pd, &c, &k, &[]).unwrap(),
            Lookup::Hit {
                layer: winners[0].layer.clone()
            }
        );
        // Once the uppers are gone (commit deletes the run), the losers' objects are
        // unreferenced garbage for gc; the winner's stay.
        for i in 0..8 {
            fs::remove_dir_all(t.path().join(format!("upper{i}"))).unwrap();
        }
        let r = store.gc(&GcOptions::default()).unwrap();
        assert_eq!(r.removed_objects, 7 * 50);
        assert_eq!(pd.objects().list().unwrap().len(), 50);
    }

    #[test]
    fn format_and_config_are_checked() {
        let t = tempfile::tempdir().unwrap();
        let root = t.path().join("s");
        Store::open(Some(&root)).unwrap();
        fs::write(
            root.join("v1/config.toml"),
            "[limits]\nmax_size = \"huge\"\n",
        )
        .unwrap();
        let e = Store::open(Some(&root)).unwrap_err().to_string();
        assert!(e.contains("config.toml") && e.contains("huge"), "{e}");
        fs::write(root.join("v1/config.toml"), gc::DEFAULT_CONFIG_TOML).unwrap();
        fs::write(root.join("v1/format.json"), r#"{"format":2,"features":[]}"#).unwrap();
        let e = Store::open(Some(&root)).unwrap_err().to_string();
        assert!(e.contains("format 2"), "{e}");
    }
}
