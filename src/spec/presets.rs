//! The built-in presets (`layercache presets`): what each package manager's cache needs so a
//! spec only names it.

use std::collections::BTreeMap;

/// A built-in preset: what a package manager's cache needs so users only name it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Preset {
    /// The name used in `preset = "…"`.
    pub name: &'static str,
    /// Bumped when the preset's behaviour changes, so old layers are not reused; enters the key.
    pub version: u32,
    /// One line for `layercache presets`.
    pub description: &'static str,
    /// Key file patterns relative to the workdir (`*` within a name, `**/` any directories);
    /// at least one file must match.
    pub key_files: &'static [&'static str],
    /// Whether `key_files` are alternatives tried in order, as the setup's `if … elif` picks
    /// its installer: the first pattern that matches a file gives the key files, the later ones
    /// are left out of the key (the venv preset: uv.lock, else poetry.lock, else
    /// requirements.txt). `false`: every match is a key file. Applies to the preset's own
    /// `key_files` only; a spec's `key_files` are all read.
    pub key_files_first: bool,
    /// Whether key files ending in `.txt` or `.in` are pip requirements files whose `-r` /
    /// `--requirement` and `-c` / `--constraint` includes (relative to the including file, as
    /// pip reads them) join the key, recursively (see [`crate::key::compute`]).
    pub requirement_includes: bool,
    /// Environment the package manager reads its cache location from (templates, module docs).
    pub env: &'static [(&'static str, &'static str)],
    /// Where the cache is mounted when the spec names no `mountpoint`; `None` means
    /// `<mount-root>/<id>`.
    pub mountpoint: Option<&'static str>,
    /// Default setup script (run with `sh -c` in the workdir on a miss, and on a restore when
    /// `restore_setup` is `None`): a clean install.
    pub setup: &'static str,
    /// Default script for a restore (the mount holds the nearest older layer): brings that tree
    /// to the current key files touching only what changed; `None` runs `setup`.
    pub restore_setup: Option<&'static str>,
    /// Default maintenance script (run on a hit); `None` runs nothing.
    pub maintenance: Option<&'static str>,
    /// Tools whose `--version` enters the key's environment fingerprint.
    pub tools: &'static [&'static str],
    /// Paths (patterns relative to the mount) removed before promotion.
    pub exclude: &'static [&'static str],
    /// The tool configuration files its setup's tool reads that shape the tree (patterns
    /// relative to the workdir, each with how much of it counts: [`ConfigPart`]); each that
    /// exists enters the key as a digest (an `.npmrc` may hold a token) and, for what decides
    /// what setup may do to the tree (lifecycle scripts, tool config), the restore-key prefix
    /// too. Missing ones are fine. Read also when the spec names its own `key_files`.
    pub config_files: &'static [(&'static str, ConfigPart)],
    /// Whether the tree it fills can be used at another path: a package manager's download
    /// cache or a `node_modules` can (its key leaves the view path out, so per-run workspaces
    /// share layers); a venv or cargo's target dir embed absolute paths (their key includes
    /// the view path — see `--workdir-view`).
    pub relocatable: bool,
}

/// How much of a tool configuration file ([`Preset::config_files`]) enters the key. The key
/// holds digests only; a part is either *trusted config* — what decides what setup may run or
/// change (lifecycle scripts, hooks, registry and tool settings): it enters the restore-key
/// prefix too, so a tree made under other such config is never restored from (an incremental
/// install keeps a postinstall's edits) — or *shape* — what changes with the lockfile
/// (declared dependencies): the key's hash only, so a dependency bump still restores.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ConfigPart {
    /// The whole file, as trusted config (`.npmrc`, `.yarnrc.yml`, `pnpm-workspace.yaml`,
    /// `.pnpmfile.cjs`, `uv.toml`, `.cargo/config.toml`, `rust-toolchain.toml`…).
    Whole,
    /// The whole file, as shape (`Cargo.toml`: its dependencies change with `Cargo.lock`).
    WholeShape,
    /// A `package.json` (npm's package.json docs, "scripts" and the fields `npm ci`, pnpm and
    /// yarn read to install): its install lifecycle scripts (`preinstall`, `install`,
    /// `postinstall`, `prepublish`, `preprepare`, `prepare`, `postprepare`, `dependencies`),
    /// `packageManager` and the `pnpm` field as trusted config; `name`, `bin`, `workspaces`,
    /// the dependency fields, `overrides`, `resolutions`, `dependenciesMeta`, `installConfig`
    /// as shape; never `description`, `version`, other scripts… The same parts of every
    /// workspace package it names (`workspaces`, or `packages` of `pnpm-workspace.yaml`) join.
    PackageJson,
    /// A `pyproject.toml` (PEP 517/518/621/735): `[build-system]` and `[tool.uv]` as trusted
    /// config; `[project]`, `[dependency-groups]` and `[tool.poetry]` without their
    /// descriptive fields (description, readme, authors, keywords, classifiers, urls, license…)
    /// as shape. The same parts of every uv workspace member it names
    /// (`[tool.uv.workspace] members`) join.
    Pyproject,
}

