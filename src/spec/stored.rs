//! The spec `layercache run --project P` runs: the project's current stored spec (saved by
//! `layercache serve`; the store keeps the versions, src/store/specs.rs), parsed and checked
//! as `--spec FILE` is, with which version it is and when it was saved ([`StoredOrigin`]), which
//! the run prints before anything runs.

use std::path::Path;

use super::Spec;
use crate::error::{Error, Result};
use crate::ids::ProjectId;

/// Which stored spec a run runs: the project, the version and when it was saved.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StoredOrigin {
    /// The project.
    pub project: ProjectId,
    /// The version (1, 2, …; `<store>/v1/projects/<p>/specs/<version>.toml|json`).
    pub version: u64,
    /// When it was saved, ms since the Unix epoch.
    pub saved_ms: u64,
}

impl StoredOrigin {
    /// The save time, RFC 3339 UTC with seconds (`2026-12-02T04:10:11Z`).
    pub fn saved_rfc3339(&self) -> String {
        let t = std::time::UNIX_EPOCH + std::time::Duration::from_millis(self.saved_ms);
        humantime::format_rfc3339_seconds(t).to_string()
    }

    /// The line `run` prints on stderr: `layercache: using the stored spec of project P,
    /// version 3, saved 2026-12-02 04:10:11 UTC`.
    pub fn notice(&self) -> String {
        let saved = self.saved_rfc3339().replace('T', " ").replace('Z', " UTC");
        format!(
            "layercache: using the stored spec of project {}, version {}, saved {saved}",
            self.project, self.version
        )
    }

    /// What `run --json` reports: `{"project", "version", "saved"}` (`saved`: RFC 3339 UTC).
    pub fn to_json(&self) -> serde_json::Value {
        serde_json::json!({
            "project": self.project.as_str(),
            "version": self.version,
            "saved": self.saved_rfc3339(),
        })
    }
}

