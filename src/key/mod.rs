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

#![forbid(unsafe_code)]

use std::collections::BTreeMap;
use std::fs;
use std::path::{Path, PathBuf};

use crate::error::{Error, IoContext, Result};
use crate::ids::{CacheId, CacheKey};
use crate::spec::{Cache, Paths, Pattern};

mod config;
mod env;
mod includes;

pub use env::{Environment, KeySalt, start_probes};
use includes::{check_inside, follow_includes};

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
    #[cfg(test)]
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
mod tests;
