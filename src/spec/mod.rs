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

use std::collections::BTreeMap;
use std::io::Read;
use std::path::{Path, PathBuf};

use serde::Deserialize;

use crate::error::{Error, IoContext, Result};
use crate::ids::{CacheId, CacheKey, ProjectId};

mod pattern;
mod presets;
mod stored;
pub use pattern::Pattern;
pub use presets::{ConfigPart, PRESETS, Preset, preset, presets_text};
pub use stored::{StoredOrigin, load_stored};

/// The spec's `user` as written: a string, or an integer taken as a UID (`user = 1000` means
/// what `user = "1000"` and `--user 1000` mean).
#[derive(Debug)]
enum RawUser {
    Text(String),
    Uid(i128),
}

impl<'de> Deserialize<'de> for RawUser {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> std::result::Result<Self, D::Error> {
        struct V;
        impl serde::de::Visitor<'_> for V {
            type Value = RawUser;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("a quoted \"UID:GID\", \"UID\", \"NAME\" or \"NAME:GROUP\", or a UID")
            }
            fn visit_str<E: serde::de::Error>(self, s: &str) -> std::result::Result<RawUser, E> {
                Ok(RawUser::Text(s.to_string()))
            }
            fn visit_i64<E: serde::de::Error>(self, n: i64) -> std::result::Result<RawUser, E> {
                Ok(RawUser::Uid(n.into()))
            }
            fn visit_u64<E: serde::de::Error>(self, n: u64) -> std::result::Result<RawUser, E> {
                Ok(RawUser::Uid(n.into()))
            }
        }
        d.deserialize_any(V)
    }
}

/// One `[[cache]]` as written (raw serde input; unknown fields are rejected by name). The
/// spec's top level (`project`, `user`, `cache` or its alias `caches`) is read field by field in
/// [`parse_all`], so a bad field of one part never hides another's.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawCache {
    id: String,
    preset: Option<String>,
    setup: Option<String>,
    restore_setup: Option<String>,
    maintenance: Option<String>,
    key_files: Option<Vec<String>>,
    restore_keys: Option<Vec<String>>,
    #[serde(default)]
    env: BTreeMap<String, String>,
    mountpoint: Option<String>,
    #[serde(default)]
    exclude: Vec<String>,
    relocatable: Option<bool>,
    passthrough: Option<String>,
    save: Option<String>,
}

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
        let mut names: Vec<String> = texts
            .into_iter()
            .flat_map(template_names)
            .filter_map(|n| n.strip_prefix("env:"))
            .filter(|n| *n != "PATH")
            .map(str::to_string)
            .collect();
        names.sort();
        names.dedup();
        names
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
        let mut names: Vec<String> = texts
            .into_iter()
            .flat_map(template_names)
            .filter_map(|n| n.strip_prefix("env:"))
            .filter(|n| std::env::var_os(n).is_none())
            .map(str::to_string)
            .collect();
        names.sort();
        names.dedup();
        names
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
        // never seen, and cannot refuse or redirect a view (issue 29 item 4). The mount root
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

/// Expands `{mount}`, `{workdir}`, `{mount_root}` and `{env:NAME}` in `template` (for `env`
/// values and `mountpoint`: no shell is involved). `{workdir}` is the workdir as the tools see
/// it; `{{` and `}}` stand for a literal brace. Anything else in braces is left as it is
/// ([`check_templates`] refuses unknown names when the spec is read).
pub fn expand(template: &str, paths: &Paths, mount: Option<&Path>) -> String {
    substitute(template, paths, mount, |v| v.to_string())
}

/// [`expand`] for a setup or maintenance script: every value is shell-quoted (shlex), so a
/// path with spaces or `$(…)` in it stays one word and never runs.
pub fn expand_script(template: &str, paths: &Paths, mount: Option<&Path>) -> String {
    substitute(template, paths, mount, |v| {
        shlex::try_quote(v)
            .map(|q| q.into_owned())
            .unwrap_or_else(|_| "''".to_string())
    })
}

/// A template name at `{…}` per [`template_names`]: `Some(name)` for `{name}` made of letters,
/// digits, `_` and one optional `:` part (`env:NAME`), not preceded by `$` (so the shell's
/// `${VAR}` is left alone).
fn template_at(text: &str, start: usize) -> Option<&str> {
    if start > 0 && text.as_bytes()[start - 1] == b'$' {
        return None;
    }
    let after = &text[start + 1..];
    let end = after.find('}')?;
    let name = &after[..end];
    let ok = !name.is_empty()
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b':')
        && name.bytes().filter(|b| *b == b':').count() <= 1;
    ok.then_some(name)
}

