//! `layercache remote ls | push KEY | pull KEY | gc`: operator commands over the remote tier.
//! Each prints one line (or one JSON value with `--json`) and returns the exit status.

use std::sync::Arc;

use serde::Serialize;

use super::{emit, json, store_root};
use crate::cli::{GlobalArgs, LsArgs, RemoteCommand, RemoteGcArgs, RemoteKeyArgs};
use crate::error::{Error, Result};
use crate::ids::{CacheId, CacheKey, ProjectId};
use crate::remote::Remote;
use crate::store::Store;

/// The remote of `store` (from `--remote` or config.toml).
///
/// Errors: [`Error::Invalid`] when none is configured, naming both ways to configure one.
pub fn require(store: &Store, global: &GlobalArgs) -> Result<Arc<Remote>> {
    crate::remote::open_for(store, global.remote.as_deref(), None)?.ok_or_else(|| {
        Error::invalid(format!(
            "no remote configured: pass --remote s3://bucket/prefix (or set LAYERCACHE_REMOTE), or \
             add [remote] url = \"s3://bucket/prefix\" to {}",
            store.root().join("v1/config.toml").display()
        ))
    })
}

/// Runs one `remote` subcommand.
///
/// Errors: [`Error::Invalid`] for bad ids or no remote; [`crate::remote::RemoteError`] naming the remote.
pub fn dispatch(global: &GlobalArgs, c: &RemoteCommand) -> Result<i32> {
    let root = store_root(global)?;
    let store = Store::open(Some(&root))?;
    let remote = require(&store, global)?;
    match c {
        RemoteCommand::Ls(a) => ls(global, &store, &remote, a),
        RemoteCommand::Push(a) => push(global, &store, &remote, a),
        RemoteCommand::Pull(a) => pull(global, &store, &remote, a),
        RemoteCommand::Gc(a) => gc(global, &remote, a),
    }
}

/// One row of `remote ls`.
#[derive(Clone, Debug, Serialize)]
pub struct RemoteRow {
    /// Project.
    pub project: ProjectId,
    /// Cache.
    pub cache: CacheId,
    /// Key.
    pub key: CacheKey,
    /// Its record (layer, created, sizes).
    #[serde(flatten)]
    pub record: crate::remote::KeyRecord,
    /// Whether this store has the key published too.
    pub local: bool,
}

/// Every key on the remote (of `project`, or all), newest first.
///
/// Errors: [`crate::remote::RemoteError`] naming the remote.
pub fn rows(store: &Store, remote: &Remote, project: Option<&ProjectId>) -> Result<Vec<RemoteRow>> {
    let mut out = remote.block_on(None, async {
        let projects = match project {
            Some(p) => vec![p.clone()],
            None => remote.projects().await?,
        };
        let mut out = Vec::new();
        for p in projects {
            for c in remote.children(&remote.layout().caches(&p)).await? {
                let Ok(cache) = CacheId::new(c) else { continue };
                for (key, _) in remote.list_keys(&p, &cache).await? {
                    if let Some(record) = remote.key_record(&p, &cache, &key).await? {
                        out.push((p.clone(), cache.clone(), key, record));
                    }
                }
            }
        }
        Ok(out)
    })?;
    out.sort_by_key(|r| std::cmp::Reverse(r.3.created_ms));
    Ok(out
        .into_iter()
        .map(|(project, cache, key, record)| {
            let local = store
                .projects(Some(&project))
                .ok()
                .and_then(|mut v| v.pop())
                .and_then(|pd| pd.read_key(&cache, &key).ok().flatten())
                .is_some();
            RemoteRow {
                project,
                cache,
                key,
                record,
                local,
            }
        })
        .collect())
}

fn ls(global: &GlobalArgs, store: &Store, remote: &Remote, a: &LsArgs) -> Result<i32> {
    let project = a.project.as_deref().map(ProjectId::new).transpose()?;
    let rows = rows(store, remote, project.as_ref())?;
    if global.json {
        emit(&json(&rows));
        return Ok(0);
    }
    emit(&format!(
        "{:<16} {:<14} {:<30} {:>10} {:>8} {:<5} KEY",
        "PROJECT", "CACHE", "LAYER", "BYTES", "FILES", "LOCAL"
    ));
    for r in rows {
        emit(&format!(
            "{:<16} {:<14} {:<30} {:>10} {:>8} {:<5} {}",
            r.project.as_str(),
            r.cache.as_str(),
            r.record.layer.as_str(),
            r.record.bytes,
            r.record.files,
            if r.local { "yes" } else { "no" },
            r.key
        ));
    }
    Ok(0)
}

