//! What the API and the pages show, computed once from the store and the event log with the
//! functions the CLI uses ([`Store::list`], [`Store::clear`], [`crate::telemetry`]), so a page,
//! a JSON answer and a command never disagree.

use std::collections::{BTreeMap, BTreeSet};

use serde::Serialize;

use super::errors::AppError;
use crate::ids::{CacheId, CacheKey, ProjectId};
use crate::store::{ClearReport, LayerInfo, ProjectDirs, Store};
use crate::telemetry::{CacheResult, Event};

/// One row of `GET /api/v1/projects`.
#[derive(Clone, Debug, Serialize)]
pub struct ProjectSummary {
    /// The project.
    pub project: ProjectId,
    /// Caches it has (with or without layers).
    pub caches: u64,
    /// Layers it holds.
    pub layers: u64,
    /// Apparent bytes of those layers (a file shared by two layers counts twice).
    pub bytes: u64,
    /// When a layer of it was last mounted (RFC 3339 UTC), `None` when never.
    pub last_used: Option<String>,
}

/// One layer under one of its keys, as `GET …/caches` lists it.
#[derive(Clone, Debug, Serialize)]
pub struct LayerRow {
    /// The key publishing it; `None` for an unpublished layer (gc removes those).
    pub key: Option<CacheKey>,
    /// The layer id.
    pub layer: String,
    /// Apparent bytes.
    pub bytes: u64,
    /// Regular files.
    pub files: u64,
    /// Created, RFC 3339 UTC.
    pub created: String,
    /// Last mounted, RFC 3339 UTC.
    pub last_used: String,
    /// Hits on this key in the event log.
    pub hits: u64,
    /// Mounted right now (clearing it is refused).
    pub in_use: bool,
}

/// One cache of a project with its layers, newest first.
#[derive(Clone, Debug, Serialize)]
pub struct CacheView {
    /// The cache id.
    pub cache: CacheId,
    /// Its layers, one row per key.
    pub layers: Vec<LayerRow>,
}

/// Formats ms since the Unix epoch as RFC 3339 UTC with seconds (`2026-12-01T07:50:03Z`).
pub fn iso_time(ms: u64) -> String {
    let secs = ms / 1000;
    let (days, rem) = (secs / 86_400, secs % 86_400);
    // Howard Hinnant's civil_from_days.
    let z = days as i64 + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    format!(
        "{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}Z",
        rem / 3600,
        rem % 3600 / 60,
        rem % 60
    )
}

/// Runs blocking store work off the async runtime.
///
/// Errors: whatever `f` returns; [`AppError::Internal`] when the task panicked.
pub async fn blocking<T: Send + 'static>(
    f: impl FnOnce() -> Result<T, AppError> + Send + 'static,
) -> Result<T, AppError> {
    tokio::task::spawn_blocking(f)
        .await
        .map_err(|e| AppError::Internal(format!("store task failed: {e}")))?
}

/// Validates a path segment as a project id (400 naming it).
pub fn project_id(s: &str) -> Result<ProjectId, AppError> {
    ProjectId::new(s).map_err(AppError::bad_id)
}

/// Validates a path segment as a cache id (400 naming it).
pub fn cache_id(s: &str) -> Result<CacheId, AppError> {
    CacheId::new(s).map_err(AppError::bad_id)
}

/// Validates a path segment as a cache key (400 naming it).
pub fn cache_key(s: &str) -> Result<CacheKey, AppError> {
    CacheKey::new(s).map_err(AppError::bad_id)
}

fn names<T: ToString>(v: impl IntoIterator<Item = T>) -> Vec<String> {
    v.into_iter().map(|x| x.to_string()).collect()
}

/// The project's directories, which must exist in the store.
///
/// Errors: 404 listing the store's projects.
pub fn require_project(store: &Store, p: &ProjectId) -> Result<ProjectDirs, AppError> {
    match store.projects(Some(p))?.pop() {
        Some(pd) => Ok(pd),
        None => Err(AppError::NotFound {
            what: format!("project {p}"),
            exists: names(store.projects(None)?.iter().map(|pd| &pd.project)),
        }),
    }
}

/// The project must be in the store or in the event log (a cleared project keeps its events),
/// as `layercache stats --project` requires.
///
/// Errors: 404 listing the projects of both.
pub fn require_known_project(
    store: &Store,
    events: &[Event],
    p: &ProjectId,
) -> Result<(), AppError> {
    if events.iter().any(|e| e.project == p.as_str()) || !store.projects(Some(p))?.is_empty() {
        return Ok(());
    }
    let mut known: BTreeSet<String> = events.iter().map(|e| e.project.clone()).collect();
    known.extend(names(store.projects(None)?.iter().map(|pd| &pd.project)));
    Err(AppError::NotFound {
        what: format!("project {p}"),
        exists: known.into_iter().collect(),
    })
}

/// The event log, for a project that must be in the store or in the log (see
/// [`require_known_project`]).
///
/// Errors: 404 listing the known projects; the log's read errors (500).
pub fn known_project_events(store: &Store, p: &ProjectId) -> Result<Vec<Event>, AppError> {
    let events = crate::telemetry::read(store.root())?;
    require_known_project(store, &events, p)?;
    Ok(events)
}

/// The caches of project `p`, which must exist (see [`caches`]), off the async runtime.
///
/// Errors: 404 listing the projects; store errors (500).
pub async fn project_caches(
    st: std::sync::Arc<super::AppState>,
    p: ProjectId,
) -> Result<Vec<CacheView>, AppError> {
    blocking(move || {
        let pd = require_project(&st.store, &p)?;
        let events = crate::telemetry::read(st.store.root())?;
        caches(&st.store, &pd, &events)
    })
    .await
}

