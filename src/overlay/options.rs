//! `-o` option parsing and validation for `layercache overlay` (fuse-overlayfs compatible).

use std::fs;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

pub use super::links::LowerLinks;
use crate::error::{Error, Result};

/// A validated overlay configuration: absolute, canonical directories.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct OverlayConfig {
    /// Read-only lower directories, topmost first (overlayfs `lowerdir=` order). Up to 63.
    pub lowerdirs: Vec<PathBuf>,
    /// The writable upper directory that receives every change; empty for a lowerdir-only
    /// mount (see [`OverlayConfig::has_upper`]), which is read-only.
    pub upperdir: PathBuf,
    /// Scratch directory on the same filesystem as `upperdir` (copy-up staging, orphans);
    /// empty for a lowerdir-only mount.
    pub workdir: PathBuf,
    /// Read-only mount (`-o ro`, or no `upperdir`, as kernel overlayfs): mounted `MS_RDONLY`,
    /// and the daemon answers `EROFS` to every change (`Filesystem::read_only`) and writes
    /// nothing, not even to the workdir.
    #[serde(default)]
    pub read_only: bool,
    /// Device nodes in the mount can be opened (`-o dev`; the mount is `nodev` otherwise).
    /// Only `layercache overlay` sets it; the store's run views stay `nodev`.
    #[serde(default)]
    pub dev: bool,
    /// Set-user-ID and set-group-ID programs in the mount run with their owner's ids (`-o suid`;
    /// the mount is `nosuid` otherwise). Only `layercache overlay` sets it, as `dev`.
    #[serde(default)]
    pub suid: bool,
    /// Ownership mapping (issue 12; fuse-overlayfs's `squash_to_uid`/`squash_to_gid`,
    /// `squash_to_root` = 0/0): every entry is reported as owned by this uid/gid, and new
    /// entries are stored with the canonical owner 0:0 in the upper. The kernel still checks
    /// modes against the reported owner (`default_permissions`).
    #[serde(default)]
    pub squash: Squash,
    /// How each lower's hard links are shown, in `lowerdirs` order; a lower without an entry
    /// shows its own links ([`LowerLinks::Real`], kernel overlayfs's behaviour). The store
    /// mounts its layers with [`LowerLinks::Recorded`].
    #[serde(default)]
    pub lower_links: Vec<LowerLinks>,
    /// `allow_other` (or `allow_root`) was asked for ([`asks_allow_other`]). A privileged mount
    /// always admits other users; a user's mount through fusermount3 only when asked, and only
    /// where /etc/fuse.conf has `user_allow_other` (fuse.conf(5)).
    #[serde(default)]
    pub allow_other: bool,
}

/// Whether the `-o` strings ask for `allow_other` or `allow_root` (libfuse's options; both
/// need `user_allow_other` for a user's mount).
pub fn asks_allow_other(options: &[String]) -> bool {
    options
        .iter()
        .flat_map(|o| o.split(','))
        .any(|o| o == "allow_other" || o == "allow_root")
}

/// The `squash_to_uid`/`squash_to_gid` of a mount; `None` = real owners.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Squash {
    /// Reported owner uid of every entry.
    pub uid: Option<u32>,
    /// Reported owner gid of every entry.
    pub gid: Option<u32>,
}

impl OverlayConfig {
    /// Whether the mount has an upper layer (a lowerdir-only mount has none).
    pub fn has_upper(&self) -> bool {
        !self.upperdir.as_os_str().is_empty()
    }
}

impl Squash {
    /// Whether any mapping is set.
    pub fn is_set(&self) -> bool {
        self.uid.is_some() || self.gid.is_some()
    }
}