fn ids(a: &RemoteKeyArgs) -> Result<(ProjectId, CacheId, CacheKey)> {
    Ok((
        ProjectId::new(a.project.as_str())?,
        CacheId::new(a.cache.as_str())?,
        CacheKey::new(a.key.as_str())?,
    ))
}

fn push(global: &GlobalArgs, store: &Store, remote: &Remote, a: &RemoteKeyArgs) -> Result<i32> {
    let (project, cache, key) = ids(a)?;
    let pd = store
        .projects(Some(&project))?
        .pop()
        .ok_or_else(|| Error::invalid(format!("project {project}: not in this store")))?;
    let layer = pd.read_key(&cache, &key)?.ok_or_else(|| {
        Error::invalid(format!(
            "key {key}: not published in {project}/{cache} here (see `layercache ls`)"
        ))
    })?;
    let rep = remote.push_layer(&pd, &cache, &key, &layer)?;
    if global.json {
        emit(&json(&rep));
    } else {
        emit(&rep.summary(remote.url()));
    }
    Ok(0)
}

fn pull(global: &GlobalArgs, store: &Store, remote: &Remote, a: &RemoteKeyArgs) -> Result<i32> {
    let (project, cache, key) = ids(a)?;
    let found = remote
        .block_on(None, remote.find(&project, &cache, &key, &[]))?
        .ok_or_else(|| {
            Error::invalid(format!(
                "key {key}: not on remote {} in {project}/{cache} (see `layercache remote ls`)",
                remote.url()
            ))
        })?;
    let pd = store.project(&project)?;
    let rep = remote.pull(store, &pd, &cache, &found)?;
    if global.json {
        emit(&json(&rep));
    } else {
        emit(&format!(
            "pulled key {} ({}): {} of {} object(s) downloaded ({} bytes), {} copied locally, in {} ms",
            rep.key,
            rep.result,
            rep.pulled_objects,
            rep.objects,
            rep.pulled_bytes,
            rep.copied_objects,
            rep.ms
        ));
    }
    Ok(0)
}

fn gc(global: &GlobalArgs, remote: &Remote, a: &RemoteGcArgs) -> Result<i32> {
    let grace = crate::units::parse_duration(&a.grace)
        .map_err(|e| Error::invalid(format!("--grace: {e}")))?
        .unwrap_or_default();
    let r = remote.gc(grace, a.dry_run)?;
    if global.json {
        emit(&json(&r));
    } else {
        emit(&format!(
            "{}remote gc: {} key(s), {} broken key(s) removed, {} manifest(s), {} object(s) and {} pack(s) ({} bytes) removed, {} recent kept",
            if r.dry_run { "(dry run) " } else { "" },
            r.keys,
            r.broken_keys.len(),
            r.removed_manifests,
            r.removed_objects,
            r.removed_packs,
            r.freed_bytes,
            r.kept_recent
        ));
    }
    Ok(0)
}

/// The line `layercache ls` adds when a remote is configured: how many keys the remote has
/// (of `project`, or all) and how many of them this store lacks; `None` without a remote. A
/// remote that cannot be read is reported in the line, never as an error of `ls`.
pub fn ls_note(global: &GlobalArgs, store: &Store, project: Option<ProjectId>) -> Option<String> {
    let remote = match crate::remote::open_for(store, global.remote.as_deref(), None) {
        Ok(Some(r)) => r,
        Ok(None) => return None,
        Err(e) => return Some(format!("remote: {e}")),
    };
    match rows(store, &remote, project.as_ref()) {
        Ok(rows) => Some(format!(
            "remote {}: {} key(s), {} not in this store (see `layercache remote ls`)",
            remote.url(),
            rows.len(),
            rows.iter().filter(|r| !r.local).count()
        )),
        Err(e) => Some(format!("remote: {e}")),
    }
}
