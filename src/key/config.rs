//! The tool configuration a preset's setup reads, as key inputs: `npm ci`
//! runs the root and workspace packages' lifecycle scripts from `package.json` and reads
//! `.npmrc`; pnpm reads `pnpm-workspace.yaml` and `.pnpmfile.cjs`; uv reads `pyproject.toml`
//! and `uv.toml`; cargo reads the workspace's `Cargo.toml` files and `.cargo/config.toml`.
//! Two workspaces of one project with one lockfile but another `postinstall` must not share a
//! layer: what each file holds that shapes the tree enters the key
//! ([`crate::spec::ConfigPart`] says how much), as a digest only.

use std::fs;
use std::path::{Path, PathBuf};

use crate::error::{Error, IoContext, Result};
use crate::spec::{Cache, ConfigPart, Pattern};

/// One configuration file found: its path relative to the workdir, the part that is trusted
/// config (enters the restore-key prefix and the hash) and the part that is shape (the hash).
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub(super) struct ConfigInput {
    /// Relative to the workdir.
    pub rel: PathBuf,
    /// Trusted config: lifecycle scripts, tool settings (may be empty).
    pub trust: Vec<u8>,
    /// Shape: declared dependencies and the like (may be empty).
    pub shape: Vec<u8>,
}

/// The lifecycle scripts npm runs on install (npm docs, "scripts": "npm ci" and "npm install"
/// run `preinstall`, `install`, `postinstall`, `prepublish`, `preprepare`, `prepare`,
/// `postprepare`; `dependencies` runs after node_modules changes); yarn and pnpm run the same.
const LIFECYCLE: &[&str] = &[
    "preinstall",
    "install",
    "postinstall",
    "prepublish",
    "preprepare",
    "prepare",
    "postprepare",
    "dependencies",
];

/// package.json fields that decide what install may run or change (trusted config).
const PACKAGE_TRUST: &[&str] = &["packageManager", "pnpm"];

/// package.json fields that shape the installed tree (the lockfile follows them).
const PACKAGE_SHAPE: &[&str] = &[
    "name",
    "bin",
    "workspaces",
    "dependencies",
    "devDependencies",
    "optionalDependencies",
    "peerDependencies",
    "peerDependenciesMeta",
    "bundleDependencies",
    "bundledDependencies",
    "overrides",
    "resolutions",
    "dependenciesMeta",
    "installConfig",
];

/// Descriptive fields of `[project]` / `[tool.poetry]`: never keyed.
const PY_DESCRIPTIVE: &[&str] = &[
    "description",
    "readme",
    "authors",
    "maintainers",
    "keywords",
    "classifiers",
    "urls",
    "license",
    "license-files",
    "homepage",
    "repository",
    "documentation",
];

/// How many workspace members' package.json / pyproject.toml files may join the key.
const MAX_WORKSPACE_PACKAGES: usize = 4096;