fn substitute(
    template: &str,
    paths: &Paths,
    mount: Option<&Path>,
    quote: impl Fn(&str) -> String,
) -> String {
    let mut out = String::new();
    let mut i = 0;
    while i < template.len() {
        let rest = &template[i..];
        if rest.starts_with("{{") || rest.starts_with("}}") {
            out.push_str(&rest[..1]);
            i += 2;
            continue;
        }
        if rest.starts_with('{')
            && let Some(name) = template_at(template, i)
        {
            let value = match name {
                "mount" => mount.map(|m| m.display().to_string()),
                "workdir" => Some(paths.view_workdir().display().to_string()),
                "mount_root" => Some(paths.mount_root.display().to_string()),
                _ => name
                    .strip_prefix("env:")
                    .map(|var| std::env::var(var).unwrap_or_default()),
            };
            if let Some(v) = value {
                out.push_str(&quote(&v));
                i += name.len() + 2;
                continue;
            }
        }
        let ch = rest.chars().next().unwrap_or_default();
        out.push(ch);
        i += ch.len_utf8();
    }
    out
}

/// The byte offsets of the `{` that may open a template in `text`: every `{` but the two of
/// a `{{` (a literal brace).
fn template_braces(text: &str) -> impl Iterator<Item = usize> + '_ {
    let mut i = 0;
    std::iter::from_fn(move || {
        loop {
            let at = i + text[i..].find('{')?;
            if text[at..].starts_with("{{") {
                i = at + 2;
                continue;
            }
            i = at + 1;
            return Some(at);
        }
    })
}

/// The first known template name `text` opens without closing it: `{mount_root` followed by
/// the end or by anything but `}` (a shell's `{ cmd; }`, `${VAR}` or awk's `{print}` are no
/// template names, so they pass).
fn unclosed_template(text: &str) -> Option<&str> {
    template_braces(text)
        .filter(|&at| at == 0 || text.as_bytes()[at - 1] != b'$')
        .find_map(|at| {
            let after = &text[at + 1..];
            let len = after
                .bytes()
                .take_while(|b| b.is_ascii_alphanumeric() || *b == b'_' || *b == b':')
                .count();
            let name = &after[..len];
            let known =
                matches!(name, "mount" | "workdir" | "mount_root") || name.starts_with("env:");
            (known && !after[len..].starts_with('}')).then_some(name)
        })
}

/// The template names `text` uses (see [`template_at`]).
fn template_names(text: &str) -> Vec<&str> {
    template_braces(text)
        .filter_map(|at| template_at(text, at))
        .collect()
}

/// Checks every `{…}` template of `text` names a known one: `{mount}`, `{workdir}`,
/// `{mount_root}` or `{env:NAME}`.
///
/// Errors: a message naming the unknown template and the known ones.
fn check_templates(text: &str) -> std::result::Result<(), String> {
    if let Some(name) = unclosed_template(text) {
        return Err(format!(
            "unclosed template {{{name} (write {{{name}}}, or {{{{ for a literal brace)"
        ));
    }
    for name in template_names(text) {
        let env_ok = name.strip_prefix("env:").is_some_and(|v| {
            !v.is_empty()
                && !v.as_bytes()[0].is_ascii_digit()
                && v.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_')
        });
        if !(matches!(name, "mount" | "workdir" | "mount_root") || env_ok) {
            return Err(format!(
                "unknown template {{{name}}} (known: {{mount}}, {{workdir}}, {{mount_root}}, \
                 {{env:NAME}}; write {{{{ for a literal brace)"
            ));
        }
    }
    Ok(())
}

