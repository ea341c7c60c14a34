//! The host directories a run builds its views on (the mount root, the `--workdir-view`
//! directory) and its store must be ones no other local user can change: a run creates them when missing,
//! flocks them, covers them in each step's mount namespace (a tmpfs over the mount root, the
//! workdir bound at its view) and removes what it made. A directory another user owns, or a
//! directory another user may write without the sticky bit above it, lets that user rename it
//! away and put a symlink in its place, so the path the tools resolve (in the step's namespace
//! too: the host's dentries are shared) would lead into that user's files.
//!
//! The rule (the one OpenSSH's `StrictModes` and sudo apply to the files they trust): every
//! existing component of the path, and of every symlink it passes through, is owned by root
//! or by the run's user, and every such directory that group or others may write has the
//! sticky bit (so its other entries' owners cannot rename or remove ours: `/tmp`, or `/cache`
//! made `1777`). Entries other users make *inside* the mount root do not matter: no step sees
//! them (the tmpfs covers them), and the view paths below it are never resolved on the host.
//! The directories a run makes are made by [`make_dirs`], which follows no symlink planted
//! while it works.

use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Component, Path, PathBuf};

use crate::error::{Error, Result};

/// Symlinks followed before a path counts as a loop (the kernel's own bound, `MAXSYMLINKS`).
const MAX_SYMLINKS: usize = 40;

/// Checks that `path` (absolute: a mount root, a workdir view, a store) is safe for a run of
/// user `uid` to build on: every
/// existing component — and of the symlinks it passes through, their own paths — is owned by
/// root or `uid`, and every such directory writable by group or others is sticky (module
/// docs). Components that do not exist yet are fine: the run makes them itself, owned by
/// `uid`, inside the last existing (checked) directory.
///
/// Errors: [`Error::Invalid`] naming `what` (`--mount-root`, `--workdir-view`, `--store`), the path,
/// the component refused, its owner and mode, and what would be valid; or the lstat/readlink
/// error of a component (not ENOENT), or ELOOP after 40 symlinks.
pub fn check_trusted(what: &str, path: &Path, uid: u32) -> Result<()> {
    let mut links = 0;
    walk(what, path, path, uid, &mut links).map(|_| ())
}

/// Checks the host directories the views of a run of `spec` over `paths` are built on, before
/// anything is made or mounted ([`check_trusted`] for the effective uid, i.e. the user outside
/// any namespace): the mount root when a cache's view lies below it, and the `--workdir-view`
/// directory. Docker needs neither (`host_view_dirs` false: the container has a root of its
/// own). Views below the workdir are the project's owner's business (a symlink there is
/// refused when it leads outside the workdir, [`crate::spec::Cache::mountpoint`]).
///
/// Errors: as [`check_trusted`], naming the flag.
pub fn check_host_views(
    spec: &crate::spec::Spec,
    paths: &crate::spec::Paths,
    host_view_dirs: bool,
) -> Result<()> {
    if !host_view_dirs {
        return Ok(());
    }
    let uid = rustix::process::geteuid().as_raw();
    let below_root = (spec.caches.iter())
        .filter_map(|c| c.mountpoint(paths).ok())
        .any(|v| v.starts_with(&paths.mount_root));
    if below_root {
        check_trusted("--mount-root", &paths.mount_root, uid)?;
    }
    if let Some(v) = &paths.workdir_view {
        check_trusted("--workdir-view", v, uid)?;
    }
    Ok(())
}