/// The configuration inputs of `cache` (its preset's [`crate::spec::Preset::config_files`])
/// found under `workdir` (whose real path is `real_root`), sorted by path; a missing file is
/// fine; globs are walked skipping `skip` directories.
///
/// Errors: [`Error::Invalid`] naming the cache and file when one resolves (symlinks followed)
/// outside the workdir (never read); [`Error::Io`] when one cannot be read.
pub(super) fn inputs(
    cache: &Cache,
    workdir: &Path,
    real_root: &Path,
    skip: &[&str],
) -> Result<Vec<ConfigInput>> {
    let Some(preset) = cache.preset else {
        return Ok(Vec::new());
    };
    let id = cache.id.as_str();
    let mut out = Vec::new();
    for (pattern, part) in preset.config_files {
        for rel in matches(id, pattern, workdir, real_root, skip)? {
            let abs = workdir.join(&rel);
            let bytes = fs::read(&abs).at(&abs)?;
            match part {
                ConfigPart::Whole => out.push(whole(rel, bytes, true)),
                ConfigPart::WholeShape => out.push(whole(rel, bytes, false)),
                ConfigPart::Pyproject => {
                    out.push(pyproject(rel.clone(), &bytes));
                    let globs = uv_workspace_members(&bytes);
                    let members = members(id, &globs, "pyproject.toml", workdir, real_root, skip)?;
                    for ws in members.into_iter().filter(|ws| *ws != rel) {
                        let abs = workdir.join(&ws);
                        out.push(pyproject(ws, &fs::read(&abs).at(&abs)?));
                    }
                }
                ConfigPart::PackageJson => {
                    out.push(package_json(rel.clone(), &bytes));
                    let globs = workspace_globs(&bytes, workdir);
                    let members = members(id, &globs, "package.json", workdir, real_root, skip)?;
                    for ws in members.into_iter().filter(|ws| *ws != rel) {
                        let abs = workdir.join(&ws);
                        out.push(package_json(ws, &fs::read(&abs).at(&abs)?));
                    }
                }
            }
        }
    }
    // A file holding nothing that counts does what no file does.
    out.retain(|c| !(c.trust.is_empty() && c.shape.is_empty()));
    out.sort();
    out.dedup_by(|a, b| a.rel == b.rel);
    Ok(out)
}

/// The `file` (package.json, pyproject.toml) of every workspace member directory `globs` name
/// under `workdir`, at most [`MAX_WORKSPACE_PACKAGES`]; negated (`!…`), absolute and `..`
/// globs are left out.
fn members(
    id: &str,
    globs: &[String],
    file: &str,
    workdir: &Path,
    real_root: &Path,
    skip: &[&str],
) -> Result<Vec<PathBuf>> {
    let mut out = Vec::new();
    for g in globs {
        if g.is_empty() || g.starts_with(['!', '/']) || g.split('/').any(|c| c == "..") {
            continue;
        }
        let pat = format!("{}/{file}", g.trim_end_matches('/'));
        out.extend(matches(id, &pat, workdir, real_root, skip)?);
        out.truncate(MAX_WORKSPACE_PACKAGES);
    }
    Ok(out)
}

/// `[tool.uv.workspace] members` of a pyproject.toml (uv's workspace docs).
fn uv_workspace_members(bytes: &[u8]) -> Vec<String> {
    let parsed = std::str::from_utf8(bytes)
        .ok()
        .and_then(|t| toml::from_str::<toml::Table>(t).ok());
    let members = parsed.as_ref().and_then(|t| {
        t.get("tool")?
            .get("uv")?
            .get("workspace")?
            .get("members")?
            .as_array()
            .cloned()
    });
    (members.into_iter().flatten())
        .filter_map(|m| m.as_str().map(String::from))
        .collect()
}

/// The files `pattern` names under `workdir` (relative), each checked to resolve inside it.
fn matches(
    id: &str,
    pattern: &str,
    workdir: &Path,
    real_root: &Path,
    skip: &[&str],
) -> Result<Vec<PathBuf>> {
    let glob = Pattern::new(pattern)
        .map_err(|e| Error::invalid(format!("cache {id:?}: config file {pattern:?}: {e}")))?;
    let mut found = Vec::new();
    glob.walk(workdir, skip, true, &mut found)?;
    for rel in &found {
        super::check_inside(id, pattern, workdir, real_root, rel)?;
    }
    Ok(found)
}

fn whole(rel: PathBuf, bytes: Vec<u8>, trusted: bool) -> ConfigInput {
    let (trust, shape) = if trusted {
        (bytes, Vec::new())
    } else {
        (Vec::new(), bytes)
    };
    ConfigInput { rel, trust, shape }
}

