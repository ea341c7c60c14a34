//! Promotion: lower ⊕ upper → a new immutable layer tree (published by [`super::Store`]).
//!
//! Merge rules are kernel overlayfs's (Documentation/filesystems/overlayfs.rst), applied by the
//! overlay's layer stack ([`crate::overlay::stack`], the same code the mounted overlay uses):
//! * an upper **whiteout** deletes the lower entry of that name, in either form the overlay
//!   reads ([`crate::overlay::whiteout::whited_out`]: a char device 0/0, or fuse-overlayfs's
//!   `.wh.NAME` file, which a user's mount writes where mknod is refused);
//! * an **opaque** upper directory (xattr, or the `.wh..wh..opq` marker) hides all lower
//!   children of that directory; the markers themselves never enter a layer;
//! * an upper directory over a lower directory merges; any other upper entry replaces the lower;
//! * lower regular files (already object hardlinks) are **re-linked**, not re-hashed (re-hashed
//!   only to find a spill copy on `EMLINK`); upper regular files are hashed and hardlinked into
//!   `objects/` — bytes already in the store are never copied;
//! * files that were one inode in the merged tree (upper files linked to each other; lower
//!   files in one of the lower layer's recorded link groups, [`super::layer::links_of_tree`])
//!   are recorded as link groups ([`TreeStats::links`]), since in the built tree every file
//!   is an object link and identical files share an inode whether they were links or not;
//! * symlinks are recreated as symlinks (never followed); modes, ns timestamps and xattrs are
//!   kept (overlay-private xattrs are dropped);
//! * every entry from the upper dir gets the **canonical owner** ([`canonical_owner`], 0:0 for
//!   a root store) whatever uid filled it, so a layer filled by uid 1000 serves uid 1001 in a
//!   later run through the overlay's `squash_to_uid`/`squash_to_gid` (as
//!   fuse-overlayfs's squash options, chown(2) clears set-user/group-ID bits of files); so do
//!   the directories, symlinks and fifos built from the lower, while lower regular files are
//!   linked as they are (a lower tree is never changed); regular files from the upper lose
//!   their set-user/group-ID bits in any case (a run as uid 1000 cannot plant a root setuid
//!   file in a layer);
//! * credential files ([`CREDENTIAL_FILES`]) are dropped and listed;
//! * fifos are kept; sockets and device nodes are dropped and listed (a socket is meaningless
//!   once its process is gone, and a device node has no business in a dependency cache — the
//!   mount is `nodev` anyway).
//!
//! Entry names come from `readdir` and are single components; every source is `lstat`ed and
//! regular files are opened with `O_NOFOLLOW`, so nothing written by a run — symlinks included
//! — can make promotion read or write outside the run's upper dir and its project's store.

use std::collections::HashMap;
use std::fs;
use std::io;
use std::path::{Path, PathBuf};

use super::layer::TreeCounts;
use super::object::{ObjectStore, copy_metadata_owned};
use crate::error::{IoContext, Result};
use crate::ids::ObjectId;
use crate::overlay::links::LinkGroups;
use crate::overlay::stack::{Kind, Stack};
use crate::sys;

