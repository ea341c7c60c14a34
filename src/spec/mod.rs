//! The cache spec a run prepares (`layercache run --spec FILE|-`): a project and its caches, in
//! TOML or JSON, validated into [`Spec`], plus the built-in [`PRESETS`].
//!
//! ```toml
//! project = "acme-web"
//! [[cache]]
//! id = "npm"                 # mounted at <mount-root>/<id>, default mount root /cache
//! preset = "npm"             # fills key_files, env, default restore key, default setup/maintenance
//! setup = "npm ci"
//! restore_setup = "npm install --prefer-offline"  # optional: on a restore, over the old layer
//! maintenance = "npm ci --prefer-offline"   # optional
//! # optional overrides: key_files, restore_keys, env, mountpoint, exclude, relocatable
//! passthrough = "auto"       # optional: FUSE passthrough for this cache's mounts: auto|on|off
//! save = "miss"              # optional: "success" also saves what COMMAND wrote (SaveWhen)
//! ```
//!
//! Outside references: GitHub `actions/cache` (`key`, `restore-keys`: prefixes tried in order
//! when the exact key has no entry), Codex cloud environments (a *setup* script fills an empty
//! environment; a cheaper *maintenance* script runs when a cached one is resumed).
//!
//! Templates: `env` values, `mountpoint`, `setup`, `restore_setup` and `maintenance` may use `{mount}` (the cache's
//! mountpoint; scripts also get it as `$LAYERCACHE_MOUNT`),
//! `{workdir}` (the project directory), `{mount_root}` and `{env:NAME}` (the variable in
//! layercache's own environment, empty when unset). The value of every `{env:NAME}` in
//! `setup`, `restore_setup` and `env` enters the cache's key, `PATH` excepted
//! ([`Cache::key_variables`]); a variable a script reads as `$NAME` does not: write
//! `{env:NAME}` to make it an input.

#![forbid(unsafe_code)]

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use crate::error::{Error, Result};
use crate::ids::{CacheId, ProjectId};

mod pattern;
mod presets;
mod stored;
pub use pattern::Pattern;
pub use presets::{ConfigPart, PRESETS, Preset, preset, presets_text, unless_mounted_dir};
pub use stored::{StoredOrigin, load_stored};

mod parse;
mod template;
pub use parse::{load, parse, parse_all};
use template::template_names;
pub use template::{expand, expand_script};

/// When a cache's view is promoted into a layer (spec field `save`).
///
/// Outside references: BuildKit `RUN --mount=type=cache` (what a build writes into the cache
/// mount is kept for the next build) and GitHub `actions/cache` (the post step saves the
/// cache after a successful job).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum SaveWhen {
    /// `"miss"` (the default): only a miss's or restore's setup is promoted; a hit's writes,
    /// and COMMAND's, are private to the run and discarded with it.
    #[default]
    Miss,
    /// `"success"`: as `Miss`, and after COMMAND exits 0 the view, when COMMAND (or
    /// maintenance) changed it, is promoted again as a newer layer of the same key (objects
    /// already stored are linked, not copied), so the next run hits it — build output such as
    /// `target/` or `node_modules/.vite` survives.
    Success,
}

/// A validated spec.
#[derive(Debug, Clone)]
pub struct Spec {
    /// The project: the unit of isolation in the store.
    pub project: ProjectId,
    /// The caches in declaration order; ids are unique.
    pub caches: Vec<Cache>,
    /// The user setup, maintenance and COMMAND run as (`UID[:GID]`, `NAME[:GROUP]`; an
    /// integer in the spec is a UID, kept as its digits), checked for syntax and id range
    /// here and resolved by the run; `--user` overrides it.
    pub user: Option<String>,
}

/// One validated cache declaration, with its preset's defaults filled in.
#[derive(Debug, Clone)]
pub struct Cache {
    /// The cache id (unique within the spec).
    pub id: CacheId,
    /// The preset it builds on, if any.
    pub preset: Option<&'static Preset>,
    /// The setup script (`sh -c`, cwd = workdir), run on a miss (and on a restore when
    /// `restore_setup` is `None`).
    pub setup: String,
    /// The script run on a restore, over the nearest older layer: the spec's `restore_setup`;
    /// else the preset's when the spec keeps the preset's `setup`; else `None` (run `setup`).
    pub restore_setup: Option<String>,
    /// The maintenance script, run on a hit; `None` runs nothing.
    pub maintenance: Option<String>,
    /// Key file patterns relative to the workdir.
    pub key_files: Vec<String>,
    /// Whether the key files were written in the spec (each literal one must exist) or come from
    /// a preset (at least one must match).
    pub key_files_explicit: bool,
    /// The preset's [`Preset::key_files_first`] when the key files are the preset's; `false`
    /// for a spec's own `key_files`.
    pub key_files_first: bool,
    /// The preset's [`Preset::requirement_includes`] (also for a spec's own `key_files`).
    pub requirement_includes: bool,
    /// Restore-key prefixes from the spec; `None` means the default (the key up to its hash).
    pub restore_keys: Option<Vec<String>>,
    /// Environment templates: the preset's, overridden by the spec's.
    pub env: BTreeMap<String, String>,
    /// Mountpoint template; `None` means `<mount-root>/<id>`.
    pub mountpoint: Option<String>,
    /// Patterns (relative to the mount) removed before promotion.
    pub exclude: Vec<String>,
    /// Whether the key leaves the view path out (the preset's [`Preset::relocatable`], or the
    /// spec's `relocatable`; a cache without a preset is not, unless it says so).
    pub relocatable: bool,
    /// Whether its layer is mounted with FUSE passthrough (spec field `passthrough`:
    /// `auto`, the default, decides from the layer; see
    /// [`crate::overlay::options::PassthroughChoice`]); `layercache run --passthrough`
    /// overrides it.
    pub passthrough: crate::overlay::options::PassthroughChoice,
    /// When its view is promoted (spec field `save`: `"miss"`, the default, or `"success"`).
    pub save: SaveWhen,
}

