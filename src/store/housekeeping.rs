//! Keeping a store in shape: `layercache ls` (what is there), `gc` (stale runs and staging,
//! orphan layers, then least-recently-used layers under the limits of [`super::eviction`], then
//! unreferenced objects) and `clear` (a project's or cache's layers). Every removal takes the
//! project lock exclusively and a layer's lease exclusively: a mounted layer is never removed.

use std::collections::{BTreeSet, HashMap, HashSet};
use std::fs;
use std::io;
use std::os::unix::fs::MetadataExt;
use std::path::Path;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::lease::{self, Lease, Mode};
use super::paths::{ProjectDirs, read_names, remove_tree};
use super::{Store, eviction, one_of};
use crate::error::{Error, IoContext, Result};
use crate::ids::{CacheId, CacheKey, LayerId, ProjectId};

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
    /// Mounted right now by a run (or `layercache mount`); idle warm mounts (`warm`) alone do
    /// not count: `gc` and `clear` end them.
    pub in_use: bool,
    /// Idle warm mounts of the layer (`warm.rs`): mounts that outlived their run and wait
    /// for the next run of the layer.
    #[serde(default)]
    pub warm: u32,
    /// Runs (and `layercache mount`s) that mount the layer now, by their records.
    #[serde(default)]
    pub runs: u32,
    /// For a remote layer mounted lazily and not complete here yet (`partial/<layer>`): the
    /// bytes of its objects that are local (`bytes` is the whole layer's). `None` for a
    /// local layer.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub partial_bytes: Option<u64>,
    /// For a partial layer a run found broken (a missing or corrupt remote object, a manifest
    /// that breaks the rules: `partial/<layer>/broken`): why. Such a layer is not mounted
    /// again; a run of its key goes on as a local miss. `None` otherwise.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub broken: Option<String>,
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
    /// Idle warm mounts ended (`warm.rs`: an idle mount pins its layer; gc ends them all
    /// before it plans eviction). A dry run ends none and counts none.
    #[serde(default)]
    pub ended_warm: u64,
    /// Unpublished (orphan) layers removed.
    pub removed_orphans: u64,
    /// Empty host view directories that killed runs made and left, removed
    /// ([`super::reap_made_views`]; a dry run counts those it would remove).
    #[serde(default)]
    pub removed_view_dirs: u64,
    /// Failed setups' kept logs (`projects/<p>/failed/<run>`) removed: older than 7 days
    /// ([`super::keep_failed_logs`]).
    #[serde(default)]
    pub removed_failed_logs: u64,
    /// Partial (lazily mounted) remote layers removed: published locally since, or unused
    /// for longer than the age limit; no run using them (`partial/<layer>`).
    #[serde(default)]
    pub removed_partial: u64,
    /// Failed setups' kept logs still kept (younger than 7 days), and where: one
    /// `projects/<p>/failed/<run>` directory each.
    #[serde(default)]
    pub failed_logs: Vec<std::path::PathBuf>,
}

/// [`eviction::Usage`] in a report.
#[derive(Clone, Copy, Debug, Default, Serialize, Deserialize)]
pub struct UsageJson {
    /// Bytes of objects.
    pub bytes: u64,
    /// Inodes.
    pub inodes: u64,
    /// Layers.
    pub layers: u64,
}