/// The node presets' configuration: what npm, pnpm and yarn read in the project.
const NODE_CONFIG: &[(&str, ConfigPart)] = &[
    ("package.json", ConfigPart::PackageJson),
    (".npmrc", ConfigPart::Whole),
    (".yarnrc", ConfigPart::Whole),
    (".yarnrc.yml", ConfigPart::Whole),
    ("pnpm-workspace.yaml", ConfigPart::Whole),
    (".pnpmfile.cjs", ConfigPart::Whole),
    (".pnpmfile.mjs", ConfigPart::Whole),
];

/// The Python presets' configuration: what uv, poetry and pip read in the project.
const PYTHON_CONFIG: &[(&str, ConfigPart)] = &[
    ("pyproject.toml", ConfigPart::Pyproject),
    ("uv.toml", ConfigPart::Whole),
    ("poetry.toml", ConfigPart::Whole),
    ("pip.conf", ConfigPart::Whole),
    (".python-version", ConfigPart::Whole),
];

/// Cargo's configuration in the project (the cargo preset: where crates come from).
const CARGO_CONFIG: &[(&str, ConfigPart)] = &[
    (".cargo/config.toml", ConfigPart::Whole),
    (".cargo/config", ConfigPart::Whole),
];

/// The cargo-target preset: also the workspace's manifests and the pinned toolchain.
const CARGO_TARGET_CONFIG: &[(&str, ConfigPart)] = &[
    ("**/Cargo.toml", ConfigPart::WholeShape),
    (".cargo/config.toml", ConfigPart::Whole),
    (".cargo/config", ConfigPart::Whole),
    ("rust-toolchain.toml", ConfigPart::Whole),
    ("rust-toolchain", ConfigPart::Whole),
];

const NODE_SETUP: &str = "if [ -f pnpm-lock.yaml ]; then pnpm install --frozen-lockfile; \
elif [ -f yarn.lock ]; then yarn install --frozen-lockfile; \
else npm ci --no-audit --no-fund; fi";

/// The node_modules preset on a restore: each tool's own install diffs the restored tree against
/// the lockfile and touches only what changed (`npm ci` would delete node_modules first).
/// `--no-save`: the workdir's package.json and lockfile are never rewritten. npm's
/// `npm ci --dry-run` first refuses a lockfile out of sync with package.json as the clean
/// `npm ci` of a miss does (`npm install` would install from package.json instead), and
/// changes nothing.
const NODE_RESTORE: &str = "if [ -f pnpm-lock.yaml ]; then \
pnpm install --frozen-lockfile --prefer-offline --config.confirmModulesPurge=false; \
elif [ -f yarn.lock ]; then yarn install --frozen-lockfile --prefer-offline; \
else npm ci --dry-run --no-audit --no-fund >/dev/null && \
npm install --prefer-offline --no-audit --no-fund --no-save; fi";

/// The venv preset's setup (v2): the venv is made by the tool of the lockfile it is
/// keyed on — `uv sync --frozen` for uv.lock (uv makes `.venv` itself, from the lock alone),
/// poetry for poetry.lock (`poetry install --no-root` into the venv made first, which poetry
/// uses as the active one: `VIRTUAL_ENV` is the mount), else pip for requirements.txt; v1 ran
/// pip in every case and failed in a uv or poetry project without a requirements.txt.
const VENV_SETUP: &str = "if [ -f uv.lock ]; then uv sync --frozen; \
elif [ -f poetry.lock ]; then python3 -m venv .venv && poetry install --no-root --no-interaction; \
else python3 -m venv .venv && .venv/bin/pip install -r requirements.txt; fi";

