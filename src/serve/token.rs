//! The token of `layercache serve` when no `--token-file` is given, kept in the store:
//!
//! ```text
//! <store>/v1/serve-token   64 hex digits (256 bits from getrandom(2)) and a newline;
//!                          mode 0600, owned by the store's owner (the owner of <store>/v1)
//! ```
//!
//! The first `serve` of a store makes it; later ones reuse it, so a bookmarked login URL and a
//! script that reads the file keep working across restarts (code-server keeps its password the
//! same way). Rotating it: remove the file and restart `serve` (a new one is made; cookies and
//! bearer headers holding the old one are then refused).
//!
//! Nobody but the store's owner (and root) can read it: the file is 0600 and `v1/` (0755, made
//! by the store) must not be writable by group or others, so nobody else can plant or swap it.
//! It is made like a store object: written to an `O_EXCL|O_NOFOLLOW` temporary file in `v1/`,
//! fsynced, then `linkat`ed to its name (never replacing one: two `serve`s starting at once
//! end up with the same token), all relative to one descriptor of `v1/` opened with
//! `O_NOFOLLOW`. An existing file is opened with `O_NOFOLLOW` and refused unless it is a
//! regular file of the store's owner (or of this process's user) that nobody else may read.

use std::fs::File;
use std::io::{Read, Write};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use rustix::fs::{AtFlags, Mode, OFlags};

use crate::error::{Error, IoContext, Result};

/// The token file's name in `<store>/v1/`.
pub const FILE_NAME: &str = "serve-token";

/// Random bytes in a new token (256 bits; shown as twice as many hex digits).
const TOKEN_BYTES: usize = 32;

/// A new secret: [`TOKEN_BYTES`] random bytes from `getrandom(2)` as lowercase hex (safe in a
/// URL and a cookie).
///
/// Errors: [`Error::Io`] when the kernel gives no random bytes.
pub(super) fn random_secret() -> Result<String> {
    let mut bytes = [0u8; TOKEN_BYTES];
    crate::sys::fill_random(&mut bytes).map_err(|e| Error::io("getrandom(2)", e))?;
    Ok(crate::units::hex(&bytes))
}

/// Where the token of the store at `root` is kept: `<root>/v1/serve-token`.
pub fn path(root: &Path) -> PathBuf {
    root.join("v1").join(FILE_NAME)
}

/// The store's token: read from [`path`]`(root)`, or made there (see the module docs) when
/// there is none yet. Returns the token (64 hex digits, which are safe in a URL and a cookie).
///
/// Errors: [`Error::Invalid`] (exit 2) naming the file or directory when `<root>/v1` is a
/// symlink, not a directory, or writable by group or others; when this process runs as
/// neither the store's owner nor root; when the token file is a symlink or not a regular
/// file, belongs to another user, may be read by group or others, or holds no token (each
/// with the fix: `chmod`, or remove the file so that a new one is made); [`Error::Io`] when
/// the directory or file cannot be opened, written or linked, or the kernel gives no random
/// bytes.
pub fn load_or_create(root: &Path) -> Result<String> {
    let dir_path = root.join("v1");
    let dir = rustix::fs::open(
        &dir_path,
        OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
        Mode::empty(),
    )
    .map_err(|e| match e {
        rustix::io::Errno::LOOP | rustix::io::Errno::NOTDIR => Error::invalid(format!(
            "{}: a symlink or not a directory; the serve token is kept only in the store's own \
             v1 directory",
            dir_path.display()
        )),
        e => Error::io(&dir_path, e.into()),
    })?;
    let dir_stat = rustix::fs::fstat(&dir).map_err(|e| Error::io(&dir_path, e.into()))?;
    let owner = dir_stat.st_uid;
    if dir_stat.st_mode & 0o022 != 0 {
        return Err(Error::invalid(format!(
            "{}: writable by other users (mode {:03o}), so the serve token cannot be kept \
             there; `chmod 755 {}`",
            dir_path.display(),
            dir_stat.st_mode & 0o777,
            dir_path.display()
        )));
    }
    let euid = rustix::process::geteuid().as_raw();
    if euid != 0 && euid != owner {
        return Err(Error::invalid(format!(
            "{}: belongs to uid {owner}; `layercache serve` runs as the store's owner or root \
             (this is uid {euid})",
            dir_path.display()
        )));
    }
    let file_path = dir_path.join(FILE_NAME);
    loop {
        match read_existing(&dir, &file_path, owner, euid)? {
            Some(token) => return Ok(token),
            None => {
                if let Some(token) = create(&dir, &dir_path, owner, dir_stat.st_gid, euid)? {
                    return Ok(token);
                }
                // Another serve linked its token first: read that one.
            }
        }
    }
}