impl From<eviction::Usage> for UsageJson {
    fn from(u: eviction::Usage) -> Self {
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

impl Store {
    /// `layercache ls`: every layer (of `project`, or all), newest first.
    ///
    /// Errors: [`Error::Invalid`] for an unknown project; [`Error::Io`] reading the store.
    pub fn list(&self, project: Option<&ProjectId>) -> Result<Vec<LayerInfo>> {
        let mut out = Vec::new();
        for pd in self.selected_projects(project)? {
            let holders = super::warm::holders(&pd);
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
                    in_use: lease::is_held(&l.lease_path(), Mode::Exclusive)?
                        && holders.get(&id).is_none_or(|h| h.runs > 0 || h.idle == 0),
                    warm: holders.get(&id).map_or(0, |h| h.idle),
                    runs: holders.get(&id).map_or(0, |h| h.runs),
                    layer: id,
                    partial_bytes: None,
                    broken: None,
                });
            }
            out.extend(partial_layers(&pd, &mut keys)?);
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

    /// `layercache gc`: removes stale staging and run directories (daemon dead), fill locks
    /// nobody holds, failed setups' kept logs older than 7 days (listing the others), empty host view directories a killed run made ([`super::reap_made_views`])
    /// and unpublished layers, then evicts least-recently-mounted layers (never a
    /// mounted one), quarantined entries (aged from when `verify` quarantined them; they
    /// count against the limits like layers) and partial layers no run holds (their held
    /// bytes count like a layer's; the remote has them) until under the limits (config.toml, overridden
    /// by `opts`), and removes objects no layer references. A dry run removes nothing and
    /// reports the same numbers (objects included: those only doomed trees link).
    ///
    /// Errors: [`Error::Io`] when the store cannot be read or changed.
    pub fn gc(&self, opts: &GcOptions) -> Result<GcReport> {
        let _span = tracing::info_span!("gc", dry_run = opts.dry_run).entered();
        let limits = super::Limits {
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
        let mut doomed = Doomed::new(pds.len());
        // 0. Mounts a killed mount or commit left; idle warm mounts (they pin their layers).
        if !dry {
            self.clear_all_leftover_mounts()?;
            for pd in &pds {
                report.ended_warm += self.reap_warm(pd);
            }
        }
        // 1. Garbage from crashes: staging (no promotion runs: we hold the locks) and runs.
        // Their files may be the only links to objects (a killed pull's tree, a promoted
        // upper), which the sweep below then removes.
        for (pi, pd) in pds.iter().enumerate() {
            let (staging, runs) = self.remove_crash_garbage(pd, dry, &mut doomed.of(pi))?;
            report.removed_partial += remove_partials(pd, limits.max_age, dry, &mut doomed.of(pi))?;
            report.removed_staging += staging;
            report.removed_runs += runs;
            self.reap_failed_logs(pd, dry, &mut report)?;
        }
        // Empty host view directories killed runs made (their records say which).
        report.removed_view_dirs = match dry {
            false => super::views::reap_made_views(&self.root)?,
            true => super::views::count_made_views(&self.root)?,
        };
        // 2. Candidates (orphans removed on the way), the plan under the limits, eviction.
        let mut cands = Candidates::default();
        for (pi, pd) in pds.iter().enumerate() {
            report.removed_orphans += cands.add_project(pi, pd, dry, &mut doomed.of(pi))?;
        }
        report.in_use = cands.list.iter().filter(|c| c.in_use).count() as u64;
        report.before = eviction::usage(&cands.list).into();
        let (evict, after) = eviction::plan(&cands.list, &limits);
        report.after = after.into();
        report.evicted = cands.evict(&pds, &evict, dry, &mut doomed)?;
        // 3. Objects no tree links any more (in a dry run: none but doomed trees).
        for (pi, pd) in pds.iter().enumerate() {
            if !dry {
                remove_stale_inputs(pd)?;
            }
            let (n, b) = if dry {
                would_sweep(pd, &doomed.0[pi])?
            } else {
                pd.objects().sweep_unreferenced(false)?
            };
            report.removed_objects += n;
            report.freed_bytes += b;
        }
        Ok(report)
    }

    /// Clears the leftovers a killed mount or commit left at every mountpoint where this
    /// store's runs are mounted (a stacked second mount above all; see
    /// [`Store::clear_leftover_mounts`]).
    ///
    /// Errors: [`Error::Io`] reading `/proc/self/mountinfo` or unmounting.
    fn clear_all_leftover_mounts(&self) -> Result<()> {
        let mut seen = HashSet::new();
        for m in crate::sys::mounts().at("/proc/self/mountinfo")? {
            if m.fs_type == "fuse.layercache"
                && m.source.starts_with("layercache:")
                && seen.insert(m.mount_point.clone())
            {
                self.clear_leftover_mounts(&m.mount_point, false)?;
            }
        }
        Ok(())
    }

    /// Phase 1 of [`Store::gc`] for one project (its lock held): removes every staging entry,
    /// the directories of stale runs and free fill locks; with `dry`, removes nothing and
    /// counts the trees in `doomed`. Returns (staging entries, run directories) removed.
    ///
    /// Errors: [`Error::Io`] reading or removing them.
    fn remove_crash_garbage(
        &self,
        pd: &ProjectDirs,
        dry: bool,
        doomed: &mut DoomedLinks<'_>,
    ) -> Result<(u64, u64)> {
        let (mut staging, mut runs) = (0, 0);
        for name in read_names(&pd.staging())? {
            staging += 1;
            let dir = pd.staging().join(name);
            if dry {
                doomed.tree(&dir)?;
            } else {
                remove_tree(&dir)?;
            }
        }
        for name in read_names(&pd.runs())? {
            let dir = pd.runs().join(&name);
            if self.run_is_stale(&dir)? {
                runs += 1;
                if dry {
                    doomed.tree(&dir)?;
                } else {
                    super::runs::remove_stale_run(&dir)?;
                }
            }
        }
        if !dry {
            remove_free_fill_locks(pd)?;
        }
        Ok((staging, runs))
    }

    /// Phase 1 of [`Store::gc`], failed setups' kept logs of `pd`: those older than
    /// [`super::failed::KEEP_FOR`] go (with `dry`, are counted), the rest are listed in
    /// `report`.
    ///
    /// Errors: [`Error::Io`] reading or removing them.
    fn reap_failed_logs(&self, pd: &ProjectDirs, dry: bool, report: &mut GcReport) -> Result<()> {
        let (removed, _) = super::failed::reap_failed(pd, super::failed::KEEP_FOR, dry)?;
        report.removed_failed_logs += removed;
        for name in read_names(&pd.failed())? {
            let dir = pd.failed().join(name);
            let old = dry
                && fs::symlink_metadata(&dir)
                    .and_then(|m| m.modified())
                    .ok()
                    .and_then(|t| t.elapsed().ok())
                    .is_some_and(|age| age >= super::failed::KEEP_FOR);
            if !old {
                report.failed_logs.push(dir);
            }
        }
        Ok(())
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
        // Idle warm mounts pin their layers: they end first.
        self.reap_warm(&pd);
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
        // Quarantined layers and objects go with the project's (or cache's) layers
        // (a quarantined layer whose cache cannot be told is cleared with the project only).
        for (name, _) in quarantine_entries(&pd)? {
            let entry = pd.quarantine().join(&name);
            let cache_of = LayerId::new(name.clone())
                .ok()
                .and_then(|id| {
                    super::layer::Layer::new(&pd.quarantine(), id)
                        .manifest()
                        .ok()
                })
                .map(|m| m.cache);
            if cache.is_none() || cache_of.as_ref() == cache {
                remove_tree(&entry)?;
            }
        }
        remove_free_fill_locks(&pd)?;
        remove_stale_inputs(&pd)?;
        report.removed_objects = pd.objects().sweep_unreferenced(false)?.0;
        // A cleared project leaves nothing behind (and stops being listed in error hints),
        // unless something of it is still mounted or running.
        if cache.is_none() && report.in_use.is_empty() && self.no_live_runs(&pd)? {
            // Renamed to a hidden name first, so a crash midway leaves no half project.
            let hidden = format!(".removing-{}-{}", pd.project, crate::sys::random_hex(6));
            let gone = pd.root.with_file_name(hidden);
            fs::rename(&pd.root, &gone).at(&pd.root)?;
            self.forget_checked(&pd.project);
            remove_tree(&gone)?;
        }
        Ok(report)
    }

    /// True when no run directory of `pd` belongs to a live run.
    fn no_live_runs(&self, pd: &ProjectDirs) -> Result<bool> {
        for name in read_names(&pd.runs())? {
            let dir = pd.runs().join(&name);
            if !self.run_is_stale(&dir)? {
                return Ok(false);
            }
        }
        Ok(true)
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
        self.reap_warm(&pd);
        let mut report = ClearReport::default();
        if let Some(id) = pd.read_key(cache, key)? {
            if pd.evict(&id)? {
                report.removed.push(id);
            } else {
                report.in_use.push(id);
            }
        }
        remove_stale_inputs(&pd)?;
        report.removed_objects = pd.objects().sweep_unreferenced(false)?.0;
        Ok(report)
    }

    /// An upper bound of [`Store::quick_usage`] from the layer manifests alone (nothing in
    /// `objects/` is read): each layer's file bytes and entries counted as if it shared no
    /// object with another layer. Objects that no layer links (a crashed build's, a lost
    /// race's) and the quarantine are not in it; gc counts and removes them.
    ///
    /// Errors: [`Error::Io`] listing the projects or their layers.
    pub fn usage_bound(&self) -> Result<eviction::Usage> {
        let mut u = eviction::Usage::default();
        for pd in self.projects(None)? {
            for id in pd.layer_ids()? {
                if let Ok(m) = pd.layer(&id).manifest() {
                    let c = &m.counts;
                    u.layers += 1;
                    u.bytes += c.bytes;
                    u.inodes += c.files + c.dirs + c.symlinks + c.other;
                }
            }
        }
        Ok(u)
    }

    /// Cheap usage estimate: object bytes and count (each once) plus the directories,
    /// symlinks and fifos recorded in the manifests.
    ///
    /// Errors: [`Error::Io`] reading the store.
    pub fn quick_usage(&self) -> Result<eviction::Usage> {
        let mut u = eviction::Usage::default();
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

/// What a gc candidate stands for.
enum Doomable {
    /// A layer of `layers/`.
    Layer(LayerId),
    /// An entry of `quarantine/` (a layer directory, or `objects`).
    Quarantined(String),
    /// A partial layer (`partial/<layer>`: what a lazy mount fetched so far; the remote
    /// has all of it).
    Partial(String),
}

/// Links into objects from the trees a gc removes, per project (inode → links): a dry run
/// counts the objects those removals would leave unreferenced.
struct Doomed(Vec<HashMap<u64, u64>>);

impl Doomed {
    fn new(projects: usize) -> Doomed {
        Doomed(vec![HashMap::new(); projects])
    }

    /// The counts of project `pi`.
    fn of(&mut self, pi: usize) -> DoomedLinks<'_> {
        DoomedLinks(&mut self.0[pi])
    }
}

/// [`Doomed`] of one project.
struct DoomedLinks<'a>(&'a mut HashMap<u64, u64>);

impl DoomedLinks<'_> {
    /// Counts one link to each of `objects` ((inode, bytes), as [`tree_usage`] lists them).
    fn objects(&mut self, objects: &[(u64, u64)]) {
        for &(ino, _) in objects {
            *self.0.entry(ino).or_default() += 1;
        }
    }

    /// Counts the links of the tree at `tree`.
    ///
    /// Errors: [`Error::Io`] reading it.
    fn tree(&mut self, tree: &Path) -> Result<()> {
        self.objects(&tree_usage(tree)?.0);
        Ok(())
    }
}

/// What gc may evict, across projects: each candidate of the eviction plan and what it is
/// (`place[c.index]` is the project index and the layer or quarantine entry of `list[c]`).
#[derive(Default)]
struct Candidates {
    list: Vec<eviction::Candidate>,
    place: Vec<(usize, Doomable)>,
}

impl Candidates {
    /// Adds the layers and quarantine entries of project `pi` (`pd`, its lock held).
    /// Unpublished layers that are not mounted are orphans of a crash between rename and
    /// publish: they are removed (with `dry`, counted in `doomed`), not added. Returns the
    /// number of orphans.
    ///
    /// Errors: [`Error::Io`] reading the project or removing an orphan.
    fn add_project(
        &mut self,
        pi: usize,
        pd: &ProjectDirs,
        dry: bool,
        doomed: &mut DoomedLinks<'_>,
    ) -> Result<u64> {
        let mut orphans = 0;
        let published: HashSet<LayerId> = pd.all_keys()?.into_iter().map(|(_, _, l)| l).collect();
        // A dry run ends no idle warm mount but plans as if it had (a real gc ends them all
        // first): a layer only they hold counts as free.
        let warm_only: HashSet<LayerId> = match dry {
            true => (super::warm::holders(pd).into_iter())
                .filter(|(_, h)| h.runs == 0 && h.idle > 0)
                .map(|(l, _)| l)
                .collect(),
            false => HashSet::new(),
        };
        for id in pd.layer_ids()? {
            let l = pd.layer(&id);
            let in_use =
                lease::is_held(&l.lease_path(), Mode::Exclusive)? && !warm_only.contains(&id);
            if !published.contains(&id) && !in_use {
                orphans += 1;
                if dry {
                    doomed.tree(&l.tree())?;
                } else {
                    pd.remove_layer(&id)?;
                }
                continue;
            }
            self.push(pi, Doomable::Layer(id), &l.tree(), l.idle(), in_use)?;
        }
        // Quarantined layers and objects: garbage that still takes space.
        for (name, age) in quarantine_entries(pd)? {
            let tree = pd.quarantine().join(&name);
            self.push(pi, Doomable::Quarantined(name), &tree, age, false)?;
        }
        // Partial layers: their held bytes count towards the limits like a layer's, and they
        // go by the same LRU rule (a run mounting one holds its lease).
        let root = pd.root.join("partial");
        for name in read_names(&root)? {
            if LayerId::new(&name).is_ok_and(|id| pd.layer(&id).tree().is_dir()) {
                continue; // published: phase 1 removes it (or, in a dry run, counted it)
            }
            let dir = root.join(&name);
            let in_use = lease::is_held(&dir.join("lease"), Mode::Exclusive)?;
            let idle = fs::metadata(&dir)
                .and_then(|m| m.modified())
                .ok()
                .and_then(|t| t.elapsed().ok())
                .unwrap_or_default();
            self.push(pi, Doomable::Partial(name), &dir, idle, in_use)?;
        }
        Ok(orphans)
    }