/// Generic mount options that are accepted and need no action here (the mount is always
/// `allow_other` and `default_permissions`; atime behaviour follows the upper). `ro`/`rw`,
/// `dev`/`nodev` and `suid`/`nosuid` are parsed in [`parse`].
const GENERIC: &[&str] = &[
    "noatime",
    "atime",
    "relatime",
    "norelatime",
    "strictatime",
    "lazytime",
    "nolazytime",
    "nodiratime",
    "diratime",
    "allow_other",
    "allow_root",
    "default_permissions",
    "exec",
    "noexec",
    "async",
    "sync",
    "dirsync",
    "auto",
    "noauto",
    "user",
    "nouser",
    "users",
    "nofail",
    "_netdev",
    "defaults",
    "silent",
    "loud",
    "auto_unmount",
    "clone_fd",
];
/// Generic options that take a value and are accepted (ignored).
const GENERIC_VALUED: &[&str] = &[
    "fsname",
    "subtype",
    "context",
    "fscontext",
    "defcontext",
    "rootcontext",
    "max_read",
    "blksize",
    "uid",
    "gid",
    "x-systemd.",
    "comment",
];
/// overlayfs / fuse-overlayfs options whose default behaviour is what layercache does anyway.
const OVERLAY_NOOP: &[&str] = &[
    "redirect_dir",
    "index",
    "xino",
    "metacopy",
    "nfs_export",
    "volatile",
    "userxattr",
    "threaded",
    "fsync",
    "noacl",
    "static_nlink",
    "plugins",
    "uidmapping",
    "gidmapping",
    "timeout",
    "noxattrs",
];

/// When the `-o` strings ask for a remount (`remount` among them, as mount(8) passes them on
/// for `mount -o remount,ro MNT`): the mount(2) flags they give (`ro`, `nosuid`, `nodev`,
/// `noexec`, the atime flags, `sync`, `dirsync`, `lazytime`); other options are ignored then.
pub fn remount_flags(options: &[String]) -> Option<nix::mount::MsFlags> {
    use nix::mount::MsFlags as F;
    let opts: Vec<&str> = options.iter().flat_map(|o| o.split(',')).collect();
    if !opts.contains(&"remount") {
        return None;
    }
    let mut flags = F::empty();
    for o in opts {
        match o {
            "ro" => flags.insert(F::MS_RDONLY),
            "rw" => flags.remove(F::MS_RDONLY),
            "nosuid" => flags.insert(F::MS_NOSUID),
            "nodev" => flags.insert(F::MS_NODEV),
            "noexec" => flags.insert(F::MS_NOEXEC),
            "noatime" => flags.insert(F::MS_NOATIME),
            "nodiratime" => flags.insert(F::MS_NODIRATIME),
            "relatime" => flags.insert(F::MS_RELATIME),
            "strictatime" => flags.insert(F::MS_STRICTATIME),
            "sync" => flags.insert(F::MS_SYNCHRONOUS),
            "dirsync" => flags.insert(F::MS_DIRSYNC),
            "lazytime" => flags.insert(F::MS_LAZYTIME),
            _ => {}
        }
    }
    Some(flags)
}

