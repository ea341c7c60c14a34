//! The spec `layercache run --project P` runs: the project's current stored spec (saved by
//! `layercache serve`; the store keeps the versions, src/store/specs.rs), parsed and checked
//! as `--spec FILE` is.

use std::path::Path;

use super::Spec;
use crate::error::{Error, Result};
use crate::ids::ProjectId;

/// The current stored spec of `project` in the store at `root`, parsed, for
/// `layercache run --project P`.
///
/// Errors: [`Error::Invalid`] (exit 2) for a bad project id, no store, a project the store does
/// not have, a project without a stored spec, or a stored spec that no longer validates (naming
/// its version); [`Error::Io`] reading it.
pub fn load_stored(root: &Path, project: &str) -> Result<Spec> {
    let p = ProjectId::new(project)?;
    let store = crate::store::Store::open_existing(root)?.ok_or_else(|| {
        Error::invalid(format!(
            "--project {p}: no layercache store at {}",
            root.display()
        ))
    })?;
    let Some(pd) = store.projects(Some(&p))?.pop() else {
        let known: Vec<String> = store
            .projects(None)?
            .iter()
            .map(|pd| pd.project.to_string())
            .collect();
        return Err(crate::store::no_such_project(root, &p, &known));
    };
    let Some(stored) = pd.current_spec()? else {
        return Err(Error::invalid(format!(
            "--project {p}: the project has no stored spec (save one on the spec page of \
             `layercache serve` or with PUT /api/v1/projects/{p}/spec), or pass --spec FILE"
        )));
    };
    let spec = super::parse(&stored.text).map_err(|e| {
        Error::invalid(format!(
            "stored spec of {p} (version {}): {e}",
            stored.version
        ))
    })?;
    if spec.project != p {
        return Err(Error::invalid(format!(
            "stored spec of {p} (version {}) declares project {}",
            stored.version, spec.project
        )));
    }
    Ok(spec)
}