    fn push(
        &mut self,
        pi: usize,
        what: Doomable,
        tree: &Path,
        idle: std::time::Duration,
        in_use: bool,
    ) -> Result<()> {
        let (objects, own_inodes) = tree_usage(tree)?;
        self.list.push(eviction::Candidate {
            index: self.place.len(),
            idle,
            in_use,
            objects,
            own_inodes,
            project: pi,
        });
        self.place.push((pi, what));
        Ok(())
    }

    /// Evicts the candidates `evict` (indices the plan chose) of the projects `pds`; with
    /// `dry`, removes nothing and counts their links in `doomed`. A layer is re-checked under
    /// an exclusive lease (a mount may have started meanwhile) and skipped when mounted.
    /// Returns what went, as `project/layer` or `project/quarantine/name`.
    ///
    /// Errors: [`Error::Io`] removing a tree.
    fn evict(
        &self,
        pds: &[ProjectDirs],
        evict: &[usize],
        dry: bool,
        doomed: &mut Doomed,
    ) -> Result<Vec<String>> {
        let mut evicted = Vec::new();
        for &i in evict {
            let (pi, what) = &self.place[i];
            let pd = &pds[*pi];
            let gone = match what {
                Doomable::Layer(id) => dry || pd.evict(id)?,
                Doomable::Quarantined(name) => {
                    if !dry {
                        remove_tree(&pd.quarantine().join(name))?;
                    }
                    true
                }
                Doomable::Partial(name) => {
                    let dir = pd.root.join("partial").join(name);
                    match Lease::try_acquire(&dir.join("lease"), Mode::Exclusive)? {
                        Some(lease) => {
                            if !dry {
                                remove_tree(&dir)?;
                            }
                            drop(lease);
                            true
                        }
                        None => false, // a run mounted it meanwhile
                    }
                }
            };
            if !gone {
                continue;
            }
            if dry {
                doomed.of(*pi).objects(&self.list[i].objects);
            }
            evicted.push(match what {
                Doomable::Layer(id) => format!("{}/{id}", pd.project),
                Doomable::Quarantined(name) => format!("{}/quarantine/{name}", pd.project),
                Doomable::Partial(name) => format!("{}/partial/{name}", pd.project),
            });
        }
        Ok(evicted)
    }
}

/// Entries of `quarantine/` with the time since they were quarantined (their ctime: the
/// rename into quarantine sets it).
fn quarantine_entries(pd: &ProjectDirs) -> Result<Vec<(String, std::time::Duration)>> {
    let q = pd.quarantine();
    let now = std::time::SystemTime::now();
    let mut out = Vec::new();
    for name in read_names(&q)? {
        let p = q.join(&name);
        let m = fs::symlink_metadata(&p).at(&p)?;
        let ctime = std::time::UNIX_EPOCH
            + std::time::Duration::new(m.ctime().max(0) as u64, m.ctime_nsec().max(0) as u32);
        out.push((name, now.duration_since(ctime).unwrap_or_default()));
    }
    Ok(out)
}

/// Removes `caches/*/fills/*.lock` files nobody holds (a crashed fill's; a finished fill
/// removes its own).
fn remove_free_fill_locks(pd: &ProjectDirs) -> Result<()> {
    for c in pd.caches()? {
        let fills = pd.keys_dir(&c).with_file_name("fills");
        for name in read_names(&fills)? {
            if name.ends_with(".lock")
                && let Some(l) = Lease::try_acquire(&fills.join(&name), Mode::Exclusive)?
            {
                l.remove();
            }
        }
    }
    Ok(())
}

/// Removes `caches/*/inputs/<key>.json` ([`crate::why`]) whose key is no longer published.
fn remove_stale_inputs(pd: &ProjectDirs) -> Result<()> {
    for c in pd.caches()? {
        let keys = pd.keys_dir(&c);
        let inputs = pd.inputs_dir(&c);
        for name in read_names(&inputs)? {
            if let Some(key) = name.strip_suffix(".json")
                && !keys.join(key).exists()
            {
                let p = inputs.join(&name);
                fs::remove_file(&p).at(&p)?;
            }
        }
    }
    Ok(())
}

/// What [`super::object::ObjectStore::sweep_unreferenced`] would remove once the trees
/// counted in `doomed` (inode → links) are gone: (objects, bytes).
fn would_sweep(pd: &ProjectDirs, doomed: &HashMap<u64, u64>) -> Result<(u64, u64)> {
    let (mut n, mut b) = (0, 0);
    for (_, _, meta) in pd.objects().list()? {
        if meta.nlink() <= 1 + doomed.get(&meta.ino()).copied().unwrap_or(0) {
            n += 1;
            b += meta.len();
        }
    }
    Ok((n, b))
}

/// Objects (inode, size) a tree links, one entry per link, and the inodes it owns (dirs,
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

/// Phase 1 of [`Store::gc`], partial layers of `pd` (`partial/<layer>`, see
/// `crate::remote::lazy`): each that no run holds (its `lease` free) and that is published
/// locally now, or unused for longer than `max_age` (`None`: no age limit), goes — its `held/`
/// links with it, so objects only it kept are swept after; with `dry`, counted in `doomed`.
/// Returns how many.
///
/// Errors: [`Error::Io`] reading or removing them.
fn remove_partials(
    pd: &ProjectDirs,
    max_age: Option<std::time::Duration>,
    dry: bool,
    doomed: &mut DoomedLinks<'_>,
) -> Result<u64> {
    let root = pd.root.join("partial");
    let mut n = 0;
    for name in read_names(&root)? {
        let dir = root.join(&name);
        let published = LayerId::new(&name).is_ok_and(|id| pd.layer(&id).tree().is_dir());
        let idle = fs::metadata(&dir)
            .and_then(|m| m.modified())
            .ok()
            .and_then(|t| t.elapsed().ok())
            .unwrap_or_default();
        if !published && max_age.is_none_or(|age| idle < age) {
            continue;
        }
        let Some(lease) = Lease::try_acquire(&dir.join("lease"), Mode::Exclusive)? else {
            continue; // a run is using it
        };
        n += 1;
        if dry {
            doomed.tree(&dir)?;
        } else {
            remove_tree(&dir)?;
        }
        drop(lease);
    }
    Ok(n)
}

/// `broken` of a partial directory: why a run found the layer unusable (written by the tier
/// that lays partial directories out; `ls` shows it).
const PARTIAL_BROKEN: &str = "broken";

/// The rows of `pd`'s partial layers (`partial/<layer>`) that are not published locally: what
/// their `key.json` (the remote key record they were found by) says, with the bytes of the
/// objects in their `held/`. An unreadable one is left out.
///
/// Errors: [`Error::Io`] listing `partial/` or taking a lease probe.
fn partial_layers(
    pd: &ProjectDirs,
    keys: &mut HashMap<LayerId, Vec<CacheKey>>,
) -> Result<Vec<LayerInfo>> {
    let root = pd.root.join("partial");
    let mut out = Vec::new();
    for name in read_names(&root)? {
        let Ok(id) = LayerId::new(&name) else {
            continue;
        };
        let dir = root.join(&name);
        if pd.layer(&id).tree().is_dir() {
            continue;
        }
        let rec: Option<serde_json::Value> = fs::read(dir.join("key.json"))
            .ok()
            .and_then(|b| serde_json::from_slice(&b).ok());
        let Some(rec) = rec else { continue };
        // `cache` names it; partial directories of an earlier version only have the JSON
        // manifest, whose header says it.
        let cache: Option<CacheId> = match fs::read_to_string(dir.join("cache")) {
            Ok(c) => CacheId::new(c.trim()).ok(),
            Err(_) => fs::read(dir.join("manifest.json")).ok().and_then(|b| {
                let v: serde_json::Value = serde_json::from_slice(&b).ok()?;
                CacheId::new(v["layer"]["cache"].as_str()?).ok()
            }),
        };
        let Some(cache) = cache else { continue };
        let num = |k: &str| rec[k].as_u64().unwrap_or(0);
        let held: u64 = fs::read_dir(dir.join("held"))
            .map(|d| {
                d.flatten()
                    .filter_map(|e| e.metadata().ok())
                    .map(|m| m.len())
                    .sum()
            })
            .unwrap_or(0);
        let used = fs::metadata(&dir).and_then(|m| m.modified()).ok();
        out.push(LayerInfo {
            project: pd.project.clone(),
            cache,
            keys: keys.remove(&id).unwrap_or_default(),
            parent: None,
            created_ms: num("created_ms"),
            last_used_ms: used
                .and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok())
                .map_or(0, |d| d.as_millis() as u64),
            bytes: num("bytes"),
            files: num("files"),
            in_use: lease::is_held(&dir.join("lease"), Mode::Exclusive)?,
            warm: 0,
            runs: 0,
            layer: id,
            partial_bytes: Some(held),
            broken: fs::read_to_string(dir.join(PARTIAL_BROKEN))
                .ok()
                .map(|why| why.trim().to_string()),
        });
    }
    Ok(out)
}
