//! Where things live in the remote object store (one prefix per project, nothing shared):
//!
//! ```text
//! <prefix>/v1/projects/<project>/objects/<aa>/<blake3-hex>       a large file's bytes, by content
//! <prefix>/v1/projects/<project>/packs/<pack>.pack               small objects back to back
//! <prefix>/v1/projects/<project>/packs/<pack>.idx                PackIndex: (object, offset, len)
//! <prefix>/v1/projects/<project>/manifests/<layer-id>.json       RemoteManifest: every entry
//! <prefix>/v1/projects/<project>/caches/<cache>/keys/<key>       KeyRecord JSON, create-only
//! <prefix>/v1/projects/<project>/key-salt                        the project's key salt, create-only
//! ```
//! Object ids are the local store's ([`crate::ids::ObjectId`]: blake3 of the bytes); the
//! metadata the local object name also carries lives in the manifest. Objects up to a quarter
//! of `pack_size` travel in packs (a pack is named by the blake3 of its bytes; its index is
//! written after it), so a layer of 10,000 small files is a few dozen requests, not 10,000; the
//! manifest names the pack, offset and length of each packed object it uses (packs of earlier
//! layers included, so a new version uploads only packs of its new objects). A push writes
//! objects and packs, then the manifest, then the key (conditional create), so a key never
//! exists without its manifest and objects; a key is never overwritten.

use object_store::path::Path as ObjectPath;

use crate::ids::{CacheId, CacheKey, LayerId, ObjectId, ProjectId};

/// Format directory under the prefix (bumped if the layout ever changes).
pub const FORMAT_DIR: &str = "v1";

/// The remote paths of one remote (its URL prefix).
#[derive(Clone, Debug)]
pub struct Layout {
    projects: ObjectPath,
}

impl Layout {
    /// The layout under `prefix` (`""` = the bucket's root).
    pub fn new(prefix: &str) -> Layout {
        let mut p = ObjectPath::default();
        for part in prefix.split('/').filter(|s| !s.is_empty()) {
            p = p.join(part);
        }
        Layout {
            projects: p.join(FORMAT_DIR).join("projects"),
        }
    }

    /// `<prefix>/v1/projects`.
    pub fn projects(&self) -> &ObjectPath {
        &self.projects
    }

    /// `<prefix>/v1/projects/<project>`.
    pub fn project(&self, p: &ProjectId) -> ObjectPath {
        self.projects.clone().join(p.as_str())
    }

    /// `…/objects`.
    pub fn objects(&self, p: &ProjectId) -> ObjectPath {
        self.project(p).join("objects")
    }

    /// `…/objects/<aa>`: one fan-out directory (the first two hex digits).
    pub fn object_fan(&self, p: &ProjectId, fan: &str) -> ObjectPath {
        self.objects(p).join(fan)
    }

    /// `…/objects/<aa>/<hex>`.
    pub fn object(&self, p: &ProjectId, id: &ObjectId) -> ObjectPath {
        let hex = id.to_hex();
        self.object_fan(p, &hex[..2]).join(hex.as_str())
    }

    /// `…/packs`.
    pub fn packs(&self, p: &ProjectId) -> ObjectPath {
        self.project(p).join("packs")
    }

    /// `…/packs/<pack>.pack`.
    pub fn pack(&self, p: &ProjectId, pack: &str) -> ObjectPath {
        self.packs(p).join(format!("{pack}.pack"))
    }

    /// `…/packs/<pack>.idx`.
    pub fn pack_index(&self, p: &ProjectId, pack: &str) -> ObjectPath {
        self.packs(p).join(format!("{pack}.idx"))
    }

    /// `…/manifests`.
    pub fn manifests(&self, p: &ProjectId) -> ObjectPath {
        self.project(p).join("manifests")
    }

    /// `…/manifests/<layer>.json`.
    pub fn manifest(&self, p: &ProjectId, layer: &LayerId) -> ObjectPath {
        self.manifests(p).join(format!("{layer}.json"))
    }

    /// `…/manifests/<layer>.compact`: the same manifest in its compact form (`compact.rs`),
    /// written after the JSON one; absent for layers pushed by older versions.
    pub fn compact_manifest(&self, p: &ProjectId, layer: &LayerId) -> ObjectPath {
        self.manifests(p).join(format!("{layer}.compact"))
    }

    /// `…/manifests/<layer>.tree`: what a lazy mount reads before its command starts (the
    /// entries of the compact form without its object table, `compact::TreeHead`), written
    /// after the compact form; absent for layers pushed by older versions.
    pub fn tree_manifest(&self, p: &ProjectId, layer: &LayerId) -> ObjectPath {
        self.manifests(p).join(format!("{layer}.tree"))
    }

    /// `…/manifests/<layer>.pieces`: the piece table of the layer's big objects
    /// (`pieces.rs`), written after the tree manifest when the layer stores an object alone
    /// that is longer than one piece; absent otherwise and for layers pushed by older versions.
    pub fn pieces(&self, p: &ProjectId, layer: &LayerId) -> ObjectPath {
        self.manifests(p).join(format!("{layer}.pieces"))
    }

    /// `<prefix>/v1/projects/<project>/key-salt`: the project's key salt (64 hex digits),
    /// created once, create-only (store/salt.rs).
    pub fn salt(&self, p: &ProjectId) -> ObjectPath {
        self.project(p).join("key-salt")
    }
    /// `…/caches`.
    pub fn caches(&self, p: &ProjectId) -> ObjectPath {
        self.project(p).join("caches")
    }

    /// `…/caches/<cache>/keys`.
    pub fn keys(&self, p: &ProjectId, cache: &CacheId) -> ObjectPath {
        self.caches(p).join(cache.as_str()).join("keys")
    }

    /// `…/caches/<cache>/keys/<key>`.
    pub fn key(&self, p: &ProjectId, cache: &CacheId, key: &CacheKey) -> ObjectPath {
        self.keys(p, cache).join(key.as_str())
    }

    /// `caches/<cache>/traces/<key>`: the order in which a run of the key's layer first
    /// opened its files (paths, one per line), for a lazy mount to fetch in (`lazy`).
    pub fn trace(&self, p: &ProjectId, cache: &CacheId, key: &CacheKey) -> ObjectPath {
        self.caches(p)
            .join(cache.as_str())
            .join("traces")
            .join(key.as_str())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_are_per_project() {
        let l = Layout::new("/team/cache/");
        let p = ProjectId::new("web").unwrap();
        let c = CacheId::new("npm").unwrap();
        let k = CacheKey::new("npm-linux:ab12").unwrap();
        assert_eq!(
            l.key(&p, &c, &k).as_ref(),
            "team/cache/v1/projects/web/caches/npm/keys/npm-linux:ab12"
        );
        let id = ObjectId([0xab; 32]);
        assert!(
            l.object(&p, &id)
                .as_ref()
                .starts_with("team/cache/v1/projects/web/objects/ab/abab")
        );
        assert_eq!(Layout::new("").projects().as_ref(), "v1/projects");
    }
}
