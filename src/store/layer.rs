//! A layer: an immutable directory tree plus its manifest, `layers/<layer-id>/`:
//!
//! ```text
//! layers/<id>/tree/            plain tree (valid kernel-overlayfs lowerdir); regular files are
//!                              hardlinks to objects/
//! layers/<id>/manifest.json    Manifest (below)
//! layers/<id>/links            the tree's link groups, when it has any: paths that were one
//!                              inode in the promoted tree (format: overlay::links)
//! layers/<id>/lease            flock: shared by every mount of the layer, exclusive for removal
//! layers/<id>/used             its mtime is the last mount time (LRU order for gc)
//! ```

use std::fs;
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use serde::{Deserialize, Serialize};

use crate::error::{Error, IoContext, Result};
use crate::ids::{CacheId, CacheKey, LayerId, ProjectId};
use crate::sys;
use crate::units::now_ms;

/// Manifest format written by this version.
pub const MANIFEST_FORMAT: u32 = 1;

/// `layers/<id>/manifest.json`: what a layer is and what it holds.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
pub struct Manifest {
    /// Manifest format version (`MANIFEST_FORMAT`).
    pub format: u32,
    /// This layer.
    pub layer: LayerId,
    /// Owning project.
    pub project: ProjectId,
    /// Cache within the project.
    pub cache: CacheId,
    /// The key the layer was promoted for (its published key unless another run won the race).
    pub key: CacheKey,
    /// The lower layer it was promoted on top of (restore), if any.
    pub parent: Option<LayerId>,
    /// Creation time, milliseconds since the Unix epoch.
    pub created_ms: u64,
    /// What the tree holds (flattened: the JSON has these fields at the top level).
    #[serde(flatten)]
    pub counts: TreeCounts,
    /// Paths (relative to the tree) dropped as credential files.
    pub dropped: Vec<String>,
}

/// What a layer's tree holds, counted while it is built (see `promote::build_tree`).
#[derive(Clone, Copy, Debug, Default, Serialize, Deserialize, PartialEq, Eq)]
pub struct TreeCounts {
    /// Apparent size of the regular files in the tree, bytes (each path counted).
    pub bytes: u64,
    /// Number of regular files in the tree.
    pub files: u64,
    /// Number of directories (the root included).
    pub dirs: u64,
    /// Number of symlinks.
    pub symlinks: u64,
    /// Number of other entries kept (fifos).
    pub other: u64,
    /// Objects this promotion added to the store.
    pub new_objects: u64,
    /// Bytes of the objects this promotion added (bytes not stored before).
    pub new_bytes: u64,
    /// Apparent size of the regular files of at least
    /// [`crate::overlay::options::LARGE_FILE`] bytes (1 MiB), bytes: with `files`, what
    /// `passthrough = "auto"` decides from. 0 in manifests written before it was counted.
    #[serde(default)]
    pub large_bytes: u64,
}

/// A fresh layer id: creation time (ms, 12 hex digits) + 64 random bits, so ids sort by age.
pub fn new_layer_id() -> LayerId {
    LayerId::new(format!("{:012x}-{}", now_ms(), sys::random_hex(8)))
        .expect("generated layer ids are valid")
}

/// A layer directory (which may or may not exist).
#[derive(Clone, Debug)]
pub struct Layer {
    /// The id.
    pub id: LayerId,
    /// `layers/<id>`.
    pub dir: PathBuf,
}

impl Layer {
    /// The layer `id` inside the `layers/` directory `layers`.
    pub fn new(layers: &Path, id: LayerId) -> Layer {
        Layer {
            dir: layers.join(id.as_str()),
            id,
        }
    }

    /// `tree/`: the directory mounted as the lowerdir.
    pub fn tree(&self) -> PathBuf {
        self.dir.join("tree")
    }

    /// `manifest.json`.
    pub fn manifest_path(&self) -> PathBuf {
        self.dir.join("manifest.json")
    }

    /// `links`: the tree's link groups (`links_of_tree`).
    pub fn links_path(&self) -> PathBuf {
        links_of_tree(&self.tree())
    }

    /// `lease` (see src/store/lease.rs).
    pub fn lease_path(&self) -> PathBuf {
        self.dir.join("lease")
    }