/// The token in the existing file, or `None` when there is no file.
fn read_existing(
    dir: &impl rustix::fd::AsFd,
    path: &Path,
    owner: u32,
    euid: u32,
) -> Result<Option<String>> {
    let (mut f, meta) = match crate::sys::open_nofollow(Some(dir.as_fd()), Path::new(FILE_NAME)) {
        Ok(opened) => opened,
        Err(e) if e.raw_os_error() == Some(libc::ENOENT) => return Ok(None),
        Err(e) if e.raw_os_error() == Some(libc::ELOOP) => {
            return Err(Error::invalid(format!(
                "{}: a symlink; remove it (`serve` then makes a new token file)",
                path.display()
            )));
        }
        Err(e) => return Err(Error::io(path, e)),
    };
    let remove = format!("remove it (`rm {}`) and restart serve", path.display());
    if !meta.file_type().is_file() {
        return Err(Error::invalid(format!(
            "{}: not a regular file; {remove}",
            path.display()
        )));
    }
    if meta.uid() != owner && meta.uid() != euid {
        return Err(Error::invalid(format!(
            "{}: belongs to uid {}, not to the store's owner (uid {owner}); {remove}",
            path.display(),
            meta.uid()
        )));
    }
    if meta.mode() & 0o077 != 0 {
        return Err(Error::invalid(format!(
            "{}: other users may use it (mode {:03o}); `chmod 600 {}`, or {remove} to make a \
             new token",
            path.display(),
            meta.mode() & 0o777,
            path.display()
        )));
    }
    let mut text = String::new();
    // A token file is one short line: a bigger one is not ours.
    (&mut f).take(4096).read_to_string(&mut text).at(path)?;
    let token = text.lines().next().unwrap_or("").trim().to_string();
    if token.len() < 2 * TOKEN_BYTES || !token.bytes().all(|b| b.is_ascii_hexdigit()) {
        return Err(Error::invalid(format!(
            "{}: holds no token (want {} hex digits on its first line); {remove}",
            path.display(),
            2 * TOKEN_BYTES
        )));
    }
    Ok(Some(token))
}

