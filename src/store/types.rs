//! The store's result and option types: what `mount` returns (the JSON `layercache mount`
//! prints), and what a lookup found.

use std::path::PathBuf;
use std::time::Duration;

use serde::{Deserialize, Serialize};

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
