//! The store's result and option types: what `mount`, `commit`, `ls`, `gc`, `clear` and
//! `verify` return (the JSON their commands print), and what a lookup found.

use std::path::PathBuf;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::gc;
use super::layer::Manifest;
use crate::ids::{CacheId, CacheKey, LayerId, ProjectId};

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

/// What a mount found for its key, `hit`, `restore` or `miss` (GitHub `actions/cache`: exact
/// hit, restore-key hit, miss); serialised lowercase, as events and `--json` show it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum MountResult {
    /// The exact key's layer is mounted; nothing to fill (a run runs maintenance, or nothing).
    Hit,
    /// An older layer matched by a restore key is mounted; fill incrementally (a run's restore
    /// setup), then commit.
    Restore,
    /// An empty lower is mounted; fill (a run's setup), then commit.
    Miss,
}

impl MountResult {
    /// `hit`, `restore` or `miss`.
    pub fn as_str(self) -> &'static str {
        match self {
            MountResult::Hit => "hit",
            MountResult::Restore => "restore",
            MountResult::Miss => "miss",
        }
    }
}

/// Inputs of [`super::Store::mount`].
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
    /// Existing directory to mount on (host-visible, `layercache mount`); `None` mounts at the
    /// run's own `runs/<run>/mnt`, a place no other run uses (`layercache run`: the run binds it
    /// at the cache's view path in a mount namespace of its own).
    pub mountpoint: Option<PathBuf>,
    /// The process the mount belongs to: when it exits (even by `kill -9`) the overlay daemon
    /// ends the mount; `None` for a mount that lives until `umount`/`commit`.
    pub owner: Option<u32>,
    /// The overlay's ownership mapping (`squash_to_uid`/`squash_to_gid`: a run as
    /// another user sees the layer as its own; new files stay 0:0 in the upper).
    pub squash: crate::overlay::options::Squash,
    /// Whether the overlay uses FUSE passthrough; `Auto` decides from the mounted layer's
    /// manifest ([`crate::overlay::options::PassthroughChoice::decide`]).
    pub passthrough: crate::overlay::options::PassthroughChoice,
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
    /// The overlay daemon's pid.
    #[serde(default)]
    pub daemon_pid: u32,
    /// True when this mount holds the key's fill lock (others wait for its commit).
    pub fill_lock: bool,
    /// What the remote tier pulled for this mount (a remote hit or restore), if anything.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub remote: Option<super::PullReport>,
    /// Milliseconds spent waiting for another run's fill.
    pub waited_ms: u64,
    /// Milliseconds for the lookup (including any wait).
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

/// Result of a publish without a mount ([`super::Store::promote_dirs`]).
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

/// What [`super::Store::publish_built`] publishes.
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

/// Options of [`super::Store::gc`].
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
    /// Empty host view directories that killed runs made and left, removed
    /// ([`super::reap_made_views`]).
    #[serde(default)]
    pub removed_view_dirs: u64,
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
