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
    /// Ownership mapping (fuse-overlayfs's `squash_to_uid`/`squash_to_gid`,
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
    /// Answer OPEN with FUSE passthrough (`passthrough.rs`; `-o passthrough`): one page cache
    /// shared with the lower files and every other mount of them, lower-speed big reads, at
    /// the cost of an OPEN/RELEASE round trip per open. Honoured only as root in the initial
    /// user namespace (the kernel's rule for registering backing files); elsewhere the mount
    /// keeps no-open mode, silently. `LAYERCACHE_PASSTHROUGH=1`/`0` in the daemon's
    /// environment overrides it (tests, benches).
    #[serde(default)]
    pub passthrough: bool,
    /// The per-mount flags of the generic options given (`noatime`, `nodiratime`,
    /// `relatime`, `strictatime`, `noexec`, `sync`, `dirsync`, `lazytime`), as mount(2)
    /// `MS_*` bits ([`mount_flags`]): the kernel applies them to the mount itself, e.g. no
    /// atime update at all under `noatime`, as on any filesystem (mount(8)).
    #[serde(default)]
    pub mount_flags: u64,
    /// File handles (name_to_handle_at(2)) stay valid across a clean remount of the same
    /// upperdir and lowerdirs, as on kernel overlayfs with `nfs_export=on`: the daemon writes a
    /// node index into the workdir when its session ends and the next mount reads it
    /// (`node_index.rs`). Set for writable `layercache overlay` mounts; the store's mounts (run
    /// views, `layercache mount`) have private per-run uppers and keep none.
    #[serde(default)]
    pub persist_handles: bool,
    /// Where the daemon writes the order in which lower files' data is first opened
    /// (`open_trace.rs`: one layer-relative path per line, every second and at exit); `None`
    /// records nothing. Set by the store for a run's exact local hit (the remote tier keeps
    /// it beside the key for fresh runners' lazy mounts).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub open_trace: Option<PathBuf>,
    /// Where the daemon listens for its owner handing the mount back to the store and a later
    /// run adopting it (`warm.rs`: `idle <ms>`, `adopt <pid>`, `end`); `None`: the mount ends
    /// with its owner, as always. Only meaningful with an owner pid.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub control: Option<PathBuf>,
    /// Lower layers the daemon makes with the process's [`super::LayerMaker`] instead of
    /// opening `lowerdirs[index]` as a directory tree (the store's lazily fetched remote
    /// layers); empty for every mount of `layercache overlay`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub made_lowers: Vec<MadeLower>,
}

/// A lower layer made from a description rather than opened as a directory (see
/// [`OverlayConfig::made_lowers`]).
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct MadeLower {
    /// Which lower it replaces, `lowerdirs` order (0 = topmost). `lowerdirs[index]` is still
    /// a directory that exists (validated like any lowerdir, never read).
    pub index: usize,
    /// What the maker reads (its own JSON shape).
    pub spec: serde_json::Value,
}

/// Whether the `-o` strings ask for `allow_other` or `allow_root` (libfuse's options; both
/// need `user_allow_other` for a user's mount).
pub fn asks_allow_other(options: &[String]) -> bool {
    options
        .iter()
        .flat_map(|o| o.split(','))
        .any(|o| o == "allow_other" || o == "allow_root")
}

/// Bytes from which a file counts as large (1 MiB): a layer's manifest records the bytes in
/// such files (`large_bytes`), which [`PassthroughChoice::decide`] takes.
pub const LARGE_FILE: u64 = 1 << 20;

/// Which mode `layercache run` mounts a cache's layer in (spec field `passthrough`, flag
/// `--passthrough`): FUSE passthrough (`On`), no-open mode (`Off`), or `Auto`, decided from the
/// layer's manifest by [`PassthroughChoice::decide`]. `layercache run` uses `Auto` unless told;
/// the default value (`Off`) is today's mode, for `layercache mount` and older run records.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum PassthroughChoice {
    /// Decide from the layer ([`PassthroughChoice::decide`]).
    Auto,
    /// Always passthrough (where the kernel allows it: root).
    On,
    /// Never: no-open mode.
    #[default]
    Off,
}

