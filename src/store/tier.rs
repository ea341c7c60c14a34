//! The store's port to a tier below it (the remote tier, src/remote/): what the store asks of
//! it at its two places — a local miss of a mount ([`Store::mount`]) and a publish
//! ([`Store::commit`]) — and what a process's exit waits for. The store defines this; the remote
//! tier implements it, and the store never names the remote tier's types.

use std::sync::Arc;

use serde::{Deserialize, Serialize};

use super::{ProjectDirs, Store};
use crate::ids::{CacheId, CacheKey, LayerId, ProjectId};

/// A tier the store can fill a miss from and push its publishes to (an S3-compatible remote:
/// `crate::remote::Remote`). Attached with [`Store::set_remote`].
pub trait RemoteTier: Send + Sync {
    /// On a local miss of `key` of `cache` in `pd` (under the key's fill lock): find `key`,
    /// then the newest key of each prefix of `restore_keys`, and publish what was found into
    /// the store (through [`Store::publish_built`]). `None` when nothing was pulled. Never
    /// fails: an unreachable, slow or refusing tier, or a broken layer, costs one
    /// [`super::Notice::Remote`] and the mount goes on as a local miss.
    fn fetch_for_mount(
        &self,
        store: &Store,
        pd: &ProjectDirs,
        cache: &CacheId,
        key: &CacheKey,
        restore_keys: &[CacheKey],
    ) -> Option<PullReport>;

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
}