/// Reads a spec from `FILE`, or standard input when `source` is `-`.
///
/// Errors: [`Error::Invalid`] naming the file when it cannot be read or parsed (see [`parse`]);
/// [`Error::Io`] when standard input cannot be read.
pub fn load(source: &str) -> Result<Spec> {
    let (text, name) = if source == "-" {
        let mut s = String::new();
        std::io::stdin()
            .read_to_string(&mut s)
            .at("<standard input>")?;
        (s, "<standard input>".to_string())
    } else {
        let text = std::fs::read_to_string(source).map_err(|e| {
            // A spec that cannot be read is bad input (exit 2), like a spec that does not parse.
            Error::invalid(format!(
                "spec {source}: {e} (want a readable TOML or JSON file, or - for standard input)"
            ))
        })?;
        (text, source.to_string())
    };
    parse_all(&text).map_err(|errors| match errors.as_slice() {
        [one] => Error::invalid(format!("spec {name}: {one}")),
        many => Error::invalid(format!(
            "spec {name}: {} errors:\n  {}",
            many.len(),
            many.join("\n  ")
        )),
    })
}

/// Parses and validates a spec: JSON when the text starts with `{`, TOML otherwise.
///
/// Errors: [`Error::Invalid`] whose message is [`parse_all`]'s messages, one per line.
pub fn parse(text: &str) -> Result<Spec> {
    parse_all(text).map_err(|errors| Error::invalid(errors.join("\n")))
}

/// Parses and validates a spec like [`parse`], reporting every bad field: on error one message
/// per problem, in spec order, each one line naming its field (`project: …`,
/// `cache[i].<field>: …`; every bad field of each cache, a field of the wrong type or an
/// unknown one included: a type error in one cache hides nothing of another), or a single
/// message for a syntax error (`TOML syntax error at line L, column C: …`; JSON's
/// `… at line L column C`).
///
/// The fields checked: `project`, `user`, `cache[i].id` (invalid or duplicate), `cache[i].preset`
/// (unknown), `cache[i].setup` (missing without a preset), `cache[i].restore_setup` (empty),
/// `cache[i].key_files` (empty), `cache[i].restore_keys`, `cache[i].env`,
/// `cache[i].mountpoint` (a system directory, or `{workdir}` itself, is refused here),
/// `cache[i].exclude`, and the templates of `setup`, `restore_setup`, `maintenance`, `env` and
/// `mountpoint`.
pub fn parse_all(text: &str) -> std::result::Result<Spec, Vec<String>> {
    let mut doc = document(text).map_err(|e| vec![e])?;
    let mut errors: Vec<String> = Vec::new();
    let known = ["project", "user", "cache", "caches"];
    for k in doc.keys().filter(|k| !known.contains(&k.as_str())) {
        errors.push(format!(
            "{k}: unknown field (a spec has project, user and [[cache]] tables)"
        ));
    }
    let project = match doc.remove("project") {
        None => {
            errors.push("project: missing: name the project, e.g. project = \"acme-web\"".into());
            None
        }
        Some(v) => String::deserialize(v)
            .map_err(|e| e.to_string())
            .and_then(|p| ProjectId::new(p).map_err(|e| e.to_string()))
            .map_err(|e| errors.push(format!("project: {e}")))
            .ok(),
    };
    let raw_user = match doc.remove("user").map(RawUser::deserialize).transpose() {
        Ok(u) => u,
        Err(e) => {
            errors.push(format!("user: {e}"));
            None
        }
    };
    let user = match raw_user {
        Some(RawUser::Text(s)) => Some(s),
        Some(RawUser::Uid(n)) if n < 0 => {
            let max = crate::sandbox::user::MAX_ID;
            errors.push(format!(
                "user: {n} is not a uid: use 0 to {max}, or a quoted \"UID:GID\", \"NAME\" or \
                 \"NAME:GROUP\""
            ));
            None
        }
        Some(RawUser::Uid(n)) => Some(n.to_string()),
        None => None,
    };
    if let Some(p) = user
        .as_deref()
        .and_then(crate::sandbox::user::syntax_problem)
    {
        errors.push(format!("user: {p}"));
    }
    let list = match (doc.remove("cache"), doc.remove("caches")) {
        (Some(_), Some(_)) => {
            errors.push("caches: give either cache or caches (its alias), not both".into());
            Vec::new()
        }
        (Some(v), None) | (None, Some(v)) => Vec::<serde_json::Value>::deserialize(v)
            .map_err(|e| errors.push(format!("cache: {e} (want [[cache]] tables)")))
            .unwrap_or_default(),
        (None, None) => Vec::new(),
    };
    let mut caches: Vec<(usize, Cache)> = Vec::new();
    // Every earlier id as written, valid caches or not, so a duplicate is named either way.
    let mut ids: Vec<(usize, String)> = Vec::new();
    for (i, value) in list.into_iter().enumerate() {
        let (rc, mut typed, bad_fields) = raw_cache(i, value);
        let Some(rc) = rc else {
            errors.append(&mut typed);
            continue;
        };
        let id = rc.id.clone();
        match validate_cache(i, rc, &ids) {
            Ok(c) if typed.is_empty() => caches.push((i, c)),
            Ok(_) => errors.append(&mut typed),
            Err(e) => {
                // A field of the wrong type was left out: its own checks (`setup: missing`)
                // would only repeat its type error.
                errors.append(&mut typed);
                let field = |m: &str| {
                    m.split_once(": ")
                        .and_then(|(h, _)| h.split_once("].").map(|(_, f)| f.to_string()))
                };
                errors.extend(
                    e.into_iter()
                        .filter(|m| field(m).is_none_or(|f| !bad_fields.contains(&f))),
                );
            }
        }
        ids.push((i, id));
    }
    errors.extend(shared_mountpoints(&caches));
    match project {
        Some(project) if errors.is_empty() => Ok(Spec {
            project,
            caches: caches.into_iter().map(|(_, c)| c).collect(),
            user,
        }),
        _ => Err(errors),
    }
}

