//! The stored specs of a project (`layercache serve` edits them, `layercache run --project P`
//! runs the current one), versioned in the project's own directory of the store:
//! ```text
//! <store>/v1/projects/<project>/specs/<n>.toml|json   every saved version, never rewritten
//! <store>/v1/projects/<project>/specs/current         "<n>.toml\n", replaced atomically (rename)
//! ```
//! A version file is created with `O_EXCL` (two saves never share a number) and fsynced before
//! `current` points at it, so a reader sees the old spec or the new one, never a partial file.
//! The store keeps the text; validating it is the spec's business (`crate::spec`).

use std::fs::File;
use std::io::{Read, Write};
use std::os::fd::AsFd;
use std::os::unix::fs::MetadataExt;
use std::path::Path;

use rustix::fs::{AtFlags, Mode, OFlags};
use rustix::io::Errno;
use serde::Serialize;

use super::ProjectDirs;
use super::trust::{self, Missing, Walked};
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
    /// Who besides this process's user and root could have written or replaced it: `uid N
    /// (the owner of PATH)` for a parent directory of the store, a directory of it or the
    /// file itself owned by another user; `None` when nobody else could. `run --project`
    /// refuses a spec someone else could have written.
    #[serde(skip)]
    pub changeable_by: Option<String>,
}

