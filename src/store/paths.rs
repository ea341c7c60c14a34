//! Where things live inside a store: [`ProjectDirs`] names every directory and file of one
//! project (see the layout in [`super`] and docs/ARCHITECTURE.md), reads its published keys,
//! and removes layers; plus the small filesystem helpers the store's parts share.

use std::fs;
use std::io;
use std::os::unix::fs::{DirBuilderExt, MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};

use super::layer::Layer;
use super::lease::{Lease, Mode};
use super::object::ObjectStore;
use crate::error::{Error, IoContext, Result};
use crate::ids::{CacheId, CacheKey, LayerId, ProjectId};

/// The directories of one project inside the store.
#[derive(Clone, Debug)]
pub struct ProjectDirs {
    /// The project.
    pub project: ProjectId,
    /// `projects/<project>` (mode 0700).
    pub root: PathBuf,
}

impl ProjectDirs {
    /// The directories of `project` in the store rooted at `store_root`
    /// (`<store_root>/v1/projects/<project>`; they may not exist).
    pub fn at(store_root: &Path, project: &ProjectId) -> ProjectDirs {
        ProjectDirs {
            project: project.clone(),
            root: store_root.join("v1/projects").join(project.as_str()),
        }
    }
    fn sub(&self, s: &str) -> PathBuf {
        self.root.join(s)
    }
    /// The project's object store.
    pub fn objects(&self) -> ObjectStore {
        ObjectStore::new(self.sub("objects"))
    }
    /// `layers/`.
    pub fn layers(&self) -> PathBuf {
        self.sub("layers")
    }
    /// The layer `id` (may not exist).
    pub fn layer(&self, id: &LayerId) -> Layer {
        Layer::new(&self.layers(), id.clone())
    }
    /// `partial/<layer>`: a remote layer mounted lazily, until every object is local and it
    /// is published (see `crate::remote::lazy`).
    pub fn partial(&self, id: &LayerId) -> PathBuf {
        self.sub("partial").join(id.as_str())
    }
    /// `caches/<cache>/keys/`.
    pub fn keys_dir(&self, cache: &CacheId) -> PathBuf {
        self.sub("caches").join(cache.as_str()).join("keys")
    }
    /// `caches/<cache>/inputs/`: the recorded inputs of its keys ([`crate::why`]).
    pub fn inputs_dir(&self, cache: &CacheId) -> PathBuf {
        self.sub("caches").join(cache.as_str()).join("inputs")
    }
    /// `specs/`: the saved spec versions (`layercache serve`).
    pub fn specs_dir(&self) -> PathBuf {
        self.sub("specs")
    }
    /// `caches/<cache>/fills/<key>.lock`.
    pub fn fill_lock(&self, cache: &CacheId, key: &CacheKey) -> PathBuf {
        self.sub("caches")
            .join(cache.as_str())
            .join("fills")
            .join(format!("{key}.lock"))
    }
    /// `runs/`.
    pub fn runs(&self) -> PathBuf {
        self.sub("runs")
    }
    /// `failed/`: what failed setups wrote to their logs, per run and cache
    /// ([`super::keep_failed_logs`]).
    pub fn failed(&self) -> PathBuf {
        self.sub("failed")
    }
    /// `staging/`.
    pub fn staging(&self) -> PathBuf {
        self.sub("staging")
    }
    /// `empty/`: the lowerdir of a miss.
    pub fn empty(&self) -> PathBuf {
        self.sub("empty")
    }
    /// `quarantine/`.
    pub fn quarantine(&self) -> PathBuf {
        self.sub("quarantine")
    }
    /// `lock`.
    pub fn lock(&self) -> PathBuf {
        self.sub("lock")
    }

    /// Reads the layer id published under `key` in `cache`, if any.
    ///
    /// Errors: [`Error::Io`] for an unreadable key file; [`Error::Failed`] for a corrupt one.
    pub fn read_key(&self, cache: &CacheId, key: &CacheKey) -> Result<Option<LayerId>> {
        let p = self.keys_dir(cache).join(key.as_str());
        match fs::read_to_string(&p) {
            Ok(s) => LayerId::new(s.trim())
                .map(Some)
                .map_err(|e| Error::Failed(format!("{}: corrupt key file: {e}", p.display()))),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(Error::io(&p, e)),
        }
    }

