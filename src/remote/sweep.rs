//! `layercache remote gc`: removes what interrupted or losing pushes left on the remote —
//! manifests no key names, objects and packs no kept manifest names (a pack partly used is kept
//! whole: there is no repacking) — once older than a grace period
//! (a push in flight writes objects and manifest before its key), and keys whose manifest or
//! objects are missing (which a correct push never leaves; such a key would only fail pulls).

use std::collections::{HashMap, HashSet};
use std::time::Duration;

use object_store::path::Path as ObjectPath;
use object_store::{ObjectMeta, ObjectStoreExt};
use serde::Serialize;

use super::Remote;
use crate::error::Result;
use crate::ids::{LayerId, ObjectId, ProjectId};

/// What live manifests reference.
#[derive(Default)]
struct Refs {
    /// Objects stored alone.
    objects: HashSet<ObjectId>,
    /// Packs.
    packs: HashSet<String>,
}

impl Refs {
    fn extend(&mut self, o: Refs) {
        self.objects.extend(o.objects);
        self.packs.extend(o.packs);
    }
}

/// What the remote holds for one project.
struct Inventory {
    /// Objects stored alone, by id.
    objects: HashMap<ObjectId, ObjectMeta>,
    /// Pack id → its files (the .pack, and the .idx once written).
    packs: HashMap<String, Vec<ObjectMeta>>,
    /// Manifests, by layer.
    manifests: HashMap<LayerId, ObjectMeta>,
    /// The other forms of manifests (`<layer>.compact`, `<layer>.tree`) and the piece tables
    /// (`<layer>.pieces`, `pieces.rs`) with their layer: they
    /// go with their JSON manifest.
    compacts: Vec<(LayerId, ObjectMeta)>,
}

impl Inventory {
    /// True when pack `p`'s data file is there.
    fn has_pack(&self, p: &str) -> bool {
        self.packs
            .get(p)
            .is_some_and(|v| v.iter().any(|m| m.location.as_ref().ends_with(".pack")))
    }
}

/// What remote gc did (or would do, with `dry_run`).
#[derive(Clone, Debug, Default, Serialize)]
pub struct RemoteGcReport {
    /// Report only.
    pub dry_run: bool,
    /// Keys seen.
    pub keys: u64,
    /// Keys removed because their manifest or an object is missing (`project/cache/key`).
    pub broken_keys: Vec<String>,
    /// Manifests removed.
    pub removed_manifests: u64,
    /// Objects removed.
    pub removed_objects: u64,
    /// Packs removed (with their indexes).
    pub removed_packs: u64,
    /// Bytes of the objects and packs removed.
    pub freed_bytes: u64,
    /// Unreferenced objects and manifests kept because younger than the grace period.
    pub kept_recent: u64,
}

impl Remote {
    /// The projects on the remote (names under `<prefix>/v1/projects/`).
    ///
    /// Errors: [`super::RemoteError`] naming the remote.
    pub async fn projects(&self) -> Result<Vec<ProjectId>> {
        self.children(self.layout.projects()).await.map(|v| {
            v.into_iter()
                .filter_map(|n| ProjectId::new(n).ok())
                .collect()
        })
    }

    /// The names of the "directories" right under `dir`.
    ///
    /// Errors: [`super::RemoteError`] naming the remote.
    pub async fn children(&self, dir: &ObjectPath) -> Result<Vec<String>> {
        let r = match self.store.list_with_delimiter(Some(dir)).await {
            Ok(r) => r,
            Err(e) if super::is_not_found(&e) => return Ok(Vec::new()),
            Err(e) => return Err(self.error("listing", e)),
        };
        let mut out: Vec<String> = r
            .common_prefixes
            .iter()
            .filter_map(|p| p.filename().map(str::to_string))
            .collect();
        out.sort();
        Ok(out)
    }

    async fn list_all(&self, dir: &ObjectPath) -> Result<Vec<ObjectMeta>> {
        self.list_dir(dir).await
    }

    /// Runs remote gc over every project (see the module docs).
    ///
    /// Errors: [`super::RemoteError`] naming the remote; nothing further is removed after an error.
    pub fn gc(&self, grace: Duration, dry_run: bool) -> Result<RemoteGcReport> {
        self.block_on(None, async {
            let mut rep = RemoteGcReport {
                dry_run,
                ..Default::default()
            };
            let cutoff = chrono_ms_now() - grace.as_millis() as i64;
            for project in self.projects().await? {
                self.gc_project(&project, cutoff, &mut rep).await?;
            }
            Ok(rep)
        })
    }

