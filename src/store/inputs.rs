//! A published key's inputs, kept so that a later miss can say what changed (`crate::why`
//! diffs them): `caches/<cache>/inputs/<key>.json`, written when the key is published (by the
//! commit, before its push starts, so the remote key record carries them; by a pull, from
//! that record); gc and clear remove it with its key.

use std::collections::BTreeMap;
use std::fs;

use super::ProjectDirs;
use crate::ids::CacheId;

/// A key's inputs: input name (`key file <path>`, `setup`, `env <NAME>`, `tool <t>`, …) →
/// value or digest (`crate::key::CacheKeys::inputs`).
pub type Inputs = BTreeMap<String, String>;

impl ProjectDirs {
    /// Records the inputs of `key` of `cache` (atomically: temp file + rename). Best effort:
    /// a failure is logged, since the layer itself is published already.
    pub fn record_inputs(&self, cache: &CacheId, key: &str, inputs: &Inputs) {
        let dir = self.inputs_dir(cache);
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

    /// The recorded inputs of `key` of `cache`; `None` when none were recorded (or the record
    /// does not parse).
    pub fn read_inputs(&self, cache: &CacheId, key: &str) -> Option<Inputs> {
        let path = self.inputs_dir(cache).join(format!("{key}.json"));
        serde_json::from_slice(&fs::read(path).ok()?).ok()
    }

    /// The inputs of the nearest layer: those of `matched` (the key a restore key matched),
    /// else of the most recently recorded key of the cache. `None` when nothing was recorded.
    pub fn nearest_inputs(
        &self,
        cache: &CacheId,
        matched: Option<&str>,
    ) -> Option<(String, Inputs)> {
        if let Some(k) = matched {
            return self.read_inputs(cache, k).map(|i| (k.to_string(), i));
        }
        let newest = fs::read_dir(self.inputs_dir(cache))
            .ok()?
            .flatten()
            .filter_map(|e| {
                let name = e.file_name().to_str()?.strip_suffix(".json")?.to_string();
                (!name.starts_with('.')).then_some((e.metadata().ok()?.modified().ok()?, name))
            })
            .max()?;
        self.read_inputs(cache, &newest.1).map(|i| (newest.1, i))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ids::ProjectId;

    #[test]
    fn record_then_nearest() {
        let t = tempfile::tempdir().unwrap();
        let (p, c) = (&ProjectId::new("p").unwrap(), &CacheId::new("c").unwrap());
        let pd = ProjectDirs::at(t.path(), p);
        assert!(pd.nearest_inputs(c, None).is_none());
        pd.record_inputs(c, "k1", &[("setup".to_string(), "a".to_string())].into());
        assert_eq!(pd.read_inputs(c, "k1").unwrap()["setup"], "a");
        let (k, i) = pd.nearest_inputs(c, None).unwrap();
        assert_eq!((k.as_str(), i["setup"].as_str()), ("k1", "a"));
        assert!(pd.nearest_inputs(c, Some("k2")).is_none());
        assert_eq!(pd.nearest_inputs(c, Some("k1")).unwrap().0, "k1");
    }
}