/// The venv preset on a restore: for uv.lock `uv sync --frozen` and for poetry.lock
/// `poetry sync --no-root` (each brings the restored venv to exactly the lock: adds, upgrades
/// and removes); for requirements.txt `pip install -r` upgrades/adds what changed, then every
/// distribution no longer reachable from requirements.txt (its `-r` includes, extras and
/// environment markers followed through the installed metadata) is uninstalled, as `pip-sync`
/// does; `pip` itself (and `setuptools` before Python 3.12, as `python3 -m venv` installs it)
/// stays. Written without braces, which are template syntax.
pub(super) const VENV_RESTORE: &str = r#"if [ -f uv.lock ]; then uv sync --frozen; elif [ -f poetry.lock ]; then poetry sync --no-root --no-interaction; else
.venv/bin/pip install -r requirements.txt && .venv/bin/python - requirements.txt <<'LAYERCACHE_PY'
import os, re, subprocess, sys
from importlib import metadata
from pip._vendor.packaging.requirements import Requirement
from pip._vendor.packaging.utils import canonicalize_name as canon
def lines(path):
    for raw in open(path, encoding='utf-8'):
        line = re.sub(r'(^|\s)#.*', '', raw).strip()
        if re.match(r'(-r|--requirement)(\s|=)', line):
            inc = re.split(r'[\s=]+', line, maxsplit=1)[1]
            yield from lines(os.path.join(os.path.dirname(path), inc))
        elif line and not line.startswith('-'):
            yield line
def active(req, extras):
    return req.marker is None or any(req.marker.evaluate(dict(extra=e)) for e in extras)
dists = dict((canon(d.metadata['Name']), d) for d in metadata.distributions())
todo = [(Requirement(l), ['']) for l in lines(sys.argv[1])]
keep, seen = set(['pip']), set()
if sys.version_info < (3, 12):
    keep.add('setuptools')
while todo:
    req, extras = todo.pop()
    name, ex = canon(req.name), tuple(sorted(req.extras))
    if not active(req, extras) or name not in dists or (name, ex) in seen:
        continue
    seen.add((name, ex))
    keep.add(name)
    for dep in dists[name].requires or []:
        todo.append((Requirement(dep), [''] + list(ex)))
gone = sorted(set(dists) - keep)
if gone:
    print('layercache: uninstalling what requirements.txt no longer needs:', *gone, file=sys.stderr)
    subprocess.check_call([sys.executable, '-m', 'pip', 'uninstall', '-y', '-q'] + gone)
LAYERCACHE_PY
fi"#;

/// Maintenance of a package manager's download cache on a hit: install the project's tree from
/// the cache, unless that tree is a mount of its own (another cache of the run, e.g. the
/// node_modules or venv preset), which is already the tree of these key files — reinstalling
/// it would undo that cache's hit.
/// A script that does nothing when directory `$dir` of the workdir is a mount point (a cache of
/// the run viewed there: the download caches' maintenance when `node_modules` is cached too),
/// else runs `$install`. [`unless_mounted_dir`] reads the form back.
macro_rules! unless_mounted {
    ($dir:literal, $install:literal) => {
        concat!("mountpoint -q ", $dir, " 2>/dev/null || ", $install)
    };
}

/// The npm preset's setup (v2). With the node_modules preset in the same spec (listed first, as
/// README's example does), that cache's `npm ci` runs with `npm_config_cache` on this mount
/// and fills it; a second `npm ci` here would delete and reinstall the whole tree only to
/// download nothing. So when `node_modules` is a mount of the run and this mount already holds
/// something — on a miss it starts empty, so only an earlier setup of this run put it there; on
/// a restore it is the older cache the node_modules restore install has just topped up — the
/// install is skipped. Otherwise (no node_modules cache, or it hit and this cache missed) it
/// installs as before.
const NPM_SETUP: &str = r#"if mountpoint -q node_modules 2>/dev/null && [ -n "$(ls -A "$LAYERCACHE_MOUNT")" ]; then echo "layercache: npm cache: filled by the node_modules install of this run; not installing again" >&2; else npm ci --no-audit --no-fund; fi"#;

/// The gradle preset's setup: resolves the files of every resolvable configuration of every
/// project (an init script adds the task), so `gradle --offline` builds from the cache. The
/// `dependencies` task it ran before resolves only the graph: the cache held POMs and no jars,
/// and an offline build failed (found by tests/presets.rs).
const GRADLE_SETUP: &str = "init=$(mktemp) && printf '%s\\n' 'allprojects { task layercacheResolve \
{ doLast { configurations.findAll { it.canBeResolved }.each { it.resolve() } } } }' > \"$init\" \
&& if [ -x ./gradlew ]; then ./gradlew --no-daemon -q -I \"$init\" layercacheResolve; \
else gradle --no-daemon -q -I \"$init\" layercacheResolve; fi; s=$?; rm -f \"$init\"; exit $s";

