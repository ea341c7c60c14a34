//! The store's port to a tier below it (the remote tier, src/remote/): what the store asks of
//! it at its two places — a local miss of a mount ([`Store::mount`]) and a publish
//! ([`Store::commit`]) — and what a process's exit waits for. The store defines this; the remote
//! tier implements it, and the store never names the remote tier's types.

use std::sync::Arc;

use serde::{Deserialize, Serialize};

use super::{ProjectDirs, Store};
use crate::ids::{CacheId, CacheKey, LayerId, ProjectId};

/// What the mount of a lazily mounted layer fetched while its run lasted
/// ([`RemoteTier::finish_lazy`]); the store says it in a [`super::Notice::LazyFetched`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LazyEnd {
    /// The line for the user (`<cache>: fetched lazily 2.1 MiB of 103 MiB …`).
    pub message: String,
    /// Object bytes fetched from the tier while the run lasted (file content, not counting
    /// the manifest fetched before the mount).
    pub fetched_bytes: u64,
    /// Objects fetched from the tier while the run lasted.
    pub fetched_objects: u64,
}

/// A tier the store can fill a miss from and push its publishes to (an S3-compatible remote:
/// `crate::remote::Remote`). Attached with [`Store::set_remote`].
pub trait RemoteTier: Send + Sync {
    /// On a local miss of `key` of `cache` in `pd` (under the key's fill lock): find `key`,
    /// then the newest key of each prefix of `restore_keys`. An exact hit is mounted lazily
    /// when `lazy` (and the tier is configured so): its partial directory is laid out
    /// ([`Fetched::Lazy`]); anything else found is published into the store (through
    /// [`Store::publish_built`], [`Fetched::Pulled`]). `None` when nothing was found or
    /// pulled. Never fails: an unreachable, slow or refusing tier, or a broken layer, costs
    /// one [`super::Notice::Remote`] and the mount goes on as a local miss.
    fn fetch_for_mount(
        &self,
        store: &Store,
        pd: &ProjectDirs,
        cache: &CacheId,
        key: &CacheKey,
        restore_keys: &[CacheKey],
        lazy: bool,
    ) -> Option<Fetched>;

    /// After the mount of a lazy layer ended (its daemon exited): reads what the daemon wrote
    /// in `run_dir`, stores the run's access trace beside the key in the tier, publishes the
    /// layer locally when every object is here (and removes its partial directory), and
    /// returns what the run fetched with the line that tells the user (`None`: the daemon
    /// left no report). Never fails.
    fn finish_lazy(
        &self,
        store: &Store,
        pd: &ProjectDirs,
        cache: &CacheId,
        key: &CacheKey,
        layer: &LayerId,
        run_dir: &std::path::Path,
    ) -> Option<LazyEnd>;

    /// After the mount of an exact local hit ended: stores the order in which its run first
    /// opened the layer's files (the file `trace`, one path per line; nothing when it is
    /// absent or empty) beside `cache`/`key` in the tier where the key has none yet (a trace
    /// there stays), for a fresh runner's lazy mount to replay. Returns whether the key has a
    /// trace now. Never fails (a failure is logged).
    fn store_trace(
        &self,
        pd: &ProjectDirs,
        cache: &CacheId,
        key: &CacheKey,
        trace: &std::path::Path,
    ) -> bool;

    /// After a publish of `layer` under `cache`/`key` in `pd`: push it on a thread of its own;
    /// [`RemoteTier::wait_pushes`] collects the result.
    fn push_background(
        self: Arc<Self>,
        pd: ProjectDirs,
        cache: CacheId,
        key: CacheKey,
        layer: LayerId,
    );

    /// Waits (bounded) for the background pushes, reports each as a
    /// [`super::Notice::Remote`] of `store`, and returns how many did not finish in time.
    fn wait_pushes(&self, store: &Store) -> usize;

    /// The key salt of `project` as the tier holds it, so runners agree on keys
    /// ([`Store::key_salt`]): the tier's own when it has one, else `proposed`, published
    /// create-only (two runners proposing at once both get the one created first). `None`
    /// when the tier cannot be asked now (one [`super::Notice::Remote`] says so): the store
    /// then keeps its local salt.
    fn agree_salt(
        &self,
        store: &Store,
        project: &ProjectId,
        proposed: &[u8; 32],
    ) -> Option<[u8; 32]>;

    /// Names the tier (its URL), recorded beside a salt agreed with it.
    fn location(&self) -> String;
}

/// What [`RemoteTier::fetch_for_mount`] did.
#[derive(Clone, Debug)]
pub enum Fetched {
    /// The layer was pulled and published locally.
    Pulled(PullReport),
    /// The exact key's layer is to be mounted lazily.
    Lazy(LazyLower),
}

/// A layer to mount lazily: a partial directory ([`ProjectDirs::partial`]) and the
/// description the overlay daemon makes the lower layer from.
#[derive(Clone, Debug)]
pub struct LazyLower {
    /// The layer.
    pub layer: LayerId,
    /// Its partial directory (holds the manifest, its link groups and its local objects).
    pub dir: std::path::PathBuf,
    /// The maker's description ([`crate::overlay::options::MadeLower::spec`]), a JSON object;
    /// the store sets its `run_dir` to the run's directory when it mounts it.
    pub spec: serde_json::Value,
    /// The layer's counts (bytes, files, large bytes), from its manifest.
    pub counts: super::TreeCounts,
    /// The lookup and manifest fetch (`lazy` set, nothing pulled yet).
    pub report: PullReport,
    /// The file the daemon writes when it refuses the layer (its manifest breaks the rules):
    /// a mount that fails with it present is tried again without lazy layers.
    pub refused: std::path::PathBuf,
}

/// What a pull did.
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq, Eq)]
pub struct PullReport {
    /// The key pulled.
    pub key: String,
    /// The layer now published locally under it.
    pub layer: String,
    /// `published`, or `exists` when a local run published the key meanwhile.
    pub result: String,
    /// Distinct objects the layer needs.
    pub objects: u64,
    /// Objects downloaded.
    pub pulled_objects: u64,
    /// Bytes downloaded (object bytes; the manifest excluded).
    pub pulled_bytes: u64,
    /// Objects made from a local object with the same bytes (other metadata), not downloaded.
    pub copied_objects: u64,
    /// Manifest bytes.
    pub manifest_bytes: u64,
    /// Milliseconds for the whole pull.
    pub ms: u64,
    /// True when the layer is mounted lazily: only the manifest was fetched; file content
    /// comes on first open ([`LazyLower`]).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub lazy: bool,
    /// For a lazy mount: bytes of the layer's objects not local when it was mounted.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub lazy_bytes: u64,
}

fn is_zero(n: &u64) -> bool {
    *n == 0
}
