//! Cache keys: what a layer is published under, and the restore keys tried when it is missing.
//!
//! Follows GitHub `actions/cache`: an exact `key` (immutable once published) plus ordered
//! `restore-keys` prefixes that pick the newest layer whose key starts with them.
//!
//! A key reads `<id>-<os>-<arch>-<env8>-<hash>`:
//! * `env8` — the environment fingerprint: the first 8 hex digits of blake3 over the sandbox
//!   image id (`--image` / `LAYERCACHE_IMAGE`, `none` when unset), the versions of the preset's
//!   tools (`node --version`, `python3 --version`, `rustc --version`, `go version`,
//!   `java --version`; a missing tool counts as `none`) and, for a path-bound tree (a venv,
//!   cargo's target dir: [`crate::spec::Preset::relocatable`] false), its view path. Installed
//!   trees with native code depend on the tools and embed their absolute path, so a changed
//!   image, toolchain or view path never restores an old layer; a relocatable tree (a package
//!   manager's cache, `node_modules`) keys on no path, so per-run workspaces share its layers;
//! * `hash` — 32 hex digits of blake3 over the cache id, the preset name and version, the setup
//!   script, the env templates, the values of the `{env:NAME}` variables of setup,
//!   restore_setup and env (`PATH` excepted: [`crate::spec::Cache::key_variables`]), the view path (path-bound trees only), the exclude list, the key files' relative paths and
//!   contents (sorted by path), and the environment fingerprint. The key files are every
//!   match of the spec's or preset's patterns, or, for a preset whose patterns are
//!   alternatives ([`crate::spec::Preset::key_files_first`], venv), those of the first pattern
//!   that matches; for the pip and venv presets the `-r`/`-c` includes of requirements files
//!   join them (recursively, relative to the including file, never outside the workdir);
//!   plus the preset's tool configuration (`key/config.rs`: lifecycle scripts, `.npmrc`,
//!   `pyproject.toml` settings, `Cargo.toml` files…), whose trusted part also enters `env8`.
//!
//! Every digest — `env8`, `hash` and the recorded inputs' — is blake3 keyed with the project's
//! salt ([`KeySalt`]), so none can be tested against guesses of a secret without it.
//!
//! The default restore key is the key up to its hash (`<id>-<os>-<arch>-<env8>-`), so a changed
//! lockfile or setup script falls back to the nearest layer of the same environment.

use std::collections::BTreeMap;
use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::Mutex;

use crate::error::{Error, IoContext, Result};
use crate::ids::{CacheId, CacheKey};
use crate::spec::{Cache, Paths, Pattern};

mod config;

/// Directories never searched for key files under a `**` pattern (installed trees, VCS data,
/// build output).
const SKIP_DIRS: &[&str] = &[
    ".git",
    "node_modules",
    ".venv",
    "target",
    "build",
    ".gradle",
];

/// Hex digits of the content hash in a key.
const HASH_HEX: usize = 32;

/// The environment fingerprint's inputs, probed once per run (tool versions are cached).
#[derive(Debug)]
pub struct Environment {
    /// `std::env::consts::OS`, e.g. `linux`.
    pub os: String,
    /// `std::env::consts::ARCH`, e.g. `x86_64`.
    pub arch: String,
    /// The sandbox image id, if any.
    pub image: Option<String>,
    /// The tools run inside `image` (`--sandbox docker`): their host versions mean nothing, the
    /// image id stands for them.
    tools_in_image: bool,
    versions: Mutex<BTreeMap<String, String>>,
    /// The variables `{env:NAME}` reads, when not the process's own (tests).
    variables: Option<BTreeMap<String, String>>,
    /// The project's key salt ([`KeySalt`]); `None` (tests of what a key covers) digests
    /// with plain blake3.
    salt: Option<KeySalt>,
}

/// A project's key salt: 32 random bytes (the store keeps them with the project, mode 0600,
/// and in the remote tier so runners agree), the key of every digest a key is made of and
/// every digest its recorded inputs hold — blake3's keyed mode (`blake3::keyed_hash`), so a
/// digest of a weak secret (`{env:TOKEN}`, an `.npmrc`) cannot be tried offline by whoever
/// reads the inputs or the key without the salt, and two projects' digests of one value differ.
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct KeySalt(pub [u8; 32]);

impl KeySalt {
    /// The salt provisioned in the environment variable `LAYERCACHE_KEY_SALT` (64 hex digits,
    /// e.g. `openssl rand -hex 32`), if set: runners given the same one agree on keys without
    /// the salt ever being stored in the remote tier. `None` when unset or empty.
    ///
    /// Errors: [`Error::Invalid`] naming the variable when it is not 64 hex digits.
    pub fn from_env() -> Result<Option<KeySalt>> {
        let Some(v) = std::env::var_os("LAYERCACHE_KEY_SALT").filter(|v| !v.is_empty()) else {
            return Ok(None);
        };
        crate::store::salt_from_hex(v.as_encoded_bytes())
            .map(|s| Some(KeySalt(s)))
            .ok_or_else(|| {
                Error::invalid(
                    "LAYERCACHE_KEY_SALT: not a key salt; want 64 hex digits \
                     (e.g. from `openssl rand -hex 32`)",
                )
            })
    }
}

impl std::fmt::Debug for KeySalt {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("KeySalt(..)")
    }
}

impl Environment {
    /// The host environment with an optional image id; tool versions are probed lazily by
    /// running the tool.
    pub fn host(image: Option<String>) -> Self {
        Environment {
            os: std::env::consts::OS.to_string(),
            arch: std::env::consts::ARCH.to_string(),
            image: image.filter(|i| !i.is_empty()),
            tools_in_image: false,
            versions: Mutex::new(BTreeMap::new()),
            variables: None,
            salt: None,
        }
    }

    /// The environment of steps that run in a container of image `image_id` (`sha256:…`):
    /// every tool's version is `in image`, and the image id fingerprints them all.
    pub fn in_image(image_id: String) -> Self {
        Environment {
            tools_in_image: true,
            ..Self::host(Some(image_id))
        }
    }

    /// An environment with fixed tool versions (tests; tools not listed are probed).
    pub fn with_versions(image: Option<String>, versions: &[(&str, &str)]) -> Self {
        let env = Self::host(image);
        if let Ok(mut v) = env.versions.lock() {
            for (tool, version) in versions {
                v.insert(tool.to_string(), version.to_string());
            }
        }
        env
    }

    /// This environment with `{env:NAME}` variables read from `vars` instead of the process's
    /// environment (tests; a name not listed is unset).
    pub fn with_variables(mut self, vars: &[(&str, &str)]) -> Self {
        let map = vars.iter().map(|(k, v)| (k.to_string(), v.to_string()));
        self.variables = Some(map.collect());
        self
    }

    /// This environment with the project's key salt: every digest of the key and of its
    /// recorded inputs is keyed with it ([`KeySalt`]).
    pub fn with_salt(mut self, salt: KeySalt) -> Self {
        self.salt = Some(salt);
        self
    }

    /// A hasher for one digest: blake3 keyed with the salt, or plain without one.
    fn hasher(&self) -> blake3::Hasher {
        match &self.salt {
            Some(KeySalt(k)) => blake3::Hasher::new_keyed(k),
            None => blake3::Hasher::new(),
        }
    }

    /// The 16-hex digest of `bytes` recorded in a key's inputs (keyed with the salt).
    fn digest(&self, bytes: &[u8]) -> String {
        let mut h = self.hasher();
        h.update(bytes);
        h.finalize().to_hex()[..16].to_string()
    }

    /// The value of variable `name` for `{env:NAME}` (`None`: unset).
    fn variable(&self, name: &str) -> Option<String> {
        match &self.variables {
            Some(vars) => vars.get(name).cloned(),
            None => std::env::var_os(name).map(|v| v.to_string_lossy().into_owned()),
        }
    }