/// A pattern naming a credential file that must never enter a shared layer.
#[derive(Clone, Copy, Debug)]
pub enum CredentialPattern {
    /// The file name equals this.
    Name(&'static str),
    /// The file name starts with this.
    Prefix(&'static str),
    /// The path relative to the layer root ends with these components.
    PathSuffix(&'static str),
    /// The file name ends with this and the file holds a private key (`PRIVATE KEY-----`).
    /// Certificate bundles such as certifi's `cacert.pem` are public data that installed
    /// Python trees need, so they are kept.
    PrivateKeySuffix(&'static str),
}

/// Credential files dropped at promotion (the one list; matched on every non-directory entry):
/// npm/yarn/pip/netrc/git/cargo/docker/maven/gradle credentials, PEM/KEY files holding a
/// private key, ssh keys, dotenv.
pub const CREDENTIAL_FILES: &[CredentialPattern] = {
    use CredentialPattern::*;
    &[
        Name(".npmrc"),
        Name(".yarnrc"),
        Name(".yarnrc.yml"),
        Name(".pypirc"),
        Name(".netrc"),
        Name("_netrc"),
        Name(".git-credentials"),
        Name("credentials"),
        Name("credentials.toml"),
        PathSuffix(".docker/config.json"),
        Name("settings.xml"),
        Name("settings-security.xml"),
        Name("gradle.properties"),
        PrivateKeySuffix(".pem"),
        PrivateKeySuffix(".key"),
        Prefix("id_rsa"),
        Prefix("id_ed25519"),
        Prefix("id_ecdsa"),
        Prefix("id_dsa"),
        Name(".env"),
        Prefix(".env."),
    ]
};

/// Files larger than this (bytes) that match a [`CredentialPattern::PrivateKeySuffix`] are
/// treated as credentials without reading them.
const MAX_KEY_SCAN: u64 = 4 << 20;

/// True when the regular file `src` contains a PEM private key block (or cannot be read, or is
/// too large to scan: when in doubt, the file stays out of the shared layer).
fn holds_private_key(src: &Path) -> bool {
    use std::io::Read;
    use std::os::unix::fs::OpenOptionsExt;
    let Ok(mut f) = fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW)
        .open(src)
    else {
        return true;
    };
    let mut buf = Vec::new();
    if f.by_ref()
        .take(MAX_KEY_SCAN + 1)
        .read_to_end(&mut buf)
        .is_err()
        || buf.len() as u64 > MAX_KEY_SCAN
    {
        return true;
    }
    buf.windows(16).any(|w| w == b"PRIVATE KEY-----")
}

/// True when `rel` (a path relative to the layer root; the file itself is at `src`) is a
/// credential file.
pub fn is_credential(rel: &Path, src: &Path) -> bool {
    let Some(name) = rel.file_name().and_then(|n| n.to_str()) else {
        return false;
    };
    CREDENTIAL_FILES.iter().any(|p| match *p {
        CredentialPattern::Name(n) => name == n,
        CredentialPattern::Prefix(n) => name.starts_with(n),
        CredentialPattern::PathSuffix(s) => rel.ends_with(s),
        CredentialPattern::PrivateKeySuffix(n) => {
            name.ends_with(n) && src.is_file() && holds_private_key(src)
        }
    })
}

/// The owner `(uid, gid)` every promoted entry gets: 0:0 when promoting as root, else the
/// promoting user's own ids (the only ones it may give).
pub fn canonical_owner() -> (u32, u32) {
    match rustix::process::geteuid().as_raw() {
        0 => (0, 0),
        uid => (uid, rustix::process::getegid().as_raw()),
    }
}

/// What a tree build produced.
#[derive(Clone, Debug, Default)]
pub struct TreeStats {
    /// What the built tree holds.
    pub counts: TreeCounts,
    /// Credential files dropped (relative paths).
    pub dropped: Vec<String>,
    /// Sockets and device nodes dropped (relative paths).
    pub skipped: Vec<String>,
    /// Object paths this build created (undone if the build is abandoned).
    pub created_objects: Vec<PathBuf>,
    /// Link groups of the built tree: regular files (relative paths) that were one inode in
    /// the merged tree, two or more per group (see the module docs).
    pub links: Vec<Vec<PathBuf>>,
}

/// What makes regular files of the merged tree one inode (see [`TreeStats::links`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
enum LinkKey {
    /// An upper file with several links: its (st_dev, st_ino).
    Upper(u64, u64),
    /// A lower file in group `n` of the lower layer's recorded link groups.
    Lower(u32),
}

/// Builds the merged tree of `lower` ⊕ `upper` at `dst` (which must not exist), storing regular
/// files as objects of `objects`. Either side may be absent (a miss has no lower).
///
/// Errors: [`crate::Error::Io`] naming the path that failed; for `ENOSPC`/`EDQUOT`,
/// [`crate::Error::NoSpace`] with the filesystem's room at that moment. On error the objects
/// this build created are removed again and `dst` is left for the caller to remove.
pub fn build_tree(
    objects: &ObjectStore,
    lower: Option<&Path>,
    upper: Option<&Path>,
    dst: &Path,
) -> Result<TreeStats> {
    // Hash the upper's regular files up front on every core: hashing is most of a promotion's
    // CPU time (the walk below then only links).
    let hashes = match upper {
        Some(u) => {
            let mut files = Vec::new();
            collect_files(u, &mut files);
            let threads = std::thread::available_parallelism().map_or(2, |n| n.get());
            super::object::hash_files(files, threads)
        }
        None => HashMap::new(),
    };
    let lowers: Vec<&Path> = lower.into_iter().collect();
    let stack = Stack::open_merge(upper, &lowers).at(upper.or(lower).unwrap_or(dst))?;
    let in_lowers = stack.root_lowers();
    let lower_links = match lower {
        Some(l) => {
            let p = super::layer::links_of_tree(l);
            LinkGroups::read(&p).at(&p)?
        }
        None => LinkGroups::default(),
    };
    let mut b = Builder {
        lower_links,
        groups: HashMap::new(),
        objects,
        owner: canonical_owner(),
        stats: TreeStats::default(),
        hashes,
        stack,
        upper,
        lower,
    };
    match b.merge_dir(upper.is_some(), in_lowers, dst, Path::new("")) {
        Ok(()) => {
            let mut links: Vec<Vec<PathBuf>> =
                b.groups.into_values().filter(|g| g.len() > 1).collect();
            links.sort();
            b.stats.links = links;
            Ok(b.stats)
        }
        Err(e) => {
            // The room of a full store is taken before anything is undone (the message
            // about it reports what ran out: bytes or inodes).
            let e = e.noting_room(dst.parent().unwrap_or(dst));
            undo_created_objects(&b.stats);
            Err(e)
        }
    }
}

struct Builder<'a> {
    objects: &'a ObjectStore,
    /// [`canonical_owner`].
    owner: (u32, u32),
    stats: TreeStats,
    /// Content hashes of the upper's regular files, computed in parallel before the walk.
    hashes: HashMap<PathBuf, ObjectId>,
    /// The upper over the lower: it applies the merge rules.
    stack: Stack,
    upper: Option<&'a Path>,
    lower: Option<&'a Path>,
    /// The lower layer's recorded link groups.
    lower_links: LinkGroups,
    /// Paths of the regular files built so far, by what makes them one inode.
    groups: HashMap<LinkKey, Vec<PathBuf>>,
}

/// Regular files below `dir` (not following symlinks); unreadable parts are skipped (the
/// walk that follows reports them).
fn collect_files(dir: &Path, out: &mut Vec<PathBuf>) {
    let Ok(rd) = fs::read_dir(dir) else { return };
    for ent in rd.flatten() {
        use std::os::unix::ffi::OsStrExt;
        if crate::overlay::whiteout::is_marker_name(ent.file_name().as_bytes()) {
            continue; // a whiteout marker, never part of the built tree
        }
        match ent.file_type() {
            Ok(t) if t.is_dir() => collect_files(&ent.path(), out),
            Ok(t) if t.is_file() => out.push(ent.path()),
            _ => {}
        }
    }
}

impl Builder<'_> {
    /// The path of `rel` in the upper dir when `in_upper`, else in the lower when `in_lower`.
    fn source(&self, in_upper: bool, in_lower: bool, rel: &Path) -> Option<PathBuf> {
        let root = if in_upper { self.upper } else { None };
        root.or(self.lower.filter(|_| in_lower))
            .map(|r| r.join(rel))
    }

    /// Builds directory `rel` at `dst` from the merged names of the upper dir (when `upper`)
    /// and the lower (when `lowers` is not 0), each entry taken from the layer that the stack
    /// finds it in ([`Stack::lookup`]).
    fn merge_dir(&mut self, upper: bool, lowers: u64, dst: &Path, rel: &Path) -> Result<()> {
        fs::create_dir(dst).at(dst)?;
        self.stats.counts.dirs += 1;
        let src = self.source(upper, lowers != 0, rel);
        let at = || src.clone().unwrap_or_else(|| dst.to_path_buf());
        let crel = sys::cstr(Path::new(".").join(rel).as_os_str()).at(at())?;
        let mut names = self.stack.merged_names(upper, lowers, &crel).at(at())?;
        names.sort_by(|a, b| a.0.cmp(&b.0));
        for (name, _) in names {
            let r = rel.join(&name);
            let d = dst.join(&name);
            let cr = sys::child(&crel, &name).at(at())?;
            let Some(e) = self.stack.lookup(upper, lowers, &cr).at(at())? else {
                continue;
            };
            if e.kind == Kind::Dir {
                self.merge_dir(e.upper, e.lowers, &d, &r)?;
            } else if let Some(src) = self.source(e.upper, e.lowers != 0, &r) {
                self.entry(&src, &e.st, &d, &r, e.upper)?;
            }
        }
        if let Some(src) = src {
            copy_metadata_owned(&src, dst, Some(self.owner))?;
        }
        Ok(())
    }

    /// One non-directory entry `src` (from the upper when `from_upper`) into `dst`.
    fn entry(
        &mut self,
        src: &Path,
        st: &libc::stat,
        dst: &Path,
        rel: &Path,
        from_upper: bool,
    ) -> Result<()> {
        if is_credential(rel, src) {
            self.stats.dropped.push(rel.to_string_lossy().into_owned());
            return Ok(());
        }
        let ft = st.st_mode & libc::S_IFMT;
        if ft == libc::S_IFREG {
            // A lower file that is already an object link is linked as is (no rehash).
            let linked = if !from_upper && st.st_nlink > 1 {
                match fs::hard_link(src, dst) {
                    Ok(()) => true,
                    Err(e) if e.raw_os_error() == Some(libc::EMLINK) => false,
                    Err(e) => return Err(crate::Error::io(dst, e)),
                }
            } else {
                false
            };
            if !linked {
                // The upper file becomes the object: it gets the canonical owner first (the
                // owner is part of the object's metadata tag). Lower files are never changed.
                if from_upper && (st.st_uid, st.st_gid) != self.owner {
                    let (uid, gid) = self.owner;
                    std::os::unix::fs::lchown(src, Some(uid), Some(gid)).at(src)?;
                }
                // No set-user/group-ID file enters a layer: with the canonical owner it would
                // be a root setuid file that any run's user could have planted.
                let setid = st.st_mode & (libc::S_ISUID | libc::S_ISGID);
                if from_upper && setid != 0 {
                    let mode = st.st_mode & 0o7777 & !setid;
                    use std::os::unix::fs::PermissionsExt;
                    fs::set_permissions(src, fs::Permissions::from_mode(mode)).at(src)?;
                }
                let hash = self.hashes.get(src).copied();
                let stored = self.objects.store_by_link_hashed(src, hash)?;
                if stored.new {
                    self.stats.counts.new_objects += 1;
                    self.stats.counts.new_bytes += st.st_size as u64;
                    self.stats.created_objects.push(stored.path.clone());
                }
                self.objects.link_object(&stored.path, dst)?;
            }
            self.stats.counts.files += 1;
            self.stats.counts.bytes += st.st_size as u64;
            if st.st_size as u64 >= crate::overlay::options::LARGE_FILE {
                self.stats.counts.large_bytes += st.st_size as u64;
            }
            let key = if from_upper {
                (st.st_nlink > 1).then_some(LinkKey::Upper(st.st_dev, st.st_ino))
            } else {
                let c = sys::cstr(rel.as_os_str()).at(src)?;
                self.lower_links.group(&c).map(|(g, _)| LinkKey::Lower(g))
            };
            if let Some(k) = key {
                self.groups.entry(k).or_default().push(rel.to_path_buf());
            }
        } else if ft == libc::S_IFLNK {
            let target = fs::read_link(src).at(src)?;
            std::os::unix::fs::symlink(&target, dst).at(dst)?;
            copy_metadata_owned(src, dst, Some(self.owner))?;
            self.stats.counts.symlinks += 1;
        } else if ft == libc::S_IFIFO {
            sys::mkfifo(dst, st.st_mode).at(dst)?;
            copy_metadata_owned(src, dst, Some(self.owner))?;
            self.stats.counts.other += 1;
        } else {
            // Sockets and device nodes (whiteouts were handled by the caller).
            self.stats.skipped.push(rel.to_string_lossy().into_owned());
        }
        Ok(())
    }
}

/// Removes the objects a build created (best effort; gc would remove them too once no tree
/// links them). Needed because an upper file *is* the new object's inode: if that upper is
/// mounted again after a failed commit, its writes must not reach the store.
pub fn undo_created_objects(stats: &TreeStats) {
    for p in &stats.created_objects {
        if let Err(e) = fs::remove_file(p)
            && e.kind() != io::ErrorKind::NotFound
        {
            tracing::warn!(path = %p.display(), error = %e, "could not remove an abandoned object");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::overlay::whiteout;
    use std::ffi::OsStr;
    use std::os::fd::AsFd;
    use std::os::unix::fs::PermissionsExt;
    use std::os::unix::fs::{FileTypeExt, MetadataExt};

    fn write(p: &Path, s: &str) {
        fs::create_dir_all(p.parent().unwrap()).unwrap();
        fs::write(p, s).unwrap();
    }

    fn whiteout_at(dir: &Path, name: &str) {
        fs::create_dir_all(dir).unwrap();
        let d = fs::File::open(dir).unwrap();
        whiteout::create_whiteout(d.as_fd(), OsStr::new(name)).unwrap();
    }

    /// `rel = content`, `rel/` for directories, `rel -> target` for symlinks; sorted.
    pub(crate) fn listing(root: &Path) -> Vec<String> {
        fn walk(root: &Path, dir: &Path, out: &mut Vec<String>) {
            for e in fs::read_dir(dir).unwrap() {
                let e = e.unwrap();
                let rel = e
                    .path()
                    .strip_prefix(root)
                    .unwrap()
                    .to_string_lossy()
                    .into_owned();
                let ft = e.file_type().unwrap();
                if ft.is_dir() {
                    out.push(format!("{rel}/"));
                    walk(root, &e.path(), out);
                } else if ft.is_symlink() {
                    let t = fs::read_link(e.path()).unwrap();
                    out.push(format!("{rel} -> {}", t.display()));
                } else {
                    let c = fs::read_to_string(e.path()).unwrap_or_default();
                    out.push(format!("{rel} = {c}"));
                }
            }
        }
        let mut out = Vec::new();
        walk(root, root, &mut out);
        out.sort();
        out
    }

    struct Fixture {
        t: tempfile::TempDir,
        objects: ObjectStore,
    }

    fn fixture() -> Fixture {
        let t = tempfile::tempdir().unwrap();
        let objects = ObjectStore::new(t.path().join("objects"));
        fs::create_dir(objects.dir()).unwrap();
        Fixture { t, objects }
    }

    /// Builds a first layer from `src` (as an upper with no lower) so its files are objects.
    fn layer_from(fx: &Fixture, src: &Path, name: &str) -> PathBuf {
        let dst = fx.t.path().join(name);
        build_tree(&fx.objects, None, Some(src), &dst).unwrap();
        dst
    }

    /// An opaque mark on the upper root hides nothing, as on the mounted root and in kernel
    /// overlayfs: promotion builds the tree a mount showed.
    #[test]
    fn an_opaque_upper_root_still_merges_the_lower() {
        let fx = fixture();
        let base = fx.t.path().join("base");
        write(&base.join("old.txt"), "lower");
        let lower = layer_from(&fx, &base, "lower");
        let upper = fx.t.path().join("upper");
        write(&upper.join("new.txt"), "upper");
        let root = fs::File::open(&upper).unwrap();
        whiteout::set_opaque(root.as_fd()).unwrap();
        let out = fx.t.path().join("out");
        build_tree(&fx.objects, Some(&lower), Some(&upper), &out).unwrap();
        assert_eq!(listing(&out), vec!["new.txt = upper", "old.txt = lower"]);
    }

    #[test]
    fn whiteouts_and_opaque_dirs_apply() {
        let fx = fixture();
        let base = fx.t.path().join("base");
        write(&base.join("keep.txt"), "lower");
        write(&base.join("gone.txt"), "lower");
        write(&base.join("replaced.txt"), "old");
        write(&base.join("merged/a"), "la");
        write(&base.join("merged/b"), "lb");
        write(&base.join("hidden/x"), "lx");
        write(&base.join("hidden/y"), "ly");
        write(&base.join("dir_to_file/z"), "lz");
        let lower = layer_from(&fx, &base, "lower");

        let upper = fx.t.path().join("upper");
        whiteout_at(&upper, "gone.txt");
        write(&upper.join("replaced.txt"), "new");
        write(&upper.join("merged/c"), "uc");
        whiteout_at(&upper.join("merged"), "a");
        write(&upper.join("hidden/y"), "uy");
        let h = fs::File::open(upper.join("hidden")).unwrap();
        whiteout::set_opaque(h.as_fd()).unwrap();
        write(&upper.join("dir_to_file"), "now a file");
        std::os::unix::fs::symlink("keep.txt", upper.join("link")).unwrap();

        let out = fx.t.path().join("out");
        let st = build_tree(&fx.objects, Some(&lower), Some(&upper), &out).unwrap();
        assert_eq!(
            listing(&out),
            vec![
                "dir_to_file = now a file",
                "hidden/",
                "hidden/y = uy",
                "keep.txt = lower",
                "link -> keep.txt",
                "merged/",
                "merged/b = lb",
                "merged/c = uc",
                "replaced.txt = new",
            ]
        );
        // The opaque marker does not leak into the layer.
        let hidden = crate::sys::cstr(out.join("hidden").as_os_str()).unwrap();
        assert!(!whiteout::dir_is_opaque_at(libc::AT_FDCWD, &hidden).unwrap());
        // Lower files are re-linked to the same inode (no copy, no new object).
        let (a, b) = (
            fs::metadata(lower.join("keep.txt")).unwrap(),
            fs::metadata(out.join("keep.txt")).unwrap(),
        );
        assert_eq!(a.ino(), b.ino());
        assert_eq!(st.counts.new_objects, 4, "new, uc, uy, 'now a file'");
        assert_eq!(st.counts.symlinks, 1);
    }

    /// An upper written by a user's mount where mknod is refused (fuse-overlayfs's `.wh.`
    /// files and opaque marker file) promotes to the same tree, without the markers.
    #[test]
    fn file_form_whiteouts_and_opaque_markers_apply() {
        let fx = fixture();
        let base = fx.t.path().join("base");
        write(&base.join("keep.txt"), "lower");
        write(&base.join("gone.txt"), "lower");
        write(&base.join("merged/a"), "la");
        write(&base.join("merged/b"), "lb");
        write(&base.join("hidden/x"), "lx");
        let lower = layer_from(&fx, &base, "lower");

        let upper = fx.t.path().join("upper");
        write(&upper.join(".wh.gone.txt"), "");
        write(&upper.join("merged/.wh.a"), "");
        write(&upper.join("merged/c"), "uc");
        write(&upper.join("hidden/.wh..wh..opq"), "");
        write(&upper.join("hidden/y"), "uy");
        // A whiteout of a name that no lower has hides nothing and leaves nothing.
        write(&upper.join(".wh.never"), "");

        let out = fx.t.path().join("out");
        let st = build_tree(&fx.objects, Some(&lower), Some(&upper), &out).unwrap();
        assert_eq!(
            listing(&out),
            vec![
                "hidden/",
                "hidden/y = uy",
                "keep.txt = lower",
                "merged/",
                "merged/b = lb",
                "merged/c = uc",
            ]
        );
        assert_eq!(st.counts.new_objects, 2, "uc, uy");
    }

    #[test]
    fn metadata_is_kept_and_upper_owners_become_canonical() {
        let fx = fixture();
        let upper = fx.t.path().join("upper");
        write(&upper.join("d/exe"), "#!/bin/sh\n");
        let exe = upper.join("d/exe");
        std::os::unix::fs::symlink("exe", upper.join("d/ln")).unwrap();
        // Filled by other users (needs root to set up; as another user only its own ids).
        let other = match canonical_owner() {
            (0, 0) => (1234, 4321),
            own => own,
        };
        for p in [upper.join("d/ln"), exe.clone(), upper.join("d")] {
            std::os::unix::fs::lchown(p, Some(other.0), Some(other.1)).unwrap();
        }
        fs::set_permissions(&exe, fs::Permissions::from_mode(0o751)).unwrap();
        fs::set_permissions(upper.join("d"), fs::Permissions::from_mode(0o750)).unwrap();
        sys::set_times_nofollow(&exe, (1, 2), (499_162_800, 123_456_789)).unwrap();
        sys::set_times_nofollow(&upper.join("d"), (1, 2), (1_000_000, 5)).unwrap();
        sys::set_xattr(&exe, b"user.mime", b"text/x-sh").unwrap();
        sys::set_xattr(&exe, b"trusted.overlay.origin", b"zz").unwrap();
        let out = fx.t.path().join("out");
        build_tree(&fx.objects, None, Some(&upper), &out).unwrap();
        let m = fs::metadata(out.join("d/exe")).unwrap();
        assert_eq!(m.mode() & 0o7777, 0o751);
        assert_eq!((m.mtime(), m.mtime_nsec()), (499_162_800, 123_456_789));
        assert_eq!(
            sys::get_xattr(&out.join("d/exe"), b"user.mime").unwrap(),
            b"text/x-sh"
        );
        assert!(sys::get_xattr(&out.join("d/exe"), b"trusted.overlay.origin").is_err());
        let d = fs::metadata(out.join("d")).unwrap();
        assert_eq!(
            (d.mode() & 0o7777, d.mtime(), d.mtime_nsec()),
            (0o750, 1_000_000, 5)
        );
        let l = fs::symlink_metadata(out.join("d/ln")).unwrap();
        for m in [&m, &d, &l] {
            assert_eq!((m.uid(), m.gid()), canonical_owner());
        }
    }

    /// A set-user/group-ID file from the upper, even one that already has the canonical
    /// owner (a squashed run's files do), enters the layer without those bits.
    #[test]
    fn upper_files_lose_setuid_and_setgid() {
        let fx = fixture();
        let upper = fx.t.path().join("upper");
        for (name, mode) in [("suid", 0o4755), ("sgid", 0o2711), ("both", 0o6750)] {
            write(&upper.join(name), name);
            fs::set_permissions(upper.join(name), fs::Permissions::from_mode(mode)).unwrap();
        }
        let out = fx.t.path().join("out");
        build_tree(&fx.objects, None, Some(&upper), &out).unwrap();
        let mode = |n: &str| fs::metadata(out.join(n)).unwrap().mode() & 0o7777;
        assert_eq!(
            (mode("suid"), mode("sgid"), mode("both")),
            (0o755, 0o711, 0o750)
        );
    }

    #[test]
    fn credentials_are_dropped() {
        let fx = fixture();
        let upper = fx.t.path().join("upper");
        for p in [
            ".npmrc",
            "sub/.pypirc",
            ".docker/config.json",
            "keys/server.pem",
            ".ssh/id_ed25519.pub",
            ".env",
            ".cargo/credentials.toml",
            ".m2/settings.xml",
        ] {
            write(&upper.join(p), "secret");
        }
        write(
            &upper.join("keys/server.pem"),
            "-----BEGIN PRIVATE KEY-----\nsecret\n-----END PRIVATE KEY-----\n",
        );
        write(&upper.join("pkg/config.json"), "fine");
        write(&upper.join("pkg/index.js"), "fine");
        std::os::unix::fs::symlink("/root/.netrc", upper.join(".netrc")).unwrap();
        let out = fx.t.path().join("out");
        let st = build_tree(&fx.objects, None, Some(&upper), &out).unwrap();
        assert_eq!(st.dropped.len(), 9, "{:?}", st.dropped);
        assert_eq!(st.counts.files, 2);
        assert!(out.join("pkg/config.json").exists());
        assert!(!out.join(".npmrc").exists());
        assert!(fs::symlink_metadata(out.join(".netrc")).is_err());
        let none = Path::new("/nonexistent");
        assert!(is_credential(Path::new("a/.git-credentials"), none));
        assert!(!is_credential(Path::new("a/config.json"), none));
        let t = tempfile::tempdir().unwrap();
        let key = t.path().join("server.pem");
        fs::write(
            &key,
            "-----BEGIN RSA PRIVATE KEY-----\nMIIB\n-----END RSA PRIVATE KEY-----\n",
        )
        .unwrap();
        assert!(is_credential(Path::new("certs/server.pem"), &key));
        let bundle = t.path().join("cacert.pem");
        fs::write(
            &bundle,
            "-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n",
        )
        .unwrap();
        assert!(!is_credential(Path::new("certifi/cacert.pem"), &bundle));
    }

    #[test]
    fn planted_symlinks_are_never_followed() {
        let fx = fixture();
        let outside = fx.t.path().join("outside");
        write(&outside.join("secret"), "other project's data");
        let upper = fx.t.path().join("upper");
        fs::create_dir_all(&upper).unwrap();
        std::os::unix::fs::symlink(&outside, upper.join("escape")).unwrap();
        std::os::unix::fs::symlink(outside.join("secret"), upper.join("file")).unwrap();
        std::os::unix::fs::symlink("../../../../outside", upper.join("rel")).unwrap();
        let out = fx.t.path().join("out");
        let st = build_tree(&fx.objects, None, Some(&upper), &out).unwrap();
        assert_eq!(
            (st.counts.files, st.counts.symlinks, st.counts.new_objects),
            (0, 3, 0)
        );
        for n in ["escape", "file", "rel"] {
            let m = fs::symlink_metadata(out.join(n)).unwrap();
            assert!(m.file_type().is_symlink());
        }
        // Nothing was written outside, and the outside file did not become an object.
        assert_eq!(
            fs::read_to_string(outside.join("secret")).unwrap(),
            "other project's data"
        );
        assert_eq!(fs::metadata(outside.join("secret")).unwrap().nlink(), 1);
        assert!(fx.objects.list().unwrap().is_empty());
    }

    #[test]
    fn special_files() {
        let fx = fixture();
        let upper = fx.t.path().join("upper");
        fs::create_dir_all(&upper).unwrap();
        sys::mkfifo(&upper.join("fifo"), 0o600).unwrap();
        let _sock = std::os::unix::net::UnixListener::bind(upper.join("sock")).unwrap();
        let out = fx.t.path().join("out");
        let st = build_tree(&fx.objects, None, Some(&upper), &out).unwrap();
        let m = fs::symlink_metadata(out.join("fifo")).unwrap();
        assert!(m.file_type().is_fifo());
        assert!(!out.join("sock").exists());
        assert_eq!(st.skipped, vec!["sock".to_string()]);
    }

    #[test]
    fn second_version_stores_only_the_change() {
        let fx = fixture();
        let base = fx.t.path().join("base");
        for i in 0..50 {
            write(
                &base.join(format!("pkg{i}/index.js")),
                &format!("module {i}"),
            );
        }
        let v1 = layer_from(&fx, &base, "v1");
        let upper = fx.t.path().join("upper");
        write(&upper.join("pkg-new/index.js"), "brand new");
        let v2 = fx.t.path().join("v2");
        let st = build_tree(&fx.objects, Some(&v1), Some(&upper), &v2).unwrap();
        assert_eq!(
            (st.counts.files, st.counts.new_objects, st.counts.new_bytes),
            (51, 1, 9)
        );
        assert_eq!(fx.objects.list().unwrap().len(), 51);
    }

    /// Links of the merged tree are recorded (identical files that were not links are not),
    /// and a promotion on top keeps the lower's groups minus the names copied up or removed.
    #[test]
    fn link_groups_are_recorded_and_carried_on() {
        let fx = fixture();
        let base = fx.t.path().join("base");
        write(&base.join("a"), "same");
        fs::hard_link(base.join("a"), base.join("b")).unwrap();
        write(&base.join("d/c"), "same");
        fs::hard_link(base.join("a"), base.join("d/e")).unwrap();
        write(&base.join("f"), "other");
        fs::hard_link(base.join("f"), base.join("g")).unwrap();
        // Same bytes and same metadata (times included): one object for `a` and `d/c`.
        for f in ["a", "d/c"] {
            sys::set_times_nofollow(&base.join(f), (1, 0), (1_000_000, 0)).unwrap();
        }
        let v1 = fx.t.path().join("l1").join("tree");
        fs::create_dir_all(v1.parent().unwrap()).unwrap();
        let st = build_tree(&fx.objects, None, Some(&base), &v1).unwrap();
        let p = |v: &[&str]| v.iter().map(PathBuf::from).collect::<Vec<_>>();
        assert_eq!(st.links, vec![p(&["a", "b", "d/e"]), p(&["f", "g"])]);
        // Identical content shares the object inode either way: only the record tells.
        assert_eq!(
            fs::metadata(v1.join("a")).unwrap().ino(),
            fs::metadata(v1.join("d/c")).unwrap().ino()
        );
        let groups: Vec<Vec<&[u8]>> = st
            .links
            .iter()
            .map(|g| g.iter().map(|x| x.as_os_str().as_encoded_bytes()).collect())
            .collect();
        let links = super::super::layer::links_of_tree(&v1);
        assert!(LinkGroups::write(&links, &groups).unwrap());
        // On top: `b` was copied up (broke from its group), `g` removed, `h` linked to `f`
        // in the merged view (both in the upper then).
        let upper = fx.t.path().join("upper");
        write(&upper.join("b"), "changed");
        whiteout_at(&upper, "g");
        write(&upper.join("f"), "other");
        fs::hard_link(upper.join("f"), upper.join("h")).unwrap();
        let v2 = fx.t.path().join("l2").join("tree");
        fs::create_dir_all(v2.parent().unwrap()).unwrap();
        let st = build_tree(&fx.objects, Some(&v1), Some(&upper), &v2).unwrap();
        assert_eq!(st.links, vec![p(&["a", "d/e"]), p(&["f", "h"])]);
    }
}