/// Every project with its usage, by name.
///
/// Errors: store read errors (500).
pub fn projects(store: &Store) -> Result<Vec<ProjectSummary>, AppError> {
    let layers = store.list(None)?;
    let mut out = Vec::new();
    for pd in store.projects(None)? {
        let mine: Vec<&LayerInfo> = layers.iter().filter(|l| l.project == pd.project).collect();
        let mut caches: BTreeSet<CacheId> = pd.caches()?.into_iter().collect();
        caches.extend(mine.iter().map(|l| l.cache.clone()));
        out.push(ProjectSummary {
            caches: caches.len() as u64,
            layers: mine.len() as u64,
            bytes: mine.iter().map(|l| l.bytes).sum(),
            last_used: mine
                .iter()
                .map(|l| l.last_used_ms)
                .max()
                .filter(|&ms| ms > 0)
                .map(iso_time),
            project: pd.project,
        });
    }
    Ok(out)
}

/// The caches of an existing project with their layers (one row per key; an unpublished
/// layer gets one row without a key) and each key's hits from the event log.
///
/// Errors: store read errors (500).
pub fn caches(
    store: &Store,
    pd: &ProjectDirs,
    events: &[Event],
) -> Result<Vec<CacheView>, AppError> {
    let mut hits: BTreeMap<(&str, &str), u64> = BTreeMap::new();
    for e in events
        .iter()
        .filter(|e| e.project == pd.project.as_str() && e.result == CacheResult::Hit)
    {
        *hits.entry((&e.cache, &e.key)).or_default() += 1;
    }
    let mut by_cache: BTreeMap<CacheId, Vec<LayerRow>> =
        pd.caches()?.into_iter().map(|c| (c, Vec::new())).collect();
    for l in store.list(Some(&pd.project))? {
        let keys: Vec<Option<CacheKey>> = if l.keys.is_empty() {
            vec![None]
        } else {
            l.keys.iter().cloned().map(Some).collect()
        };
        let rows = by_cache.entry(l.cache.clone()).or_default();
        for key in keys {
            rows.push(LayerRow {
                hits: key
                    .as_ref()
                    .and_then(|k| hits.get(&(l.cache.as_str(), k.as_str())))
                    .copied()
                    .unwrap_or(0),
                key,
                layer: l.layer.to_string(),
                bytes: l.bytes,
                files: l.files,
                created: iso_time(l.created_ms),
                last_used: iso_time(l.last_used_ms),
                in_use: l.in_use,
            });
        }
    }
    Ok(by_cache
        .into_iter()
        .map(|(cache, layers)| CacheView { cache, layers })
        .collect())
}

/// What to clear: a whole project, one cache, or one key of a cache.
#[derive(Clone, Debug)]
pub enum ClearTarget {
    /// Every layer of the project.
    Project,
    /// Every layer of one cache.
    Cache(CacheId),
    /// The layer of one key.
    Key(CacheId, CacheKey),
}

/// Clears `target` in the existing project `pd` with the store's own clear; layers in use are
/// refused and reported as 409 (the others are cleared all the same, as `layercache clear`
/// does).
///
/// Errors: 404 for a cache or key the project does not have (listing those it has); 409 when
/// a layer was in use; store errors (500).
pub fn clear(
    store: &Store,
    pd: &ProjectDirs,
    target: &ClearTarget,
) -> Result<ClearReport, AppError> {
    let report = match target {
        ClearTarget::Project => store.clear(&pd.project, None)?,
        ClearTarget::Cache(c) => {
            require_cache(store, pd, c)?;
            store.clear(&pd.project, Some(c))?
        }
        ClearTarget::Key(c, k) => {
            require_cache(store, pd, c)?;
            if pd.read_key(c, k)?.is_none() {
                return Err(AppError::NotFound {
                    what: format!("key {k} of cache {c}"),
                    exists: names(pd.keys(c)?.into_iter().map(|(k, _)| k)),
                });
            }
            store.clear_key(&pd.project, c, k)?
        }
    };
    if report.in_use.is_empty() {
        return Ok(report);
    }
    let ids = names(&report.in_use);
    Err(AppError::InUse {
        message: format!(
            "refused to clear {} layer(s) in use (mounted): {}; unmount them first",
            ids.len(),
            ids.join(", ")
        ),
        in_use: ids,
        removed: names(&report.removed),
    })
}

/// The cache must exist in the project (a `caches/<cache>/` directory or a layer of it).
///
/// Errors: 404 listing the project's caches.
pub fn require_cache(store: &Store, pd: &ProjectDirs, c: &CacheId) -> Result<(), AppError> {
    let mut known: BTreeSet<CacheId> = pd.caches()?.into_iter().collect();
    known.extend(store.list(Some(&pd.project))?.into_iter().map(|l| l.cache));
    if known.contains(c) {
        return Ok(());
    }
    Err(AppError::NotFound {
        what: format!("cache {c} of project {}", pd.project),
        exists: names(known),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn iso_times() {
        assert_eq!(iso_time(0), "1970-01-01T00:00:00Z");
        assert_eq!(iso_time(951_782_400_000), "2000-02-29T00:00:00Z");
        assert_eq!(iso_time(1_796_111_403_000), "2026-12-01T07:50:03Z");
    }
}