    /// The first line `tool --version` prints (`go version` for Go), or `none` when the tool is
    /// missing or fails; `in image` for an [`Environment::in_image`].
    pub fn tool_version(&self, tool: &str) -> String {
        if self.tools_in_image {
            return "in image".into();
        }
        if let Some(v) = self.versions.lock().ok().and_then(|v| v.get(tool).cloned()) {
            return v;
        }
        let version = probe_version(tool);
        if let Ok(mut v) = self.versions.lock() {
            v.insert(tool.to_string(), version.clone());
        }
        version
    }

    /// The fingerprint string hashed into `env8` for these tools (stable: tools are sorted).
    pub fn fingerprint(&self, tools: &[&str]) -> String {
        let mut tools: Vec<&str> = tools.to_vec();
        tools.sort_unstable();
        tools.dedup();
        let mut s = format!(
            "os={}\narch={}\nimage={}\n",
            self.os,
            self.arch,
            self.image.as_deref().unwrap_or("none")
        );
        for t in tools {
            s.push_str(&format!("{t}={}\n", self.tool_version(t)));
        }
        s
    }
}

fn probe_version(tool: &str) -> String {
    let arg = if tool == "go" { "version" } else { "--version" };
    let out = Command::new(tool)
        .arg(arg)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .output();
    match out {
        Ok(o) if o.status.success() => {
            let text = if o.stdout.iter().any(|b| !b.is_ascii_whitespace()) {
                o.stdout
            } else {
                o.stderr
            };
            String::from_utf8_lossy(&text)
                .lines()
                .map(str::trim)
                .find(|l| !l.is_empty())
                .unwrap_or("none")
                .to_string()
        }
        _ => "none".to_string(),
    }
}

/// A cache's computed key, restore keys and the inputs that went into them.
#[derive(Debug, Clone, serde::Serialize)]
pub struct CacheKeys {
    /// The cache.
    pub id: CacheId,
    /// The exact key.
    pub key: CacheKey,
    /// Restore-key prefixes, tried in order when the key has no layer.
    pub restore_keys: Vec<CacheKey>,
    /// The key files found, relative to the workdir, sorted.
    pub key_files: Vec<PathBuf>,
    /// Where the cache is mounted.
    pub mountpoint: PathBuf,
    /// The environment fingerprint text (see the module docs).
    pub fingerprint: String,
    /// What went into the key, by name ([`crate::why::Inputs`]; digests are 16 hex of blake3
    /// keyed with the project's salt: [`KeySalt`]): `key file <path>` → digest of its content,
    /// `config <path>` → digest of the tool configuration that counts, `setup` → digest of the
    /// script, `env <NAME>`, `variable <NAME>` → digest of an `{env:NAME}` value or `unset`,
    /// `mountpoint`,
    /// `exclude`, `preset`, `tool <t>`, `image`), so a miss can say what differs from the
    /// nearest layer (`layercache key` and the run summary show it).
    pub inputs: crate::why::Inputs,
}

impl CacheKeys {
    /// The key up to its hash: `<id>-<os>-<arch>-<env8>-`.
    pub fn prefix(&self) -> &str {
        let k = self.key.as_str();
        &k[..k.len() - HASH_HEX]
    }
}

/// Computes a cache's key and restore keys from the key files under `paths.workdir`.
///
/// Errors: [`Error::Invalid`] naming `cache "<id>": key_files` when a literal key file of the
/// spec is missing or a directory, no key file matches at all, or a key file (or the directory
/// a key-file glob walks) resolves through a symlink to a path outside the workdir (the outside
/// file is never read); [`Error::Io`] when a key file cannot be read.
pub fn compute(cache: &Cache, paths: &Paths, env: &Environment) -> Result<CacheKeys> {
    let id = cache.id.as_str();
    let mountpoint = cache.mountpoint(paths)?;
    // What a requirements include's `${VAR}` expands to: the cache's env, else the run's.
    let run_env = cache.env_for(paths, &mountpoint);
    let files = find_key_files(cache, &paths.workdir, &run_env)?;
    let real_root = fs::canonicalize(&paths.workdir).at(&paths.workdir)?;
    let configs = config::inputs(cache, &paths.workdir, &real_root, SKIP_DIRS)?;
    let fingerprint = env.fingerprint(cache.tools());
    // A path-bound tree's view path joins the environment: it embeds its absolute path (a
    // venv's scripts, cargo's fingerprints), so even a restore must not cross view paths. A
    // relocatable tree's key holds no path at all: per-run workspaces share its layers.
    let bound_to = (!cache.relocatable).then_some(&mountpoint);
    let mut env_h = env.hasher();
    env_h.update(fingerprint.as_bytes());
    if let Some(mp) = bound_to {
        env_h.update(b"\0mountpoint=");
        env_h.update(mp.as_os_str().as_encoded_bytes());
    }
    // Trusted config (lifecycle scripts, tool settings) joins the environment too: a tree made
    // under other such config is never restored from (an incremental install would keep what
    // another postinstall did to it).
    for c in configs.iter().filter(|c| !c.trust.is_empty()) {
        for part in [c.rel.as_os_str().as_encoded_bytes(), &c.trust] {
            env_h.update(&(part.len() as u64).to_le_bytes());
            env_h.update(part);
        }
    }
    let env8 = &env_h.finalize().to_hex()[..8];

    let mut h = env.hasher();
    h.update(b"layercache cache key v1");
    let mut field = |name: &str, value: &[u8]| {
        for part in [name.as_bytes(), value] {
            h.update(&(part.len() as u64).to_le_bytes());
            h.update(part);
        }
    };
    field("id", id.as_bytes());
    if let Some(p) = cache.preset {
        field("preset", p.name.as_bytes());
        field("preset_version", &p.version.to_le_bytes());
    }
    field("setup", cache.setup.as_bytes());
    for (k, v) in &cache.env {
        field("env", format!("{k}={v}").as_bytes());
    }
    if let Some(mp) = bound_to {
        field("mountpoint", mp.as_os_str().as_encoded_bytes());
    }
    for x in &cache.exclude {
        field("exclude", x.as_bytes());
    }
    for (name, value) in variables(cache, env) {
        field("variable", name.as_bytes());
        field("value", value.as_deref().unwrap_or_default().as_bytes());
        field("set", &[value.is_some() as u8]);
    }
    for rel in &files {
        let abs = paths.workdir.join(rel);
        let content = fs::read(&abs).at(&abs)?;
        field("file", rel.as_os_str().as_encoded_bytes());
        field("content", &content);
    }
    for c in &configs {
        field("config", c.rel.as_os_str().as_encoded_bytes());
        field("config_trust", &c.trust);
        field("config_shape", &c.shape);
    }
    field("environment", fingerprint.as_bytes());
    let hash = h.finalize().to_hex();
    let mut inputs = key_inputs(cache, paths, env, &files, &mountpoint, &fingerprint)?;
    for c in &configs {
        let mut both = c.trust.clone();
        both.push(0);
        both.extend_from_slice(&c.shape);
        inputs.insert(format!("config {}", c.rel.display()), env.digest(&both));
    }

    let prefix = format!("{id}-{}-{}-{env8}-", env.os, env.arch);
    let key = CacheKey::new(format!("{prefix}{}", &hash[..HASH_HEX]))?;
    let restore_keys = match &cache.restore_keys {
        Some(list) => list
            .iter()
            .map(|r| CacheKey::new(r.clone()))
            .collect::<Result<Vec<_>>>()?,
        None => vec![CacheKey::new(prefix)?],
    };
    Ok(CacheKeys {
        id: cache.id.clone(),
        key,
        restore_keys,
        key_files: files,
        mountpoint,
        fingerprint,
        inputs,
    })
}