/// Makes directory `dir` (absolute, no `..`) and its missing parents as `mkdir -p` does (mode
/// 0755 before the umask), without following a symlink planted meanwhile: the symlinks of its
/// existing part are resolved once ([`crate::spec::resolve_existing`]), then the real path is
/// walked from `/` one component at a time through descriptors opened
/// `O_DIRECTORY|O_NOFOLLOW`, each missing component made with mkdirat(2) in its parent's
/// descriptor. A component swapped for a symlink (or a file) fails with `ELOOP`/`ENOTDIR`
/// instead of leading the run to make directories elsewhere.
///
/// Returns the real path, the directories made (outermost first) and the directory opened
/// (`O_RDONLY`, for the caller's flock).
///
/// Errors: the first failing call's `std::io::Error` (realpath, mkdirat, openat).
pub fn make_dirs(dir: &Path) -> std::io::Result<(PathBuf, Vec<PathBuf>, std::fs::File)> {
    use rustix::fs::{Mode, OFlags};
    let real = crate::spec::resolve_existing(dir)?;
    let flags = OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC;
    let mut fd = rustix::fs::open("/", flags, Mode::empty())?;
    let mut cur = PathBuf::from("/");
    let mut made = Vec::new();
    for c in real.components() {
        let Component::Normal(name) = c else {
            continue;
        };
        match rustix::fs::mkdirat(&fd, name, Mode::from_raw_mode(0o755)) {
            Ok(()) => made.push(cur.join(name)),
            Err(rustix::io::Errno::EXIST) => {}
            Err(e) => return Err(e.into()),
        }
        fd = rustix::fs::openat(&fd, name, flags, Mode::empty())?;
        cur.push(name);
    }
    Ok((cur, made, std::fs::File::from(fd)))
}

/// Walks `path` from `/`, checking each existing component (see [`check_trusted`]) and
/// following symlinks by recursion; returns where it leads (`None`: a component is missing,
/// so the rest is the run's to make).
fn walk(
    what: &str,
    shown: &Path,
    path: &Path,
    uid: u32,
    links: &mut usize,
) -> Result<Option<PathBuf>> {
    let mut cur = PathBuf::from("/");
    check_entry(what, shown, &cur, uid)?;
    for c in path.components() {
        let name = match c {
            Component::RootDir | Component::CurDir | Component::Prefix(_) => continue,
            Component::ParentDir => {
                cur.pop();
                continue;
            }
            Component::Normal(n) => n,
        };
        let next = cur.join(name);
        let meta = match std::fs::symlink_metadata(&next) {
            Ok(m) => m,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(io_err(what, shown, &next, e)),
        };
        check_entry(what, shown, &next, uid)?;
        if meta.file_type().is_symlink() {
            *links += 1;
            if *links > MAX_SYMLINKS {
                return Err(Error::invalid(format!(
                    "{what} {}: more than {MAX_SYMLINKS} symlinks on the way (a loop?)",
                    shown.display()
                )));
            }
            let target = std::fs::read_link(&next).map_err(|e| io_err(what, shown, &next, e))?;
            let base = cur.join(target);
            match walk(what, shown, &base, uid, links)? {
                Some(to) => cur = to,
                None => return Ok(None),
            }
        } else if meta.is_dir() {
            cur = next;
        } else {
            // A file where a directory is wanted: making the views fails with its own error.
            return Ok(None);
        }
    }
    Ok(Some(cur))
}

/// Checks one existing entry `at` (lstat: a symlink is judged as itself).
fn check_entry(what: &str, shown: &Path, at: &Path, uid: u32) -> Result<()> {
    let m = std::fs::symlink_metadata(at).map_err(|e| io_err(what, shown, at, e))?;
    let mode = m.permissions().mode();
    let owner_ok = m.uid() == 0 || m.uid() == uid;
    let open_dir = m.is_dir() && mode & 0o022 != 0 && mode & 0o1000 == 0;
    if owner_ok && !open_dir {
        return Ok(());
    }
    let why = if !owner_ok {
        format!("{} is owned by uid {}", at.display(), m.uid())
    } else {
        format!(
            "{} (mode {:o}) may be written by other users and is not sticky",
            at.display(),
            mode & 0o7777
        )
    };
    let who = if uid == 0 {
        "root".to_string()
    } else {
        format!("root or uid {uid}")
    };
    Err(Error::invalid(format!(
        "{what} {}: refused: {why}, so another user could replace a directory on its way (rename \
         it, put a symlink in its place); use a path whose directories only {who} can change \
         (below a 1777 directory such as `mkdir -m 1777 /cache` is fine: it is sticky)",
        shown.display()
    )))
}

