//! The stored specs of a project (`layercache serve` edits them, `layercache run --project P`
//! runs the current one), versioned in the project's own directory of the store:
//! ```text
//! <store>/v1/projects/<project>/specs/<n>.toml|json   every saved version, never rewritten
//! <store>/v1/projects/<project>/specs/current         "<n>.toml\n", replaced atomically (rename)
//! ```
//! A version file is created with `O_EXCL` (two saves never share a number) and fsynced before
//! `current` points at it, so a reader sees the old spec or the new one, never a partial file.
//! The store keeps the text; validating it is the spec's business (`crate::spec`).

use std::fs;
use std::io::Write;
use std::path::Path;

use serde::Serialize;

use super::ProjectDirs;
use crate::error::{Error, IoContext, Result};
use crate::ids::ProjectId;

/// A stored spec version.
#[derive(Clone, Debug, Serialize)]
pub struct StoredSpec {
    /// The project.
    pub project: ProjectId,
    /// The version number (1, 2, …).
    pub version: u64,
    /// `toml` or `json`.
    pub format: &'static str,
    /// The spec text as it was saved.
    pub text: String,
    /// When it was saved: the version file's modification time (version files are never
    /// rewritten), ms since the Unix epoch.
    pub saved_ms: u64,
}

/// The modification time of `f`, ms since the Unix epoch (0 before it).
fn mtime_ms(f: &fs::File, path: &Path) -> Result<u64> {
    let m = f.metadata().at(path)?.modified().at(path)?;
    Ok(m.duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64))
}

fn version_of(name: &str) -> Option<(u64, &'static str)> {
    let (n, ext) = name.split_once('.')?;
    let format = match ext {
        "toml" => "toml",
        "json" => "json",
        _ => return None,
    };
    Some((n.parse().ok()?, format))
}

impl ProjectDirs {
    /// The saved versions of this project's spec, ascending.
    ///
    /// Errors: [`Error::Io`] reading `specs/`.
    pub fn spec_versions(&self) -> Result<Vec<u64>> {
        let dir = self.specs_dir();
        let rd = match fs::read_dir(&dir) {
            Ok(rd) => rd,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
            Err(e) => return Err(Error::io(&dir, e)),
        };
        let mut out = Vec::new();
        for ent in rd {
            let ent = ent.at(&dir)?;
            if let Some((n, _)) = ent.file_name().to_str().and_then(version_of) {
                out.push(n);
            }
        }
        out.sort_unstable();
        Ok(out)
    }

    /// The current stored spec of this project, if one was saved.
    ///
    /// Errors: [`Error::Io`] reading it; [`Error::Failed`] when `current` names no version.
    pub fn current_spec(&self) -> Result<Option<StoredSpec>> {
        let dir = self.specs_dir();
        let ptr = dir.join("current");
        let name = match fs::read_to_string(&ptr) {
            Ok(s) => s.trim().to_string(),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(Error::io(&ptr, e)),
        };
        let (version, format) = version_of(&name)
            .ok_or_else(|| Error::Failed(format!("{}: names no spec version", ptr.display())))?;
        let path = dir.join(&name);
        let mut f = fs::File::open(&path).at(&path)?;
        let mut text = String::new();
        std::io::Read::read_to_string(&mut f, &mut text).at(&path)?;
        Ok(Some(StoredSpec {
            project: self.project.clone(),
            version,
            format,
            text,
            saved_ms: mtime_ms(&f, &path)?,
        }))
    }

    /// Saves `text` (already validated, for this project) as the next version and points
    /// `current` at it; returns the new version (its `saved_ms` is the new file's mtime).
    ///
    /// Errors: [`Error::Io`] when `specs/` cannot be written.
    pub fn save_spec(&self, text: &str) -> Result<StoredSpec> {
        let dir = self.specs_dir();
        match fs::DirBuilder::new().create(&dir) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
            Err(e) => return Err(Error::io(&dir, e)),
        }
        let format = if text.trim_start().starts_with('{') {
            "json"
        } else {
            "toml"
        };
        let mut version = self.spec_versions()?.last().copied().unwrap_or(0) + 1;
        let (name, saved_ms) = loop {
            let name = format!("{version}.{format}");
            let path = dir.join(&name);
            match fs::OpenOptions::new()
                .write(true)
                .create_new(true)
                .open(&path)
            {
                Ok(mut f) => {
                    f.write_all(text.as_bytes()).at(&path)?;
                    f.sync_all().at(&path)?;
                    break (name, mtime_ms(&f, &path)?);
                }
                // Another save took this number: take the next.
                Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => version += 1,
                Err(e) => return Err(Error::io(&path, e)),
            }
        };
        replace_atomically(&dir.join("current"), format!("{name}\n").as_bytes())?;
        Ok(StoredSpec {
            project: self.project.clone(),
            version,
            format,
            text: text.to_string(),
            saved_ms,
        })
    }
}

/// Writes `bytes` to a temporary file next to `path`, fsyncs it and renames it over `path`.
fn replace_atomically(path: &Path, bytes: &[u8]) -> Result<()> {
    let dir = path.parent().unwrap_or(Path::new("."));
    let tmp = dir.join(format!(".current-{}", crate::sys::random_hex(6)));
    let result = (|| {
        let mut f = fs::File::create(&tmp).at(&tmp)?;
        f.write_all(bytes).at(&tmp)?;
        f.sync_all().at(&tmp)?;
        fs::rename(&tmp, path).at(path)?;
        fs::File::open(dir).and_then(|d| d.sync_all()).at(dir)
    })();
    if result.is_err() {
        let _ = fs::remove_file(&tmp);
    }
    result
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn save_versions_and_current() {
        let d = tempfile::tempdir().unwrap();
        let pd = ProjectDirs {
            project: ProjectId::new("p").unwrap(),
            root: d.path().to_path_buf(),
        };
        assert!(pd.current_spec().unwrap().is_none());
        assert_eq!(pd.save_spec("project = \"p\"\n").unwrap().version, 1);
        let s = pd.save_spec("{\"project\": \"p\"}").unwrap();
        assert_eq!((s.version, s.format), (2, "json"));
        let c = pd.current_spec().unwrap().unwrap();
        assert_eq!((c.version, c.text.as_str()), (2, "{\"project\": \"p\"}"));
        // The save time is the version file's, the same when read back, and recent.
        assert_eq!(c.saved_ms, s.saved_ms);
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_millis() as u64;
        assert!(
            c.saved_ms <= now && now - c.saved_ms < 3_600_000,
            "{}",
            c.saved_ms
        );
        assert_eq!(pd.spec_versions().unwrap(), vec![1, 2]);
    }
}
