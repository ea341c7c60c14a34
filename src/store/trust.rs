//! Who can change a store, checked before anything in it is trusted.
//!
//! A store is the user's who owns its root directory (the store's owner). Nobody else may be
//! able to replace what is in it, so every directory on the way from the root to what is used
//! is opened relative to its parent with `O_NOFOLLOW | O_DIRECTORY` (a symlink planted in the
//! store is refused, never followed) and refused (exit 2, naming the path, its owner, its mode
//! and the fix) when
//!
//! * it is writable by group or other users (the root included, sticky bit or not: layercache
//!   makes it 0755 whatever the umask);
//! * it belongs to a user other than the store's owner and root;
//! * for the root itself: one of its parent directories is writable by every user without the
//!   sticky bit (anyone could rename the store away and put their own in its place).
//!
//! What is made on the way gets its mode explicitly (`fchmod` after `mkdirat`, so the umask
//! does not matter) and, when root writes into a user's store, that user as its owner — root
//! never leaves files in a user's store that the user cannot manage.
//!
//! The walk also says who besides the caller and root could have changed what it reached
//! ([`Walked::changeable_by`]): a parent directory of the store or a directory of it owned by
//! another user. `run --project` refuses a stored spec someone else could have written (see
//! `crate::spec::load_stored`).

use std::fs;
use std::os::fd::OwnedFd;
use std::os::unix::fs::{DirBuilderExt, MetadataExt};
use std::path::{Path, PathBuf};

use rustix::fs::{Mode, OFlags};
use rustix::io::Errno;

use crate::error::{Error, Result};

/// How [`walk`] opens a directory it passes: no symlink followed, search permission only.
const PATH_FLAGS: OFlags = OFlags::PATH
    .union(OFlags::DIRECTORY)
    .union(OFlags::NOFOLLOW)
    .union(OFlags::CLOEXEC);
/// How a directory is opened to read, fchmod or fsync it.
const READ_FLAGS: OFlags = OFlags::RDONLY
    .union(OFlags::DIRECTORY)
    .union(OFlags::NOFOLLOW)
    .union(OFlags::CLOEXEC);

/// Opens the directory `dir` (from [`walk`], perhaps an `O_PATH` descriptor) again for
/// reading: `readdir`, `fsync`.
///
/// Errors: [`Error::Io`] naming it.
pub(crate) fn reopen_for_reading(dir: &Walked) -> Result<OwnedFd> {
    rustix::fs::openat(&dir.fd, ".", READ_FLAGS, Mode::empty())
        .map_err(|e| Error::io(&dir.path, e.into()))
}

/// A directory of the store reached by [`walk`], open.
#[derive(Debug)]
pub(crate) struct Walked {
    /// The directory, opened with `O_NOFOLLOW | O_DIRECTORY` relative to its parent (`O_PATH`
    /// unless this walk made it: [`reopen_for_reading`] to list or fsync it).
    pub fd: OwnedFd,
    /// Its path (for messages).
    pub path: PathBuf,
    /// The store's owner (the owner of its root directory) and that directory's group.
    pub owner: (u32, u32),
    /// Who besides this process's user and root could have changed what was reached: `uid N
    /// (the owner of PATH)` for the first such directory on the way, from `/` down; `None`
    /// when nobody else could.
    pub changeable_by: Option<String>,
}

/// This process's effective uid.
pub(crate) fn euid() -> u32 {
    rustix::process::geteuid().as_raw()
}