/// The built-in presets, in the order `layercache presets` lists them.
pub const PRESETS: &[Preset] = &[
    Preset {
        name: "npm",
        // v3: keyed on the tool configuration it reads too (config_files).
        version: 3,
        description: "npm's download cache (npm_config_cache)",
        key_files: &["package-lock.json", "npm-shrinkwrap.json"],
        key_files_first: false,
        requirement_includes: false,
        env: &[("npm_config_cache", "{mount}")],
        mountpoint: None,
        setup: NPM_SETUP,
        restore_setup: None,
        maintenance: Some(unless_mounted!(
            "node_modules",
            "npm ci --prefer-offline --no-audit --no-fund"
        )),
        tools: &["node"],
        // npm's debug logs of the setup run (`_logs/<time>-debug-0.log`): not cache content.
        exclude: &["_logs"],
        config_files: NODE_CONFIG,
        relocatable: true,
    },
    Preset {
        name: "pnpm",
        // v2: keyed on the tool configuration it reads too (config_files).
        version: 2,
        description: "pnpm's content-addressed store (npm_config_store_dir)",
        key_files: &["pnpm-lock.yaml"],
        key_files_first: false,
        requirement_includes: false,
        env: &[("npm_config_store_dir", "{mount}")],
        mountpoint: None,
        setup: "pnpm install --frozen-lockfile",
        restore_setup: None,
        maintenance: Some(unless_mounted!(
            "node_modules",
            "pnpm install --frozen-lockfile --prefer-offline"
        )),
        tools: &["node"],
        exclude: &[],
        config_files: NODE_CONFIG,
        relocatable: true,
    },
    Preset {
        name: "yarn",
        // v2: keyed on the tool configuration it reads too (config_files).
        version: 2,
        description: "yarn's download cache (YARN_CACHE_FOLDER)",
        key_files: &["yarn.lock"],
        key_files_first: false,
        requirement_includes: false,
        env: &[("YARN_CACHE_FOLDER", "{mount}")],
        mountpoint: None,
        setup: "yarn install --frozen-lockfile",
        restore_setup: None,
        maintenance: Some(unless_mounted!(
            "node_modules",
            "yarn install --frozen-lockfile --prefer-offline"
        )),
        tools: &["node"],
        exclude: &[],
        config_files: NODE_CONFIG,
        relocatable: true,
    },
    Preset {
        name: "pip",
        version: 2,
        description: "pip's HTTP and wheel cache (PIP_CACHE_DIR)",
        key_files: &["requirements*.txt", "constraints*.txt"],
        key_files_first: false,
        requirement_includes: true,
        env: &[("PIP_CACHE_DIR", "{mount}")],
        mountpoint: None,
        // Fills the cache without installing anything: a bare `pip install` would install into
        // whatever Python is first on PATH — the host's, outside a sandbox. Installing is the
        // venv preset's job (its pip sees PIP_CACHE_DIR too).
        setup: "d=$(mktemp -d) && pip download -q -r requirements.txt -d \"$d\"; s=$?; \
                rm -rf \"$d\"; exit $s",
        restore_setup: None,
        maintenance: None,
        tools: &["python3"],
        exclude: &[],
        config_files: &[],
        relocatable: true,
    },
    Preset {
        name: "uv",
        // v2: keyed on the tool configuration it reads too (config_files).
        version: 2,
        description: "uv's cache (UV_CACHE_DIR)",
        key_files: &["uv.lock"],
        key_files_first: false,
        requirement_includes: false,
        // The cache and the venv are separate mounts (another filesystem to uv): copy instead
        // of trying hardlinks, which uv warns about on every miss.
        env: &[("UV_CACHE_DIR", "{mount}"), ("UV_LINK_MODE", "copy")],
        mountpoint: None,
        setup: "uv sync --frozen",
        restore_setup: None,
        maintenance: Some(unless_mounted!(".venv", "uv sync --frozen --offline")),
        tools: &["python3"],
        exclude: &[],
        config_files: PYTHON_CONFIG,
        relocatable: true,
    },
    Preset {
        name: "go",
        version: 1,
        description: "Go module and build caches (GOMODCACHE={mount}/mod, GOCACHE={mount}/build)",
        key_files: &["**/go.sum", "**/go.mod"],
        key_files_first: false,
        requirement_includes: false,
        env: &[("GOMODCACHE", "{mount}/mod"), ("GOCACHE", "{mount}/build")],
        mountpoint: None,
        setup: "go mod download",
        restore_setup: None,
        maintenance: None,
        tools: &["go"],
        exclude: &[],
        config_files: &[],
        relocatable: true,
    },
    Preset {
        name: "cargo",
        // v2: keyed on the tool configuration it reads too (config_files).
        version: 2,
        description: "Cargo's registry and git caches (CARGO_HOME; bin/ and credentials are dropped)",
        key_files: &["Cargo.lock"],
        key_files_first: false,
        requirement_includes: false,
        env: &[("CARGO_HOME", "{mount}")],
        mountpoint: None,
        setup: "cargo fetch --locked",
        restore_setup: None,
        maintenance: None,
        tools: &["rustc"],
        exclude: &["bin", "credentials", "credentials.toml", ".package-cache"],
        config_files: CARGO_CONFIG,
        relocatable: true,
    },
    Preset {
        name: "maven",
        version: 1,
        description: "Maven's local repository (-Dmaven.repo.local via MAVEN_OPTS)",
        key_files: &["**/pom.xml"],
        key_files_first: false,
        requirement_includes: false,
        env: &[("MAVEN_OPTS", "-Dmaven.repo.local={mount} {env:MAVEN_OPTS}")],
        mountpoint: None,
        setup: "mvn -B -q dependency:go-offline",
        restore_setup: None,
        maintenance: None,
        tools: &["java"],
        exclude: &[],
        config_files: &[],
        relocatable: true,
    },
    Preset {
        name: "gradle",
        version: 2,
        description: "Gradle's user home caches (GRADLE_USER_HOME)",
        key_files: &[
            "**/*.gradle*",
            "**/gradle-wrapper.properties",
            "**/libs.versions.toml",
        ],
        key_files_first: false,
        requirement_includes: false,
        env: &[("GRADLE_USER_HOME", "{mount}")],
        mountpoint: None,
        setup: GRADLE_SETUP,
        restore_setup: None,
        maintenance: None,
        tools: &["java"],
        exclude: &["gradle.properties"],
        config_files: &[],
        relocatable: true,
    },
    Preset {
        name: "node_modules",
        // v2: keyed on the tool configuration it reads too (config_files).
        version: 2,
        description: "the installed node_modules tree, mounted at <workdir>/node_modules",
        key_files: &[
            "package-lock.json",
            "npm-shrinkwrap.json",
            "pnpm-lock.yaml",
            "yarn.lock",
        ],
        key_files_first: false,
        requirement_includes: false,
        env: &[],
        mountpoint: Some("{workdir}/node_modules"),
        setup: NODE_SETUP,
        restore_setup: Some(NODE_RESTORE),
        maintenance: None,
        tools: &["node"],
        exclude: &[],
        config_files: NODE_CONFIG,
        relocatable: true,
    },
    Preset {
        name: "venv",
        // v3: keyed on the inputs of the installer its setup runs (the first of uv.lock,
        // poetry.lock, requirements.txt with its includes), not on all of them; v4: keyed on
        // the tool configuration it reads too (config_files).
        version: 4,
        description: "a Python virtualenv, mounted at <workdir>/.venv",
        key_files: &["uv.lock", "poetry.lock", "requirements.txt"],
        key_files_first: true,
        requirement_includes: true,
        env: &[
            ("VIRTUAL_ENV", "{mount}"),
            ("PATH", "{mount}/bin:{env:PATH}"),
            // uv's cache is on another filesystem than this mount: copy, without a warning.
            ("UV_LINK_MODE", "copy"),
        ],
        mountpoint: Some("{workdir}/.venv"),
        setup: VENV_SETUP,
        restore_setup: Some(VENV_RESTORE),
        maintenance: None,
        tools: &["python3"],
        exclude: &[],
        config_files: PYTHON_CONFIG,
        relocatable: false,
    },
    Preset {
        name: "cargo-target",
        // v2: keyed on the tool configuration it reads too (config_files).
        version: 2,
        description: "Cargo's build output (CARGO_TARGET_DIR), so dependencies are not rebuilt",
        key_files: &["Cargo.lock"],
        key_files_first: false,
        requirement_includes: false,
        env: &[("CARGO_TARGET_DIR", "{mount}")],
        mountpoint: None,
        setup: "cargo build",
        restore_setup: None,
        maintenance: None,
        tools: &["rustc"],
        exclude: &[],
        config_files: CARGO_TARGET_CONFIG,
        relocatable: false,
    },
];