    /// `trace-stored`: present once a run's open trace of this layer was stored in the remote
    /// tier beside its key (a local hit stores one only once).
    pub fn trace_stored_path(&self) -> PathBuf {
        self.dir.join("trace-stored")
    }

    /// `used`: its mtime is the last mount time.
    pub fn used_path(&self) -> PathBuf {
        self.dir.join("used")
    }

    /// Reads the manifest.
    ///
    /// Errors: [`Error::Io`] if unreadable; [`Error::Failed`] if it is not a valid manifest.
    pub fn manifest(&self) -> Result<Manifest> {
        let p = self.manifest_path();
        let text = fs::read(&p).at(&p)?;
        serde_json::from_slice(&text)
            .map_err(|e| Error::Failed(format!("{}: corrupt manifest: {e}", p.display())))
    }

    /// Writes `m` as the manifest and fsyncs it.
    ///
    /// Errors: [`Error::Io`] naming the manifest path.
    pub fn write_manifest(&self, m: &Manifest) -> Result<()> {
        let p = self.manifest_path();
        let text = serde_json::to_vec_pretty(m).map_err(|e| Error::Failed(e.to_string()))?;
        write_synced(&p, &text)
    }

    /// Records "mounted now" (sets the mtime of `used`, creating it).
    ///
    /// Errors: [`Error::Io`] naming the file.
    pub fn touch_used(&self) -> Result<()> {
        let p = self.used_path();
        let f = fs::OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(&p)
            .at(&p)?;
        f.set_modified(SystemTime::now()).at(&p)
    }

    /// Last mount time (or creation, if never mounted): falls back to the manifest's mtime.
    pub fn last_used(&self) -> SystemTime {
        fs::metadata(self.used_path())
            .or_else(|_| fs::metadata(self.manifest_path()))
            .and_then(|m| m.modified())
            .unwrap_or(UNIX_EPOCH)
    }

    /// Time since [`Layer::last_used`] (zero if in the future).
    pub fn idle(&self) -> Duration {
        SystemTime::now()
            .duration_since(self.last_used())
            .unwrap_or_default()
    }
}

/// The link-groups file of the layer whose tree is `tree` (`layers/<id>/tree` →
/// `layers/<id>/links`): the paths that were hard links of each other in the tree that was
/// promoted (every regular file of a tree is a hardlink of an object, so the tree's own link
/// counts do not say), written by promotion when there are any
/// ([`crate::overlay::links::LinkGroups`]).
pub fn links_of_tree(tree: &Path) -> PathBuf {
    tree.with_file_name("links")
}

/// Writes `bytes` to `path` (created/truncated) and fsyncs the file.
///
/// Errors: [`Error::Io`] naming `path`.
pub fn write_synced(path: &Path, bytes: &[u8]) -> Result<()> {
    use std::io::Write;
    let mut f = fs::File::create(path).at(path)?;
    f.write_all(bytes).at(path)?;
    f.sync_all().at(path)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_sort_by_age_and_manifest_roundtrips() {
        let a = new_layer_id();
        std::thread::sleep(Duration::from_millis(2));
        let b = new_layer_id();
        assert!(a < b);
        let t = tempfile::tempdir().unwrap();
        let l = Layer::new(t.path(), a.clone());
        fs::create_dir_all(l.tree()).unwrap();
        let m = Manifest {
            format: MANIFEST_FORMAT,
            layer: a,
            project: ProjectId::new("p").unwrap(),
            cache: CacheId::new("npm").unwrap(),
            key: CacheKey::new("k1").unwrap(),
            parent: None,
            created_ms: now_ms(),
            counts: TreeCounts {
                bytes: 1,
                files: 1,
                dirs: 1,
                symlinks: 0,
                other: 0,
                new_objects: 1,
                new_bytes: 1,
                large_bytes: 0,
            },
            dropped: vec![],
        };
        l.write_manifest(&m).unwrap();
        assert_eq!(l.manifest().unwrap(), m);
        // The counts stand at the top level of manifest.json.
        let json: serde_json::Value =
            serde_json::from_slice(&fs::read(l.dir.join("manifest.json")).unwrap()).unwrap();
        assert_eq!(
            (json["files"].as_u64(), json["dirs"].as_u64()),
            (Some(1), Some(1))
        );
        l.touch_used().unwrap();
        assert!(l.idle() < Duration::from_secs(5));
    }
}