/// The values of the cache's key variables ([`Cache::key_variables`]) in layercache's own
/// environment (`None`: unset), by name.
fn variables(cache: &Cache, env: &Environment) -> Vec<(String, Option<String>)> {
    (cache.key_variables().into_iter())
        .map(|n| {
            let v = env.variable(&n);
            (n, v)
        })
        .collect()
}

/// The named inputs of a key (see [`CacheKeys::inputs`]); the fingerprint's `name=value` lines
/// become `tool <name>` (and `os`, `arch`, `image`).
fn key_inputs(
    cache: &Cache,
    paths: &Paths,
    env: &Environment,
    files: &[PathBuf],
    mountpoint: &Path,
    fingerprint: &str,
) -> Result<crate::why::Inputs> {
    let digest = |b: &[u8]| env.digest(b);
    let mut m = crate::why::Inputs::new();
    if let Some(p) = cache.preset {
        m.insert("preset".into(), format!("{} v{}", p.name, p.version));
    }
    m.insert("setup".into(), digest(cache.setup.as_bytes()));
    for (k, v) in &cache.env {
        m.insert(format!("env {k}"), v.clone());
    }
    // Only what enters the key: a relocatable tree's key holds no path.
    if !cache.relocatable {
        m.insert("mountpoint".into(), mountpoint.display().to_string());
    }
    if !cache.exclude.is_empty() {
        m.insert("exclude".into(), cache.exclude.join(" "));
    }
    // A digest, never the value: a variable may hold a token, and inputs travel to the remote.
    for (name, value) in variables(cache, env) {
        let shown = value.map_or_else(|| "unset".to_string(), |v| digest(v.as_bytes()));
        m.insert(format!("variable {name}"), shown);
    }
    for rel in files {
        let abs = paths.workdir.join(rel);
        let content = fs::read(&abs).at(&abs)?;
        m.insert(format!("key file {}", rel.display()), digest(&content));
    }
    for line in fingerprint.lines() {
        if let Some((k, v)) = line.split_once('=') {
            let name = if matches!(k, "os" | "arch" | "image") {
                k.to_string()
            } else {
                format!("tool {k}")
            };
            m.insert(name, v.to_string());
        }
    }
    Ok(m)
}

/// The key files of `cache` under `workdir`, relative and sorted; `${VAR}` in a requirements
/// include is looked up in `cache_env` (the cache's expanded env), then in this process's.
fn find_key_files(
    cache: &Cache,
    workdir: &Path,
    cache_env: &BTreeMap<String, String>,
) -> Result<Vec<PathBuf>> {
    let id = cache.id.as_str();
    let real_root = fs::canonicalize(workdir).at(workdir)?;
    let mut found: Vec<PathBuf> = Vec::new();
    for pattern in &cache.key_files {
        // Alternatives (the venv preset): the first pattern with a match is the installer's input.
        if cache.key_files_first && !found.is_empty() {
            break;
        }
        let before = found.len();
        let glob = Pattern::new(pattern)
            .map_err(|e| Error::invalid(format!("cache {id:?}: key_files: {e}")))?;
        // The directory a glob walks (its literal leading components) or the literal file,
        // then every match: none may resolve outside the workdir, nor is any outside file read.
        let base: PathBuf = pattern
            .split('/')
            .take_while(|c| !c.contains(['*', '?', '[', '{']))
            .collect();
        if !base.as_os_str().is_empty() && fs::symlink_metadata(workdir.join(&base)).is_ok() {
            check_inside(id, pattern, workdir, &real_root, &base)?;
        }
        glob.walk(workdir, SKIP_DIRS, true, &mut found)?;
        for rel in &found[before..] {
            check_inside(id, pattern, workdir, &real_root, rel)?;
        }
        if cache.key_files_explicit && glob.is_literal() && found.len() == before {
            if workdir.join(&base).is_dir() {
                return Err(Error::invalid(format!(
                    "cache {id:?}: key_files: {pattern:?} is a directory in {}; name a file or \
                     a glob such as \"{}/*\"",
                    workdir.display(),
                    pattern.trim_end_matches('/')
                )));
            }
            return Err(Error::invalid(format!(
                "cache {id:?}: key_files: {pattern:?} not found in {}",
                workdir.display()
            )));
        }
    }
    if cache.requirement_includes {
        let env = |name: &str| (cache_env.get(name).cloned()).or_else(|| std::env::var(name).ok());
        follow_includes(id, workdir, &real_root, &env, &mut found)?;
    }
    found.sort();
    found.dedup();
    if found.is_empty() {
        return Err(Error::invalid(format!(
            "cache {id:?}: key_files: none of {} found in {}{}",
            cache.key_files.join(", "),
            workdir.display(),
            lockfile_hint(&cache.key_files, workdir)
        )));
    }
    Ok(found)
}

/// When no key file exists: how to make the lockfile the key wants without installing
/// anything, for the project file that is there (`package.json` → `npm install
/// --package-lock-only`, `pyproject.toml` → `uv lock`, `Cargo.toml` → `cargo
/// generate-lockfile`), as `"; …"`; empty when none applies.
fn lockfile_hint(key_files: &[String], workdir: &Path) -> String {
    const HINTS: &[(&str, &str, &str)] = &[
        (
            "package-lock.json",
            "package.json",
            "npm install --package-lock-only",
        ),
        ("uv.lock", "pyproject.toml", "uv lock"),
        ("Cargo.lock", "Cargo.toml", "cargo generate-lockfile"),
    ];
    HINTS
        .iter()
        .find(|(lock, project, _)| {
            key_files.iter().any(|k| k == lock) && workdir.join(project).is_file()
        })
        .map(|(lock, project, cmd)| {
            format!("; {project} is there: `{cmd}` writes {lock} without installing anything")
        })
        .unwrap_or_default()
}

/// How deep `-r`/`-c` includes of requirements files may nest below a key file.
const MAX_INCLUDE_DEPTH: usize = 8;
/// How many files includes may add to one cache's key files.
const MAX_INCLUDED_FILES: usize = 64;

/// Adds to `found` (key files relative to `workdir`) every file the requirements files among
/// them include with `-r`/`--requirement` or `-c`/`--constraint`, recursively, each read
/// relative to the file that names it (as pip does). A requirements file is a key file ending
/// in `.txt` or `.in`; included files are requirements files whatever their name. A URL include
/// is not followed (a warning on stderr says so: the key cannot cover it). A `${NAME}` in an
/// include's path (NAME of `A-Z`, `0-9`, `_`) is expanded from `env` (the run's environment),
/// as pip expands it in requirements files; an include naming an unset variable is skipped
/// with a warning naming it (pip would read it literally and fail, or the setup sets it).
///
/// Errors: [`Error::Invalid`] naming the cache, the including file, its line and the include
/// when the included file is missing, resolves (symlinks followed) outside the workdir's real
/// path `real_root` (the outside file is never read: same rule as the key files' own), or the
/// includes nest deeper than 8 or add more than 64 files; [`Error::Io`] when a requirements
/// file cannot be read.
fn follow_includes(
    id: &str,
    workdir: &Path,
    real_root: &Path,
    env: &dyn Fn(&str) -> Option<String>,
    found: &mut Vec<PathBuf>,
) -> Result<()> {
    let is_requirements = |p: &Path| p.extension().is_some_and(|e| e == "txt" || e == "in");
    let mut todo: Vec<(PathBuf, usize)> = found
        .iter()
        .filter(|p| is_requirements(p))
        .map(|p| (p.clone(), 0))
        .collect();
    let mut added = 0;
    while let Some((rel, depth)) = todo.pop() {
        let abs = workdir.join(&rel);
        let text = String::from_utf8_lossy(&fs::read(&abs).at(&abs)?).into_owned();
        for (line, opt, target) in requirement_includes(&text) {
            let at = format!(
                "cache {id:?}: key file {} line {line}: {opt} {target}",
                rel.display()
            );
            if target.contains("://") {
                eprintln!(
                    "layercache: warning: {at}: a URL is not followed into the key; a change \
                     behind it does not change the key"
                );
                continue;
            }
            let target = match expand_env_vars(&target, env) {
                Ok(t) => t,
                Err(unset) => {
                    eprintln!(
                        "layercache: warning: {at}: ${{{unset}}} is not set, so this include is \
                         not followed into the key; set {unset} for the run to key on it"
                    );
                    continue;
                }
            };
            let inc_abs = abs.parent().unwrap_or(workdir).join(&target);
            let real = fs::canonicalize(&inc_abs).map_err(|e| {
                Error::invalid(format!(
                    "{at}: cannot read {}: {e}; an include is read relative to the file that \
                     names it and must be a file of the project",
                    inc_abs.display()
                ))
            })?;
            let Ok(inside) = real.strip_prefix(real_root) else {
                return Err(Error::invalid(format!(
                    "{at}: {} leads outside the project ({}); included requirements files must \
                     resolve to paths under the workdir",
                    real.display(),
                    real_root.display()
                )));
            };
            if !real.is_file() {
                return Err(Error::invalid(format!(
                    "{at}: {} is not a file; an include names a requirements file",
                    real.display()
                )));
            }
            let inside = inside.to_path_buf();
            if found.contains(&inside) {
                continue;
            }
            if depth + 1 > MAX_INCLUDE_DEPTH || added == MAX_INCLUDED_FILES {
                return Err(Error::invalid(format!(
                    "{at}: includes nest deeper than {MAX_INCLUDE_DEPTH} or add more than \
                     {MAX_INCLUDED_FILES} files; name the requirements files in key_files instead"
                )));
            }
            added += 1;
            found.push(inside.clone());
            todo.push((inside, depth + 1));
        }
    }
    Ok(())
}