/// The modification time of `f`, ms since the Unix epoch (0 before it).
fn mtime_ms(f: &File, path: &Path) -> Result<u64> {
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

/// Mode of the files written in `specs/` (the project directory above is 0700).
const FILE_MODE: u32 = 0o644;

/// Opens the file `name` of the opened `specs/` directory for reading without following a
/// symlink; `None` when it does not exist. Refused like a directory of the store (see
/// `trust`): a symlink, a file that is not regular, writable by group or others, or of a user
/// other than the store's owner and root. Notes its owner in `changeable_by`.
///
/// Errors: [`Error::Invalid`] (exit 2) naming the file, its owner and mode and the fix;
/// [`Error::Io`] when it cannot be opened.
fn open_file(
    dir: &Walked,
    name: &str,
    store_root: &Path,
    changeable_by: &mut Option<String>,
) -> Result<Option<File>> {
    let path = dir.path.join(name);
    let (f, m) = match crate::sys::open_nofollow(Some(dir.fd.as_fd()), Path::new(name)) {
        Ok(opened) => opened,
        Err(e) if e.raw_os_error() == Some(libc::ENOENT) => return Ok(None),
        Err(e) if e.raw_os_error() == Some(libc::ELOOP) => {
            return Err(Error::invalid(format!(
                "{}: a symlink inside the store; layercache does not follow links there \
                 (another user may have planted it): remove it",
                path.display()
            )));
        }
        Err(e) => return Err(Error::io(&path, e)),
    };
    if !m.file_type().is_file() {
        return Err(Error::invalid(format!(
            "{}: not a regular file; remove it",
            path.display()
        )));
    }
    trust::check_mode(&path, m.mode(), m.uid(), false)?;
    trust::check_owner(&path, m.uid(), dir.owner.0, store_root)?;
    trust::note_owner(changeable_by, m.uid(), trust::euid(), &path);
    Ok(Some(f))
}

/// The version numbers in the opened `specs/` directory, ascending.
fn versions_in(dir: &Walked) -> Result<Vec<u64>> {
    let fd = trust::reopen_for_reading(dir)?;
    let mut rd = rustix::fs::Dir::read_from(&fd).map_err(|e| Error::io(&dir.path, e.into()))?;
    let mut out = Vec::new();
    while let Some(ent) = rd.read() {
        let ent = ent.map_err(|e| Error::io(&dir.path, e.into()))?;
        if let Some((n, _)) = ent.file_name().to_str().ok().and_then(version_of) {
            out.push(n);
        }
    }
    out.sort_unstable();
    Ok(out)
}

impl ProjectDirs {
    /// The store root this project is in (`<root>` of `<root>/v1/projects/<project>`).
    fn store_root(&self) -> &Path {
        self.root.ancestors().nth(3).unwrap_or(Path::new("/"))
    }

    /// Opens `specs/` walking from the store root without following symlinks, each directory
    /// checked (see `trust`); with [`Missing::Create`] what is missing is made.
    fn specs_dir_walked(&self, missing: Missing) -> Result<Option<Walked>> {
        trust::walk(
            self.store_root(),
            &[
                ("v1", 0o755),
                ("projects", 0o711),
                (self.project.as_str(), 0o700),
                ("specs", 0o755),
            ],
            missing,
        )
    }

    /// The saved versions of this project's spec, ascending.
    ///
    /// Errors: [`Error::Invalid`] when a directory on the way fails the store's checks (see
    /// `trust`); [`Error::Io`] reading `specs/`.
    pub fn spec_versions(&self) -> Result<Vec<u64>> {
        match self.specs_dir_walked(Missing::Stop)? {
            Some(dir) => versions_in(&dir),
            None => Ok(Vec::new()),
        }
    }

    /// The current stored spec of this project, if one was saved. Every directory from the
    /// store root down and the two files (`current`, the version) are opened without
    /// following symlinks and checked like the store's own (see `trust`).
    ///
    /// Errors: [`Error::Invalid`] (exit 2) for a symlink, a file or directory others may write
    /// or of another user (naming it, its owner and mode, and the fix); [`Error::Io`] reading
    /// it; [`Error::Failed`] when `current` names no version.
    pub fn current_spec(&self) -> Result<Option<StoredSpec>> {
        let Some(dir) = self.specs_dir_walked(Missing::Stop)? else {
            return Ok(None);
        };
        let mut by = dir.changeable_by.clone();
        let store_root = self.store_root();
        let ptr = dir.path.join("current");
        let Some(f) = open_file(&dir, "current", store_root, &mut by)? else {
            return Ok(None);
        };
        let mut name = String::new();
        f.take(4096).read_to_string(&mut name).at(&ptr)?;
        let name = name.trim().to_string();
        let (version, format) = version_of(&name)
            .ok_or_else(|| Error::Failed(format!("{}: names no spec version", ptr.display())))?;
        let path = dir.path.join(&name);
        let mut f = open_file(&dir, &name, store_root, &mut by)?.ok_or_else(|| {
            Error::Failed(format!(
                "{}: names {name}, which does not exist",
                ptr.display()
            ))
        })?;
        let mut text = String::new();
        f.read_to_string(&mut text).at(&path)?;
        Ok(Some(StoredSpec {
            project: self.project.clone(),
            version,
            format,
            text,
            saved_ms: mtime_ms(&f, &path)?,
            changeable_by: by,
        }))
    }

    /// Saves `text` (already validated, for this project) as the next version and points
    /// `current` at it; returns the new version (its `saved_ms` is the new file's mtime).
    /// Every directory from the store root down is opened without following symlinks and
    /// checked (see `trust`); the files are made relative to the `specs/` descriptor
    /// (`openat` with `O_EXCL|O_NOFOLLOW`, mode 0644; `renameat` for `current`) and, when root
    /// writes into a user's store, given to the store's owner.
    ///
    /// Errors: [`Error::Invalid`] (exit 2) for a symlink or a directory others may write or
    /// of another user on the way; [`Error::Io`] when `specs/` cannot be written.
    pub fn save_spec(&self, text: &str) -> Result<StoredSpec> {
        let dir = self
            .specs_dir_walked(Missing::Create)?
            .ok_or_else(|| Error::Failed(format!("{}: not made", self.specs_dir().display())))?;
        let format = if text.trim_start().starts_with('{') {
            "json"
        } else {
            "toml"
        };
        let mut version = versions_in(&dir)?.last().copied().unwrap_or(0) + 1;
        let (name, saved_ms) = loop {
            let name = format!("{version}.{format}");
            let path = dir.path.join(&name);
            match create_file(&dir, &name) {
                Ok(mut f) => {
                    f.write_all(text.as_bytes()).at(&path)?;
                    f.sync_all().at(&path)?;
                    break (name, mtime_ms(&f, &path)?);
                }
                // Another save took this number: take the next.
                Err(Errno::EXIST) => version += 1,
                Err(e) => return Err(Error::io(&path, e.into())),
            }
        };
        replace_atomically(&dir, "current", format!("{name}\n").as_bytes())?;
        Ok(StoredSpec {
            project: self.project.clone(),
            version,
            format,
            text: text.to_string(),
            saved_ms,
            changeable_by: dir.changeable_by,
        })
    }
}

/// Creates `name` in `dir` (`O_EXCL|O_NOFOLLOW`, mode [`FILE_MODE`] whatever the umask, the
/// store owner's when root writes into a user's store).
fn create_file(dir: &Walked, name: &str) -> std::result::Result<File, Errno> {
    let fd = rustix::fs::openat(
        &dir.fd,
        name,
        OFlags::WRONLY | OFlags::CREATE | OFlags::EXCL | OFlags::NOFOLLOW | OFlags::CLOEXEC,
        Mode::from_raw_mode(FILE_MODE),
    )?;
    let made = (|| {
        rustix::fs::fchmod(&fd, Mode::from_raw_mode(FILE_MODE))?;
        if trust::euid() == 0 && dir.owner.0 != 0 {
            rustix::fs::fchown(
                &fd,
                Some(rustix::fs::Uid::from_raw(dir.owner.0)),
                Some(rustix::fs::Gid::from_raw(dir.owner.1)),
            )?;
        }
        Ok(())
    })();
    if let Err(e) = made {
        let _ = rustix::fs::unlinkat(&dir.fd, name, AtFlags::empty());
        return Err(e);
    }
    Ok(File::from(fd))
}

/// Writes `bytes` to a new temporary file in `dir`, fsyncs it and renames it over `name`
/// (`renameat` relative to `dir`), then fsyncs `dir`.
fn replace_atomically(dir: &Walked, name: &str, bytes: &[u8]) -> Result<()> {
    let tmp = format!(".{name}-{}", crate::sys::random_hex(6));
    let tmp_path = dir.path.join(&tmp);
    let path = dir.path.join(name);
    let result = (|| {
        let mut f = create_file(dir, &tmp).map_err(|e| Error::io(&tmp_path, e.into()))?;
        f.write_all(bytes).at(&tmp_path)?;
        f.sync_all().at(&tmp_path)?;
        rustix::fs::renameat(&dir.fd, &tmp, &dir.fd, name)
            .map_err(|e| Error::io(&path, e.into()))?;
        let fd = trust::reopen_for_reading(dir)?;
        rustix::fs::fsync(&fd).map_err(|e| Error::io(&dir.path, e.into()))
    })();
    if result.is_err() {
        let _ = rustix::fs::unlinkat(&dir.fd, &tmp, AtFlags::empty());
    }
    result
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn save_versions_and_current() {
        let d = tempfile::tempdir().unwrap();
        let store = super::super::Store::open(Some(d.path())).unwrap();
        let pd = store.project(&ProjectId::new("p").unwrap()).unwrap();
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

    /// A symlink planted anywhere on the way (the specs directory, the project directory,
    /// `current`, a version file) is refused, not followed: nothing is written or read
    /// through it.
    #[test]
    fn planted_symlinks_are_not_followed() {
        let d = tempfile::tempdir().unwrap();
        let store = super::super::Store::open(Some(&d.path().join("s"))).unwrap();
        let pd = store.project(&ProjectId::new("p").unwrap()).unwrap();
        let elsewhere = d.path().join("elsewhere");
        std::fs::create_dir(&elsewhere).unwrap();
        let empty = |p: &Path| std::fs::read_dir(p).unwrap().next().is_none();

        std::os::unix::fs::symlink(&elsewhere, pd.specs_dir()).unwrap();
        let e = pd.save_spec("project = \"p\"\n").unwrap_err().to_string();
        assert!(e.contains("a symlink") && e.contains("specs"), "{e}");
        assert!(pd.current_spec().is_err());
        assert!(empty(&elsewhere));
        std::fs::remove_file(pd.specs_dir()).unwrap();

        let other = store.project(&ProjectId::new("q").unwrap()).unwrap();
        std::fs::rename(&other.root, d.path().join("q-moved")).unwrap();
        std::os::unix::fs::symlink(&elsewhere, &other.root).unwrap();
        let e = other
            .save_spec("project = \"q\"\n")
            .unwrap_err()
            .to_string();
        assert!(e.contains("a symlink") && e.contains("q"), "{e}");
        assert!(empty(&elsewhere));

        pd.save_spec("project = \"p\"\n").unwrap();
        let secret = elsewhere.join("secret.toml");
        std::fs::write(&secret, "project = \"p\"\n# not the store's\n").unwrap();
        let version = pd.specs_dir().join("1.toml");
        std::fs::remove_file(&version).unwrap();
        std::os::unix::fs::symlink(&secret, &version).unwrap();
        let e = pd.current_spec().unwrap_err().to_string();
        assert!(e.contains("a symlink") && e.contains("1.toml"), "{e}");
        std::fs::remove_file(&version).unwrap();
        let current = pd.specs_dir().join("current");
        std::fs::remove_file(&current).unwrap();
        std::os::unix::fs::symlink(&secret, &current).unwrap();
        assert!(pd.current_spec().is_err());
        // A new save replaces the planted `current` (the link itself, not its target).
        assert_eq!(pd.save_spec("project = \"p\"\n").unwrap().version, 1);
        assert!(std::fs::symlink_metadata(&current).unwrap().is_file());
        assert_eq!(
            std::fs::read_to_string(&secret).unwrap(),
            "project = \"p\"\n# not the store's\n"
        );
    }

    /// Root saving into a user's store (root serving it) makes the specs directory, the
    /// version file and `current` that user's, mode 0755/0644 whatever the umask. Needs root.
    #[test]
    fn root_saving_in_a_users_store_gives_the_files_to_its_owner() {
        use std::os::unix::fs::MetadataExt;
        if trust::euid() != 0 {
            eprintln!("skipped: needs root");
            return;
        }
        let d = tempfile::tempdir().unwrap();
        let root = d.path().join("s");
        let store = super::super::Store::open(Some(&root)).unwrap();
        trust::chown_tree(&root, 65534);
        let pd = store.project(&ProjectId::new("p").unwrap()).unwrap();
        let old = crate::sys::thread_umask(0o077);
        let saved = pd.save_spec("project = \"p\"\n");
        crate::sys::thread_umask(old);
        saved.unwrap();
        for (p, mode) in [
            (pd.root.clone(), 0o700),
            (pd.root.join("layers"), 0o755),
            (pd.specs_dir(), 0o755),
            (pd.specs_dir().join("1.toml"), 0o644),
            (pd.specs_dir().join("current"), 0o644),
        ] {
            let m = std::fs::symlink_metadata(&p).unwrap();
            assert_eq!(
                (m.uid(), m.gid(), m.mode() & 0o7777),
                (65534, 65534, mode),
                "{}",
                p.display()
            );
        }
        let c = pd.current_spec().unwrap().unwrap();
        assert!(c.changeable_by.unwrap().contains("uid 65534"));
    }
}