/// The spec's top-level table: JSON when `text` starts with `{`, TOML otherwise (TOML tables
/// become JSON objects, so one reader checks both).
///
/// Errors: one line for a syntax error: `TOML syntax error at line L, column C: …` (1-based,
/// columns in characters), or serde_json's `… at line L column C`.
fn document(text: &str) -> std::result::Result<serde_json::Map<String, serde_json::Value>, String> {
    let value = if text.trim_start().starts_with('{') {
        serde_json::from_str(text).map_err(|e| format!("JSON syntax error: {e}"))?
    } else {
        let table: toml::Table = toml::from_str(text).map_err(|e| {
            let at = e.span().map(|s| {
                let before = &text[..s.start.min(text.len())];
                let line = before.matches('\n').count() + 1;
                let col = before.rsplit('\n').next().unwrap_or("").chars().count() + 1;
                format!(" at line {line}, column {col}")
            });
            let msg = e
                .message()
                .lines()
                .next()
                .unwrap_or("")
                .trim_end()
                .to_string();
            format!("TOML syntax error{}: {msg}", at.unwrap_or_default())
        })?;
        serde_json::to_value(table).map_err(|e| format!("spec: {e}"))?
    };
    match value {
        serde_json::Value::Object(m) => Ok(m),
        other => Err(format!(
            "spec: a spec is a table (TOML) or an object (JSON), not {other}"
        )),
    }
}

/// `cache[i]` as written, read field by field when it does not read whole: the cache (`None`
/// when even its `id` cannot be read), a message `cache[i].<field>: …` per field of the wrong
/// type or unknown, and those fields' names (left out of the cache returned).
fn raw_cache(i: usize, value: serde_json::Value) -> (Option<RawCache>, Vec<String>, Vec<String>) {
    let mut obj = match value {
        serde_json::Value::Object(m) => m,
        other => {
            return (
                None,
                vec![format!("cache[{i}]: want a table of fields, not {other}")],
                Vec::new(),
            );
        }
    };
    if let Ok(rc) = RawCache::deserialize(serde_json::Value::Object(obj.clone())) {
        return (Some(rc), Vec::new(), Vec::new());
    }
    let (mut errors, mut bad) = (Vec::new(), Vec::new());
    for (k, v) in &obj {
        // The field alone (beside a placeholder id): its own type error, or serde's
        // `unknown field`, naming the known ones.
        let mut probe = serde_json::Map::new();
        probe.insert("id".into(), serde_json::Value::String("x".into()));
        probe.insert(k.clone(), v.clone());
        if let Err(e) = RawCache::deserialize(serde_json::Value::Object(probe)) {
            errors.push(format!("cache[{i}].{k}: {e}"));
            bad.push(k.clone());
        }
    }
    for k in &bad {
        obj.remove(k);
    }
    if !obj.contains_key("id") && !bad.iter().any(|k| k == "id") {
        errors.push(format!(
            "cache[{i}].id: missing: every cache needs an id, e.g. id = \"npm\""
        ));
    }
    match RawCache::deserialize(serde_json::Value::Object(obj)) {
        Ok(rc) => (Some(rc), errors, bad),
        Err(e) if errors.is_empty() => (None, vec![format!("cache[{i}]: {e}")], bad),
        Err(_) => (None, errors, bad),
    }
}