/// `s` with each `${NAME}` (NAME of ASCII capitals, digits and `_`, the form pip expands in
/// requirements files: pip's docs, "Using Environment Variables") replaced by `env(NAME)`;
/// anything else (`$NAME`, `${lower}`) stays literal, as in pip.
///
/// Errors: the first NAME that `env` does not know.
fn expand_env_vars(
    s: &str,
    env: &dyn Fn(&str) -> Option<String>,
) -> std::result::Result<String, String> {
    let mut out = String::new();
    let mut rest = s;
    while let Some(at) = rest.find("${") {
        out.push_str(&rest[..at]);
        let after = &rest[at + 2..];
        let name_len = after
            .find(|c: char| !(c.is_ascii_uppercase() || c.is_ascii_digit() || c == '_'))
            .unwrap_or(after.len());
        if name_len == 0 || !after[name_len..].starts_with('}') {
            out.push_str("${");
            rest = after;
            continue;
        }
        let name = &after[..name_len];
        out.push_str(&env(name).ok_or_else(|| name.to_string())?);
        rest = &after[name_len + 1..];
    }
    out.push_str(rest);
    Ok(out)
}

/// The include options of a pip requirements file, as `(line number, option, file)` (the
/// line 1-based, the option as written: `-r`, `--constraint`, …): `-r`/`--requirement` and `-c`/`--constraint`, each
/// with its file after a space, `=` or (short forms) directly. Comments (`#` at the start or
/// after whitespace) and `\` line continuations are handled as pip's requirements-file format
/// does (pip's docs, "Requirements File Format").
fn requirement_includes(text: &str) -> Vec<(usize, &'static str, String)> {
    let mut out = Vec::new();
    let mut joined = String::new();
    let mut first_line = 0;
    for (n, raw) in text.lines().enumerate() {
        if joined.is_empty() {
            first_line = n + 1;
        }
        if let Some(cont) = raw.strip_suffix('\\') {
            joined.push_str(cont);
            continue;
        }
        joined.push_str(raw);
        let line = std::mem::take(&mut joined);
        let line = match line.find('#') {
            Some(0) => "",
            Some(at) if line[..at].ends_with(char::is_whitespace) => &line[..at],
            _ => line.as_str(),
        }
        .trim();
        let file = ["--requirement", "--constraint", "-r", "-c"]
            .iter()
            .find_map(|opt| {
                let rest = line.strip_prefix(opt)?;
                let long = opt.starts_with("--");
                let rest = if let Some(r) = rest.strip_prefix('=') {
                    r
                } else if rest.starts_with(char::is_whitespace) || !long {
                    rest
                } else {
                    return None;
                };
                let rest = rest.trim().trim_matches(['"', '\'']);
                (!rest.is_empty()).then(|| (*opt, rest.to_string()))
            });
        if let Some((opt, f)) = file {
            out.push((first_line, opt, f));
        }
    }
    out
}

/// Refuses `rel` (a key file, or the directory a key-file glob walks) of the key_files entry
/// `pattern` when its real path (symlinks resolved) is not under `real_root`, the workdir's
/// real path: a symlink must not carry a hash of an outside file (`/etc/shadow`) into the key's
/// inputs, the store and the remote tier.
fn check_inside(
    id: &str,
    pattern: &str,
    workdir: &Path,
    real_root: &Path,
    rel: &Path,
) -> Result<()> {
    let abs = workdir.join(rel);
    let real = fs::canonicalize(&abs).at(&abs)?;
    if real.starts_with(real_root) {
        return Ok(());
    }
    Err(Error::invalid(format!(
        "cache {id:?}: key_files {pattern:?}: {} -> {} leads outside the project ({}); key files \
         must resolve to paths under the workdir",
        rel.display(),
        real.display(),
        real_root.display()
    )))
}