/// Parses `-o` strings (each comma-separated; may repeat) into lower/upper/work directories.
///
/// Without `upperdir` the mount is read-only (kernel overlayfs's lowerdir-only mount); `ro`
/// makes one with an upper read-only too.
///
/// Errors: [`Error::Invalid`] naming an unknown option, a missing `lowerdir`, or a `workdir`
/// without an `upperdir`.
pub fn parse(options: &[String]) -> Result<RawOptions> {
    let mut raw = RawOptions::default();
    for opt in options
        .iter()
        .flat_map(|o| o.split(','))
        .filter(|o| !o.is_empty())
    {
        let (name, value) = match opt.split_once('=') {
            Some((n, v)) => (n, Some(v)),
            None => (opt, None),
        };
        match (name, value) {
            ("lowerdir", Some(v)) => {
                raw.lowerdirs = v
                    .split(':')
                    .filter(|s| !s.is_empty())
                    .map(PathBuf::from)
                    .collect()
            }
            ("upperdir", Some(v)) => raw.upperdir = Some(PathBuf::from(v)),
            ("workdir", Some(v)) => raw.workdir = Some(PathBuf::from(v)),
            ("squash_to_root", None) => {
                raw.squash = Squash {
                    uid: Some(0),
                    gid: Some(0),
                }
            }
            ("squash_to_uid", Some(v)) => raw.squash.uid = Some(id_value(name, v)?),
            ("squash_to_gid", Some(v)) => raw.squash.gid = Some(id_value(name, v)?),
            ("ro", None) => raw.read_only = true,
            ("rw", None) => raw.read_only = false,
            ("dev", None) => raw.dev = true,
            ("nodev", None) => raw.dev = false,
            ("suid", None) => raw.suid = true,
            ("nosuid", None) => raw.suid = false,
            (n, None) if GENERIC.contains(&n) => {}
            (n, _) if OVERLAY_NOOP.contains(&n) => {}
            (n, Some(_))
                if GENERIC_VALUED
                    .iter()
                    .any(|g| n == *g || (g.ends_with('.') && n.starts_with(g))) => {}
            (n, _) if n.starts_with("x-") => {}
            _ => {
                return Err(Error::invalid(format!(
                    "unknown mount option {opt:?}: valid are lowerdir=DIR[:DIR...], upperdir=DIR, workdir=DIR \
                     and generic mount options (rw, noatime, lazytime, allow_other, ...)"
                )));
            }
        }
    }
    if raw.lowerdirs.is_empty() {
        return Err(Error::invalid("missing option lowerdir=DIR[:DIR...]"));
    }
    if raw.upperdir.is_none() {
        if raw.workdir.is_some() {
            return Err(Error::invalid(
                "option workdir= needs an upperdir=DIR (without one the mount is read-only)",
            ));
        }
        raw.read_only = true;
    }
    Ok(raw)
}

/// A numeric uid/gid option value. Errors: [`Error::Invalid`] naming the option.
fn id_value(name: &str, v: &str) -> Result<u32> {
    v.parse::<u32>()
        .ok()
        .filter(|n| *n != u32::MAX)
        .ok_or_else(|| Error::invalid(format!("option {name}={v:?}: want a numeric id")))
}

/// Options as given, before the directories are checked.
#[derive(Clone, Debug, Default)]
pub struct RawOptions {
    /// `lowerdir=` entries, topmost first.
    pub lowerdirs: Vec<PathBuf>,
    /// `upperdir=`.
    pub upperdir: Option<PathBuf>,
    /// `workdir=`; when absent a sibling `.<upper-name>.layercache-work` directory is used.
    pub workdir: Option<PathBuf>,
    /// `squash_to_uid=`, `squash_to_gid=`, `squash_to_root` (see [`OverlayConfig::squash`]).
    pub squash: Squash,
    /// `ro` (see [`OverlayConfig::read_only`]); set when there is no `upperdir`.
    pub read_only: bool,
    /// `dev` (see [`OverlayConfig::dev`]).
    pub dev: bool,
    /// `suid` (see [`OverlayConfig::suid`]).
    pub suid: bool,
}

fn existing_dir(what: &str, p: &Path) -> Result<PathBuf> {
    let meta = fs::metadata(p).map_err(|e| {
        if e.raw_os_error() == Some(libc::ENOTCONN) {
            return Error::invalid(format!(
                "{what} {}: a dead FUSE mount is there (its daemon is gone); remove it with \
                 `layercache umount {0}` or `umount -l {0}`",
                p.display()
            ));
        }
        Error::invalid(format!(
            "{what} {}: {e} (want an existing directory)",
            p.display()
        ))
    })?;
    if !meta.is_dir() {
        return Err(Error::invalid(format!(
            "{what} {}: not a directory",
            p.display()
        )));
    }
    fs::canonicalize(p).map_err(|e| Error::invalid(format!("{what} {}: {e}", p.display())))
}

fn nested(a: &Path, b: &Path) -> bool {
    a.starts_with(b) || b.starts_with(a)
}

