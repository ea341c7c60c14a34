//! `layercache verify`: re-hash every object; quarantine what does not match its name and
//! unpublish every layer that links it (a later mount of its key misses and refills).

use std::collections::HashMap;
use std::fs;
use std::os::unix::fs::MetadataExt;
use std::path::Path;

use serde::{Deserialize, Serialize};

use super::{ProjectDirs, Store, object};
use crate::error::{IoContext, Result};
use crate::ids::{CacheId, CacheKey, ProjectId};

/// `quarantine/<layer>/verify.json`: why verify quarantined the layer, so a later miss of its
/// keys says so ([`ProjectDirs::quarantine_note`]) instead of "its key is gone".
#[derive(Debug, Serialize, Deserialize)]
struct QuarantineNote {
    cache: Option<CacheId>,
    /// The keys that published the layer (unpublished by verify).
    keys: Vec<CacheKey>,
    /// When, ms since the epoch.
    quarantined_ms: u64,
    /// A corrupt object the layer linked (`<aa>/<name>` under `objects/`).
    object: String,
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

impl Store {
    /// `layercache verify`: re-hashes every object (of `project`, or all); an object whose
    /// bytes do not match its name is moved to `quarantine/objects/`, and every layer linking
    /// it is unpublished and moved to `quarantine/` (a later mount of its key misses and
    /// refills).
    ///
    /// Errors: [`crate::Error::Invalid`] for an unknown project; [`crate::Error::Io`] when the store cannot
    /// be read or changed.
    pub fn verify(&self, project: Option<&ProjectId>) -> Result<VerifyReport> {
        let pds = self.selected_projects(project)?;
        let _locks = self.lock_projects(&pds)?;
        let mut report = VerifyReport::default();
        for pd in &pds {
            let mut bad: HashMap<(u64, u64), String> = HashMap::new();
            let mut bad_paths = Vec::new();
            for (path, id, meta) in pd.objects().list()? {
                report.objects_checked += 1;
                let ok = object::hash_file(&path).map(|h| h == id).unwrap_or(false);
                if !ok {
                    let dir = pd.root.join("objects");
                    let shown = path.strip_prefix(&dir).unwrap_or(&path);
                    bad.insert((meta.dev(), meta.ino()), shown.display().to_string());
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
                if let Some(object) = tree_links_any(&l.tree(), &bad)? {
                    let keys = pd.unpublish(&id)?;
                    let to = q.join(id.as_str());
                    fs::rename(&l.dir, &to).at(&l.dir)?;
                    let note = QuarantineNote {
                        cache: super::layer::Layer::new(&q, id.clone())
                            .manifest()
                            .ok()
                            .map(|m| m.cache),
                        keys,
                        quarantined_ms: crate::units::now_ms(),
                        object,
                    };
                    // Best effort: without it a later miss only says its key is gone.
                    if let Ok(body) = serde_json::to_vec(&note) {
                        let _ = fs::write(to.join("verify.json"), body);
                    }
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

impl ProjectDirs {
    /// Why key `key` of `cache` has no layer when `layercache verify` quarantined its layer:
    /// one line naming the layer, when, and the corrupt object it linked; `None` when no
    /// quarantined layer was published under it.
    pub fn quarantine_note(&self, cache: &CacheId, key: &str) -> Option<String> {
        let q = self.quarantine();
        for ent in fs::read_dir(&q).ok()?.flatten() {
            let Ok(body) = fs::read(ent.path().join("verify.json")) else {
                continue;
            };
            let Ok(note) = serde_json::from_slice::<QuarantineNote>(&body) else {
                continue;
            };
            if note.cache.as_ref().is_none_or(|c| c == cache)
                && note.keys.iter().any(|k| k.as_str() == key)
            {
                let s = crate::units::now_ms().saturating_sub(note.quarantined_ms) / 1000;
                let ago = match s {
                    0..120 => format!("{s} s"),
                    120..7200 => format!("{} min", s / 60),
                    7200..172_800 => format!("{} h", s / 3600),
                    _ => format!("{} days", s / 86_400),
                };
                return Some(format!(
                    "its layer {} was quarantined by `layercache verify` {} ago: it linked \
                     object {}, whose bytes no longer match its hash",
                    ent.file_name().to_string_lossy(),
                    ago,
                    note.object
                ));
            }
        }
        None
    }
}

/// The first of the `bad` objects (by device and inode, with their names) that the tree at
/// `root` links, by name.
fn tree_links_any(root: &Path, bad: &HashMap<(u64, u64), String>) -> Result<Option<String>> {
    let mut stack = vec![root.to_path_buf()];
    while let Some(dir) = stack.pop() {
        for ent in fs::read_dir(&dir).at(&dir)? {
            let ent = ent.at(&dir)?;
            let m = ent.metadata().at(ent.path())?;
            if m.is_dir() {
                stack.push(ent.path());
            } else if m.is_file()
                && let Some(name) = bad.get(&(m.dev(), m.ino()))
            {
                return Ok(Some(name.clone()));
            }
        }
    }
    Ok(None)
}