    async fn gc_project(
        &self,
        project: &ProjectId,
        cutoff: i64,
        rep: &mut RemoteGcReport,
    ) -> Result<()> {
        let inv = self.inventory(project).await?;
        let (live, refs) = self.mark(project, &inv, rep).await?;
        self.sweep(project, inv, &live, refs, cutoff, rep).await
    }

    /// Lists what the remote holds for `project`: objects, packs (by pack id) and manifests.
    ///
    /// Errors: [`super::RemoteError`] naming the remote.
    async fn inventory(&self, project: &ProjectId) -> Result<Inventory> {
        let objects: HashMap<ObjectId, ObjectMeta> = self
            .list_all(&self.layout.objects(project))
            .await?
            .into_iter()
            .filter_map(|m| Some((ObjectId::from_hex(m.location.filename()?).ok()?, m)))
            .collect();
        // pack id → its files (the .pack, and the .idx once written).
        let mut packs: HashMap<String, Vec<ObjectMeta>> = HashMap::new();
        for m in self.list_all(&self.layout.packs(project)).await? {
            let Some(name) = m.location.filename() else {
                continue;
            };
            let id = name.split('.').next().unwrap_or(name).to_string();
            packs.entry(id).or_default().push(m);
        }
        let (mut manifests, mut compacts) = (HashMap::new(), Vec::new());
        for m in self.list_all(&self.layout.manifests(project)).await? {
            let Some(name) = m.location.filename() else {
                continue;
            };
            if let Some(l) = name.strip_suffix(".json") {
                if let Ok(l) = LayerId::new(l) {
                    manifests.insert(l, m);
                }
                continue;
            }
            let other = (name.strip_suffix(".compact"))
                .or_else(|| name.strip_suffix(".tree"))
                .or_else(|| name.strip_suffix(".pieces"));
            if let Some(Ok(l)) = other.map(LayerId::new) {
                compacts.push((l, m));
            }
        }
        Ok(Inventory {
            objects,
            packs,
            manifests,
            compacts,
        })
    }

    /// Reads every key of `project`: a key whose manifest and objects are all there marks its
    /// layer live and what it references; any other key is broken and removed (unless
    /// `rep.dry_run`).
    ///
    /// Errors: [`super::RemoteError`] naming the remote.
    async fn mark(
        &self,
        project: &ProjectId,
        inv: &Inventory,
        rep: &mut RemoteGcReport,
    ) -> Result<(HashSet<LayerId>, Refs)> {
        // `caches/<cache>/keys/<key>` and, beside them, `caches/<cache>/traces/<key>` (a lazy
        // mount's access trace): a trace lives as long as its key.
        let (traces, keys): (Vec<_>, Vec<_>) =
            (self.list_all(&self.layout.caches(project)).await?)
                .into_iter()
                .partition(|m| trace_key(&m.location).is_some());
        let mut kept_keys: HashSet<String> = HashSet::new();
        let mut live: HashSet<LayerId> = HashSet::new();
        let mut refs = Refs::default();
        for k in keys {
            rep.keys += 1;
            let bytes = self
                .store
                .get(&k.location)
                .await
                .map_err(|e| self.error("reading a key", e))?
                .bytes()
                .await
                .map_err(|e| self.error("reading a key", e))?;
            let layer = serde_json::from_slice::<super::manifest::KeyRecord>(&bytes)
                .ok()
                .map(|r| r.layer);
            let r = match &layer {
                Some(l) if inv.manifests.contains_key(l) => self.manifest_refs(project, l).await?,
                _ => None,
            };
            let complete = r.as_ref().is_some_and(|r| {
                r.objects.iter().all(|id| inv.objects.contains_key(id))
                    && r.packs.iter().all(|p| inv.has_pack(p))
            });
            match (layer, r) {
                (Some(l), Some(r)) if complete => {
                    live.insert(l);
                    refs.extend(r);
                    kept_keys.insert(k.location.to_string());
                }
                _ => {
                    rep.broken_keys.push(k.location.to_string());
                    if !rep.dry_run {
                        self.delete(&k.location).await?;
                    }
                }
            }
        }
        for t in traces {
            let key = trace_key(&t.location).unwrap_or_default();
            if !kept_keys.contains(&key) && !rep.dry_run {
                tracing::info!(trace = %t.location, "remote gc: removing the trace of a key that is gone");
                self.delete(&t.location).await?;
            }
        }
        Ok((live, refs))
    }

