//! Why a miss (issue 11): what differs between a cache's key inputs now and those of the
//! nearest layer — the one a restore key matched, else the newest layer of the same cache.
//! (actions/cache users ask exactly this: which key matched and why it missed.)
//!
//! Each published key's inputs ([`crate::key::CacheKeys::inputs`]: key-file digests, setup
//! script digest, env templates, mountpoint, preset version, tool versions, image) are kept at
//! `<store>/v1/projects/<p>/caches/<c>/inputs/<key>.json`, written when the key is published
//! (by the commit, before its push starts) and when a pull publishes a key whose remote key
//! record carries them (issue 14); gc and clear remove them with their key.

use std::collections::BTreeMap;
use std::fs;
use std::path::Path;

use crate::ids::{CacheId, ProjectId};
use crate::store::ProjectDirs;

/// A key's inputs: input name (`key file <path>`, `setup`, `env <NAME>`, `tool <t>`, …) →
/// value or digest.
pub type Inputs = BTreeMap<String, String>;

/// Records the inputs of `key` of `cache` in project `pd` (atomically: temp file + rename).
/// Best effort: a failure is logged, since the layer itself is published already.
pub fn record(pd: &ProjectDirs, cache: &CacheId, key: &str, inputs: &Inputs) {
    let dir = pd.inputs_dir(cache);
    let write = || -> std::io::Result<()> {
        fs::create_dir_all(&dir)?;
        let tmp = dir.join(format!(".{key}.{}", crate::sys::random_hex(6)));
        fs::write(&tmp, serde_json::to_vec(inputs).unwrap_or_default())?;
        fs::rename(&tmp, dir.join(format!("{key}.json")))
    };
    if let Err(e) = write() {
        tracing::warn!(dir = %dir.display(), error = %e, "could not record the key's inputs");
    }
}

/// The recorded inputs of `key` of `cache` in project `pd`; `None` when none were recorded (or
/// the record does not parse).
pub fn read(pd: &ProjectDirs, cache: &CacheId, key: &str) -> Option<Inputs> {
    let path = pd.inputs_dir(cache).join(format!("{key}.json"));
    serde_json::from_slice(&fs::read(path).ok()?).ok()
}

/// The inputs of the nearest layer: those of `matched` (the key a restore key matched), else
/// of the most recently recorded key of the cache. `None` when nothing was recorded.
pub fn nearest(
    store_root: &Path,
    project: &ProjectId,
    cache: &CacheId,
    matched: Option<&str>,
) -> Option<(String, Inputs)> {
    let pd = ProjectDirs::at(store_root, project);
    let dir = pd.inputs_dir(cache);
    if let Some(k) = matched {
        return read(&pd, cache, k).map(|i| (k.to_string(), i));
    }
    let newest = fs::read_dir(&dir)
        .ok()?
        .flatten()
        .filter_map(|e| {
            let name = e.file_name().to_str()?.strip_suffix(".json")?.to_string();
            (!name.starts_with('.')).then_some((e.metadata().ok()?.modified().ok()?, name))
        })
        .max()?;
    read(&pd, cache, &newest.1).map(|i| (newest.1, i))
}

/// Why `key` (with `inputs`) was not a hit: the [`diff`] against the nearest layer's inputs
/// (see [`nearest`]), prefixed by which key that is; or that there is no earlier layer.
pub fn explain(
    store_root: &Path,
    project: &ProjectId,
    cache: &CacheId,
    matched: Option<&str>,
    inputs: &Inputs,
) -> Vec<String> {
    match nearest(store_root, project, cache, matched) {
        None if matched.is_some() => vec!["the restored layer's inputs were not recorded".into()],
        None => vec!["no earlier layer of this cache".into()],
        Some((k, old)) => {
            let mut d = diff(&old, inputs);
            if d.is_empty() {
                d.push("same inputs as the nearest layer, whose key is gone".into());
            }
            d.insert(0, format!("nearest layer {k}"));
            d
        }
    }
}

/// What changed from `old` to `new`, one phrase per input: `package-lock.json changed`,
/// `key file yarn.lock added`, `tool node: v20.1.0 → v22.0.0`, `setup script changed`, …
/// Empty when the inputs are equal (the nearest layer was built from the same inputs).
pub fn diff(old: &Inputs, new: &Inputs) -> Vec<String> {
    let mut out = Vec::new();
    let digest = |name: &str| name.starts_with("key file ") || name == "setup";
    for (name, v) in new {
        match old.get(name) {
            Some(o) if o == v => {}
            Some(_) if digest(name) => out.push(format!(
                "{} changed",
                name.strip_prefix("key file ").unwrap_or("setup script")
            )),
            Some(o) => out.push(format!("{name}: {o} → {v}")),
            None => out.push(format!("{name} added")),
        }
    }
    // A relocatable key has no mountpoint input; older records listed one anyway.
    for name in (old.keys()).filter(|n| !new.contains_key(*n) && *n != "mountpoint") {
        out.push(format!("{name} removed"));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn inputs(pairs: &[(&str, &str)]) -> Inputs {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn diff_names_each_changed_input() {
        let old = inputs(&[
            ("key file package-lock.json", "aa"),
            ("key file yarn.lock", "bb"),
            ("setup", "s1"),
            ("tool node", "v20.1.0"),
            ("mountpoint", "/w/node_modules"),
        ]);
        let new = inputs(&[
            ("key file package-lock.json", "cc"),
            ("key file pnpm-lock.yaml", "dd"),
            ("setup", "s2"),
            ("tool node", "v22.0.0"),
            ("mountpoint", "/w/node_modules"),
        ]);
        assert_eq!(
            diff(&old, &new),
            [
                "package-lock.json changed",
                "key file pnpm-lock.yaml added",
                "setup script changed",
                "tool node: v20.1.0 → v22.0.0",
                "key file yarn.lock removed",
            ]
        );
        assert!(diff(&new, &new).is_empty());
    }

    #[test]
    fn record_then_nearest() {
        let t = tempfile::tempdir().unwrap();
        let (p, c) = (&ProjectId::new("p").unwrap(), &CacheId::new("c").unwrap());
        assert!(nearest(t.path(), p, c, None).is_none());
        let pd = ProjectDirs::at(t.path(), p);
        record(&pd, c, "k1", &inputs(&[("setup", "a")]));
        assert_eq!(read(&pd, c, "k1").unwrap()["setup"], "a");
        let (k, i) = nearest(t.path(), p, c, None).unwrap();
        assert_eq!((k.as_str(), i["setup"].as_str()), ("k1", "a"));
        assert!(nearest(t.path(), p, c, Some("k2")).is_none());
        assert_eq!(nearest(t.path(), p, c, Some("k1")).unwrap().0, "k1");
    }
}
