//! What a failed setup wrote to its logs, kept where its user can read it after the run:
//! `projects/<p>/failed/<run>/<cache>/…`. A run's private upper is discarded when the run
//! ends, and the log a package manager points at (npm's `<cache>/_logs/…-debug-0.log`, pip's
//! and uv's `--log-file`s) lies inside the view, so without this it is gone before anyone can
//! read it. Only log-like regular files of the upper ([`is_log_like`]) are copied, newest
//! first, at most [`MAX_FILES`] files and [`MAX_BYTES`] bytes; `gc` lists what is kept and
//! removes it after [`KEEP_FOR`] (CI systems keep a failed job's logs for a bounded time
//! too).

use std::fs;
use std::os::unix::fs::DirBuilderExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};

use super::paths::{ProjectDirs, read_names, remove_tree};
use crate::error::{Error, IoContext, Result};
use crate::sys::FsRoom;

/// How long `gc` keeps a failed setup's logs: 7 days from the failure.
pub const KEEP_FOR: Duration = Duration::from_secs(7 * 24 * 3600);
/// At most this many files are kept of one failed setup.
pub const MAX_FILES: usize = 64;
/// At most this many bytes are kept of one failed setup (a bigger file is cut to its tail).
pub const MAX_BYTES: u64 = 32 << 20;

/// What [`keep_failed_logs`] kept.
#[derive(Clone, Debug, Default)]
pub struct KeptLogs {
    /// `projects/<p>/failed/<run>/<cache>`: where the files are.
    pub dir: PathBuf,
    /// Each kept file: its path as the setup saw it (under the cache's view path) and where
    /// it is kept now; newest first.
    pub files: Vec<(PathBuf, PathBuf)>,
    /// Whether the end of the setup's output was kept, as `output.txt` in [`KeptLogs::dir`].
    pub output: bool,
}

/// Whether a file at `rel` (relative to a cache's mount) looks like a log a tool wrote for a
/// human: a name ending in `.log` (or a rotated `.log.N`), or any file in a directory named
/// `_logs`, `logs` or `log` (npm writes `_logs/<time>-debug-0.log`).
pub fn is_log_like(rel: &Path) -> bool {
    let name = rel
        .file_name()
        .map(|n| n.to_string_lossy().to_ascii_lowercase())
        .unwrap_or_default();
    if name.ends_with(".log") || name.contains(".log.") {
        return true;
    }
    let parent = rel.parent().and_then(|p| p.file_name());
    parent.is_some_and(|p| matches!(p.to_str(), Some("_logs" | "logs" | "log")))
}

/// A failed setup, as [`keep_failed_logs`] keeps it.
#[derive(Clone, Copy, Debug)]
pub struct FailedSetup<'a> {
    /// The run id (letters, digits and `-`).
    pub run: &'a str,
    /// The cache id.
    pub cache: &'a str,
    /// Its private upper: only what the setup wrote.
    pub upper: &'a Path,
    /// Where the setup saw the cache (its view path).
    pub view: &'a Path,
    /// The script as it ran.
    pub script: &'a str,
    /// Its exit status.
    pub status: i32,
    /// The end of its stdout and stderr, when captured.
    pub output: Option<&'a [u8]>,
    /// The run's other caches as (cache id, private upper, view path): a tool may log into
    /// another cache's view (npm's `_logs` live in its cache, the `npm` cache, when the
    /// `node_modules` setup fails), and those uppers go with the run too.
    pub others: &'a [(&'a str, &'a Path, &'a Path)],
}

