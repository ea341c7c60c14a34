//! Host view directories a run made (`<store>/v1/views/<run>.json`): a run that creates the
//! mount root, a `--workdir-view` directory or an empty `<workdir>/node_modules` on the host
//! for its views records them here (with their device and inode) and removes them itself when
//! it ends; when it is killed (`kill -9`) the record stays, and `gc` and the next run remove
//! what it names once its owner is gone — only a directory that is still the one the run made
//! (same device and inode), empty (rmdir(2) refuses anything else) and held by no live run (an
//! exclusive flock(2) taken without waiting: a run holds each view directory it uses shared).

use std::fs;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::error::{Error, IoContext, Result};
use crate::sys;

/// `views/<run>.json`: the directories one run made, outermost first.
#[derive(Debug, Serialize, Deserialize)]
struct MadeViews {
    /// The `layercache run` process that made them.
    owner_pid: u32,
    dirs: Vec<MadeDir>,
}

/// One directory a run made, and its identity when made.
#[derive(Debug, Serialize, Deserialize)]
struct MadeDir {
    path: PathBuf,
    dev: u64,
    ino: u64,
}

fn views_dir(root: &Path) -> PathBuf {
    root.join("v1").join("views")
}

fn record_path(root: &Path, run: &str) -> Result<PathBuf> {
    if run.is_empty() || !run.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-') {
        return Err(Error::invalid(format!(
            "run id {run:?}: want letters, digits and '-'"
        )));
    }
    Ok(views_dir(root).join(format!("{run}.json")))
}

/// Records that run `run` (this process) made `dirs` (outermost first) in the store at `root`,
/// replacing an earlier record of the run. Directories that no longer exist are left out; an
/// empty list removes the record.
///
/// Errors: [`Error::Invalid`] for a run id that is not letters, digits and `-`;
/// [`Error::Io`] writing `v1/views/<run>.json`.
pub fn record_made_views(root: &Path, run: &str, dirs: &[PathBuf]) -> Result<()> {
    let path = record_path(root, run)?;
    let dirs: Vec<MadeDir> = dirs
        .iter()
        .filter_map(|d| {
            let m = fs::symlink_metadata(d).ok().filter(|m| m.is_dir())?;
            Some(MadeDir {
                path: d.clone(),
                dev: m.dev(),
                ino: m.ino(),
            })
        })
        .collect();
    if dirs.is_empty() {
        return forget_made_views(root, run);
    }
    let rec = MadeViews {
        owner_pid: std::process::id(),
        dirs,
    };
    let dir = views_dir(root);
    fs::create_dir_all(&dir).at(&dir)?;
    let body = serde_json::to_vec(&rec).map_err(|e| Error::Failed(e.to_string()))?;
    let tmp = dir.join(format!(".{run}-{}.tmp", sys::random_hex(6)));
    fs::write(&tmp, body).at(&tmp)?;
    fs::rename(&tmp, &path).at(&path)
}

/// Removes run `run`'s record (its run removed what it made, or made nothing).
///
/// Errors: as [`record_made_views`]; a missing record is not an error.
pub fn forget_made_views(root: &Path, run: &str) -> Result<()> {
    let path = record_path(root, run)?;
    match fs::remove_file(&path) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(Error::io(&path, e)),
    }
}

/// Removes the view directories that runs of the store at `root` made and left behind when they
/// were killed (see the module docs for what is removed); returns how many were removed. A
/// record whose owner is alive is left alone; one whose directories are all gone, changed
/// (another inode), or not empty is removed; a directory another run holds stays recorded for
/// a later pass.
///
/// Errors: [`Error::Io`] listing `v1/views/` or removing a record.
pub fn reap_made_views(root: &Path) -> Result<u64> {
    let mut removed = 0;
    for (path, rec) in dead_records(root)? {
        let mut busy = Vec::new();
        for d in rec.dirs.into_iter().rev() {
            match remove_if_unused(&d) {
                Removal::Removed => removed += 1,
                Removal::Busy => busy.push(d),
                Removal::Keep => {}
            }
        }
        if busy.is_empty() {
            match fs::remove_file(&path) {
                Ok(()) => {}
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                Err(e) => return Err(Error::io(&path, e)),
            }
        } else {
            busy.reverse();
            let rec = MadeViews {
                owner_pid: rec.owner_pid,
                dirs: busy,
            };
            if let Ok(body) = serde_json::to_vec(&rec) {
                let tmp = path.with_extension("json.tmp");
                if fs::write(&tmp, body).is_ok() {
                    let _ = fs::rename(&tmp, &path);
                }
            }
        }
    }
    Ok(removed)
}

/// The records of `v1/views/` whose run is gone (its owner pid dead), with their paths; an
/// unreadable record (half-written by a run killed mid-write) is passed over.
///
/// Errors: [`Error::Io`] listing `v1/views/`.
fn dead_records(root: &Path) -> Result<Vec<(PathBuf, MadeViews)>> {
    let dir = views_dir(root);
    let names = match fs::read_dir(&dir) {
        Ok(rd) => rd,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(Error::io(&dir, e)),
    };
    let mut out = Vec::new();
    for ent in names {
        let path = ent.at(&dir)?.path();
        if path.extension().is_none_or(|e| e != "json") {
            continue;
        }
        let Ok(rec) = fs::read(&path)
            .map_err(drop)
            .and_then(|b| serde_json::from_slice::<MadeViews>(&b).map_err(drop))
        else {
            continue;
        };
        if !sys::pid_alive(rec.owner_pid) {
            out.push((path, rec));
        }
    }
    Ok(out)
}