/// Makes the missing directories of `root` (and of its parents) with mode 0755 whatever the
/// umask (`mkdir(2)` then `fchmod(2)` of the directory made, opened with `O_NOFOLLOW`).
///
/// Errors: the `io::Error` of the `mkdir(2)` that failed (the caller names the store).
pub(crate) fn make_dirs(root: &Path) -> std::io::Result<()> {
    let missing: Vec<&Path> = root
        .ancestors()
        .take_while(|a| !a.as_os_str().is_empty() && fs::symlink_metadata(a).is_err())
        .collect();
    for dir in missing.into_iter().rev() {
        match fs::DirBuilder::new().mode(0o755).create(dir) {
            Ok(()) => {
                let fd = rustix::fs::open(
                    dir,
                    OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
                    Mode::empty(),
                )?;
                rustix::fs::fchmod(&fd, Mode::from_raw_mode(0o755))?;
            }
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

/// Whether a missing directory on the way is made ([`walk`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Missing {
    /// Made with the mode given with its name.
    Create,
    /// `walk` answers `Ok(None)`.
    Stop,
}

/// Opens the store root `root` and then each of `below` (names with the mode to make them
/// with), each relative to the one before, checking each as the module docs say. Returns the
/// last one, or `None` when one is missing and `missing` is [`Missing::Stop`].
///
/// Errors: [`Error::Invalid`] (exit 2) naming the path, its owner and mode and the fix for a
/// directory others can change, a symlink or non-directory in the store, or one of another
/// user; [`Error::Io`] when a directory cannot be opened, made or chowned.
pub(crate) fn walk(root: &Path, below: &[(&str, u32)], missing: Missing) -> Result<Option<Walked>> {
    let canon = fs::canonicalize(root).map_err(|e| Error::io(root, e))?;
    let me = euid();
    let mut changeable_by = None;
    // Parents of the store, from `/` down.
    let parents: Vec<&Path> = canon.ancestors().skip(1).collect();
    for dir in parents.into_iter().rev() {
        let m = fs::symlink_metadata(dir).map_err(|e| Error::io(dir, e))?;
        if m.mode() & 0o002 != 0 && m.mode() & 0o1000 == 0 {
            return Err(Error::invalid(format!(
                "store {}: its parent {} is writable by every user without the sticky bit \
                 (owner uid {}, mode {:04o}), so anyone could put another store in its place; \
                 `chmod o-w {}` (or `chmod +t`), or keep the store elsewhere",
                root.display(),
                dir.display(),
                m.uid(),
                m.mode() & 0o7777,
                dir.display()
            )));
        }
        note_owner(&mut changeable_by, m.uid(), me, dir);
    }
    // O_PATH: walking needs search permission only (a user reads a root store whose
    // projects/ is 0711); what is made is reopened for reading to fchmod it.
    let fd = rustix::fs::open(&canon, PATH_FLAGS, Mode::empty())
        .map_err(|e| Error::io(root, e.into()))?;
    let st = rustix::fs::fstat(&fd).map_err(|e| Error::io(root, e.into()))?;
    let owner = (st.st_uid, st.st_gid);
    check_mode(root, st.st_mode, st.st_uid, true)?;
    note_owner(&mut changeable_by, st.st_uid, me, root);
    let mut here = Walked {
        fd,
        path: root.to_path_buf(),
        owner,
        changeable_by: None,
    };
    for (name, mode) in below {
        let path = here.path.join(name);
        let made = if missing == Missing::Create {
            match rustix::fs::mkdirat(&here.fd, *name, Mode::from_raw_mode(*mode)) {
                Ok(()) => true,
                Err(Errno::EXIST) => false,
                Err(e) => return Err(Error::io(&path, e.into())),
            }
        } else {
            false
        };
        let flags = if made { READ_FLAGS } else { PATH_FLAGS };
        let fd = match rustix::fs::openat(&here.fd, *name, flags, Mode::empty()) {
            Ok(fd) => fd,
            Err(Errno::NOENT) if missing == Missing::Stop => return Ok(None),
            Err(Errno::LOOP | Errno::NOTDIR) => {
                return Err(Error::invalid(format!(
                    "{}: a symlink or not a directory inside the store; layercache does not \
                     follow links there (another user may have planted it): remove it",
                    path.display()
                )));
            }
            Err(e) => return Err(Error::io(&path, e.into())),
        };
        if made {
            // The mode asked for whatever the umask, and the store owner's when root made it
            // in a user's store.
            rustix::fs::fchmod(&fd, Mode::from_raw_mode(*mode))
                .map_err(|e| Error::io(&path, e.into()))?;
            give_to_owner(&fd, &path, owner)?;
        }
        let st = rustix::fs::fstat(&fd).map_err(|e| Error::io(&path, e.into()))?;
        check_mode(&path, st.st_mode, st.st_uid, false)?;
        check_owner(&path, st.st_uid, owner.0, root)?;
        note_owner(&mut changeable_by, st.st_uid, me, &path);
        here = Walked {
            fd,
            path,
            owner,
            changeable_by: None,
        };
    }
    here.changeable_by = changeable_by;
    Ok(Some(here))
}

/// [`walk`] with [`Missing::Create`]: the last directory, made if missing.
///
/// Errors: as [`walk`].
pub(crate) fn walk_create(root: &Path, below: &[(&str, u32)]) -> Result<Walked> {
    walk(root, below, Missing::Create)?
        .ok_or_else(|| Error::Failed(format!("{}: not made", root.display())))
}

/// Makes the directory `name` (mode `mode` whatever the umask, the store owner's when root
/// makes it in a user's store) in `dir` unless it exists.
///
/// Errors: [`Error::Io`] naming it when it cannot be made, opened (a symlink in its place
/// included: `ELOOP`) or chowned.
pub(crate) fn make_in(dir: &Walked, name: &str, mode: u32) -> Result<()> {
    let path = dir.path.join(name);
    match rustix::fs::mkdirat(&dir.fd, name, Mode::from_raw_mode(mode)) {
        Ok(()) => {
            let fd = rustix::fs::openat(&dir.fd, name, READ_FLAGS, Mode::empty())
                .map_err(|e| Error::io(&path, e.into()))?;
            rustix::fs::fchmod(&fd, Mode::from_raw_mode(mode))
                .map_err(|e| Error::io(&path, e.into()))?;
            give_to_owner(&fd, &path, dir.owner)
        }
        Err(Errno::EXIST) => Ok(()),
        Err(e) => Err(Error::io(&path, e.into())),
    }
}

/// When root writes into a user's store, makes what it made (`fd`) that user's.
///
/// Errors: [`Error::Io`] naming `path` when `fchown(2)` fails.
pub(crate) fn give_to_owner(
    fd: &impl std::os::fd::AsFd,
    path: &Path,
    owner: (u32, u32),
) -> Result<()> {
    if euid() == 0 && owner.0 != 0 {
        rustix::fs::fchown(
            fd,
            Some(rustix::fs::Uid::from_raw(owner.0)),
            Some(rustix::fs::Gid::from_raw(owner.1)),
        )
        .map_err(|e| Error::io(path, e.into()))?;
    }
    Ok(())
}

/// Notes `uid` (the owner of `path`) as one who could change the store when it is neither
/// root nor `me`, unless someone was noted before.
pub(crate) fn note_owner(noted: &mut Option<String>, uid: u32, me: u32, path: &Path) {
    if noted.is_none() && uid != 0 && uid != me {
        *noted = Some(format!("uid {uid} (the owner of {})", path.display()));
    }
}

/// Checks the file `path` of the store (format.json, config.toml) the way [`walk`] checks a
/// directory: not a symlink, not writable by group or others, the store owner's (`owner`, of
/// `root`) or root's. A missing file passes (the caller's read reports it).
///
/// Errors: [`Error::Invalid`] (exit 2) naming the file, its owner and mode, and the fix;
/// [`Error::Io`] when it cannot be looked at.
pub(crate) fn check_file(path: &Path, owner: (u32, u32), root: &Path) -> Result<()> {
    let m = match fs::symlink_metadata(path) {
        Ok(m) => m,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(Error::io(path, e)),
    };
    if !m.file_type().is_file() {
        return Err(Error::invalid(format!(
            "{}: a symlink or not a regular file inside the store; layercache does not follow \
             links there (another user may have planted it): remove it",
            path.display()
        )));
    }
    check_mode(path, m.mode(), m.uid(), false)?;
    check_owner(path, m.uid(), owner.0, root)
}

/// Refuses a directory or file of the store that group or other users may write.
///
/// Errors: [`Error::Invalid`] naming `path`, its owner and mode, and the fix.
pub(crate) fn check_mode(path: &Path, mode: u32, uid: u32, is_root: bool) -> Result<()> {
    if mode & 0o022 == 0 {
        return Ok(());
    }
    let what = if is_root {
        "the store's root directory"
    } else {
        "inside the store"
    };
    Err(Error::invalid(format!(
        "{}: writable by {} (owner uid {uid}, mode {:04o}), {what}, so another user could \
         replace what layercache reads there; `chmod go-w {}` (layercache makes its \
         directories 0755 or tighter)",
        path.display(),
        if mode & 0o002 != 0 {
            "every user"
        } else {
            "its group"
        },
        mode & 0o7777,
        path.display()
    )))
}

/// Refuses a directory or file of the store owned by neither the store's owner nor root.
///
/// Errors: [`Error::Invalid`] naming `path`, both owners and the fix.
pub(crate) fn check_owner(path: &Path, uid: u32, owner: u32, root: &Path) -> Result<()> {
    if uid == owner || uid == 0 {
        return Ok(());
    }
    Err(Error::invalid(format!(
        "{}: belongs to uid {uid}, not to the store's owner (uid {owner}, the owner of {}), so \
         that user could change what layercache reads there; remove it, or `chown -R {owner} \
         {}` if it is the store owner's",
        path.display(),
        root.display(),
        path.display()
    )))
}

/// `chown -R UID:UID path` (tests that play another user's store as root).
#[cfg(test)]
pub(crate) fn chown_tree(path: &Path, uid: u32) {
    let out = std::process::Command::new("chown")
        .args(["-R", &format!("{uid}:{uid}")])
        .arg(path)
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    fn chmod(p: &Path, m: u32) {
        fs::set_permissions(p, fs::Permissions::from_mode(m)).unwrap();
    }

    /// Missing directories are made with the mode asked for whatever the umask; a directory
    /// others may write, a symlink and a parent anyone may write without the sticky bit are
    /// refused with the path, owner, mode and fix.
    #[test]
    fn walk_makes_and_checks() {
        let t = tempfile::tempdir().unwrap();
        let root = t.path().join("a/b/store");
        // umask 000, as in the review's reproduction; put back below.
        let old = crate::sys::thread_umask(0);
        let made = make_dirs(&root);
        let walked = made.map(|()| walk(&root, &[("v1", 0o755), ("x", 0o700)], Missing::Create));
        crate::sys::thread_umask(old);
        let w = walked.unwrap().unwrap().unwrap();
        for (p, m) in [
            (t.path().join("a"), 0o755),
            (t.path().join("a/b"), 0o755),
            (root.clone(), 0o755),
            (root.join("v1"), 0o755),
            (root.join("v1/x"), 0o700),
        ] {
            assert_eq!(
                fs::metadata(&p).unwrap().mode() & 0o7777,
                m,
                "{}",
                p.display()
            );
        }
        assert_eq!(w.path, root.join("v1/x"));
        assert_eq!(w.changeable_by, None);
        assert!(
            walk(&root, &[("v1", 0o755), ("y", 0o700)], Missing::Stop)
                .unwrap()
                .is_none()
        );

        chmod(&root, 0o1777);
        let e = walk(&root, &[("v1", 0o755)], Missing::Stop)
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("every user") && e.contains("mode 1777") && e.contains("chmod go-w"),
            "{e}"
        );
        chmod(&root, 0o755);
        chmod(&root.join("v1"), 0o775);
        let e = walk(&root, &[("v1", 0o755)], Missing::Stop)
            .unwrap_err()
            .to_string();
        assert!(e.contains("its group") && e.contains("v1"), "{e}");
        chmod(&root.join("v1"), 0o755);

        std::os::unix::fs::symlink(t.path(), root.join("v1/link")).unwrap();
        let e = walk(&root, &[("v1", 0o755), ("link", 0o755)], Missing::Create)
            .unwrap_err()
            .to_string();
        assert!(e.contains("a symlink") && e.contains("link"), "{e}");

        chmod(&t.path().join("a"), 0o777);
        let e = walk(&root, &[("v1", 0o755)], Missing::Stop)
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("without the sticky bit") && e.contains("a"),
            "{e}"
        );
        chmod(&t.path().join("a"), 0o1777);
        assert!(walk(&root, &[("v1", 0o755)], Missing::Stop).is_ok());
    }

    /// Root: a directory of a third user is refused; a store of another user is walked, says
    /// who could change it, and what root makes there is that user's. Needs root.
    #[test]
    fn owners_as_root() {
        if euid() != 0 {
            eprintln!("skipped: needs root");
            return;
        }
        let t = tempfile::tempdir().unwrap();
        let root = t.path().join("store");
        make_dirs(&root).unwrap();
        walk(&root, &[("v1", 0o755)], Missing::Create).unwrap();
        std::os::unix::fs::chown(root.join("v1"), Some(65534), None).unwrap();
        let e = walk(&root, &[("v1", 0o755)], Missing::Stop)
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("belongs to uid 65534") && e.contains("store's owner (uid 0"),
            "{e}"
        );
        std::os::unix::fs::chown(&root, Some(65534), Some(65534)).unwrap();
        let w = walk(&root, &[("v1", 0o755), ("p", 0o700)], Missing::Create)
            .unwrap()
            .unwrap();
        let by = w.changeable_by.unwrap();
        assert!(by.contains("uid 65534"), "{by}");
        let m = fs::metadata(root.join("v1/p")).unwrap();
        assert_eq!((m.uid(), m.gid(), m.mode() & 0o7777), (65534, 65534, 0o700));
    }
}
