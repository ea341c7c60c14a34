//! Why a miss: what differs between a cache's key inputs now and those of the nearest layer —
//! the one a restore key matched, else the newest layer of the same cache. (actions/cache users
//! ask exactly this: which key matched and why it missed.)
//!
//! Each published key's inputs ([`crate::key::CacheKeys::inputs`]: key-file digests, setup
//! script digest, env templates, mountpoint, preset version, tool versions, image) are kept by
//! the store (`caches/<c>/inputs/<key>.json`, src/store/inputs.rs, which reads and writes
//! them); this module is the diff.

use std::path::Path;

use crate::ids::{CacheId, ProjectId};
pub use crate::store::Inputs;
use crate::store::ProjectDirs;

/// Why `key` (with `inputs`) was not a hit: the [`diff`] against the nearest layer's inputs
/// (the store's [`ProjectDirs::nearest_inputs`]), prefixed by which key that is; or that there
/// is no earlier layer.
pub fn explain(
    store_root: &Path,
    project: &ProjectId,
    cache: &CacheId,
    matched: Option<&str>,
    inputs: &Inputs,
) -> Vec<String> {
    match ProjectDirs::at(store_root, project).nearest_inputs(cache, matched) {
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
    let digest = |name: &str| {
        name.starts_with("key file ") || name.starts_with("variable ") || name == "setup"
    };
    for (name, v) in new {
        match old.get(name) {
            Some(o) if o == v => {}
            Some(_) if digest(name) => out.push(format!(
                "{} changed",
                match name.strip_prefix("key file ") {
                    Some(file) => file,
                    None if name == "setup" => "setup script",
                    None => name,
                }
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
}