    /// Removes the manifests, objects and packs nothing live references and older than
    /// `cutoff` (ms since the epoch); the young ones, a push in flight's, are kept with what
    /// they reference.
    ///
    /// Errors: [`super::RemoteError`] naming the remote.
    async fn sweep(
        &self,
        project: &ProjectId,
        inv: Inventory,
        live: &HashSet<LayerId>,
        mut refs: Refs,
        cutoff: i64,
        rep: &mut RemoteGcReport,
    ) -> Result<()> {
        // Manifests of pushes in flight (young) keep their objects too.
        for (l, m) in &inv.manifests {
            if live.contains(l) {
                continue;
            }
            if m.last_modified.timestamp_millis() > cutoff {
                rep.kept_recent += 1;
                if let Some(r) = self.manifest_refs(project, l).await? {
                    refs.extend(r);
                }
            } else {
                rep.removed_manifests += 1;
                if !rep.dry_run {
                    self.delete(&m.location).await?;
                }
            }
        }
        // A compact or tree manifest goes with its JSON one: kept while that is live or young (or,
        // without one, while young itself: a push in flight writes the JSON first).
        for (l, m) in &inv.compacts {
            let young = |m: &ObjectMeta| m.last_modified.timestamp_millis() > cutoff;
            if live.contains(l) || inv.manifests.get(l).map_or(young(m), young) {
                continue;
            }
            rep.freed_bytes += m.size;
            if !rep.dry_run {
                self.delete(&m.location).await?;
            }
        }
        for (id, m) in &inv.objects {
            if refs.objects.contains(id) {
                continue;
            }
            if m.last_modified.timestamp_millis() > cutoff {
                rep.kept_recent += 1;
                continue;
            }
            rep.removed_objects += 1;
            rep.freed_bytes += m.size;
            if !rep.dry_run {
                self.delete(&m.location).await?;
            }
        }
        for (pack, mut files) in inv.packs {
            if refs.packs.contains(&pack) {
                continue;
            }
            if files
                .iter()
                .any(|m| m.last_modified.timestamp_millis() > cutoff)
            {
                rep.kept_recent += 1;
                continue;
            }
            rep.removed_packs += 1;
            // The index goes first: a pack is only used through its index.
            files.sort_by_key(|m| !m.location.as_ref().ends_with(".idx"));
            for m in files {
                rep.freed_bytes += m.size;
                if !rep.dry_run {
                    self.delete(&m.location).await?;
                }
            }
        }
        Ok(())
    }

    /// What manifest `layer` needs: objects stored alone and packs; `None` when it cannot be
    /// read or parsed.
    async fn manifest_refs(&self, project: &ProjectId, layer: &LayerId) -> Result<Option<Refs>> {
        let path = self.layout.manifest(project, layer);
        let bytes = match self.store.get(&path).await {
            Ok(g) => g
                .bytes()
                .await
                .map_err(|e| self.error("reading a manifest", e))?,
            Err(e) if super::is_not_found(&e) => return Ok(None),
            Err(e) => return Err(self.error("reading a manifest", e)),
        };
        let Ok(m) = serde_json::from_slice::<super::manifest::RemoteManifest>(&bytes) else {
            return Ok(None);
        };
        let (Ok(all), Ok(packed)) = (m.objects(), m.pack_locations()) else {
            return Ok(None);
        };
        Ok(Some(Refs {
            objects: all
                .into_keys()
                .filter(|id| !packed.contains_key(id))
                .collect(),
            packs: m.packs.into_keys().collect(),
        }))
    }

    async fn delete(&self, p: &ObjectPath) -> Result<()> {
        match self.store.delete(p).await {
            Ok(()) => Ok(()),
            Err(e) if super::is_not_found(&e) => Ok(()),
            Err(e) => Err(self.error(&format!("deleting {p}"), e)),
        }
    }
}

fn chrono_ms_now() -> i64 {
    crate::units::now_ms() as i64
}

/// For `…/caches/<cache>/traces/<key>`, the location of its key (`…/caches/<cache>/keys/<key>`);
/// `None` for any other location.
fn trace_key(location: &object_store::path::Path) -> Option<String> {
    let parts: Vec<_> = location.parts().collect();
    let n = parts.len();
    (n >= 3 && parts[n - 2].as_ref() == "traces").then(|| {
        let mut p: Vec<&str> = parts.iter().map(|p| p.as_ref()).collect();
        p[n - 2] = "keys";
        p.join("/")
    })
}