impl PassthroughChoice {
    /// Parses `auto`, `on` or `off` given for `what` (a flag or spec field, for the message).
    ///
    /// Errors: [`Error::Invalid`] naming `what`, the value and the valid ones.
    pub fn parse(what: &str, v: &str) -> Result<PassthroughChoice> {
        match v {
            "auto" => Ok(PassthroughChoice::Auto),
            "on" => Ok(PassthroughChoice::On),
            "off" => Ok(PassthroughChoice::Off),
            _ => Err(Error::invalid(format!(
                "{what} {v:?}: want auto, on or off"
            ))),
        }
    }

    /// Whether a layer holding `files` regular files, `large_bytes` bytes of them in files of
    /// at least [`LARGE_FILE`], is mounted with passthrough. `Auto` says yes for every layer
    /// with a file in it, whatever their sizes: every run of the layer then shares one page
    /// cache (4 runs of the npm fixture's tree, a numpy+pandas venv, a cargo target dir or a
    /// layer of big .so files, each read fully: 1.00-1.02× one native read, against ~5× in
    /// no-open mode), and most of its first passes measured level with no-open mode or faster
    /// (first read-all of the big-file layers 1.3-1.9× kernel overlayfs instead of 1.6-3.1×,
    /// of the venv 0.8-0.9× no-open mode's; node's require of the npm tree's 5 largest
    /// packages 0.87-0.96×), at the cost of an OPEN and a RELEASE round trip per open and an
    /// OPENDIR per directory: the npm tree's first read-all 0.9-1.5× no-open mode's across
    /// series on a noisy machine, its first `find` walk 15-50 % slower, its second passes on
    /// the same mount 2-3× slower
    /// (`benches/results/2026-12-02-modes-915b7c1.md`). An empty layer (a miss, whose setup
    /// fills it) says no: there is no page to share, and its fill (`npm ci`) measured 19 %
    /// slower with passthrough. (`files` = 0 with `large_bytes` > 0 comes from no manifest;
    /// yes.)
    pub fn decide(self, large_bytes: u64, files: u64) -> bool {
        match self {
            PassthroughChoice::On => true,
            PassthroughChoice::Off => false,
            PassthroughChoice::Auto => files > 0 || large_bytes > 0,
        }
    }
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

/// Generic mount options that are accepted and need no action in the daemon (the mount is
/// always `default_permissions`; the per-mount ones, such as `noatime`, become mount(2) flags:
/// [`mount_flags`]). `ro`/`rw`,
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
pub fn remount_flags(options: &[String]) -> Option<rustix::mount::MountFlags> {
    use rustix::mount::MountFlags as F;
    let opts: Vec<&str> = options.iter().flat_map(|o| o.split(',')).collect();
    if !opts.contains(&"remount") {
        return None;
    }
    let mut flags = mount_flags(&opts);
    for o in opts {
        match o {
            "ro" => flags.insert(F::RDONLY),
            "rw" => flags.remove(F::RDONLY),
            "nosuid" => flags.insert(F::NOSUID),
            "nodev" => flags.insert(F::NODEV),
            _ => {}
        }
    }
    Some(flags)
}

/// The mount(2) flags of the per-mount generic options among `opts` (mount(8)): `noexec`,
/// `noatime`, `nodiratime`, `relatime`, `strictatime`, `sync`, `dirsync`, `lazytime`; a later
/// `exec`/`atime`/`norelatime`/`async`/`nolazytime` undoes its counterpart. Others give none.
pub fn mount_flags(opts: &[&str]) -> rustix::mount::MountFlags {
    use rustix::mount::MountFlags as F;
    let mut flags = F::empty();
    for o in opts {
        match *o {
            "noexec" => flags.insert(F::NOEXEC),
            "exec" => flags.remove(F::NOEXEC),
            "noatime" => flags.insert(F::NOATIME),
            "atime" => flags.remove(F::NOATIME),
            "nodiratime" => flags.insert(F::NODIRATIME),
            "diratime" => flags.remove(F::NODIRATIME),
            "relatime" => flags.insert(F::RELATIME),
            "norelatime" => flags.remove(F::RELATIME),
            "strictatime" => flags.insert(F::STRICTATIME),
            "sync" => flags.insert(F::SYNCHRONOUS),
            "async" => flags.remove(F::SYNCHRONOUS),
            "dirsync" => flags.insert(F::DIRSYNC),
            "lazytime" => flags.insert(F::LAZYTIME),
            "nolazytime" => flags.remove(F::LAZYTIME),
            _ => {}
        }
    }
    flags
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
            ("passthrough", None) => raw.passthrough = true,
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
    let opts: Vec<&str> = options.iter().flat_map(|o| o.split(',')).collect();
    raw.mount_flags = mount_flags(&opts).bits().into();
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
    /// `passthrough` (see [`OverlayConfig::passthrough`]).
    pub passthrough: bool,
    /// Per-mount flags (see [`OverlayConfig::mount_flags`]).
    pub mount_flags: u64,
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
/// directory that is not inside the upper or work dir, nor strictly inside a lower (kernel
/// overlayfs would show the lower's own directory there, the daemon reads its lowers through
/// their paths and would show the mount inside itself: refused, not served wrong; the lower
/// itself may be the mountpoint). The workdir is created if missing, once every check passed
/// (unless read-only: then a missing one is not needed). A lowerdir-only mount checks the
/// lowers and the mountpoint only.
///
/// Errors: [`Error::Invalid`] naming the offending input.
pub fn validate(raw: &RawOptions, mountpoint: &Path) -> Result<OverlayConfig> {
    validate_made(raw, mountpoint).map(|(cfg, _)| cfg)
}

/// [`validate`], also returning the topmost directory it created for the workdir (`None` when
/// the workdir existed or is not needed), for the caller to remove when the mount then fails
/// (the `overlay` command: a refused mount leaves nothing).
///
/// Errors: as [`validate`].
pub fn validate_made(
    raw: &RawOptions,
    mountpoint: &Path,
) -> Result<(OverlayConfig, Option<PathBuf>)> {
    let (lowerdirs, mnt) = checked_lowers(raw, mountpoint)?;
    let Some(upper_given) = raw.upperdir.as_deref() else {
        return Ok((
            config(raw, lowerdirs, PathBuf::new(), PathBuf::new(), true),
            None,
        ));
    };
    let upperdir = existing_dir("upperdir", upper_given)?;
    // The workdir is created only once every check passed: a refused mount leaves nothing.
    let (workdir, create_work) = planned_workdir(raw, &upperdir)?;
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
        return Ok((config(raw, lowerdirs, upperdir, workdir, true), None));
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
    // A workdir still to be made lands on its nearest existing ancestor's filesystem.
    let dev = |p: &Path| (p.ancestors().find_map(|a| fs::metadata(a).ok())).map_or(0, |m| m.dev());
    if dev(&upperdir) != dev(&workdir) {
        return Err(Error::invalid(format!(
            "workdir {} is not on the same filesystem as upperdir {}",
            workdir.display(),
            upperdir.display()
        )));
    }
    let workdir = if create_work.is_some() {
        fs::create_dir_all(&workdir).map_err(|e| {
            Error::invalid(format!("workdir {}: cannot create: {e}", workdir.display()))
        })?;
        existing_dir("workdir", &workdir)?
    } else {
        workdir
    };
    Ok((
        config(raw, lowerdirs, upperdir, workdir, raw.read_only),
        create_work,
    ))
}

/// The lowerdirs (at most 63, each an existing directory, canonical) and the canonical
/// mountpoint, which may not lie strictly inside a lowerdir.
///
/// Errors: [`Error::Invalid`] naming the offending input.
fn checked_lowers(raw: &RawOptions, mountpoint: &Path) -> Result<(Vec<PathBuf>, PathBuf)> {
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
    let mnt = existing_dir("mountpoint", mountpoint)?;
    if let Some(l) = lowerdirs.iter().find(|l| mnt != **l && mnt.starts_with(l)) {
        return Err(Error::invalid(format!(
            "mountpoint {} is inside lowerdir {}: the mount would show itself at {} (its \
             daemon never looks through its own mountpoint); mount over the lowerdir itself \
             or at a directory outside every lowerdir",
            mnt.display(),
            l.display(),
            mnt.strip_prefix(l).unwrap_or(&mnt).display()
        )));
    }
    Ok((lowerdirs, mnt))
}

/// Where the workdir of a mount with upperdir `upperdir` is (canonical, or planned) and the
/// topmost directory creating it would make; no workdir for a read-only mount without an
/// existing one. The default is `.<upper name>.layercache-work` beside the upperdir.
///
/// Errors: [`Error::Invalid`] for an upperdir of `/` without a workdir, or as [`planned_dir`].
fn planned_workdir(raw: &RawOptions, upperdir: &Path) -> Result<(PathBuf, Option<PathBuf>)> {
    Ok(match &raw.workdir {
        Some(w) if raw.read_only && !w.exists() => (PathBuf::new(), None),
        None if raw.read_only => (PathBuf::new(), None),
        Some(w) => planned_dir("workdir", w)?,
        None => {
            let name = upperdir
                .file_name()
                .map(|n| n.to_string_lossy().into_owned())
                .unwrap_or_default();
            let parent = upperdir.parent().ok_or_else(|| {
                Error::invalid("upperdir /: give a workdir= on the same filesystem")
            })?;
            planned_dir("workdir", &parent.join(format!(".{name}.layercache-work")))?
        }
    })
}

/// The canonical path `p` has or will have once created, and the topmost directory that
/// creating it makes (`None` when it exists): an existing directory is checked as [`existing_dir`] does; a missing one is its nearest existing
/// ancestor (canonical, a directory) joined with the missing names, which may not hold `..`
/// or `.`. Nothing is created here.
///
/// Errors: [`Error::Invalid`] naming `what` and `p` (not a directory, a `..` in the missing
/// part, an ancestor that cannot be read).
fn planned_dir(what: &str, p: &Path) -> Result<(PathBuf, Option<PathBuf>)> {
    if fs::symlink_metadata(p).is_ok() {
        return Ok((existing_dir(what, p)?, None));
    }
    let mut missing = Vec::new();
    let mut base = p;
    while fs::symlink_metadata(base).is_err() {
        match (base.parent(), base.file_name()) {
            (Some(parent), Some(name))
                if base
                    .components()
                    .next_back()
                    .is_some_and(|c| matches!(c, std::path::Component::Normal(_))) =>
            {
                missing.push(name.to_owned());
                base = if parent.as_os_str().is_empty() {
                    Path::new(".")
                } else {
                    parent
                };
            }
            _ => {
                return Err(Error::invalid(format!(
                    "{what} {}: cannot be created (a '.' or '..' in its missing part; give an \
                     existing directory or a plain path)",
                    p.display()
                )));
            }
        }
    }
    let mut out = existing_dir(what, base)?;
    let top = missing.last().map(|n| out.join(n));
    out.extend(missing.iter().rev());
    Ok((out, top))
}

/// The checked configuration of `raw` over its checked directories (`upperdir` and `workdir`
/// empty for a lowerdir-only mount); `allow_other` and `lower_links` are the caller's to set.
fn config(
    raw: &RawOptions,
    lowerdirs: Vec<PathBuf>,
    upperdir: PathBuf,
    workdir: PathBuf,
    read_only: bool,
) -> OverlayConfig {
    OverlayConfig {
        persist_handles: !read_only && !upperdir.as_os_str().is_empty(),
        made_lowers: Vec::new(),
        open_trace: None,
        control: None,
        lowerdirs,
        upperdir,
        workdir,
        squash: raw.squash,
        lower_links: Vec::new(),
        allow_other: false,
        read_only,
        dev: raw.dev,
        suid: raw.suid,
        passthrough: raw.passthrough,
        mount_flags: raw.mount_flags,
    }
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
    fn passthrough_is_an_option_and_auto_takes_it_for_every_layer_with_a_file() {
        let r = parse(&s("lowerdir=/a,upperdir=/u,passthrough")).unwrap();
        assert!(r.passthrough);
        assert!(!parse(&s("lowerdir=/a,upperdir=/u")).unwrap().passthrough);
        let e = PassthroughChoice::parse("--passthrough", "yes").unwrap_err();
        assert!(e.to_string().contains("want auto, on or off"), "{e}");
        assert_eq!(
            PassthroughChoice::parse("x", "auto").unwrap(),
            PassthroughChoice::Auto
        );
        const MIB: u64 = 1 << 20;
        let auto = PassthroughChoice::Auto;
        // Every layer with a file: the npm fixture's node_modules (10,428 files, a few
        // MB-sized binaries), the same with a 512 MiB file, a torch venv (GBs of .so among
        // 30,000 files), a small layer, and manifests written before large_bytes was counted.
        assert!(auto.decide(45 * MIB, 10_428), "node_modules");
        assert!(auto.decide(557 * MIB, 10_429), "node_modules + 512 MiB");
        assert!(auto.decide(3_000 * MIB, 30_000), "torch venv");
        assert!(auto.decide(0, 3), "three small files");
        assert!(auto.decide(0, 100_000), "a manifest without large_bytes");
        // An empty layer (a miss: setup fills it) keeps no-open mode.
        assert!(!auto.decide(0, 0), "empty layer");
        assert!(PassthroughChoice::On.decide(0, 100_000));
        assert!(!PassthroughChoice::Off.decide(u64::MAX, 1));
        assert_eq!(PassthroughChoice::default(), PassthroughChoice::Off);
    }

    #[test]
    fn per_mount_options_become_mount_flags() {
        use rustix::mount::MountFlags as F;
        let r = parse(&s("lowerdir=/a,upperdir=/u,noatime,nodiratime,noexec")).unwrap();
        assert_eq!(
            F::from_bits_truncate(r.mount_flags as u32),
            F::NOATIME | F::NODIRATIME | F::NOEXEC
        );
        let r = parse(&s("lowerdir=/a,upperdir=/u,noatime,atime,strictatime")).unwrap();
        assert_eq!(F::from_bits_truncate(r.mount_flags as u32), F::STRICTATIME);
        assert_eq!(parse(&s("lowerdir=/a,upperdir=/u")).unwrap().mount_flags, 0);
        let f = remount_flags(&s("remount,ro,noatime")).unwrap();
        assert_eq!(f, F::RDONLY | F::NOATIME);
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
        use rustix::mount::MountFlags as F;
        assert_eq!(remount_flags(&s("lowerdir=/a,upperdir=/u,ro")), None);
        let f = remount_flags(&s("ro,nosuid,nodev,relatime,remount,user_id=0,allow_other"));
        assert_eq!(f, Some(F::RDONLY | F::NOSUID | F::NODEV | F::RELATIME));
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

    #[test]
    fn writable_mounts_keep_handles_across_a_remount_read_only_ones_do_not() {
        let t = tempfile::tempdir().unwrap();
        let (lower, mnt) = (t.path().join("lower"), t.path().join("mnt"));
        fs::create_dir_all(&lower).unwrap();
        fs::create_dir(&mnt).unwrap();
        let mut raw = RawOptions {
            lowerdirs: vec![lower],
            upperdir: Some(t.path().join("up")),
            workdir: Some(t.path().join("work")),
            ..Default::default()
        };
        fs::create_dir(t.path().join("up")).unwrap();
        assert!(validate(&raw, &mnt).unwrap().persist_handles);
        raw.read_only = true;
        assert!(!validate(&raw, &mnt).unwrap().persist_handles);
        raw.read_only = false;
        raw.upperdir = None;
        raw.workdir = None;
        assert!(
            !validate(&raw, &mnt).unwrap().persist_handles,
            "lowerdir only"
        );
    }

    /// A mountpoint strictly inside a lower is refused by name (the mount would show itself
    /// there); the lower itself, or a lower inside the mountpoint, is fine.
    #[test]
    fn a_mountpoint_inside_a_lower_is_refused() {
        let t = tempfile::tempdir().unwrap();
        let (x, up) = (t.path().join("x"), t.path().join("up"));
        fs::create_dir_all(x.join("sub/deeper")).unwrap();
        fs::create_dir(&up).unwrap();
        let mut raw = RawOptions {
            lowerdirs: vec![x.clone()],
            upperdir: Some(up),
            workdir: Some(t.path().join("work")),
            ..Default::default()
        };
        for mnt in [x.join("sub"), x.join("sub/deeper")] {
            let e = validate(&raw, &mnt).unwrap_err().to_string();
            assert!(e.contains("is inside lowerdir") && e.contains("sub"), "{e}");
            assert!(!t.path().join("work").exists(), "{e}");
        }
        raw.upperdir = None;
        raw.workdir = None;
        let e = validate(&raw, &x.join("sub")).unwrap_err().to_string();
        assert!(e.contains("is inside lowerdir"), "read-only too: {e}");
        assert!(validate(&raw, &x).is_ok(), "over the lower itself");
        raw.lowerdirs = vec![x.join("sub")];
        assert!(validate(&raw, &x).is_ok(), "a lower inside the mountpoint");
    }

    /// A refused mount creates nothing: its workdir (given, or the default beside the upper)
    /// is made only after every check passed.
    #[test]
    fn refused_mount_leaves_no_workdir() {
        let t = tempfile::tempdir().unwrap();
        let (lower, up) = (t.path().join("lower"), t.path().join("up"));
        fs::create_dir(&lower).unwrap();
        fs::create_dir(&up).unwrap();
        let work = t.path().join("w/work");
        let mut raw = RawOptions {
            lowerdirs: vec![lower.clone()],
            upperdir: Some(up.clone()),
            workdir: Some(work.clone()),
            ..Default::default()
        };
        for mnt in [t.path().join("no-such-mountpoint"), up.clone()] {
            let e = validate(&raw, &mnt).unwrap_err().to_string();
            assert!(e.contains("mountpoint"), "{e}");
            assert!(
                !t.path().join("w").exists(),
                "refused ({e}), yet made the workdir"
            );
        }
        raw.workdir = None;
        let e = validate(&raw, &up).unwrap_err().to_string();
        assert!(e.contains("mountpoint"), "{e}");
        assert!(!t.path().join(".up.layercache-work").exists(), "{e}");
        // Accepted: the workdirs are made, canonical.
        raw.workdir = Some(work.clone());
        let mnt = t.path().join("mnt");
        fs::create_dir(&mnt).unwrap();
        let c = validate(&raw, &mnt).unwrap();
        assert_eq!(c.workdir, fs::canonicalize(&work).unwrap());
        raw.workdir = None;
        let c = validate(&raw, &mnt).unwrap();
        assert!(c.workdir.ends_with(".up.layercache-work") && c.workdir.is_dir());
        raw.workdir = Some(t.path().join("w/../x"));
        assert!(
            validate(&raw, &mnt).is_ok(),
            "an existing ancestor's '..' is fine"
        );
        raw.workdir = Some(t.path().join("nope/../x"));
        let e = validate(&raw, &mnt).unwrap_err().to_string();
        assert!(e.contains("'..'"), "{e}");
    }
}