/// Two caches whose mountpoints are the same template (a cache's default is
/// `{mount_root}/<id>`) would mount at one view path: one message per later cache. Mountpoints
/// that differ as written but meet once the run's paths are known are refused by the run.
fn shared_mountpoints(caches: &[(usize, Cache)]) -> Vec<String> {
    let template = |c: &Cache| {
        let t =
            (c.mountpoint.clone()).unwrap_or_else(|| format!("{{mount_root}}/{}", c.id.as_str()));
        t.trim_end_matches('/').to_string()
    };
    let mut errors = Vec::new();
    for (k, (i, c)) in caches.iter().enumerate() {
        if let Some((j, first)) = caches[..k].iter().find(|(_, b)| template(b) == template(c)) {
            errors.push(format!(
                "cache[{i}].mountpoint: {:?} is also cache[{j}]'s (cache {:?}): give each cache \
                 its own",
                template(c),
                first.id.as_str()
            ));
        }
    }
    errors
}

/// Validates `cache[i]`; `before` are the ids of the caches declared before it, as written,
/// with their indices (for duplicate ids).
///
/// Errors: one message `cache[i].<field>: …` per bad field (every one, in field order; a field
/// that cannot be checked because an earlier one is bad, such as `setup` of an unknown preset,
/// is left out).
fn validate_cache(
    i: usize,
    rc: RawCache,
    before: &[(usize, String)],
) -> std::result::Result<Cache, Vec<String>> {
    let mut bad = Problems {
        i,
        errors: Vec::new(),
    };
    let id = cache_id(rc.id, before, &mut bad);
    let (preset, unknown_preset) = cache_preset(rc.preset.as_deref(), &mut bad);
    let (setup, restore_setup, maintenance) = scripts(
        (rc.setup, rc.restore_setup, rc.maintenance),
        preset,
        unknown_preset,
        &mut bad,
    );
    let key_files_explicit = rc.key_files.is_some();
    let key_files = key_inputs(
        rc.key_files,
        &rc.restore_keys,
        preset,
        unknown_preset,
        &mut bad,
    );
    let env = cache_env(rc.env, preset, &mut bad);
    let (mountpoint, exclude) = tree_paths(rc.mountpoint, rc.exclude, preset, &mut bad);
    // Templates last: their messages follow every field's own.
    let mut templates = vec![("setup", setup.as_str())];
    templates.extend(restore_setup.as_deref().map(|r| ("restore_setup", r)));
    templates.extend(maintenance.as_deref().map(|m| ("maintenance", m)));
    for (f, t) in templates {
        if let Err(m) = check_templates(t) {
            bad.add(f, m);
        }
    }
    for (k, v) in &env {
        if let Err(m) = check_templates(v) {
            bad.add("env", format!("{k}: {m}"));
        }
    }
    if let Some(mp) = &mountpoint
        && let Err(m) = check_templates(mp)
    {
        bad.add("mountpoint", m);
    }
    let relocatable = rc
        .relocatable
        .unwrap_or_else(|| preset.is_some_and(|p| p.relocatable));
    let passthrough = match rc.passthrough.as_deref() {
        None => crate::overlay::options::PassthroughChoice::Auto,
        Some(v) => match crate::overlay::options::PassthroughChoice::parse("passthrough", v) {
            Ok(p) => p,
            Err(_) => {
                bad.add("passthrough", format!("{v:?}: want auto, on or off"));
                crate::overlay::options::PassthroughChoice::Auto
            }
        },
    };
    let save = match rc.save.as_deref() {
        None | Some("miss") => SaveWhen::Miss,
        Some("success") => SaveWhen::Success,
        Some(v) => {
            bad.add(
                "save",
                format!(
                    "{v:?}: want \"miss\" (promote setup's tree only; the default) or \"success\" \
                     (also promote the view again after COMMAND exits 0)"
                ),
            );
            SaveWhen::Miss
        }
    };
    match id {
        Some(id) if bad.errors.is_empty() => Ok(Cache {
            id,
            preset,
            setup,
            restore_setup,
            maintenance,
            key_files,
            key_files_explicit,
            key_files_first: !key_files_explicit && preset.is_some_and(|p| p.key_files_first),
            requirement_includes: preset.is_some_and(|p| p.requirement_includes),
            restore_keys: rc.restore_keys,
            env,
            mountpoint,
            exclude,
            relocatable,
            passthrough,
            save,
        }),
        _ => Err(bad.errors),
    }
}

