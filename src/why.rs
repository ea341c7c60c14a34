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
    let pd = ProjectDirs::at(store_root, project);
    match pd.nearest_inputs(cache, matched) {
        None if matched.is_some() => vec!["the restored layer's inputs were not recorded".into()],
        None => vec!["no earlier layer of this cache".into()],
        Some((k, old)) => {
            let mut d = diff(&old, inputs);
            if d.is_empty() {
                // Its key is gone: verify may have quarantined its layer (else gc or clear).
                d.push(match pd.quarantine_note(cache, &k) {
                    Some(note) => format!("same inputs as the nearest layer, but {note}"),
                    None => "same inputs as the nearest layer, whose key is gone".into(),
                });
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
        name.starts_with("key file ")
            || name.starts_with("variable ")
            || name.starts_with("config ")
            || name == "setup"
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
    fn a_layer_verify_quarantined_is_said_so() {
        let root = tempfile::tempdir().unwrap();
        let store = crate::store::Store::open(Some(root.path())).unwrap();
        let (p, c) = (ProjectId::new("p").unwrap(), CacheId::new("c").unwrap());
        let key = crate::ids::CacheKey::new("c-k1").unwrap();
        let upper = root.path().join("upper");
        std::fs::create_dir(&upper).unwrap();
        std::fs::write(upper.join("f"), b"good bytes").unwrap();
        let published = store
            .promote_dirs(&p, &c, &key, None, Some(&upper))
            .unwrap();
        let pd = store.project(&p).unwrap();
        let mine = inputs(&[("setup", "aa")]);
        pd.record_inputs(&c, key.as_str(), &mine);
        let before = explain(root.path(), &p, &c, None, &mine);
        assert_eq!(
            before[1],
            "same inputs as the nearest layer, whose key is gone"
        );
        // The object changes under its name (same inode as the layer's file): verify
        // quarantines the layer and unpublishes its key.
        let tree_file = pd.layer(&published.layer).tree().join("f");
        std::fs::write(&tree_file, b"evil bytes").unwrap();
        let report = store.verify(Some(&p)).unwrap();
        assert_eq!(report.quarantined.len(), 1, "{report:?}");
        let why = explain(root.path(), &p, &c, None, &mine);
        assert_eq!(why[0], "nearest layer c-k1", "{why:?}");
        let want = format!(
            "same inputs as the nearest layer, but its layer {} was quarantined by \
             `layercache verify` ",
            published.layer
        );
        assert!(why[1].starts_with(&want), "{why:?}");
        assert!(
            why[1].contains("it linked object ") && why[1].contains("no longer match its hash"),
            "{why:?}"
        );
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