/// The parts of a package.json ([`ConfigPart::PackageJson`]); one that does not parse counts
/// whole as trusted config (the tool will refuse it anyway).
fn package_json(rel: PathBuf, bytes: &[u8]) -> ConfigInput {
    let Ok(serde_json::Value::Object(m)) = serde_json::from_slice::<serde_json::Value>(bytes)
    else {
        return whole(rel, bytes.to_vec(), true);
    };
    let pick = |fields: &[&str]| -> serde_json::Map<String, serde_json::Value> {
        (fields.iter())
            .filter_map(|f| Some((f.to_string(), m.get(*f)?.clone())))
            .collect()
    };
    let mut trust = pick(PACKAGE_TRUST);
    if let Some(serde_json::Value::Object(scripts)) = m.get("scripts") {
        let life: serde_json::Map<_, _> = (LIFECYCLE.iter())
            .filter_map(|s| Some((s.to_string(), scripts.get(*s)?.clone())))
            .collect();
        if !life.is_empty() {
            trust.insert("scripts".into(), life.into());
        }
    }
    let shape = pick(PACKAGE_SHAPE);
    ConfigInput {
        rel,
        trust: canonical(trust),
        shape: canonical(shape),
    }
}

/// The workspace globs of a root package.json (`workspaces: [...]` or `workspaces:
/// {packages: [...]}`, npm and yarn) and of `pnpm-workspace.yaml`'s `packages:` list beside
/// it.
fn workspace_globs(package_json: &[u8], workdir: &Path) -> Vec<String> {
    let mut globs: Vec<String> = Vec::new();
    if let Ok(v) = serde_json::from_slice::<serde_json::Value>(package_json) {
        let list = match v.get("workspaces") {
            Some(serde_json::Value::Array(a)) => Some(a),
            Some(serde_json::Value::Object(o)) => o.get("packages").and_then(|p| p.as_array()),
            _ => None,
        };
        globs.extend(
            list.into_iter()
                .flatten()
                .filter_map(|g| g.as_str().map(String::from)),
        );
    }
    if let Ok(text) = fs::read_to_string(workdir.join("pnpm-workspace.yaml")) {
        globs.extend(pnpm_packages(&text));
    }
    globs.sort();
    globs.dedup();
    globs
}

/// The `packages:` list of a pnpm-workspace.yaml (block style `- 'glob'` items, or a flow
/// list `[a, b]`), enough of YAML for the file pnpm documents.
fn pnpm_packages(text: &str) -> Vec<String> {
    let unquote = |s: &str| {
        let s = s.split(" #").next().unwrap_or("").trim();
        s.trim_matches(['"', '\'']).to_string()
    };
    let mut out = Vec::new();
    let mut inside = false;
    for line in text.lines() {
        let t = line.trim_end();
        if t.trim_start().starts_with('#') || t.trim().is_empty() {
            continue;
        }
        if !t.starts_with([' ', '\t', '-']) {
            inside = false;
            if let Some(rest) = t.strip_prefix("packages:") {
                let rest = rest.trim();
                if let Some(flow) = rest.strip_prefix('[').and_then(|r| r.strip_suffix(']')) {
                    out.extend(flow.split(',').map(unquote).filter(|s| !s.is_empty()));
                } else {
                    inside = true;
                }
            }
            continue;
        }
        if inside && let Some(item) = t.trim_start().strip_prefix('-') {
            out.push(unquote(item));
        }
    }
    out
}

/// The parts of a pyproject.toml ([`ConfigPart::Pyproject`]); one that does not parse counts
/// whole as trusted config.
fn pyproject(rel: PathBuf, bytes: &[u8]) -> ConfigInput {
    let parsed = std::str::from_utf8(bytes)
        .ok()
        .and_then(|t| toml::from_str::<toml::Table>(t).ok());
    let Some(t) = parsed else {
        return whole(rel, bytes.to_vec(), true);
    };
    let json = |v: &toml::Value| serde_json::to_value(v).unwrap_or_default();
    let without_descriptive = |v: &toml::Value| {
        let mut j = json(v);
        if let Some(o) = j.as_object_mut() {
            for f in PY_DESCRIPTIVE {
                o.remove(*f);
            }
        }
        j
    };
    let tool = |name: &str| t.get("tool").and_then(|x| x.get(name));
    let mut trust = serde_json::Map::new();
    if let Some(b) = t.get("build-system") {
        trust.insert("build-system".into(), json(b));
    }
    if let Some(uv) = tool("uv") {
        trust.insert("tool.uv".into(), json(uv));
    }
    let mut shape = serde_json::Map::new();
    if let Some(p) = t.get("project") {
        shape.insert("project".into(), without_descriptive(p));
    }
    if let Some(g) = t.get("dependency-groups") {
        shape.insert("dependency-groups".into(), json(g));
    }
    if let Some(p) = tool("poetry") {
        shape.insert("tool.poetry".into(), without_descriptive(p));
    }
    ConfigInput {
        rel,
        trust: canonical(trust),
        shape: canonical(shape),
    }
}