/// Values substituted into templates.
#[derive(Debug, Clone)]
pub struct Paths {
    /// The project directory on the host (key files are read here).
    pub workdir: PathBuf,
    /// The default mount root (`/cache`).
    pub mount_root: PathBuf,
    /// Where setup, maintenance and COMMAND see the workdir (`--workdir-view`); `None`: at
    /// `workdir` itself.
    pub workdir_view: Option<PathBuf>,
}

impl Paths {
    /// The workdir as the tools see it: [`Paths::workdir_view`], else [`Paths::workdir`].
    pub fn view_workdir(&self) -> &Path {
        self.workdir_view.as_deref().unwrap_or(&self.workdir)
    }
}

/// Directories that can never be a mount root or a workdir (nor hold one, for the first
/// group): covering them would break or expose the host.
const SYSTEM_DIRS: &[&str] = &["/proc", "/sys", "/dev", "/etc", "/usr", "/boot"];
/// Top-level directories refused as a mount root or workdir themselves.
const TOP_DIRS: &[&str] = &[
    "/", "/bin", "/home", "/lib", "/lib32", "/lib64", "/media", "/mnt", "/opt", "/root", "/run",
    "/sbin", "/srv", "/tmp", "/var",
];

/// `path` (absolute, without `..`) with the symlinks of its existing part resolved: the
/// deepest existing ancestor canonicalised (`realpath(3)`), the components that do not exist yet
/// re-appended as they are. A path that does not exist at all comes back unchanged.
///
/// Errors: the `std::io::Error` of `canonicalize` for an existing entry that cannot be resolved
/// (a dangling or looping symlink: ENOENT, ELOOP; EACCES).
pub fn resolve_existing(path: &Path) -> std::io::Result<PathBuf> {
    let mut base = path;
    let mut rest = Vec::new();
    loop {
        if base.symlink_metadata().is_ok() {
            let mut out = std::fs::canonicalize(base)?;
            out.extend(rest.iter().rev());
            return Ok(out);
        }
        match (base.parent(), base.file_name()) {
            (Some(parent), Some(name)) => {
                rest.push(name);
                base = parent;
            }
            _ => return Ok(path.to_path_buf()),
        }
    }
}

/// Checks that `dir` (absolute, normalised) may be a mount root or workdir: not `/`, not a
/// top-level system directory, nothing under `/proc`, `/sys`, `/dev`, `/etc`, `/usr`, `/boot`
/// — neither `dir` itself nor where its symlinks lead ([`resolve_existing`]).
///
/// Errors: [`Error::Invalid`] naming `what` (`--mount-root`, `--workdir`, `--workdir-view`,
/// `mountpoint`), the path and, when it differs, where its symlinks lead.
pub fn check_root(what: &str, dir: &Path) -> Result<()> {
    let resolved = resolve_existing(dir).map_err(|e| {
        Error::invalid(format!(
            "{what} {}: cannot resolve its symlinks: {e}",
            dir.display()
        ))
    })?;
    let refused = |d: &Path| {
        SYSTEM_DIRS.iter().any(|s| d.starts_with(s)) || TOP_DIRS.iter().any(|t| d == Path::new(t))
    };
    if refused(dir) || refused(&resolved) {
        let via = if resolved != dir {
            format!(" (a symlink to {})", resolved.display())
        } else {
            String::new()
        };
        return Err(Error::invalid(format!(
            "{what} {}{via}: refused: a system directory (or /) cannot hold cache mounts; use a \
             directory of its own such as /cache or /workspace",
            dir.display()
        )));
    }
    Ok(())
}

/// The `NAME`s of the `{env:NAME}` templates in `texts` that `keep` accepts, sorted, each once.
fn env_variables(texts: Vec<&str>, keep: impl Fn(&str) -> bool) -> Vec<String> {
    let mut names: Vec<String> = texts
        .into_iter()
        .flat_map(template_names)
        .filter_map(|n| n.strip_prefix("env:"))
        .filter(|n| keep(n))
        .map(str::to_string)
        .collect();
    names.sort();
    names.dedup();
    names
}