    /// All published keys of `cache`: `(key, layer id)`.
    ///
    /// Errors: [`Error::Io`] reading the keys directory.
    pub fn keys(&self, cache: &CacheId) -> Result<Vec<(CacheKey, LayerId)>> {
        let dir = self.keys_dir(cache);
        let mut out = Vec::new();
        for name in read_names(&dir)? {
            let Ok(key) = CacheKey::new(name) else {
                continue; // temporary files start with '.'
            };
            if let Some(id) = self.read_key(cache, &key)? {
                out.push((key, id));
            }
        }
        Ok(out)
    }

    /// All caches that have a directory under `caches/`.
    ///
    /// Errors: [`Error::Io`] reading `caches/`.
    pub fn caches(&self) -> Result<Vec<CacheId>> {
        Ok(read_names(&self.sub("caches"))?
            .into_iter()
            .filter_map(|n| CacheId::new(n).ok())
            .collect())
    }

    /// Every `(cache, key, layer)` of the project.
    ///
    /// Errors: as [`ProjectDirs::keys`].
    pub fn all_keys(&self) -> Result<Vec<(CacheId, CacheKey, LayerId)>> {
        let mut out = Vec::new();
        for c in self.caches()? {
            for (k, l) in self.keys(&c)? {
                out.push((c.clone(), k, l));
            }
        }
        Ok(out)
    }

    /// Ids of the layer directories under `layers/`.
    ///
    /// Errors: [`Error::Io`] reading `layers/`.
    pub fn layer_ids(&self) -> Result<Vec<LayerId>> {
        Ok(read_names(&self.layers())?
            .into_iter()
            .filter_map(|n| LayerId::new(n).ok())
            .collect())
    }

    /// Removes every key file that points at `id`; returns the keys removed.
    pub(super) fn unpublish(&self, id: &LayerId) -> Result<Vec<CacheKey>> {
        let mut removed = Vec::new();
        for (c, k, l) in self.all_keys()? {
            if &l == id {
                let p = self.keys_dir(&c).join(k.as_str());
                match fs::remove_file(&p) {
                    Ok(()) => removed.push(k),
                    Err(e) if e.kind() == io::ErrorKind::NotFound => {}
                    Err(e) => return Err(Error::io(&p, e)),
                }
            }
        }
        Ok(removed)
    }

    /// Unpublishes and removes layer `id` under an exclusive lease on it; `false` (nothing
    /// changed) when the layer is mounted (its lease is held).
    ///
    /// Errors: [`Error::Io`] reading the keys or removing the layer.
    pub(super) fn evict(&self, id: &LayerId) -> Result<bool> {
        let Some(_x) = Lease::try_acquire(&self.layer(id).lease_path(), Mode::Exclusive)? else {
            return Ok(false);
        };
        self.unpublish(id)?;
        self.remove_layer(id)?;
        Ok(true)
    }

    /// Moves layer `id` out of `layers/` (so no lookup can reach it) and deletes it.
    pub(super) fn remove_layer(&self, id: &LayerId) -> Result<()> {
        let from = self.layers().join(id.as_str());
        let to = self.staging().join(format!("{id}.removing"));
        match fs::rename(&from, &to) {
            Ok(()) => remove_tree(&to),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
            Err(e) => Err(Error::io(&from, e)),
        }
    }
}

pub(super) fn read_names(dir: &Path) -> Result<Vec<String>> {
    let rd = match fs::read_dir(dir) {
        Ok(r) => r,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(Error::io(dir, e)),
    };
    let mut out = Vec::new();
    for ent in rd {
        let ent = ent.at(dir)?;
        if let Some(n) = ent.file_name().to_str()
            && !n.starts_with('.')
        {
            out.push(n.to_string());
        }
    }
    out.sort();
    Ok(out)
}

/// `rm -rf` that tolerates a missing path and read-only directories inside.
pub(super) fn remove_tree(p: &Path) -> Result<()> {
    match fs::remove_dir_all(p) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
        Err(e) if e.kind() == io::ErrorKind::PermissionDenied => {
            // EACCES: a directory without write permission; EPERM: an immutable or
            // append-only file or directory (`chattr +i`/`+a` by a setup, in its upper).
            make_writable(p);
            clear_inode_flags(p);
            fs::remove_dir_all(p).at(p)
        }
        Err(e) => Err(Error::io(p, e)),
    }
}