/// The directory a script of the form `mountpoint -q DIR 2>/dev/null || COMMAND` (what the
/// download caches' maintenance is, see `unless_mounted!`) tests: the script does nothing when
/// DIR, one plain name relative to the workdir, is a mount point. A run that mounts a cache
/// there knows the answer and need not start the script. `None` for a script of another form,
/// and when COMMAND could run something after the test's answer (it holds `;`, `&`, `|`, a
/// parenthesis or a line break: `… || a; b` runs `b` either way).
pub fn unless_mounted_dir(script: &str) -> Option<&str> {
    let (dir, command) = (script.strip_prefix("mountpoint -q ")?).split_once(" 2>/dev/null || ")?;
    let simple =
        !command.trim().is_empty() && !command.contains([';', '&', '|', '(', ')', '\n', '\r']);
    let plain = |b: u8| b.is_ascii_alphanumeric() || b"._-".contains(&b);
    (simple && dir.bytes().all(plain) && !matches!(dir, "" | "." | "..")).then_some(dir)
}

/// Looks up a preset by name.
pub fn preset(name: &str) -> Option<&'static Preset> {
    PRESETS.iter().find(|p| p.name == name)
}

/// `layercache presets`: one line per preset (or a JSON array with `--json`).
pub fn presets_text(json: bool) -> String {
    if json {
        let list: Vec<_> = PRESETS
            .iter()
            .map(|p| {
                serde_json::json!({
                    "name": p.name,
                    "version": p.version,
                    "description": p.description,
                    "key_files": p.key_files,
                    "key_files_first": p.key_files_first,
                    "requirement_includes": p.requirement_includes,
                    "env": p.env.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect::<BTreeMap<_, _>>(),
                    "mountpoint": p.mountpoint.unwrap_or("{mount_root}/{id}"),
                    "setup": p.setup,
                    "restore_setup": p.restore_setup,
                    "maintenance": p.maintenance,
                    "tools": p.tools,
                    "exclude": p.exclude,
                    "relocatable": p.relocatable,
                    "config_files": p.config_files.iter().map(|(f, _)| *f).collect::<Vec<_>>(),
                })
            })
            .collect();
        return serde_json::Value::Array(list).to_string() + "\n";
    }
    let mut out = String::new();
    for p in PRESETS {
        out.push_str(&format!("{:<13} {}\n", p.name, p.description));
        out.push_str(&format!(
            "{:<13}   key files: {}{}{}\n",
            "",
            if p.key_files_first {
                "the first found of "
            } else {
                ""
            },
            p.key_files.join(", "),
            if p.requirement_includes {
                " (with their -r/-c includes)"
            } else {
                ""
            }
        ));
        if !p.config_files.is_empty() {
            let files: Vec<&str> = p.config_files.iter().map(|(f, _)| *f).collect();
            out.push_str(&format!(
                "{:<13}   tool config (as digests): {}\n",
                "",
                files.join(", ")
            ));
        }
        let env: Vec<String> = p.env.iter().map(|(k, v)| format!("{k}={v}")).collect();
        if !env.is_empty() {
            out.push_str(&format!("{:<13}   env: {}\n", "", env.join(" ")));
        }
        out.push_str(&format!(
            "{:<13}   mountpoint: {}\n",
            "",
            p.mountpoint.unwrap_or("{mount_root}/{id}")
        ));
        out.push_str(&format!("{:<13}   setup: {}\n", "", p.setup));
        if let Some(r) = p.restore_setup {
            out.push_str(&format!("{:<13}   restore setup: {r}\n", ""));
        }
        if let Some(m) = p.maintenance {
            out.push_str(&format!("{:<13}   maintenance: {m}\n", ""));
        }
        if !p.exclude.is_empty() {
            out.push_str(&format!("{:<13}   exclude: {}\n", "", p.exclude.join(", ")));
        }
        if !p.relocatable {
            out.push_str(&format!(
                "{:<13}   path-bound: the view path enters the key\n",
                ""
            ));
        }
    }
    out
}