impl Cache {
    /// The variables whose values enter the key: every `NAME` of an `{env:NAME}` template in
    /// `setup`, `restore_setup` and the `env` values (the preset's and the spec's), which
    /// shape what setup installs (an index URL, a version pin), sorted — except `PATH`, which
    /// differs between hosts and shells and only finds the tools (their versions are the
    /// key's input). `maintenance` and `mountpoint` are not read: maintenance does not make
    /// the layer, and a path-bound tree's mountpoint is in the key as expanded.
    pub fn key_variables(&self) -> Vec<String> {
        let mut texts: Vec<&str> = vec![self.setup.as_str()];
        texts.extend(self.restore_setup.as_deref());
        texts.extend(self.env.values().map(String::as_str));
        env_variables(texts, |n| n != "PATH")
    }

    /// The variables of every `{env:NAME}` this cache's templates use (`setup`,
    /// `restore_setup`, `maintenance`, `env` values, `mountpoint`) that are unset in
    /// layercache's environment, sorted: each becomes an empty string, which a run warns
    /// about (a typo or a variable the agent's environment lacks).
    pub fn unset_variables(&self) -> Vec<String> {
        let mut texts: Vec<&str> = vec![self.setup.as_str()];
        texts.extend(self.restore_setup.as_deref());
        texts.extend(self.maintenance.as_deref());
        texts.extend(self.env.values().map(String::as_str));
        texts.extend(self.mountpoint.as_deref());
        env_variables(texts, |n| std::env::var_os(n).is_none())
    }

    /// The tools whose versions enter the environment fingerprint (the preset's).
    pub fn tools(&self) -> &'static [&'static str] {
        self.preset.map(|p| p.tools).unwrap_or(&[])
    }

    /// The view path (where the tools see the cache): the spec's or preset's template, else
    /// `<mount-root>/<id>`. `{workdir}` is the workdir as the tools see it.
    ///
    /// Errors: [`Error::Invalid`] naming `cache "<id>".mountpoint` when it is not absolute after
    /// substitution, contains `..`, or is not strictly below the mount root or the workdir
    /// (`/`, `/etc`, anything outside is refused), and, for a path below the workdir's view,
    /// also once the symlinks of its existing part below the workdir on the host are resolved
    /// ([`resolve_existing`]). A path below the mount root is checked as written: what the
    /// host holds there is never used (each step covers the mount root with a tmpfs of its own).
    pub fn mountpoint(&self, paths: &Paths) -> Result<PathBuf> {
        let mp = match &self.mountpoint {
            Some(t) => PathBuf::from(expand(t, paths, None)),
            None => paths.mount_root.join(self.id.as_str()),
        };
        if !mp.is_absolute() || mp.components().any(|c| c.as_os_str() == "..") {
            return Err(Error::invalid(format!(
                "cache {:?}: mountpoint {} must be an absolute path without '..' \
                 (templates: {{workdir}}, {{mount_root}})",
                self.id.as_str(),
                mp.display()
            )));
        }
        let below = |root: &Path| mp.starts_with(root) && mp != root;
        if !(below(&paths.mount_root) || below(paths.view_workdir())) {
            return Err(Error::invalid(format!(
                "cache {:?}: mountpoint {} is refused: a cache mounts only below the mount root \
                 ({}) or the workdir ({})",
                self.id.as_str(),
                mp.display(),
                paths.mount_root.display(),
                paths.view_workdir().display()
            )));
        }
        // Below the mount root nothing of the host is followed: every step sees the mount
        // root as a tmpfs of its own namespace (bwrap: `--tmpfs`; Docker: the container's
        // root), so entries another user made in a shared mount root (`/cache`, 1777) are
        // never seen, and cannot refuse or redirect a view. The mount root
        // itself is checked by the run (`run::hostpath`).
        if below(&paths.mount_root) {
            return Ok(mp);
        }
        // Below the workdir's view: that path below the workdir on the host; its symlinks must
        // not lead out of the workdir.
        let (host, root, what) = {
            let rel = mp.strip_prefix(paths.view_workdir()).unwrap_or(&mp);
            (paths.workdir.join(rel), paths.workdir.as_path(), "workdir")
        };
        let resolve = |p: &Path| {
            resolve_existing(p).map_err(|e| {
                Error::invalid(format!(
                    "cache {:?}: mountpoint {}: cannot resolve its symlinks: {e}",
                    self.id.as_str(),
                    mp.display()
                ))
            })
        };
        let (to, root) = (resolve(&host)?, resolve(root)?);
        if !to.starts_with(&root) || to == root {
            return Err(Error::invalid(format!(
                "cache {:?}: mountpoint {} is refused: a symlink leads it to {}, not below the \
                 {what} ({})",
                self.id.as_str(),
                mp.display(),
                to.display(),
                root.display()
            )));
        }
        Ok(mp)
    }

    /// The environment for setup, maintenance and COMMAND, with templates expanded.
    pub fn env_for(&self, paths: &Paths, mount: &Path) -> BTreeMap<String, String> {
        self.env
            .iter()
            .map(|(k, v)| (k.clone(), expand(v, paths, Some(mount))))
            .collect()
    }
}

#[cfg(test)]
mod tests;