/// The current stored spec of `project` in the store at `root`, parsed, for
/// `layercache run --project P`, and which version it is.
///
/// A stored spec that a user other than this process's and root could have written (the
/// owner of a parent of the store, of a directory of it or of the file: see
/// `StoredSpec::changeable_by`) is refused: root never runs a spec from another user's store.
///
/// Errors: [`Error::Invalid`] (exit 2) for a bad project id, no store, a project the store does
/// not have, a project without a stored spec, a stored spec another user could have written
/// (naming that user, the file and what to do instead), one in a store that fails the store's
/// checks, or a stored spec that no longer validates (naming its version); [`Error::Io`]
/// reading it.
pub fn load_stored(root: &Path, project: &str) -> Result<(Spec, StoredOrigin)> {
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
    // Whoever could write the stored spec decides what runs: never another user's for root
    // (or for anyone) — a spec of a user's store runs as that user, or after review as a file.
    if let Some(who) = &stored.changeable_by {
        return Err(Error::invalid(format!(
            "--project {p}: the stored spec (version {}) could have been written by {who}, \
             not only by you (uid {}) or root, so it is not run; run it as that user, or read \
             {}/{}.{} and, if you trust it, pass a copy with --spec FILE",
            stored.version,
            rustix::process::geteuid().as_raw(),
            pd.specs_dir().display(),
            stored.version,
            stored.format
        )));
    }
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
    let origin = StoredOrigin {
        project: p,
        version: stored.version,
        saved_ms: stored.saved_ms,
    };
    Ok((spec, origin))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The version and save time come from the store, and the line names both.
    #[test]
    fn names_version_and_save_time() {
        let d = tempfile::tempdir().unwrap();
        let store = crate::store::Store::open(Some(d.path())).unwrap();
        let pd = store.project(&ProjectId::new("p").unwrap()).unwrap();
        pd.save_spec("project = \"p\"\n").unwrap();
        let saved = pd.save_spec("project = \"p\"\n# two\n").unwrap();
        let (spec, origin) = load_stored(d.path(), "p").unwrap();
        assert_eq!(spec.project.as_str(), "p");
        assert_eq!((origin.version, origin.saved_ms), (2, saved.saved_ms));
        let o = StoredOrigin {
            project: ProjectId::new("p").unwrap(),
            version: 3,
            saved_ms: 1_796_184_611_000,
        };
        assert_eq!(
            o.notice(),
            "layercache: using the stored spec of project p, version 3, saved 2026-12-02 \
             04:10:11 UTC"
        );
        assert_eq!(
            o.to_json(),
            serde_json::json!({"project": "p", "version": 3, "saved": "2026-12-02T04:10:11Z"})
        );
    }

    /// The review's reproduction, as root: a store root made under umask 000 is 0755 (so no
    /// user can swap its v1/); a store whose v1/ another user put there is refused; in a user's
    /// store (which root may serve) root does not run the stored spec. Needs root.
    #[test]
    fn root_never_runs_another_users_stored_spec() {
        use std::os::unix::fs::{MetadataExt, PermissionsExt};
        if !rustix::process::geteuid().is_root() {
            eprintln!("skipped: needs root");
            return;
        }
        let t = tempfile::tempdir().unwrap();
        let root = t.path().join("S");
        let old = crate::sys::thread_umask(0);
        let opened = crate::store::Store::open(Some(&root));
        crate::sys::thread_umask(old);
        let store = opened.unwrap();
        for (p, m) in [
            (root.clone(), 0o755),
            (root.join("v1"), 0o755),
            (root.join("v1/config.toml"), 0o644),
            (root.join("v1/format.json"), 0o644),
        ] {
            let mode = std::fs::metadata(&p).unwrap().mode() & 0o7777;
            assert_eq!(mode, m, "{}", p.display());
        }
        // A config.toml others may write (it names the remote a run pulls from) is refused.
        let cfg = root.join("v1/config.toml");
        std::fs::set_permissions(&cfg, std::fs::Permissions::from_mode(0o666)).unwrap();
        let e = crate::store::Store::open(Some(&root))
            .unwrap_err()
            .to_string();
        assert!(e.contains("config.toml") && e.contains("chmod go-w"), "{e}");
        std::fs::set_permissions(&cfg, std::fs::Permissions::from_mode(0o644)).unwrap();
        let pd = store.project(&ProjectId::new("rtp").unwrap()).unwrap();
        pd.save_spec("project = \"rtp\"\n").unwrap();
        assert!(load_stored(&root, "rtp").is_ok());

        // A v1/ of another user (as if planted in a root others could write) is refused.
        let chown = |p: &Path, uid: u32| std::os::unix::fs::chown(p, Some(uid), Some(uid)).unwrap();
        let chown_tree = |p: &Path, uid: u32| {
            let out = std::process::Command::new("chown")
                .args(["-R", &format!("{uid}:{uid}")])
                .arg(p)
                .output()
                .unwrap();
            assert!(out.status.success(), "{out:?}");
        };
        chown(&root.join("v1"), 65534);
        let e = load_stored(&root, "rtp").unwrap_err().to_string();
        assert!(
            e.contains("belongs to uid 65534") && e.contains("v1"),
            "{e}"
        );
        // A root others may write is refused even before that.
        std::fs::set_permissions(&root, std::fs::Permissions::from_mode(0o777)).unwrap();
        let e = load_stored(&root, "rtp").unwrap_err().to_string();
        assert!(e.contains("mode 0777") && e.contains("chmod go-w"), "{e}");
        std::fs::set_permissions(&root, std::fs::Permissions::from_mode(0o755)).unwrap();

        // The whole store the user's: root may read it (serve), but does not run its spec.
        chown_tree(&root, 65534);
        assert!(pd.current_spec().unwrap().unwrap().changeable_by.is_some());
        let e = load_stored(&root, "rtp").unwrap_err().to_string();
        assert!(
            e.contains("uid 65534") && e.contains("--spec FILE") && e.contains("1.toml"),
            "{e}"
        );
        // Only the version file another user's: refused too.
        chown_tree(&root, 0);
        assert!(load_stored(&root, "rtp").is_ok());
        chown(&root.join("v1/projects/rtp/specs/1.toml"), 65534);
        assert!(load_stored(&root, "rtp").is_err());
    }
}