/// Makes a new token file; `None` when another process made one first.
fn create(
    dir: &impl rustix::fd::AsFd,
    dir_path: &Path,
    owner: u32,
    group: u32,
    euid: u32,
) -> Result<Option<String>> {
    let token = random_secret()?;
    let tmp = format!(".{FILE_NAME}-{}", crate::sys::random_hex(6));
    let tmp_path = dir_path.join(&tmp);
    let fd = rustix::fs::openat(
        dir,
        &tmp,
        OFlags::WRONLY | OFlags::CREATE | OFlags::EXCL | OFlags::NOFOLLOW | OFlags::CLOEXEC,
        Mode::from_raw_mode(0o600),
    )
    .map_err(|e| Error::io(&tmp_path, e.into()))?;
    let result = (|| {
        let mut f = File::from(fd);
        // Root serving a user's store: the file is the store owner's, like the rest of it.
        if euid == 0 && owner != 0 {
            std::os::unix::fs::fchown(&f, Some(owner), Some(group)).at(&tmp_path)?;
        }
        f.write_all(format!("{token}\n").as_bytes()).at(&tmp_path)?;
        f.sync_all().at(&tmp_path)?;
        let file_path = dir_path.join(FILE_NAME);
        match rustix::fs::linkat(dir, &tmp, dir, FILE_NAME, AtFlags::empty()) {
            Ok(()) => {
                rustix::fs::fsync(dir).map_err(|e| Error::io(dir_path, e.into()))?;
                Ok(Some(token.clone()))
            }
            Err(rustix::io::Errno::EXIST) => Ok(None),
            Err(e) => Err(Error::io(&file_path, e.into())),
        }
    })();
    let _ = rustix::fs::unlinkat(dir, &tmp, AtFlags::empty());
    result
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    fn store() -> tempfile::TempDir {
        let d = tempfile::tempdir().unwrap();
        crate::store::Store::open(Some(d.path())).unwrap();
        d
    }

    /// Made 0600 with 256 random bits, reused by the next start, a new one once removed.
    #[test]
    fn made_private_and_reused() {
        let d = store();
        let t = load_or_create(d.path()).unwrap();
        assert_eq!(t.len(), 64);
        assert!(t.bytes().all(|b| b.is_ascii_hexdigit()), "{t}");
        let meta = std::fs::symlink_metadata(path(d.path())).unwrap();
        assert!(meta.file_type().is_file());
        assert_eq!(meta.permissions().mode() & 0o777, 0o600);
        assert_eq!(meta.uid(), rustix::process::geteuid().as_raw());
        assert_eq!(
            std::fs::read_to_string(path(d.path())).unwrap(),
            format!("{t}\n")
        );
        assert_eq!(load_or_create(d.path()).unwrap(), t);
        // No temporary file is left behind.
        let names: Vec<String> = std::fs::read_dir(d.path().join("v1"))
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .filter(|n| n.contains(FILE_NAME))
            .collect();
        assert_eq!(names, [FILE_NAME]);
        std::fs::remove_file(path(d.path())).unwrap();
        let t2 = load_or_create(d.path()).unwrap();
        assert_ne!(t2, t);
    }

    /// Root serving another user's store makes the token file that user's (0600); a token file
    /// of a third user is refused. Needs root (a skip otherwise).
    #[test]
    fn root_keeps_the_store_owners_ownership() {
        if rustix::process::geteuid().as_raw() != 0 {
            eprintln!("skipped: needs root");
            return;
        }
        let d = store();
        let v1 = d.path().join("v1");
        let (owner, group, third) = (65534, 65534, 65533);
        std::os::unix::fs::chown(&v1, Some(owner), Some(group)).unwrap();
        let t = load_or_create(d.path()).unwrap();
        let meta = std::fs::symlink_metadata(path(d.path())).unwrap();
        assert_eq!((meta.uid(), meta.gid()), (owner, group));
        assert_eq!(meta.permissions().mode() & 0o777, 0o600);
        assert_eq!(load_or_create(d.path()).unwrap(), t);
        std::os::unix::fs::chown(path(d.path()), Some(third), None).unwrap();
        let e = load_or_create(d.path()).unwrap_err().to_string();
        assert!(e.contains("belongs to uid 65533"), "{e}");
    }

    /// A symlink, a readable file, an empty one and a world-writable v1 are refused with the
    /// fix; nothing is written through the symlink.
    #[test]
    fn unsafe_places_refused() {
        let d = store();
        let target = d.path().join("elsewhere");
        std::os::unix::fs::symlink(&target, path(d.path())).unwrap();
        let e = load_or_create(d.path()).unwrap_err().to_string();
        assert!(e.contains("a symlink") && e.contains(FILE_NAME), "{e}");
        assert!(!target.exists());
        std::fs::remove_file(path(d.path())).unwrap();

        std::fs::write(path(d.path()), format!("{}\n", "a".repeat(64))).unwrap();
        std::fs::set_permissions(path(d.path()), std::fs::Permissions::from_mode(0o644)).unwrap();
        let e = load_or_create(d.path()).unwrap_err().to_string();
        assert!(e.contains("mode 644") && e.contains("chmod 600"), "{e}");
        std::fs::set_permissions(path(d.path()), std::fs::Permissions::from_mode(0o600)).unwrap();
        assert_eq!(load_or_create(d.path()).unwrap(), "a".repeat(64));

        std::fs::write(path(d.path()), "").unwrap();
        let e = load_or_create(d.path()).unwrap_err().to_string();
        assert!(e.contains("holds no token") && e.contains("rm "), "{e}");
        std::fs::remove_file(path(d.path())).unwrap();

        let v1 = d.path().join("v1");
        std::fs::set_permissions(&v1, std::fs::Permissions::from_mode(0o777)).unwrap();
        let e = load_or_create(d.path()).unwrap_err().to_string();
        assert!(
            e.contains("writable by other users") && e.contains("chmod 755"),
            "{e}"
        );
        assert!(!path(d.path()).exists());
        std::fs::set_permissions(&v1, std::fs::Permissions::from_mode(0o755)).unwrap();
        assert!(load_or_create(d.path()).is_ok());
    }
}