/// The messages of one cache's bad fields, in the order they are found.
struct Problems {
    i: usize,
    errors: Vec<String>,
}

impl Problems {
    /// Records `cache[i].<field>: <msg>`.
    fn add(&mut self, field: &str, msg: String) {
        self.errors
            .push(format!("cache[{}].{field}: {msg}", self.i));
    }
}

/// The cache's `id`: valid, and not one of `before`'s.
fn cache_id(id: String, before: &[(usize, String)], bad: &mut Problems) -> Option<CacheId> {
    let id = match CacheId::new(id) {
        Ok(id) => Some(id),
        Err(e) => {
            bad.add("id", e.to_string());
            None
        }
    };
    if let Some(id) = &id
        && let Some((j, _)) = before.iter().find(|(_, b)| b == id.as_str())
    {
        bad.add(
            "id",
            format!("duplicate id {:?} (also cache[{j}].id)", id.as_str()),
        );
    }
    id
}

/// The named preset, and whether the name is unknown (then the fields it would fill are not
/// checked: its defaults are unknown).
fn cache_preset(name: Option<&str>, bad: &mut Problems) -> (Option<&'static Preset>, bool) {
    let Some(name) = name else {
        return (None, false);
    };
    match preset(name) {
        Some(p) => (Some(p), false),
        None => {
            let known: Vec<&str> = PRESETS.iter().map(|p| p.name).collect();
            bad.add(
                "preset",
                format!("unknown preset {name:?} (known: {})", known.join(", ")),
            );
            (None, true)
        }
    }
}

/// `setup`, `restore_setup` and `maintenance` as written, else the preset's.
fn scripts(
    (setup, restore_setup, maintenance): (Option<String>, Option<String>, Option<String>),
    preset: Option<&'static Preset>,
    unknown_preset: bool,
    bad: &mut Problems,
) -> (String, Option<String>, Option<String>) {
    let setup = match (setup, preset) {
        (Some(s), _) if s.trim().is_empty() => {
            bad.add("setup", "must not be empty".into());
            String::new()
        }
        (Some(s), _) => s,
        (None, Some(p)) => p.setup.to_string(),
        (None, None) => {
            if !unknown_preset {
                bad.add(
                    "setup",
                    "missing: a cache without a preset needs a setup script".into(),
                );
            }
            String::new()
        }
    };
    let restore_setup = match (restore_setup, preset) {
        (Some(s), _) if s.trim().is_empty() => {
            bad.add("restore_setup", "must not be empty".into());
            None
        }
        (Some(s), _) => Some(s),
        // A spec's own setup is also its restore script unless it names one.
        (None, Some(p)) if setup == p.setup => p.restore_setup.map(str::to_string),
        (None, _) => None,
    };
    let maintenance = match maintenance {
        Some(m) if m.trim().is_empty() => None,
        Some(m) => Some(m),
        None => preset.and_then(|p| p.maintenance.map(str::to_string)),
    };
    (setup, restore_setup, maintenance)
}

/// The key's inputs: `key_files` as written (else the preset's; at least one, each relative)
/// and `restore_keys` (each a valid key).
fn key_inputs(
    key_files: Option<Vec<String>>,
    restore_keys: &Option<Vec<String>>,
    preset: Option<&'static Preset>,
    unknown_preset: bool,
    bad: &mut Problems,
) -> Vec<String> {
    let key_files: Vec<String> = match key_files {
        Some(k) => k,
        None => preset
            .map(|p| p.key_files.iter().map(|s| s.to_string()).collect())
            .unwrap_or_default(),
    };
    if key_files.is_empty() && !unknown_preset {
        bad.add(
            "key_files",
            "missing: name at least one lockfile (or use a preset)".into(),
        );
    }
    for k in &key_files {
        if let Err(m) = check_relative(k) {
            bad.add("key_files", format!("{k:?}: {m}"));
        }
    }
    for rk in restore_keys.iter().flatten() {
        if let Err(e) = CacheKey::new(rk.clone()) {
            bad.add("restore_keys", e.to_string());
        }
    }
    key_files
}