/// `FS_IMMUTABLE_FL | FS_APPEND_FL` (include/uapi/linux/fs.h): the inode flags that make
/// unlink(2), rename(2) and link(2) fail with EPERM.
const PINNING_FLAGS: u32 = 0x10 | 0x20;

/// Clears the immutable and append-only inode flags (`chattr -i -a`) of `p` and everything
/// below it (symlinks not followed), so the tree can be removed or its files linked into
/// objects. Best effort: a file whose flags cannot be read or changed (no CAP_LINUX_IMMUTABLE,
/// a filesystem without inode flags) is left as it is. Returns how many inodes it changed.
pub(super) fn clear_inode_flags(p: &Path) -> u64 {
    use crate::sys::{FS_IOC_GETFLAGS, FS_IOC_SETFLAGS};
    use std::os::fd::AsFd;
    use std::os::unix::fs::OpenOptionsExt;
    let Ok(meta) = fs::symlink_metadata(p) else {
        return 0;
    };
    let ft = meta.file_type();
    if !(ft.is_dir() || ft.is_file()) {
        return 0;
    }
    let mut changed = 0;
    if let Ok(f) = fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK)
        .open(p)
    {
        let mut buf = [0u8; 28];
        if crate::sys::ioctl_fileattr(f.as_fd(), FS_IOC_GETFLAGS, &mut buf).is_ok() {
            let flags = u32::from_ne_bytes([buf[0], buf[1], buf[2], buf[3]]);
            if flags & PINNING_FLAGS != 0 {
                buf[..4].copy_from_slice(&(flags & !PINNING_FLAGS).to_ne_bytes());
                if crate::sys::ioctl_fileattr(f.as_fd(), FS_IOC_SETFLAGS, &mut buf).is_ok() {
                    changed += 1;
                }
            }
        }
    }
    if ft.is_dir()
        && let Ok(rd) = fs::read_dir(p)
    {
        for e in rd.flatten() {
            changed += clear_inode_flags(&e.path());
        }
    }
    changed
}

fn make_writable(p: &Path) {
    if let Ok(m) = fs::symlink_metadata(p)
        && m.is_dir()
    {
        let _ = fs::set_permissions(p, fs::Permissions::from_mode(m.mode() | 0o700));
        if let Ok(rd) = fs::read_dir(p) {
            for e in rd.flatten() {
                make_writable(&e.path());
            }
        }
    }
}

pub(super) fn mkdir_mode(p: &Path, mode: u32) -> Result<()> {
    match fs::DirBuilder::new().mode(mode).create(p) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == io::ErrorKind::AlreadyExists => Ok(()),
        Err(e) => Err(Error::io(p, e)),
    }
}

pub(super) fn canonical_mountpoint(p: &Path) -> Result<PathBuf> {
    let c = fs::canonicalize(p).map_err(|e| {
        Error::invalid(format!(
            "mountpoint {}: {e} (want an existing directory)",
            p.display()
        ))
    })?;
    if !c.is_dir() {
        return Err(Error::invalid(format!(
            "mountpoint {}: not a directory",
            p.display()
        )));
    }
    Ok(c)
}

/// True when a layercache store (format file included) exists at `root`.
pub fn exists_at(root: &Path) -> bool {
    root.join("v1").join("format.json").is_file()
}

/// The store root of a run's private upper dir, `<root>/v1/projects/<project>/runs/<run>/upper`
/// (see the layout at the top of this module); `None` for any other path.
pub fn store_of_run_upper(upper: &Path) -> Option<PathBuf> {
    let names: Vec<&std::ffi::OsStr> = upper.iter().collect();
    let n = names.len();
    let shaped = n >= 7
        && names[n - 1] == "upper"
        && names[n - 3] == "runs"
        && names[n - 5] == "projects"
        && names[n - 6] == "v1";
    shaped.then(|| upper.ancestors().nth(6).map(Path::to_path_buf))?
}
