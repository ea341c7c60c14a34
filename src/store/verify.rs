//! `layercache verify`: re-hash every object; quarantine what does not match its name and
//! unpublish every layer that links it (a later mount of its key misses and refills).

use std::collections::HashSet;
use std::fs;
use std::os::unix::fs::MetadataExt;
use std::path::Path;

use serde::Serialize;

use super::{Store, object};
use crate::error::{IoContext, Result};
use crate::ids::ProjectId;

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
            let mut bad: HashSet<(u64, u64)> = HashSet::new();
            let mut bad_paths = Vec::new();
            for (path, id, meta) in pd.objects().list()? {
                report.objects_checked += 1;
                let ok = object::hash_file(&path).map(|h| h == id).unwrap_or(false);
                if !ok {
                    bad.insert((meta.dev(), meta.ino()));
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
                if tree_links_any(&l.tree(), &bad)? {
                    pd.unpublish(&id)?;
                    let to = q.join(id.as_str());
                    fs::rename(&l.dir, &to).at(&l.dir)?;
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

fn tree_links_any(root: &Path, bad: &HashSet<(u64, u64)>) -> Result<bool> {
    let mut stack = vec![root.to_path_buf()];
    while let Some(dir) = stack.pop() {
        for ent in fs::read_dir(&dir).at(&dir)? {
            let ent = ent.at(&dir)?;
            let m = ent.metadata().at(ent.path())?;
            if m.is_dir() {
                stack.push(ent.path());
            } else if m.is_file() && bad.contains(&(m.dev(), m.ino())) {
                return Ok(true);
            }
        }
    }
    Ok(false)
}