/// Paths under `root` matching `pattern` (relative, `*`/`?` within a name, `**` any directories;
/// symlinked directories are not followed under `**`), relative to `root` and sorted. Used for
/// `exclude`.
///
/// Errors: [`Error::Invalid`] for a malformed pattern; [`Error::Io`] naming a directory that
/// exists but cannot be listed.
pub fn find_matches(root: &Path, pattern: &str) -> Result<Vec<PathBuf>> {
    let glob =
        Pattern::new(pattern).map_err(|e| Error::invalid(format!("exclude {pattern:?}: {e}")))?;
    let mut out = Vec::new();
    glob.walk(root, &[], false, &mut out)?;
    out.sort();
    out.dedup();
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::spec;

    fn setup_dir() -> tempfile::TempDir {
        let d = tempfile::tempdir().unwrap();
        fs::write(d.path().join("package-lock.json"), b"{\"v\":1}").unwrap();
        fs::write(d.path().join("package.json"), b"{}").unwrap();
        d
    }

    /// Paths of a workdir `dir` with caches mounted under `mount_root`.
    fn paths(dir: &Path, mount_root: &str) -> Paths {
        Paths {
            workdir: dir.to_path_buf(),
            mount_root: mount_root.into(),
            workdir_view: None,
        }
    }

    fn keys(spec_text: &str, dir: &Path, image: Option<&str>) -> Result<CacheKeys> {
        let s = spec::parse(spec_text)?;
        let paths = paths(dir, "/cache");
        let env = Environment::with_versions(image.map(String::from), &[("node", "v20.0.0")]);
        compute(&s.caches[0], &paths, &env)
    }

    const NPM: &str = "project = \"p\"\n[[cache]]\nid = \"npm\"\npreset = \"npm\"\n";

    #[test]
    fn key_is_stable_and_well_formed() {
        let d = setup_dir();
        let a = keys(NPM, d.path(), None).unwrap();
        let b = keys(NPM, d.path(), None).unwrap();
        assert_eq!(a.key, b.key);
        let k = a.key.as_str();
        let prefix = format!("npm-{}-{}-", std::env::consts::OS, std::env::consts::ARCH);
        assert!(k.starts_with(&prefix), "{k}");
        assert_eq!(k.len(), prefix.len() + 8 + 1 + HASH_HEX, "{k}");
        assert_eq!(a.restore_keys.len(), 1);
        assert_eq!(a.restore_keys[0].as_str(), a.prefix());
        assert!(a.prefix().ends_with('-'));
        assert_eq!(a.key_files, [PathBuf::from("package-lock.json")]);
        assert_eq!(a.mountpoint, Path::new("/cache/npm"));
    }

    #[test]
    fn lockfile_change_changes_key_not_prefix() {
        let d = setup_dir();
        let a = keys(NPM, d.path(), None).unwrap();
        fs::write(d.path().join("package-lock.json"), b"{\"v\":2}").unwrap();
        let b = keys(NPM, d.path(), None).unwrap();
        assert_ne!(a.key, b.key);
        assert_eq!(a.prefix(), b.prefix());
        // a second key file also changes it
        fs::write(d.path().join("npm-shrinkwrap.json"), b"{}").unwrap();
        let c = keys(NPM, d.path(), None).unwrap();
        assert_ne!(b.key, c.key);
        // files not named as key files do not
        fs::write(d.path().join("README"), b"x").unwrap();
        assert_eq!(keys(NPM, d.path(), None).unwrap().key, c.key);
    }

    #[test]
    fn setup_change_changes_key_not_prefix() {
        let d = setup_dir();
        let a = keys(NPM, d.path(), None).unwrap();
        let b = keys(&format!("{NPM}setup = \"npm install\"\n"), d.path(), None).unwrap();
        assert_ne!(a.key, b.key);
        assert_eq!(a.prefix(), b.prefix());
        // maintenance does not change what the layer holds
        let c = keys(&format!("{NPM}maintenance = \"true\"\n"), d.path(), None).unwrap();
        assert_eq!(a.key, c.key);
    }

    #[test]
    fn in_an_image_the_image_id_stands_for_the_tools() {
        let a = Environment::in_image("sha256:aa".into()).fingerprint(&["node"]);
        assert!(a.contains("image=sha256:aa\nnode=in image\n"), "{a}");
        let b = Environment::in_image("sha256:bb".into()).fingerprint(&["node"]);
        assert_ne!(a, b);
        // No host probe: a tool the host lacks is still `in image`.
        let c = Environment::in_image("sha256:aa".into()).fingerprint(&["no-such-tool-xyz"]);
        assert!(c.ends_with("no-such-tool-xyz=in image\n"), "{c}");
    }

    #[test]
    fn image_tool_or_mountpoint_change_changes_prefix() {
        let d = setup_dir();
        let a = keys(NPM, d.path(), Some("img-a")).unwrap();
        let b = keys(NPM, d.path(), Some("img-b")).unwrap();
        assert_ne!(a.prefix(), b.prefix());
        assert_ne!(a.key, b.key);
        let s = spec::parse(NPM).unwrap();
        let env = Environment::with_versions(Some("img-a".into()), &[("node", "v22.0.0")]);
        let c = compute(&s.caches[0], &paths(d.path(), "/cache"), &env).unwrap();
        assert_ne!(a.prefix(), c.prefix());
        // npm's cache is relocatable: another mount root or workdir is the same key.
        let env = Environment::with_versions(Some("img-a".into()), &[("node", "v20.0.0")]);
        let m = compute(&s.caches[0], &paths(d.path(), "/elsewhere"), &env).unwrap();
        assert_eq!(a.key, m.key);
        let other = tempfile::tempdir().unwrap();
        fs::copy(
            d.path().join("package-lock.json"),
            other.path().join("package-lock.json"),
        )
        .unwrap();
        let w = compute(&s.caches[0], &paths(other.path(), "/cache"), &env).unwrap();
        assert_eq!(a.key, w.key, "a new workspace path hits");
        // A venv is path-bound: another view path is another environment (no restore across
        // view paths either), the same view path (`--workdir-view`) the same key.
        let venv = spec::parse("project = \"p\"\n[[cache]]\nid = \"v\"\npreset = \"venv\"\nkey_files = [\"package-lock.json\"]\n").unwrap();
        let v1 = compute(&venv.caches[0], &paths(d.path(), "/cache"), &env).unwrap();
        let v2 = compute(&venv.caches[0], &paths(other.path(), "/cache"), &env).unwrap();
        assert_ne!(v1.prefix(), v2.prefix());
        let view = |dir: &Path| Paths {
            workdir_view: Some("/workspace".into()),
            ..paths(dir, "/cache")
        };
        let v3 = compute(&venv.caches[0], &view(d.path()), &env).unwrap();
        let v4 = compute(&venv.caches[0], &view(other.path()), &env).unwrap();
        assert_eq!(v3.key, v4.key);
        assert_eq!(v3.mountpoint, Path::new("/workspace/.venv"));
        // The miss reason lists only inputs of the key: a relocatable cache's
        // mountpoint is none, a path-bound one's is.
        assert!(!a.inputs.contains_key("mountpoint"), "{:?}", a.inputs);
        assert!(crate::why::diff(&a.inputs, &w.inputs).is_empty());
        assert_eq!(
            v1.inputs.get("mountpoint").map(String::as_str),
            Some(d.path().join(".venv").to_str().unwrap())
        );
        assert_eq!(crate::why::diff(&v1.inputs, &v2.inputs).len(), 1);
        // A record written before (with the relocatable cache's mountpoint) reads the same.
        let mut old = a.inputs.clone();
        old.insert("mountpoint".into(), "/a/node_modules".into());
        assert!(crate::why::diff(&old, &w.inputs).is_empty());
    }

    #[test]
    fn explicit_restore_keys_and_missing_files() {
        let d = setup_dir();
        let k = keys(
            &format!("{NPM}restore_keys = [\"npm-linux-\", \"npm-\"]\n"),
            d.path(),
            None,
        )
        .unwrap();
        assert_eq!(k.restore_keys.len(), 2);
        let e = keys(
            &format!("{NPM}key_files = [\"nope.lock\"]\n"),
            d.path(),
            None,
        )
        .unwrap_err()
        .to_string();
        assert!(e.contains("key_files") && e.contains("nope.lock"), "{e}");
        let empty = tempfile::tempdir().unwrap();
        let e = keys(NPM, empty.path(), None).unwrap_err().to_string();
        assert!(
            e.contains("key_files") && e.contains("package-lock.json"),
            "{e}"
        );
    }

    /// A spec of one cache `k` whose key_files are `files` (a TOML array body).
    fn with_key_files(files: &str) -> String {
        format!("project = \"p\"\n[[cache]]\nid = \"k\"\npreset = \"npm\"\nkey_files = [{files}]\n")
    }

    #[test]
    fn key_files_symlinked_outside_the_project_are_refused() {
        use std::os::unix::fs::symlink;
        let outside = tempfile::tempdir().unwrap();
        let secret = outside.path().join("shadow");
        fs::write(&secret, b"root:secret").unwrap();
        let real_secret = fs::canonicalize(&secret).unwrap();
        let d = tempfile::tempdir().unwrap();
        symlink(&secret, d.path().join("lock")).unwrap();
        let e = keys(&with_key_files("\"lock\""), d.path(), None).unwrap_err();
        assert!(matches!(e, Error::Invalid(_)), "{e:?}");
        let e = e.to_string();
        let want = format!("key_files \"lock\": lock -> {}", real_secret.display());
        assert!(
            e.contains(&want) && e.contains("outside the project"),
            "{e}"
        );
        assert!(!e.contains('\n'), "{e}");

        // A glob under a symlinked directory, and a glob whose walk enters one.
        symlink(outside.path(), d.path().join("sub")).unwrap();
        let e = keys(&with_key_files("\"sub/*\""), d.path(), None)
            .unwrap_err()
            .to_string();
        assert!(e.contains("key_files \"sub/*\": sub -> "), "{e}");
        fs::remove_file(d.path().join("sub")).unwrap();
        fs::create_dir(d.path().join("real")).unwrap();
        fs::write(d.path().join("real/x.lock"), b"in").unwrap();
        symlink(outside.path(), d.path().join("other")).unwrap();
        fs::write(outside.path().join("x.lock"), b"out").unwrap();
        let e = keys(&with_key_files("\"*/x.lock\""), d.path(), None)
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("other/x.lock -> ") && e.contains("outside"),
            "{e}"
        );
    }

    #[test]
    fn key_file_symlinks_inside_the_project_are_followed() {
        use std::os::unix::fs::symlink;
        let d = tempfile::tempdir().unwrap();
        fs::create_dir(d.path().join("real")).unwrap();
        fs::write(d.path().join("real/a.lock"), b"1").unwrap();
        symlink("real/a.lock", d.path().join("lock")).unwrap();
        symlink("real", d.path().join("sub")).unwrap();
        let k = keys(&with_key_files("\"lock\", \"sub/*\""), d.path(), None).unwrap();
        assert_eq!(
            k.key_files,
            [PathBuf::from("lock"), PathBuf::from("sub/a.lock")]
        );
        fs::write(d.path().join("real/a.lock"), b"2").unwrap();
        let k2 = keys(&with_key_files("\"lock\", \"sub/*\""), d.path(), None).unwrap();
        assert_ne!(k.key, k2.key);
    }

    #[test]
    fn a_directory_as_key_file_says_so() {
        let d = tempfile::tempdir().unwrap();
        fs::create_dir(d.path().join("deps")).unwrap();
        let e = keys(&with_key_files("\"deps\""), d.path(), None).unwrap_err();
        assert!(matches!(e, Error::Invalid(_)), "{e:?}");
        let e = e.to_string();
        assert!(
            e.contains("\"deps\" is a directory") && e.contains("\"deps/*\""),
            "{e}"
        );
    }

    #[test]
    fn recursive_patterns_skip_installed_trees() {
        let d = tempfile::tempdir().unwrap();
        fs::create_dir_all(d.path().join("sub/node_modules/x")).unwrap();
        fs::write(d.path().join("go.sum"), b"a").unwrap();
        fs::write(d.path().join("sub/go.sum"), b"b").unwrap();
        fs::write(d.path().join("sub/node_modules/x/go.sum"), b"c").unwrap();
        let k = keys(
            "project = \"p\"\n[[cache]]\nid = \"go\"\npreset = \"go\"\n",
            d.path(),
            None,
        )
        .unwrap();
        assert_eq!(
            k.key_files,
            [PathBuf::from("go.sum"), PathBuf::from("sub/go.sum")]
        );
    }

    #[test]
    fn globs() {
        let m = |p: &str, path: &str| Pattern::new(p).unwrap().is_match(Path::new(path));
        assert!(m("requirements*.txt", "requirements-dev.txt"));
        assert!(!m("requirements*.txt", "sub/requirements.txt"));
        assert!(m("**/go.sum", "go.sum"));
        assert!(m("**/go.sum", "a/b/go.sum"));
        assert!(m("**/*.gradle*", "app/build.gradle.kts"));
        assert!(!m("Cargo.lock", "Cargo.toml"));
        assert!(m("a?c", "abc"));
        let e = Pattern::new("a[").unwrap_err();
        assert!(e.contains("a["), "{e}");
    }

    const VENV: &str = "project = \"p\"\n[[cache]]\nid = \"venv\"\npreset = \"venv\"\n";
    const PIP: &str = "project = \"p\"\n[[cache]]\nid = \"pip\"\npreset = \"pip\"\n";

    #[test]
    fn requirements_includes_join_the_key() {
        let d = tempfile::tempdir().unwrap();
        let w = d.path();
        fs::create_dir(w.join("sub")).unwrap();
        fs::write(
            w.join("requirements.txt"),
            "# deps\n-r base.txt\nrequests==2.0  # -r not-this.txt\n--constraint=sub/c.txt\n",
        )
        .unwrap();
        fs::write(w.join("sub/c.txt"), "-r ../common.txt\n").unwrap();
        for spec in [VENV, PIP] {
            fs::write(w.join("base.txt"), "six==1.0\n-r requirements.txt\n").unwrap();
            fs::write(w.join("common.txt"), "idna==1.0\n").unwrap();
            let a = keys(spec, w, None).unwrap();
            let want: Vec<PathBuf> = ["base.txt", "common.txt", "requirements.txt", "sub/c.txt"]
                .iter()
                .map(PathBuf::from)
                .collect();
            assert_eq!(a.key_files, want, "{spec}");
            assert!(
                a.inputs.contains_key("key file common.txt"),
                "{:?}",
                a.inputs
            );
            // An edit of an included file (two levels down) is another key.
            fs::write(w.join("common.txt"), "idna==2.0\n").unwrap();
            let b = keys(spec, w, None).unwrap();
            assert_ne!(a.key, b.key, "{spec}");
            fs::write(w.join("base.txt"), "six==2.0\n-r requirements.txt\n").unwrap();
            assert_ne!(keys(spec, w, None).unwrap().key, b.key, "{spec}");
        }
    }

    #[test]
    fn requirements_includes_outside_the_project_are_refused() {
        use std::os::unix::fs::symlink;
        let d = tempfile::tempdir().unwrap();
        let w = d.path().join("proj");
        fs::create_dir(&w).unwrap();
        fs::write(d.path().join("secret.txt"), "x\n").unwrap();
        fs::write(w.join("requirements.txt"), "six\n\n-r ../secret.txt\n").unwrap();
        let e = keys(VENV, &w, None).unwrap_err();
        assert!(matches!(e, Error::Invalid(_)), "{e:?}");
        let e = e.to_string();
        assert!(
            e.contains("key file requirements.txt line 3: -r ../secret.txt")
                && e.contains("outside the project"),
            "{e}"
        );
        assert!(!e.contains('\n'), "{e}");
        // Through a symlink inside the project, and as an absolute path.
        symlink(d.path().join("secret.txt"), w.join("link.txt")).unwrap();
        fs::write(w.join("requirements.txt"), "-c link.txt\n").unwrap();
        let e = keys(VENV, &w, None).unwrap_err().to_string();
        assert!(e.contains("-c link.txt") && e.contains("outside"), "{e}");
        let abs = d.path().join("secret.txt");
        fs::write(w.join("requirements.txt"), format!("-r{}\n", abs.display())).unwrap();
        let e = keys(VENV, &w, None).unwrap_err().to_string();
        assert!(e.contains("outside the project"), "{e}");
        // A missing include names itself and where it was looked for.
        fs::write(w.join("requirements.txt"), "-r nope.txt\n").unwrap();
        let e = keys(VENV, &w, None).unwrap_err().to_string();
        assert!(
            e.contains("line 1: -r nope.txt: cannot read") && e.contains("nope.txt"),
            "{e}"
        );
    }

    /// `${NAME}` in an include's path is expanded from the run's environment as pip does; an
    /// unset one skips the include (a warning), never a "missing file" error.
    #[test]
    fn requirements_includes_expand_environment_references() {
        let d = tempfile::tempdir().unwrap();
        let w = d.path();
        fs::create_dir(w.join("reqs")).unwrap();
        fs::write(w.join("reqs/prod.txt"), "six\n").unwrap();
        fs::write(
            w.join("requirements.txt"),
            "-r reqs/${STAGE}.txt\n-c ${MISSING_VAR}/c.txt\n-r ${lower}.txt\n",
        )
        .unwrap();
        fs::write(w.join("${lower}.txt"), "").unwrap();
        let root = fs::canonicalize(w).unwrap();
        let env = |n: &str| (n == "STAGE").then(|| "prod".to_string());
        let mut found = vec![PathBuf::from("requirements.txt")];
        follow_includes("venv", w, &root, &env, &mut found).unwrap();
        found.sort();
        let want = ["${lower}.txt", "reqs/prod.txt", "requirements.txt"];
        assert_eq!(found, want.map(PathBuf::from));
        // Unset, the include is skipped rather than refused.
        let mut found = vec![PathBuf::from("requirements.txt")];
        follow_includes("venv", w, &root, &|_| None, &mut found).unwrap();
        assert_eq!(found.len(), 2, "{found:?}");
        // Through compute: the cache's env names the file; unset, the include is skipped.
        let with_env = format!("{VENV}env = {{ STAGE = \"prod\" }}\n");
        fs::write(w.join("requirements.txt"), "-r reqs/${STAGE}.txt\n").unwrap();
        let k = keys(&with_env, w, None).unwrap();
        assert!(
            k.key_files.contains(&PathBuf::from("reqs/prod.txt")),
            "{:?}",
            k.key_files
        );
        if std::env::var_os("STAGE").is_none() {
            let k = keys(VENV, w, None).unwrap();
            assert_eq!(k.key_files, [PathBuf::from("requirements.txt")]);
        }
        assert_eq!(
            expand_env_vars("a${B}c${", &|_| Some("x".into())).unwrap(),
            "axc${"
        );
        assert_eq!(
            expand_env_vars("${X}${Y}", &|n| (n == "X").then(String::new)),
            Err("Y".into())
        );
    }

    #[test]
    fn requirements_includes_are_bounded() {
        let d = tempfile::tempdir().unwrap();
        let w = d.path();
        fs::write(w.join("requirements.txt"), "-r r0.txt\n").unwrap();
        for n in 0..20 {
            fs::write(w.join(format!("r{n}.txt")), format!("-r r{}.txt\n", n + 1)).unwrap();
        }
        let e = keys(VENV, w, None).unwrap_err().to_string();
        assert!(e.contains("nest deeper than 8"), "{e}");
    }

    #[test]
    fn venv_keys_on_the_installer_its_setup_runs() {
        let d = tempfile::tempdir().unwrap();
        let w = d.path();
        fs::write(w.join("requirements.txt"), "six\n").unwrap();
        fs::write(w.join("requirements-dev.txt"), "pytest\n").unwrap();
        let pip = keys(VENV, w, None).unwrap();
        assert_eq!(pip.key_files, [PathBuf::from("requirements.txt")]);
        fs::write(w.join("poetry.lock"), "p\n").unwrap();
        let poetry = keys(VENV, w, None).unwrap();
        assert_eq!(poetry.key_files, [PathBuf::from("poetry.lock")]);
        fs::write(w.join("uv.lock"), "u\n").unwrap();
        let uv = keys(VENV, w, None).unwrap();
        assert_eq!(uv.key_files, [PathBuf::from("uv.lock")]);
        // uv sync reads uv.lock, not requirements.txt: editing that is the same key.
        fs::write(w.join("requirements.txt"), "six==9\n").unwrap();
        assert_eq!(keys(VENV, w, None).unwrap().key, uv.key);
        // A spec's own key_files are all read.
        let own = format!("{VENV}key_files = [\"uv.lock\", \"requirements.txt\"]\n");
        let k = keys(&own, w, None).unwrap();
        assert_eq!(
            k.key_files,
            [PathBuf::from("requirements.txt"), PathBuf::from("uv.lock")]
        );
    }

    #[test]
    fn requirement_include_lines() {
        let text = "a\n-r x.txt\n--requirement=y.txt\n--requirement  z.txt\n-cw.txt\n\
                    --constraint \"q.txt\"\n--require-hashes\n# -r no.txt\nb # -r no.txt\n\
                    -r \\\n  cont.txt\n-r\n";
        let got = requirement_includes(text);
        let want = [
            (2, "-r", "x.txt"),
            (3, "--requirement", "y.txt"),
            (4, "--requirement", "z.txt"),
            (5, "-c", "w.txt"),
            (6, "--constraint", "q.txt"),
            (10, "-r", "cont.txt"),
        ];
        let got: Vec<(usize, &str, &str)> =
            got.iter().map(|(n, o, f)| (*n, *o, f.as_str())).collect();
        assert_eq!(got, want);
    }

    #[test]
    fn env_templates_of_setup_and_env_are_key_inputs() {
        let d = setup_dir();
        let spec = format!(
            "{NPM}setup = \"npm ci --registry {{env:LC_REGISTRY}}\"\n\
             env = {{ NPM_PIN = \"{{env:LC_PIN}}\", NPM_PATH = \"{{env:PATH}}\" }}\n\
             maintenance = \"echo {{env:LC_MAINT}}\"\n"
        );
        let s = spec::parse(&spec).unwrap();
        assert_eq!(s.caches[0].key_variables(), ["LC_PIN", "LC_REGISTRY"]);
        let k = |vars: &[(&str, &str)]| {
            let env = Environment::with_versions(None, &[("node", "v20.0.0")]).with_variables(vars);
            compute(&s.caches[0], &paths(d.path(), "/cache"), &env).unwrap()
        };
        let base = [
            ("LC_REGISTRY", "https://a"),
            ("LC_PIN", "1"),
            ("PATH", "/bin"),
        ];
        let a = k(&base);
        let b = k(&[
            ("LC_REGISTRY", "https://b"),
            ("LC_PIN", "1"),
            ("PATH", "/bin"),
        ]);
        assert_ne!(a.key, b.key, "the registry shapes what setup installs");
        assert_eq!(a.prefix(), b.prefix(), "a restore across it is fine");
        assert_ne!(k(&base[..1]).key, a.key, "LC_PIN unset is another key");
        assert_ne!(
            k(&[("LC_PIN", "1"), ("LC_REGISTRY", "")]).key,
            k(&base[1..2]).key
        );
        // PATH and maintenance's variables are not inputs.
        let c = k(&[
            ("LC_REGISTRY", "https://a"),
            ("LC_PIN", "1"),
            ("PATH", "/usr/bin"),
        ]);
        assert_eq!(a.key, c.key);
        let e = k(&[
            ("LC_REGISTRY", "https://a"),
            ("LC_PIN", "1"),
            ("PATH", "/bin"),
            ("LC_MAINT", "x"),
        ]);
        assert_eq!(a.key, e.key);
        // The inputs name the variable and hold a digest, never the value; a miss says which.
        let shown = &a.inputs["variable LC_REGISTRY"];
        assert_eq!(shown.len(), 16);
        assert!(!shown.contains("https"));
        assert_eq!(k(&base[..1]).inputs["variable LC_PIN"], "unset");
        assert_eq!(
            crate::why::diff(&a.inputs, &b.inputs),
            ["variable LC_REGISTRY changed"]
        );
    }

    const NODE_MODULES: &str =
        "project = \"p\"\n[[cache]]\nid = \"node_modules\"\npreset = \"node_modules\"\n";

    /// Issue 29 item 2: what npm ci reads besides the lockfile. Two workspaces with one
    /// lockfile: a `postinstall` (root or workspace package), an `.npmrc` is another key and
    /// another restore prefix (a tree made under other scripts is never restored from); a
    /// dependency field another key but the same prefix; a description, version or test
    /// script the same key. `.npmrc` enters as a digest only.
    #[test]
    fn node_keys_cover_lifecycle_scripts_and_npmrc() {
        let a = setup_dir();
        let b = setup_dir();
        let pkg = |d: &Path, text: &str| fs::write(d.join("package.json"), text).unwrap();
        let base = r#"{"name":"app","version":"1.0.0","scripts":{"test":"jest"},
            "dependencies":{"lodash":"4.17.21"}}"#;
        pkg(a.path(), base);
        pkg(b.path(), base);
        let k = |d: &Path| keys(NODE_MODULES, d, None).unwrap();
        assert_eq!(k(a.path()).key, k(b.path()).key);
        pkg(
            a.path(),
            r#"{"name":"app","version":"1.0.0","scripts":{"test":"jest",
            "postinstall":"echo evil > node_modules/lodash/lodash.js"},
            "dependencies":{"lodash":"4.17.21"}}"#,
        );
        let (ka, kb) = (k(a.path()), k(b.path()));
        assert_ne!(ka.key, kb.key, "a postinstall is another key");
        assert_ne!(ka.prefix(), kb.prefix(), "…and no restore across it");
        assert_eq!(
            crate::why::diff(&kb.inputs, &ka.inputs),
            ["config package.json changed"]
        );
        // Descriptive fields and other scripts are not inputs.
        pkg(
            b.path(),
            r#"{"name":"app","version":"2.0.0","description":"d","scripts":{"test":"mocha"},
            "dependencies":{"lodash":"4.17.21"}}"#,
        );
        assert_eq!(k(b.path()).key, kb.key);
        // A dependency field: another key, the same prefix (a restore is fine).
        pkg(
            b.path(),
            r#"{"name":"app","dependencies":{"lodash":"4.17.20"}}"#,
        );
        let dep = k(b.path());
        assert_ne!(dep.key, kb.key);
        assert_eq!(dep.prefix(), kb.prefix());
        pkg(b.path(), base);
        // A workspace package's postinstall.
        fs::create_dir_all(b.path().join("packages/w")).unwrap();
        pkg(
            b.path(),
            r#"{"name":"app","workspaces":["packages/*"],"dependencies":{"lodash":"4.17.21"}}"#,
        );
        let ws0 = k(b.path());
        fs::write(
            b.path().join("packages/w/package.json"),
            r#"{"name":"w","scripts":{"postinstall":"touch x"}}"#,
        )
        .unwrap();
        let ws1 = k(b.path());
        assert_ne!(ws0.prefix(), ws1.prefix());
        assert!(ws1.inputs.contains_key("config packages/w/package.json"));
        // .npmrc: another key and prefix; the inputs hold a digest, never the token.
        fs::write(b.path().join(".npmrc"), "//r/:_authToken=npm_secret123\n").unwrap();
        let rc = k(b.path());
        assert_ne!(rc.prefix(), ws1.prefix());
        let shown = &rc.inputs["config .npmrc"];
        assert_eq!(shown.len(), 16);
        assert!(!format!("{:?}", rc.inputs).contains("npm_secret123"));
        // pnpm's hooks file and workspace file too.
        fs::write(b.path().join(".pnpmfile.cjs"), "module.exports = {}\n").unwrap();
        assert_ne!(k(b.path()).prefix(), rc.prefix());
    }

    /// cargo-target: a member's Cargo.toml is another key (a restore is fine), the project's
    /// `.cargo/config.toml` and `rust-toolchain.toml` another prefix; a venv's pyproject
    /// build settings another prefix.
    #[test]
    fn cargo_target_and_venv_keys_cover_their_tool_config() {
        let d = tempfile::tempdir().unwrap();
        let w = d.path();
        fs::write(w.join("Cargo.lock"), "# lock\n").unwrap();
        fs::create_dir_all(w.join("crates/a")).unwrap();
        fs::write(w.join("crates/a/Cargo.toml"), "[package]\nname = \"a\"\n").unwrap();
        let spec = "project = \"p\"\n[[cache]]\nid = \"t\"\npreset = \"cargo-target\"\n";
        let k0 = keys(spec, w, None).unwrap();
        assert!(k0.inputs.contains_key("config crates/a/Cargo.toml"));
        fs::write(
            w.join("crates/a/Cargo.toml"),
            "[package]\nname = \"a\"\n[features]\nx = []\n",
        )
        .unwrap();
        let k1 = keys(spec, w, None).unwrap();
        assert_ne!(k1.key, k0.key);
        assert_eq!(k1.prefix(), k0.prefix());
        fs::create_dir(w.join(".cargo")).unwrap();
        fs::write(
            w.join(".cargo/config.toml"),
            "[build]\nrustflags = [\"-Cx\"]\n",
        )
        .unwrap();
        assert_ne!(keys(spec, w, None).unwrap().prefix(), k1.prefix());

        fs::write(w.join("requirements.txt"), "six\n").unwrap();
        let v0 = keys(VENV, w, None).unwrap();
        fs::write(
            w.join("pyproject.toml"),
            "[tool.uv]\nindex-url = \"https://x\"\n",
        )
        .unwrap();
        let v1 = keys(VENV, w, None).unwrap();
        assert_ne!(v1.prefix(), v0.prefix());
        fs::write(
            w.join("pyproject.toml"),
            "[tool.uv]\nindex-url = \"https://x\"\n[tool.ruff]\nline-length = 1\n",
        )
        .unwrap();
        assert_eq!(keys(VENV, w, None).unwrap().key, v1.key);
        // A uv workspace member's pyproject.toml joins (its build settings: another prefix).
        fs::write(
            w.join("pyproject.toml"),
            "[tool.uv]\nindex-url = \"https://x\"\n[tool.uv.workspace]\nmembers = [\"libs/*\"]\n",
        )
        .unwrap();
        fs::create_dir_all(w.join("libs/m")).unwrap();
        fs::write(w.join("libs/m/pyproject.toml"), "[project]\nname = \"m\"\n").unwrap();
        let m0 = keys(VENV, w, None).unwrap();
        assert!(
            m0.inputs.contains_key("config libs/m/pyproject.toml"),
            "{:?}",
            m0.inputs
        );
        fs::write(
            w.join("libs/m/pyproject.toml"),
            "[project]\nname = \"m\"\n[build-system]\nrequires = [\"evil\"]\n",
        )
        .unwrap();
        assert_ne!(keys(VENV, w, None).unwrap().prefix(), m0.prefix());
    }

    /// Issue 29 item 3: a variable's recorded digest is keyed with the project's salt —
    /// not plain blake3's prefix (which an offline guesser could match), another per project,
    /// the same for one project's runs; the key itself is keyed too.
    #[test]
    fn digests_are_keyed_with_the_project_salt() {
        let d = setup_dir();
        let s = spec::parse(&format!("{NPM}env = {{ TOKEN = \"{{env:MY_TOKEN}}\" }}\n")).unwrap();
        let k = |salt: Option<[u8; 32]>| {
            let mut env = Environment::with_versions(None, &[("node", "v20.0.0")])
                .with_variables(&[("MY_TOKEN", "hunter2")]);
            if let Some(s) = salt {
                env = env.with_salt(KeySalt(s));
            }
            compute(&s.caches[0], &paths(d.path(), "/cache"), &env).unwrap()
        };
        let plain = blake3::hash(b"hunter2").to_hex()[..16].to_string();
        assert_eq!(plain, "55dcd1221c6686fb");
        let (p1, p2) = ([1u8; 32], [2u8; 32]);
        let a = k(Some(p1));
        let shown = &a.inputs["variable MY_TOKEN"];
        assert_eq!(shown.len(), 16);
        assert_ne!(shown, &plain);
        assert!(!serde_json::to_string(&a).unwrap().contains(&plain));
        let b = k(Some(p2));
        assert_ne!(
            b.inputs["variable MY_TOKEN"], *shown,
            "another project's digest"
        );
        assert_ne!(b.key, a.key);
        assert_ne!(b.prefix(), a.prefix(), "env8 is keyed too");
        let again = k(Some(p1));
        assert_eq!((again.key, &again.inputs), (a.key.clone(), &a.inputs));
        assert_eq!(
            k(None).inputs["variable MY_TOKEN"],
            plain,
            "unsalted: plain blake3"
        );
    }

    #[test]
    fn missing_tool_is_none() {
        assert_eq!(probe_version("layercache-no-such-tool"), "none");
    }
}