/// A JSON object's bytes with sorted keys (serde_json's map is ordered), empty when empty.
fn canonical(m: serde_json::Map<String, serde_json::Value>) -> Vec<u8> {
    if m.is_empty() {
        return Vec::new();
    }
    serde_json::to_vec(&serde_json::Value::Object(m)).unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn package_json_parts() {
        let a = br#"{"name":"app","version":"1.0.0","description":"x",
            "scripts":{"test":"jest","postinstall":"node fix.js"},
            "dependencies":{"lodash":"^4"},"workspaces":["packages/*"]}"#;
        let p = package_json("package.json".into(), a);
        let trust = String::from_utf8(p.trust.clone()).unwrap();
        let shape = String::from_utf8(p.shape.clone()).unwrap();
        assert_eq!(trust, r#"{"scripts":{"postinstall":"node fix.js"}}"#);
        assert!(
            shape.contains("lodash") && shape.contains("packages/*"),
            "{shape}"
        );
        assert!(
            !shape.contains("jest") && !shape.contains("1.0.0"),
            "{shape}"
        );
        // Another description, version or test script: the same parts.
        let b = br#"{"scripts":{"postinstall":"node fix.js","test":"mocha"},"version":"2",
            "name":"app","workspaces":["packages/*"],"dependencies":{"lodash":"^4"}}"#;
        assert_eq!(package_json("package.json".into(), b), p);
        // Not JSON: all of it, as trusted config.
        let bad = package_json("package.json".into(), b"{nope");
        assert_eq!(bad.trust, b"{nope");
    }

    #[test]
    fn pnpm_workspace_packages() {
        let y = "# ws\npackages:\n  - 'packages/*'\n  - \"apps/**\"  # all\n  - '!**/test/**'\n\
                 onlyBuiltDependencies:\n  - esbuild\n";
        assert_eq!(pnpm_packages(y), ["packages/*", "apps/**", "!**/test/**"]);
        assert_eq!(pnpm_packages("packages: [a/*, 'b']\n"), ["a/*", "b"]);
    }

    #[test]
    fn pyproject_parts() {
        let a = b"[project]\nname = \"x\"\ndescription = \"d\"\ndependencies = [\"six\"]\n\
                  [build-system]\nrequires = [\"hatchling\"]\n[tool.uv]\nindex-url = \"https://i\"\n\
                  [tool.ruff]\nline-length = 100\n";
        let p = pyproject("pyproject.toml".into(), a);
        let trust = String::from_utf8(p.trust.clone()).unwrap();
        let shape = String::from_utf8(p.shape.clone()).unwrap();
        assert!(
            trust.contains("hatchling") && trust.contains("https://i"),
            "{trust}"
        );
        assert!(shape.contains("six") && !shape.contains("\"d\""), "{shape}");
        assert!(!trust.contains("ruff") && !shape.contains("ruff"));
        let b = b"[project]\nname = \"x\"\ndescription = \"other\"\ndependencies = [\"six\"]\n\
                  [build-system]\nrequires = [\"hatchling\"]\n[tool.uv]\nindex-url = \"https://i\"\n";
        assert_eq!(pyproject("pyproject.toml".into(), b), p);
    }
}