/// Checks the directories and the mountpoint and returns the canonical configuration.
///
/// Checks: every directory exists; there are at most 63 lowers; upper and work are on the same
/// filesystem, neither inside a lower nor a lower inside them; the mountpoint is an existing
/// directory that is not inside the upper or work dir. The workdir is created if missing
/// (unless read-only: then a missing one is not needed). A lowerdir-only mount checks the
/// lowers and the mountpoint only.
///
/// Errors: [`Error::Invalid`] naming the offending input.
pub fn validate(raw: &RawOptions, mountpoint: &Path) -> Result<OverlayConfig> {
    if raw.lowerdirs.len() > 63 {
        return Err(Error::invalid(format!(
            "lowerdir: {} directories given, at most 63 are supported",
            raw.lowerdirs.len()
        )));
    }
    let lowerdirs = raw
        .lowerdirs
        .iter()
        .map(|p| existing_dir("lowerdir", p))
        .collect::<Result<Vec<_>>>()?;
    let Some(upper_given) = raw.upperdir.as_deref() else {
        return Ok(OverlayConfig {
            lowerdirs,
            upperdir: PathBuf::new(),
            workdir: PathBuf::new(),
            squash: raw.squash,
            lower_links: Vec::new(),
            allow_other: false,
            read_only: true,
            dev: raw.dev,
            suid: raw.suid,
        });
    };
    let upperdir = existing_dir("upperdir", upper_given)?;
    let workdir = match &raw.workdir {
        Some(w) if raw.read_only && !w.exists() => PathBuf::new(),
        None if raw.read_only => PathBuf::new(),
        Some(w) => {
            if !w.exists() {
                fs::create_dir_all(w).map_err(|e| {
                    Error::invalid(format!("workdir {}: cannot create: {e}", w.display()))
                })?;
            }
            existing_dir("workdir", w)?
        }
        None => {
            let name = upperdir
                .file_name()
                .map(|n| n.to_string_lossy().into_owned())
                .unwrap_or_default();
            let parent = upperdir.parent().ok_or_else(|| {
                Error::invalid("upperdir /: give a workdir= on the same filesystem")
            })?;
            let w = parent.join(format!(".{name}.layercache-work"));
            fs::create_dir_all(&w).map_err(|e| {
                Error::invalid(format!("workdir {}: cannot create: {e}", w.display()))
            })?;
            existing_dir("workdir", &w)?
        }
    };
    let mnt = existing_dir("mountpoint", mountpoint)?;
    for l in &lowerdirs {
        if nested(l, &upperdir) {
            return Err(Error::invalid(format!(
                "upperdir {} and lowerdir {} overlap: neither may be inside the other",
                upperdir.display(),
                l.display()
            )));
        }
        if nested(l, &workdir) {
            return Err(Error::invalid(format!(
                "workdir {} and lowerdir {} overlap: neither may be inside the other",
                workdir.display(),
                l.display()
            )));
        }
    }
    if raw.read_only && workdir.as_os_str().is_empty() {
        // A read-only mount with an upper needs no workdir (nothing is staged).
        return Ok(OverlayConfig {
            lowerdirs,
            upperdir,
            workdir,
            squash: raw.squash,
            lower_links: Vec::new(),
            allow_other: false,
            read_only: true,
            dev: raw.dev,
            suid: raw.suid,
        });
    }
    if workdir.starts_with(&upperdir) || upperdir.starts_with(&workdir) {
        return Err(Error::invalid(format!(
            "workdir {} and upperdir {} must be separate directories (neither inside the other)",
            workdir.display(),
            upperdir.display()
        )));
    }
    if mnt.starts_with(&upperdir) || mnt.starts_with(&workdir) {
        return Err(Error::invalid(format!(
            "mountpoint {} is inside the upperdir or workdir",
            mnt.display()
        )));
    }
    let dev = |p: &Path| fs::metadata(p).map(|m| m.dev()).unwrap_or(0);
    if dev(&upperdir) != dev(&workdir) {
        return Err(Error::invalid(format!(
            "workdir {} is not on the same filesystem as upperdir {}",
            workdir.display(),
            upperdir.display()
        )));
    }
    Ok(OverlayConfig {
        lowerdirs,
        upperdir,
        workdir,
        squash: raw.squash,
        lower_links: Vec::new(),
        allow_other: false,
        read_only: raw.read_only,
        dev: raw.dev,
        suid: raw.suid,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn s(v: &str) -> Vec<String> {
        vec![v.to_string()]
    }

    #[test]
    fn parses_fuse_overlayfs_style_options() {
        let r = parse(&s(
            "rw,lowerdir=/a:/b,upperdir=/u,workdir=/w,noatime,lazytime,allow_other",
        ))
        .unwrap();
        assert_eq!(r.lowerdirs, vec![PathBuf::from("/a"), PathBuf::from("/b")]);
        assert_eq!(r.upperdir, Some(PathBuf::from("/u")));
        assert_eq!(r.workdir, Some(PathBuf::from("/w")));
    }

    #[test]
    fn allow_other_and_allow_root_are_asked_for_by_name() {
        assert!(asks_allow_other(&s("lowerdir=/a,upperdir=/u,allow_other")));
        assert!(asks_allow_other(&["rw".into(), "allow_root".into()]));
        assert!(!asks_allow_other(&s("lowerdir=/allow_other,upperdir=/u")));
    }

    #[test]
    fn rejects_unknown_and_missing_options() {
        let e = parse(&s("lowerdir=/a,upperdir=/u,frobnicate"))
            .unwrap_err()
            .to_string();
        assert!(e.contains("frobnicate"), "{e}");
        let e = parse(&s("upperdir=/u")).unwrap_err().to_string();
        assert!(e.contains("lowerdir"), "{e}");
        let e = parse(&s("lowerdir=/a,workdir=/w")).unwrap_err().to_string();
        assert!(e.contains("upperdir"), "{e}");
    }

    #[test]
    fn remount_options_give_mount_flags() {
        use nix::mount::MsFlags as F;
        assert_eq!(remount_flags(&s("lowerdir=/a,upperdir=/u,ro")), None);
        let f = remount_flags(&s("ro,nosuid,nodev,relatime,remount,user_id=0,allow_other"));
        assert_eq!(
            f,
            Some(F::MS_RDONLY | F::MS_NOSUID | F::MS_NODEV | F::MS_RELATIME)
        );
        assert_eq!(remount_flags(&s("remount,ro,rw")), Some(F::empty()));
    }

    #[test]
    fn ro_dev_and_lowerdir_only() {
        let r = parse(&s("lowerdir=/a:/b")).unwrap();
        assert!(r.read_only && r.upperdir.is_none(), "{r:?}");
        let r = parse(&s("lowerdir=/a,upperdir=/u,workdir=/w,ro,dev")).unwrap();
        assert!(r.read_only && r.dev, "{r:?}");
        let r = parse(&s("ro,dev,suid,lowerdir=/a,upperdir=/u,rw,nodev")).unwrap();
        assert!(!r.read_only && !r.dev && r.suid, "{r:?}");
        let r = parse(&s("suid,lowerdir=/a,upperdir=/u,nosuid")).unwrap();
        assert!(!r.suid, "{r:?}");
    }

    #[test]
    fn validate_rejects_nesting_and_missing_dirs() {
        let t = tempfile::tempdir().unwrap();
        let lower = t.path().join("lower");
        let mnt = t.path().join("mnt");
        fs::create_dir_all(lower.join("up")).unwrap();
        fs::create_dir(&mnt).unwrap();
        let raw = RawOptions {
            lowerdirs: vec![lower.clone()],
            upperdir: Some(lower.join("up")),
            workdir: Some(t.path().join("work")),
            ..Default::default()
        };
        assert!(
            validate(&raw, &mnt)
                .unwrap_err()
                .to_string()
                .contains("overlap")
        );
        let raw = RawOptions {
            lowerdirs: vec![t.path().join("nope")],
            upperdir: Some(lower.join("up")),
            workdir: None,
            ..Default::default()
        };
        assert!(
            validate(&raw, &mnt)
                .unwrap_err()
                .to_string()
                .contains("nope")
        );
    }
}