fn io_err(what: &str, shown: &Path, at: &Path, e: std::io::Error) -> Error {
    Error::invalid(format!(
        "{what} {}: cannot check {}: {e}",
        shown.display(),
        at.display()
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::symlink;

    fn tmp() -> tempfile::TempDir {
        let d = tempfile::tempdir().unwrap();
        std::fs::set_permissions(d.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
        d
    }

    fn me() -> u32 {
        rustix::process::geteuid().as_raw()
    }

    #[test]
    fn own_and_sticky_directories_are_trusted() {
        let d = tmp();
        let root = d.path().join("cache");
        // Missing: the run makes it.
        check_trusted("--mount-root", &root.join("deep"), me()).unwrap();
        std::fs::create_dir(&root).unwrap();
        std::fs::set_permissions(&root, std::fs::Permissions::from_mode(0o1777)).unwrap();
        check_trusted("--mount-root", &root, me()).unwrap();
        // Below a sticky directory, our own entry is fine.
        std::fs::create_dir(root.join("mine")).unwrap();
        check_trusted("--mount-root", &root.join("mine"), me()).unwrap();
        // A symlink of ours to a directory of ours.
        symlink(&root, d.path().join("lnk")).unwrap();
        check_trusted("--mount-root", &d.path().join("lnk/mine"), me()).unwrap();
    }

    #[test]
    fn make_dirs_makes_the_missing_levels_and_never_follows_a_symlink_it_meets() {
        let d = tmp();
        let base = std::fs::canonicalize(d.path()).unwrap();
        let (real, made, _held) = make_dirs(&base.join("a/b/c")).unwrap();
        assert_eq!(real, base.join("a/b/c"));
        assert_eq!(made, [base.join("a"), base.join("a/b"), base.join("a/b/c")]);
        // Existing: nothing made; through a symlink of the existing part: its real path.
        symlink(base.join("a"), base.join("lnk")).unwrap();
        let (real, made, _held) = make_dirs(&base.join("lnk/b/c/d")).unwrap();
        assert_eq!(
            (real, made),
            (base.join("a/b/c/d"), vec![base.join("a/b/c/d")])
        );
        // A file where a directory is wanted.
        std::fs::write(base.join("f"), "").unwrap();
        assert!(make_dirs(&base.join("f/x")).is_err());
    }

    #[test]
    fn writable_without_sticky_is_refused() {
        let d = tmp();
        let open = d.path().join("open");
        std::fs::create_dir(&open).unwrap();
        std::fs::set_permissions(&open, std::fs::Permissions::from_mode(0o777)).unwrap();
        let e = check_trusted("--mount-root", &open.join("cache"), me())
            .unwrap_err()
            .to_string();
        assert!(
            e.starts_with("--mount-root ") && e.contains("mode 777") && e.contains("not sticky"),
            "{e}"
        );
        // Reached through a symlink: the target's directories are checked too.
        symlink(&open, d.path().join("lnk")).unwrap();
        let e = check_trusted("--workdir-view", &d.path().join("lnk/x"), me())
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("--workdir-view") && e.contains("not sticky"),
            "{e}"
        );
    }

    #[test]
    fn another_owner_is_refused() {
        let d = tmp();
        let sub = d.path().join("sub");
        std::fs::create_dir(&sub).unwrap();
        // Judged for another uid: everything here is ours (or root's when we are root).
        let other = if me() == 0 { 4242 } else { me() + 1 };
        let e = check_trusted("--mount-root", &sub, other);
        if me() == 0 {
            e.unwrap();
        } else {
            let e = e.unwrap_err().to_string();
            assert!(e.contains(&format!("owned by uid {}", me())), "{e}");
        }
        if me() == 0 {
            std::os::unix::fs::chown(&sub, Some(4242), None).unwrap();
            let e = check_trusted("--mount-root", &sub.join("cache"), 0)
                .unwrap_err()
                .to_string();
            assert!(
                e.contains("owned by uid 4242") && e.contains("root can"),
                "{e}"
            );
        }
    }
}