/// Copies the log-like files of `f.upper` into `projects/<p>/failed/<run>/<cache>/` of `pd`,
/// keeping their paths relative to the mount, plus `setup.txt` (the script, its exit status
/// and the view path) and, when given, `output.txt`: the end of the setup's stdout and
/// stderr. Returns `Ok(None)` when there is neither a log-like file nor output.
///
/// Errors: [`Error::Invalid`] for a run id that is not letters, digits and `-`; [`Error::Io`]
/// creating or writing the copies (e.g. `ENOSPC` on a full store: what was copied is removed
/// again).
pub fn keep_failed_logs(pd: &ProjectDirs, f: &FailedSetup<'_>) -> Result<Option<KeptLogs>> {
    let FailedSetup {
        run,
        cache,
        upper,
        view,
        script,
        status,
        output,
        others,
    } = *f;
    if !crate::ids::is_run_path_safe(run) {
        return Err(Error::invalid(format!(
            "run id {run:?}: want letters, digits and '-'"
        )));
    }
    // Newest first: the last attempt's log matters most.
    let newest_logs = |upper: &Path| {
        let mut found = Vec::new();
        collect_logs(upper, Path::new(""), &mut found);
        found.sort_by_key(|f| std::cmp::Reverse(f.1));
        found
    };
    let found = newest_logs(upper);
    let theirs: Vec<_> = others
        .iter()
        .filter(|(id, ..)| *id != cache && is_plain_id(id))
        .map(|&(id, up, v)| (id, up, v, newest_logs(up)))
        .filter(|o| !o.3.is_empty())
        .collect();
    let output = output.filter(|o| !o.is_empty());
    if found.is_empty() && theirs.is_empty() && output.is_none() {
        return Ok(None);
    }
    let run_dir = pd.failed().join(run);
    let dir = run_dir.join(cache);
    let copied = write_setup_note(&dir, view, script, status).and_then(|()| {
        let mut budget = Budget {
            files: MAX_FILES,
            bytes: MAX_BYTES,
        };
        let mut files = copy_found(upper, &dir, &found, view, &mut budget)?;
        // Another cache's logs under `other-caches/<its id>/`.
        for (id, up, v, found) in &theirs {
            let to = dir.join("other-caches").join(id);
            files.extend(copy_found(up, &to, found, v, &mut budget)?);
        }
        if let Some(o) = output {
            let path = dir.join("output.txt");
            fs::write(&path, o).at(&path)?;
        }
        Ok(files)
    });
    match copied {
        Ok(files) => Ok(Some(KeptLogs {
            dir,
            files,
            output: output.is_some(),
        })),
        Err(e) => {
            let _ = remove_tree(&run_dir);
            Err(e)
        }
    }
}

/// Regular files under `dir` (recursively, `rel` its path in the mount) that
/// [`is_log_like`], with their mtimes. Symlinks are not followed; unreadable directories are
/// skipped.
fn collect_logs(dir: &Path, rel: &Path, out: &mut Vec<(PathBuf, SystemTime, u64)>) {
    let Ok(rd) = fs::read_dir(dir) else { return };
    for ent in rd.flatten() {
        let Ok(t) = ent.file_type() else { continue };
        let r = rel.join(ent.file_name());
        if t.is_dir() {
            collect_logs(&ent.path(), &r, out);
        } else if t.is_file()
            && is_log_like(&r)
            && let Ok(m) = ent.metadata()
        {
            out.push((r, m.modified().unwrap_or(SystemTime::UNIX_EPOCH), m.len()));
        }
    }
}

/// What is left of [`MAX_FILES`] and [`MAX_BYTES`] for one failed setup's copies.
struct Budget {
    files: usize,
    bytes: u64,
}

/// Whether `id` can name a directory below the kept logs (a cache id: letters, digits,
/// `-`, `_`, `.`, not `.` or `..`).
fn is_plain_id(id: &str) -> bool {
    !id.is_empty()
        && id != "."
        && id != ".."
        && id
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'))
}

/// Makes `dir` (0700) and writes its `setup.txt`: the view path, the exit status, the script.
fn write_setup_note(dir: &Path, view: &Path, script: &str, status: i32) -> Result<()> {
    fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(dir)
        .at(dir)?;
    let note = dir.join("setup.txt");
    fs::write(
        &note,
        format!(
            "view: {}\nexit status: {status}\nscript:\n{script}\n",
            view.display()
        ),
    )
    .at(&note)
}