/// The preset's `env` with the spec's over it (each name a valid variable name).
fn cache_env(
    own: BTreeMap<String, String>,
    preset: Option<&'static Preset>,
    bad: &mut Problems,
) -> BTreeMap<String, String> {
    let mut env: BTreeMap<String, String> = preset
        .map(|p| {
            p.env
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect()
        })
        .unwrap_or_default();
    for (k, v) in own {
        let valid = !k.is_empty()
            && !k.as_bytes()[0].is_ascii_digit()
            && k.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_');
        if !valid {
            bad.add(
                "env",
                format!("{k:?} is not a valid variable name (letters, digits, _)"),
            );
        }
        env.insert(k, v);
    }
    env
}

/// Where the tree is seen (`mountpoint`, else the preset's; [`check_mountpoint`]) and what is
/// left out of it (the preset's `exclude` plus the spec's, each relative).
fn tree_paths(
    mountpoint: Option<String>,
    own_exclude: Vec<String>,
    preset: Option<&'static Preset>,
    bad: &mut Problems,
) -> (Option<String>, Vec<String>) {
    let mountpoint = mountpoint.or_else(|| preset.and_then(|p| p.mountpoint.map(str::to_string)));
    if let Some(mp) = &mountpoint
        && let Err(m) = check_mountpoint(mp)
    {
        bad.add("mountpoint", m);
    }
    let mut exclude: Vec<String> = preset
        .map(|p| p.exclude.iter().map(|s| s.to_string()).collect())
        .unwrap_or_default();
    for x in own_exclude {
        if let Err(m) = check_relative(&x) {
            bad.add("exclude", format!("{x:?}: {m}"));
        }
        exclude.push(x);
    }
    (mountpoint, exclude)
}

/// The checks of a `mountpoint` template that need no paths, shared by `layercache run` (at
/// spec load) and the API/editor ([`parse_all`]): it is absolute or starts with `{workdir}` or
/// `{mount_root}`, has no `..`, is strictly below `{workdir}`/`{mount_root}` (not the directory
/// itself), and a literal absolute path is none that [`check_root`] refuses (`/`, a top-level
/// system directory, anything under `/etc`, `/usr`, `/proc`, …): no mount root or workdir can
/// hold those. What depends on the run's paths (an absolute path below neither `--mount-root`
/// nor the workdir) is checked by [`Cache::mountpoint`] when the run starts.
///
/// Errors: a message naming the mountpoint and what would be valid.
fn check_mountpoint(mp: &str) -> std::result::Result<(), String> {
    if !(mp.starts_with('/') || mp.starts_with("{workdir}") || mp.starts_with("{mount_root}"))
        || mp.split('/').any(|c| c == "..")
    {
        return Err(format!(
            "{mp:?} must be absolute or start with {{workdir}} or {{mount_root}}, without '..'"
        ));
    }
    let bare = mp.trim_end_matches('/');
    if bare == "{workdir}" || bare == "{mount_root}" {
        return Err(format!(
            "{mp:?} is the directory itself: a cache mounts strictly below it (e.g. \
             \"{bare}/name\")"
        ));
    }
    // The literal part before any template: complete components only.
    let literal = match mp.find('{') {
        None if bare.is_empty() => "/",
        None => bare,
        Some(at) => &mp[..mp[..at].rfind('/').unwrap_or(0)],
    };
    let literal = Path::new(literal);
    let system = literal.is_absolute() && SYSTEM_DIRS.iter().any(|d| literal.starts_with(d));
    let top = !mp.contains('{') && TOP_DIRS.iter().any(|d| literal == Path::new(d));
    if system || top {
        return Err(format!(
            "{mp:?} is refused: a system directory (or /) cannot hold a cache mount; a cache \
             mounts only below the mount root (--mount-root, default /cache) or the workdir, \
             e.g. \"{{mount_root}}/name\" or \"{{workdir}}/name\""
        ));
    }
    Ok(())
}

/// A key-file or exclude pattern must be relative, without `..`, and a valid glob.
fn check_relative(p: &str) -> std::result::Result<(), String> {
    if p.is_empty() || p.starts_with('/') || p.split('/').any(|c| c == "..") {
        return Err("must be a relative path without '..'".into());
    }
    Pattern::new(p).map(drop)
}

#[cfg(test)]
mod tests;