/// What [`reap_made_views`] would remove now, without removing anything (`gc --dry-run`): the
/// recorded directories of dead runs that are still the ones they made, held by no run, and
/// empty but for directories that would go too.
///
/// Errors: [`Error::Io`] listing `v1/views/`.
pub fn count_made_views(root: &Path) -> Result<u64> {
    let mut doomed: std::collections::HashSet<PathBuf> = Default::default();
    for (_, rec) in dead_records(root)? {
        // Innermost first, as the reaper removes them.
        for d in rec.dirs.iter().rev() {
            let same = fs::symlink_metadata(&d.path)
                .is_ok_and(|m| m.is_dir() && m.dev() == d.dev && m.ino() == d.ino);
            let free = same
                && fs::File::open(&d.path)
                    .is_ok_and(|f| sys::flock(&f, libc::LOCK_EX | libc::LOCK_NB).is_ok());
            let empty = free
                && fs::read_dir(&d.path)
                    .is_ok_and(|rd| rd.flatten().all(|e| doomed.contains(&e.path())));
            if empty {
                doomed.insert(d.path.clone());
            }
        }
    }
    Ok(doomed.len() as u64)
}

enum Removal {
    Removed,
    /// Empty and ours, but a live run holds it: try again later.
    Busy,
    /// Gone, another directory now, or not empty: never ours to remove.
    Keep,
}

fn remove_if_unused(d: &MadeDir) -> Removal {
    let same = fs::symlink_metadata(&d.path)
        .is_ok_and(|m| m.is_dir() && m.dev() == d.dev && m.ino() == d.ino);
    if !same {
        return Removal::Keep;
    }
    let Ok(f) = fs::File::open(&d.path) else {
        return Removal::Keep;
    };
    if sys::flock(&f, libc::LOCK_EX | libc::LOCK_NB).is_err() {
        return Removal::Busy;
    }
    match fs::remove_dir(&d.path) {
        Ok(()) => Removal::Removed,
        Err(e) if e.raw_os_error() == Some(libc::EBUSY) => Removal::Busy,
        Err(_) => Removal::Keep,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_empty_unheld_dirs_of_a_dead_run_go() {
        let root = tempfile::tempdir().unwrap();
        let host = tempfile::tempdir().unwrap();
        let (a, b, full, held, later) = (
            host.path().join("a"),
            host.path().join("a/b"),
            host.path().join("full"),
            host.path().join("held"),
            host.path().join("later"),
        );
        for d in [&b, &full, &held, &later] {
            fs::create_dir_all(d).unwrap();
        }
        let dirs = [
            a.clone(),
            b.clone(),
            full.clone(),
            held.clone(),
            later.clone(),
        ];
        record_made_views(root.path(), "r1", &dirs).unwrap();
        // A live owner (this process): nothing is touched (nor counted by a dry run).
        assert_eq!(count_made_views(root.path()).unwrap(), 0);
        assert_eq!(reap_made_views(root.path()).unwrap(), 0);
        assert!(b.exists());
        // The owner is dead from here on.
        let path = record_path(root.path(), "r1").unwrap();
        let mut rec: MadeViews = serde_json::from_slice(&fs::read(&path).unwrap()).unwrap();
        rec.owner_pid = dead_pid();
        // `later` stands for a directory made anew since the run made its own (another inode).
        rec.dirs[4].ino ^= 1;
        fs::write(&path, serde_json::to_vec(&rec).unwrap()).unwrap();
        // Content and a live run's hold keep theirs too.
        fs::write(full.join("f"), b"x").unwrap();
        let hold = fs::File::open(&held).unwrap();
        sys::flock(&hold, libc::LOCK_SH).unwrap();
        // A dry run counts what the reaper then removes, and removes nothing.
        assert_eq!(count_made_views(root.path()).unwrap(), 2, "a/b and a");
        assert!(b.exists());
        assert_eq!(reap_made_views(root.path()).unwrap(), 2, "a/b then a");
        assert!(!a.exists());
        assert!(full.join("f").exists() && held.exists() && later.exists());
        // The held one is kept in the record and goes once its holder lets go.
        assert!(path.exists());
        drop(hold);
        assert_eq!(count_made_views(root.path()).unwrap(), 1);
        assert_eq!(reap_made_views(root.path()).unwrap(), 1);
        assert!(!held.exists() && !path.exists());
        assert!(later.exists());
    }

    #[test]
    fn records_are_replaced_and_forgotten() {
        let root = tempfile::tempdir().unwrap();
        let host = tempfile::tempdir().unwrap();
        record_made_views(root.path(), "r2", &[host.path().to_path_buf()]).unwrap();
        let path = record_path(root.path(), "r2").unwrap();
        assert!(path.exists());
        record_made_views(root.path(), "r2", &[host.path().join("gone")]).unwrap();
        assert!(!path.exists(), "nothing that exists: no record");
        forget_made_views(root.path(), "r2").unwrap();
        assert!(record_path(root.path(), "../x").is_err());
    }

    /// A pid no process has: a child that has exited and been waited for.
    fn dead_pid() -> u32 {
        let mut c = std::process::Command::new("true").spawn().unwrap();
        let pid = c.id();
        c.wait().unwrap();
        pid
    }
}