/// Copies the `found` files of `upper` to the same relative paths under `dir`, as far as
/// `budget` goes (a file bigger than the bytes left keeps its tail: a log's end says why it
/// failed); returns each copy as (its path under `view`, where it is kept).
///
/// Errors: [`Error::Io`] naming the path that could not be made or written.
fn copy_found(
    upper: &Path,
    dir: &Path,
    found: &[(PathBuf, SystemTime, u64)],
    view: &Path,
    budget: &mut Budget,
) -> Result<Vec<(PathBuf, PathBuf)>> {
    use std::io::{Read, Seek, SeekFrom, Write};
    let mut files = Vec::new();
    for (rel, _, len) in found {
        if budget.bytes == 0 || budget.files == 0 {
            break;
        }
        let src = upper.join(rel);
        let dst = dir.join(rel);
        if let Some(parent) = dst.parent() {
            fs::DirBuilder::new()
                .recursive(true)
                .mode(0o700)
                .create(parent)
                .at(parent)?;
        }
        let Ok(mut from) = fs::File::open(&src) else {
            continue;
        };
        let take = (*len).min(budget.bytes);
        from.seek(SeekFrom::Start(len - take)).at(&src)?;
        let mut to = fs::File::create(&dst).at(&dst)?;
        let n = std::io::copy(&mut from.take(take), &mut to).at(&dst)?;
        to.flush().at(&dst)?;
        budget.bytes = budget.bytes.saturating_sub(n);
        budget.files -= 1;
        files.push((view.join(rel), dst));
    }
    Ok(files)
}

/// The size and the free space (for an unprivileged user: `f_bavail`) of the filesystem
/// holding `path`, bytes; `None` when it cannot be asked (`statvfs(3)`).
pub fn filesystem_space(path: &Path) -> Option<(u64, u64)> {
    FsRoom::of(path).map(|r| (r.bytes, r.bytes_free))
}

/// The inodes of the filesystem holding `path` and how many are free (for an unprivileged
/// user: `f_favail`); `None` when it cannot be asked or keeps no inode count (`f_files` 0:
/// btrfs, for one, makes inodes as it goes).
pub fn filesystem_inodes(path: &Path) -> Option<(u64, u64)> {
    FsRoom::of(path).and_then(|r| r.inodes)
}

/// Whether a filesystem of `total` bytes with `free` bytes free counts as full for a failed
/// setup: under 32 MiB or under 0.5 % free (a setup that met `ENOSPC` used up what there was;
/// a failure with more space free was something else).
pub fn looks_full(total: u64, free: u64) -> bool {
    free < (32 << 20) || free.saturating_mul(200) < total
}

/// Whether a filesystem with `total` inodes, `free` of them free, counts as out of inodes
/// for a failed setup (`ENOSPC` with bytes to spare): under 64 or under 0.5 % free.
pub fn inodes_look_full(total: u64, free: u64) -> bool {
    free < 64 || free.saturating_mul(200) < total
}

/// Whether the store's filesystem at `root` looks full now, in bytes ([`looks_full`]) or in
/// inodes ([`inodes_look_full`]).
pub fn store_looks_full(root: &Path) -> bool {
    filesystem_space(root).is_some_and(|(t, f)| looks_full(t, f))
        || filesystem_inodes(root).is_some_and(|(t, f)| inodes_look_full(t, f))
}

/// The one plain line for a run that ran out of space in the store at `root`: what failed
/// (`what`, e.g. `setup of cache "npm"`), the filesystem's size and free space, that nothing
/// was published, and what to do. No internal path of the store is named. The room is `at`
/// (taken when the error was met: [`crate::Error::room_when_full`]) or else measured now; its
/// inodes are named when they are what ran out ([`inodes_look_full`]).
pub fn store_full_message(root: &Path, what: &str, at: Option<FsRoom>) -> String {
    let room = at.or_else(|| FsRoom::of(root));
    // The inodes too when they are what ran out (a filesystem made with few: mkfs -N).
    let inodes = match room.and_then(|r| r.inodes) {
        Some((total, free)) if inodes_look_full(total, free) => {
            format!("; {total} inodes, {free} free")
        }
        _ => String::new(),
    };
    let space = match room {
        Some(r) => format!(
            " ({}: {} in all, {} free{inodes})",
            root.display(),
            crate::units::fmt_bytes(r.bytes),
            crate::units::fmt_bytes(r.bytes_free)
        ),
        None => format!(" ({})", root.display()),
    };
    format!(
        "the store's filesystem is full{space}: {what} ran out of space; nothing was published \
         and the run's files were removed. Free space with `layercache gc` (`--max-size SIZE` \
         keeps less), or give the store a bigger disk (--store DIR or LAYERCACHE_STORE)"
    )
}

