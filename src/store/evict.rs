//! Keeping a store in shape: `layercache ls` (what is there), `gc` (stale runs and staging,
//! orphan layers, then least-recently-used layers under the limits of [`super::gc`], then
//! unreferenced objects) and `clear` (a project's or cache's layers). Every removal takes the
//! project lock exclusively and a layer's lease exclusively: a mounted layer is never removed.

use std::collections::{BTreeSet, HashMap, HashSet};
use std::fs;
use std::io;
use std::os::unix::fs::MetadataExt;
use std::path::Path;

use super::lease::{self, Lease, Mode};
use super::paths::{ProjectDirs, read_names, remove_tree};
use super::{ClearReport, GcOptions, GcReport, LayerInfo, Store, gc, one_of};
use crate::error::{Error, IoContext, Result};
use crate::ids::{CacheId, CacheKey, LayerId, ProjectId};

impl Store {
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
    pub(super) fn lock_projects(&self, pds: &[ProjectDirs]) -> Result<Vec<Lease>> {
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
        let _span = tracing::info_span!("gc", dry_run = opts.dry_run).entered();
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
                        super::runs::remove_stale_run(&dir)?;
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

    /// Removes the layer published under `key` in `project`'s `cache` (and every other key
    /// publishing it) and the objects only it used, as [`Store::clear`] does for a cache. A
    /// mounted layer is refused and listed in the report's `in_use`; a key with no layer
    /// removes nothing.
    ///
    /// Errors: [`Error::Invalid`] for an unknown project; [`Error::Io`] on store errors.
    pub fn clear_key(
        &self,
        project: &ProjectId,
        cache: &CacheId,
        key: &CacheKey,
    ) -> Result<ClearReport> {
        let pd = self.selected_projects(Some(project))?.remove(0);
        let _lock = Lease::acquire(&pd.lock(), Mode::Exclusive)?;
        let mut report = ClearReport::default();
        if let Some(id) = pd.read_key(cache, key)? {
            if pd.evict(&id)? {
                report.removed.push(id);
            } else {
                report.in_use.push(id);
            }
        }
        report.removed_objects = pd.objects().sweep_unreferenced(false)?.0;
        Ok(report)
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
}

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