/// `gc`'s part: removes each `failed/<run>` of `pd` older than `keep` (by its mtime) — with
/// `dry`, removes nothing; returns (removed or would be removed, kept).
///
/// Errors: [`Error::Io`] reading or removing them.
pub(super) fn reap_failed(pd: &ProjectDirs, keep: Duration, dry: bool) -> Result<(u64, u64)> {
    let (mut removed, mut kept) = (0, 0);
    let now = SystemTime::now();
    for name in read_names(&pd.failed())? {
        let dir = pd.failed().join(&name);
        let age = fs::symlink_metadata(&dir)
            .and_then(|m| m.modified())
            .ok()
            .and_then(|t| now.duration_since(t).ok())
            .unwrap_or_default();
        if age < keep {
            kept += 1;
            continue;
        }
        removed += 1;
        if !dry {
            remove_tree(&dir)?;
        }
    }
    Ok((removed, kept))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ids::ProjectId;

    #[test]
    fn logs_are_told_from_other_files() {
        for yes in [
            "_logs/2026-01-01T00_00_00_000Z-debug-0.log",
            "npm-debug.log",
            "x/pip.LOG",
            "logs/build.txt",
            "a/log/out",
            "uv.log.1",
        ] {
            assert!(is_log_like(Path::new(yes)), "{yes}");
        }
        for no in [
            "index.js",
            "logo.png",
            "catalog/x.json",
            "dialog.c",
            "_logs",
        ] {
            assert!(!is_log_like(Path::new(no)), "{no}");
        }
    }

    #[test]
    fn a_failed_setups_logs_are_kept_then_reaped() {
        let t = tempfile::tempdir().unwrap();
        let pd = ProjectDirs::at(t.path(), &ProjectId::new("p").unwrap());
        let upper = t.path().join("upper");
        fs::create_dir_all(upper.join("_logs")).unwrap();
        fs::create_dir_all(upper.join("pkg")).unwrap();
        fs::write(upper.join("_logs/1-debug-0.log"), "npm error ENOENT\n").unwrap();
        fs::write(upper.join("pkg/index.js"), "x").unwrap();
        let view = Path::new("/cache/npm");
        let kept = keep_failed_logs(
            &pd,
            &FailedSetup {
                run: "run-1",
                cache: "npm",
                upper: &upper,
                view,
                script: "npm ci",
                status: 1,
                output: None,
                others: &[],
            },
        )
        .unwrap()
        .expect("a log was written");
        assert_eq!(kept.dir, pd.failed().join("run-1/npm"));
        assert_eq!(
            kept.files,
            vec![(
                PathBuf::from("/cache/npm/_logs/1-debug-0.log"),
                kept.dir.join("_logs/1-debug-0.log")
            )]
        );
        assert_eq!(
            fs::read_to_string(&kept.files[0].1).unwrap(),
            "npm error ENOENT\n"
        );
        assert!(!kept.dir.join("pkg").exists(), "only logs are kept");
        let note = fs::read_to_string(kept.dir.join("setup.txt")).unwrap();
        assert!(
            note.contains("exit status: 1") && note.contains("npm ci"),
            "{note}"
        );
        // No log written: nothing kept.
        let bare = t.path().join("bare");
        fs::create_dir_all(&bare).unwrap();
        assert!(
            keep_failed_logs(
                &pd,
                &FailedSetup {
                    run: "run-2",
                    cache: "npm",
                    upper: &bare,
                    view,
                    script: "x",
                    status: 1,
                    output: None,
                    others: &[],
                },
            )
            .unwrap()
            .is_none()
        );
        assert!(
            keep_failed_logs(
                &pd,
                &FailedSetup {
                    run: "../x",
                    cache: "npm",
                    upper: &upper,
                    view,
                    script: "x",
                    status: 1,
                    output: None,
                    others: &[],
                },
            )
            .is_err()
        );
        // gc keeps them while young, removes them once old (a dry run only counts).
        assert_eq!(reap_failed(&pd, KEEP_FOR, false).unwrap(), (0, 1));
        assert_eq!(reap_failed(&pd, Duration::ZERO, true).unwrap(), (1, 0));
        assert!(kept.dir.exists());
        assert_eq!(reap_failed(&pd, Duration::ZERO, false).unwrap(), (1, 0));
        assert!(!pd.failed().join("run-1").exists());
    }

    #[test]
    fn full_means_little_free_in_bytes_or_share() {
        assert!(looks_full(48 << 20, 0));
        assert!(looks_full(1 << 40, 1 << 30)); // 0.1 % of 1 TiB
        assert!(!looks_full(1 << 40, 100 << 30));
        assert!(!looks_full(48 << 20, 40 << 20));
        assert!(inodes_look_full(3000, 0));
        assert!(inodes_look_full(10_000_000, 40_000)); // 0.4 %
        assert!(!inodes_look_full(3000, 2000));
        let t = tempfile::tempdir().unwrap();
        let m = store_full_message(t.path(), "setup of cache \"npm\"", None);
        assert!(m.starts_with("the store's filesystem is full ("), "{m}");
        assert!(
            m.contains(" in all, ") && m.contains("nothing was published"),
            "{m}"
        );
        assert!(m.contains("`layercache gc`"), "{m}");
        // The room when the error was met, not now: its inodes had run out.
        let then = FsRoom {
            bytes: 64 << 20,
            bytes_free: 53 << 20,
            inodes: Some((3008, 0)),
        };
        let m = store_full_message(t.path(), "promoting cache \"npm\"", Some(then));
        assert!(
            m.contains(": 64.0 MiB in all, 53.0 MiB free; 3008 inodes, 0 free)"),
            "{m}"
        );
        let roomy = FsRoom {
            inodes: Some((3008, 2000)),
            ..then
        };
        let m = store_full_message(t.path(), "promoting cache \"npm\"", Some(roomy));
        assert!(!m.contains("inodes"), "{m}");
    }

    /// A temp dir (kept alive by the first element), project `p`'s dirs in it and an empty
    /// `upper` directory.
    fn fixture() -> (tempfile::TempDir, ProjectDirs, PathBuf) {
        let t = tempfile::tempdir().unwrap();
        let pd = ProjectDirs::at(t.path(), &ProjectId::new("p").unwrap());
        let upper = t.path().join("upper");
        fs::create_dir_all(&upper).unwrap();
        (t, pd, upper)
    }

    #[test]
    fn the_output_alone_is_kept_too() {
        let (_t, pd, upper) = fixture();
        let f = FailedSetup {
            run: "r",
            cache: "c",
            upper: &upper,
            view: Path::new("/v"),
            script: "s",
            status: 2,
            output: Some(b"E: no such package\n"),
            others: &[],
        };
        let kept = keep_failed_logs(&pd, &f).unwrap().unwrap();
        assert!(kept.output && kept.files.is_empty());
        assert_eq!(
            fs::read(kept.dir.join("output.txt")).unwrap(),
            b"E: no such package\n"
        );
        let none = FailedSetup {
            output: Some(b""),
            run: "r2",
            ..f
        };
        assert!(keep_failed_logs(&pd, &none).unwrap().is_none());
    }

    #[test]
    fn a_big_log_keeps_its_tail() {
        let (_t, pd, upper) = fixture();
        let mut big = vec![b'a'; MAX_BYTES as usize];
        big.extend_from_slice(b"the reason\n");
        fs::write(upper.join("build.log"), &big).unwrap();
        let kept = keep_failed_logs(
            &pd,
            &FailedSetup {
                run: "r",
                cache: "c",
                upper: &upper,
                view: Path::new("/v"),
                script: "s",
                status: 2,
                output: None,
                others: &[],
            },
        )
        .unwrap()
        .unwrap();
        let copy = fs::read(&kept.files[0].1).unwrap();
        assert_eq!(copy.len() as u64, MAX_BYTES);
        assert!(copy.ends_with(b"the reason\n"));
    }
}
