//! Every package-manager preset proven on its real tool (issue 11): `go`, `pnpm`, `yarn`, `uv`,
//! `maven`, `gradle`, each on its fixture in examples/; and `venv` on uv and poetry projects.
//!
//! Each test goes through the CLI only and asserts outcomes: run 1 misses, its setup (the
//! preset's default) fills the cache and the layer is published; the installed tree in the
//! workdir is then removed, and run 2 hits (`--json` summary and events.jsonl) and its COMMAND
//! installs or builds with the tool's offline mode in a fresh network namespace (`unshare
//! --net`: no network at all), so everything it needs came from the layer. Nothing here looks at
//! where a run's mounts live on the host.
//!
//! Tools: Debian's golang-go (modules from a `file://` GOPROXY that scripts/goproxy.py builds from
//! Debian's golang-*-dev packages), pnpm and yarn from the npm registry, uv and poetry from PyPI (their first runs install
//! from PyPI itself, as a user's would), Debian's
//! maven with Debian's /usr/share/maven-repo as the only repository (the fixture's
//! .mvn/settings.xml), Debian's gradle with the same repository served over HTTP on 127.0.0.1
//! (Gradle reads a `file://` repository in place and caches nothing from it).
//! scripts/test.sh installs them all (scripts/lib-fixtures.sh).

use std::io::BufRead;
use std::path::Path;
use std::process::{Child, Command, Output, Stdio};

#[path = "common/run.rs"]
mod run_common;

use run_common::{
    Sandbox, can_mount, fixture, have_tool, json_summary, prep_ms, skip_or_fail, stdout,
};

/// One preset's case: the fixture, what COMMAND checks on the miss, the workdir entries to
/// remove between the runs, and the hit's offline COMMAND with its expected output.
struct Case<'a> {
    preset: &'a str,
    fixture: &'a str,
    /// Environment of both `layercache run`s (and so of setup and COMMAND).
    env: Vec<(&'a str, String)>,
    /// COMMAND of run 1 (`sh -c`), with the network; `None`: no COMMAND (a JVM build is slow,
    /// and the hit's offline build is what matters).
    first: Option<&'a str>,
    /// Workdir entries removed after run 1 (the installed tree the preset does not cache).
    remove: &'a [&'a str],
    /// COMMAND of run 2 (`sh -c`), run under `unshare --net`.
    offline: &'a str,
    /// What the COMMANDs print last.
    expect: &'a str,
    /// Runs between the two runs (e.g. stops a repository server).
    before_hit: Option<Box<dyn FnOnce()>>,
}

/// Runs `case`: miss (published), then a hit whose offline COMMAND works; prints the times.
fn prove(case: Case<'_>) {
    prove_with(case, "");
}

/// [`prove`] with `more` (further `[[cache]]` tables) after the case's own cache in the spec;
/// the summary entry checked is the case's (the first).
fn prove_with(case: Case<'_>, more: &str) {
    let Some(fx) = fixture(case.fixture) else {
        return;
    };
    let sb = Sandbox::new();
    sb.copy_into_work(&fx);
    let project = format!("preset-{}", case.preset);
    let spec = sb.write_spec(
        "spec.toml",
        &format!(
            "project = \"{project}\"\n[[cache]]\nid = \"{}\"\npreset = \"{}\"\n{more}",
            case.preset, case.preset
        ),
    );
    let env: Vec<(&str, &str)> = case.env.iter().map(|(k, v)| (*k, v.as_str())).collect();

    let first = match case.first {
        Some(cmd) => sb.run_cmd(&["--json"], &spec, &["sh", "-c", cmd], &env),
        None => sb.run_cmd::<&str>(&["--json"], &spec, &[], &env),
    };
    if let Some(f) = case.before_hit {
        f();
    }
    // Each run exits 0, its COMMAND prints what is expected; its cache's summary entry.
    let checked = |out: &Output, which: &str, command: bool| {
        assert_eq!(
            out.status.code(),
            Some(0),
            "{}: {which} failed",
            case.preset
        );
        // COMMAND's output: stdout without the `--json` summary line (wherever run prints it)
        let text: String = stdout(out)
            .lines()
            .filter(|l| {
                serde_json::from_str::<serde_json::Value>(l)
                    .map_or(true, |v| v.get("caches").is_none())
            })
            .map(|l| format!("{l}\n"))
            .collect();
        assert!(
            !command || text.ends_with(case.expect),
            "{}: {which} printed {text:?}",
            case.preset
        );
        json_summary(out)["caches"][0].clone()
    };
    let miss = &checked(&first, "run 1", case.first.is_some());
    assert_eq!(miss["result"], "miss", "{miss}");
    assert_eq!(miss["published"], true, "{miss}");

    for entry in case.remove {
        let p = sb.work().join(entry);
        if p.is_dir() {
            std::fs::remove_dir_all(&p).unwrap();
        } else if p.exists() {
            std::fs::remove_file(&p).unwrap();
        }
    }

    // A fresh network namespace with only loopback up (Gradle wants a local address).
    let offline = format!(
        "unshare --net sh -c {}",
        shell_quote(&format!("ip link set lo up && {}", case.offline))
    );
    let second = sb.run_cmd(&["--json"], &spec, &["sh", "-c", &offline], &env);
    let hit = &checked(&second, "run 2 (the offline COMMAND on the hit)", true);
    assert_eq!(hit["result"], "hit", "{hit}");
    assert_eq!(hit["key"], miss["key"], "{hit}");

    let ev: Vec<_> = sb
        .events()
        .into_iter()
        .filter(|e| e["cache"] == case.preset)
        .collect();
    assert_eq!(ev.len(), 2, "{ev:?}");
    assert_eq!(
        (ev[0]["result"].as_str(), ev[1]["result"].as_str()),
        (Some("miss"), Some("hit"))
    );
    eprintln!(
        "PRESET {}: miss {} ms (setup {} ms, promote {} ms, {} files, {} bytes), hit {} ms \
         (mount {} ms, maintenance {} ms)",
        case.preset,
        prep_ms(&ev[0]),
        ev[0]["setup_ms"],
        ev[0]["promote_ms"],
        ev[0]["files"],
        ev[0]["bytes"],
        prep_ms(&ev[1]),
        ev[1]["mount_ms"],
        ev[1]["maintenance_ms"]
    );
    assert!(sb.mounts_below().is_empty(), "{:?}", sb.mounts_below());
}

/// `'…'` quoting for `sh`.
fn shell_quote(s: &str) -> String {
    format!("'{}'", s.replace('\'', r"'\''"))
}

/// True when `cmd` runs and exits 0; otherwise [`skip_or_fail`] naming `what`.
fn runs(cmd: &mut Command, what: &str) -> bool {
    let ok = cmd.output().is_ok_and(|o| o.status.success());
    ok || !skip_or_fail(&format!("needs {what}"))
}

/// `go`: `go mod download` (the preset's setup) fills GOMODCACHE from a `file://` GOPROXY of
/// Debian's Go packages; on the hit `go build` with `GOPROXY=off` builds from the layer alone.
#[test]
fn go_preset_builds_offline_from_the_layer() {
    if !can_mount() || !runs(Command::new("go").arg("version"), "go (golang-go)") {
        return;
    }
    let sb_proxy = tempfile::Builder::new()
        .prefix("layercache-goproxy-")
        .tempdir()
        .unwrap();
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("scripts/goproxy.py");
    let built: Output = Command::new("python3")
        .arg(&script)
        .arg(sb_proxy.path())
        .output()
        .unwrap();
    if !built.status.success() {
        skip_or_fail(&format!(
            "scripts/goproxy.py failed (are the Debian packages of `goproxy.py --packages` \
             installed?): {}",
            String::from_utf8_lossy(&built.stderr)
        ));
        return;
    }
    prove(Case {
        preset: "go",
        fixture: "go-app",
        env: vec![
            ("GOPROXY", format!("file://{}", sb_proxy.path().display())),
            ("GOSUMDB", "off".into()),
            ("GOFLAGS", "".into()),
            ("GOTOOLCHAIN", "local".into()),
        ],
        first: Some("go build -o app . && ./app"),
        remove: &["app"],
        offline: "GOFLAGS=-mod=mod GOPROXY=off go build -o app . && ./app",
        expect: "go-app 56333bf6-df14-53eb-a25c-6f9fefafa040 layer: cache\n",
        before_hit: None,
    });
}

const NODE_CHECK: &str = "node -e \"const c = require('chalk'); require('lodash'); \
     console.log(require('is-number')(7), require('semver').valid('1.2.3'), typeof c.green)\"";

/// `pnpm`: the store (npm_config_store_dir) is the cache; on the hit `pnpm install --offline`
/// builds node_modules from it.
#[test]
fn pnpm_preset_installs_offline_from_the_layer() {
    if !can_mount() || !have_tool("pnpm") || !have_tool("node") {
        return;
    }
    prove(Case {
        preset: "pnpm",
        fixture: "pnpm-app",
        env: vec![],
        first: Some(NODE_CHECK),
        remove: &["node_modules"],
        offline: &format!("pnpm install --frozen-lockfile --offline && {NODE_CHECK}"),
        expect: "true 1.2.3 function\n",
        before_hit: None,
    });
}

/// `yarn` (classic): YARN_CACHE_FOLDER is the cache; on the hit `yarn install --offline` builds
/// node_modules from it.
#[test]
fn yarn_preset_installs_offline_from_the_layer() {
    if !can_mount() || !have_tool("yarn") || !have_tool("node") {
        return;
    }
    prove(Case {
        preset: "yarn",
        fixture: "yarn-app",
        env: vec![],
        first: Some(NODE_CHECK),
        remove: &["node_modules"],
        offline: &format!("yarn install --frozen-lockfile --offline && {NODE_CHECK}"),
        expect: "true 1.2.3 function\n",
        before_hit: None,
    });
}

/// `uv`: UV_CACHE_DIR is the cache; on the hit `uv sync --offline` makes a new .venv from it.
#[test]
fn uv_preset_syncs_offline_from_the_layer() {
    if !can_mount() || !have_tool("uv") {
        return;
    }
    let import =
        ".venv/bin/python -c 'import requests, attrs; print(requests.__name__, attrs.__name__)'";
    prove(Case {
        preset: "uv",
        fixture: "uv-app",
        // No interpreter downloads (not reachable): the machine's python3.
        env: vec![("UV_PYTHON_DOWNLOADS", "never".into())],
        first: Some(import),
        remove: &[".venv"],
        offline: &format!("uv sync --frozen --offline && {import}"),
        expect: "requests attrs\n",
        before_hit: None,
    });
}

/// `venv` in a uv project (issue 24), with the `uv` preset beside it as README's Python example
/// has: the venv's setup follows uv.lock (`uv sync --frozen`; the fixture has no
/// requirements.txt, which v1's `pip install -r` needed), and on the hit the venv from the
/// layer imports the locked packages and `uv sync --offline` finds nothing to do.
#[test]
fn venv_preset_follows_uv_lock() {
    if !can_mount() || !have_tool("uv") {
        return;
    }
    let import =
        ".venv/bin/python -c 'import requests, attrs; print(requests.__name__, attrs.__name__)'";
    prove_with(
        Case {
            preset: "venv",
            fixture: "uv-app",
            env: vec![("UV_PYTHON_DOWNLOADS", "never".into())],
            first: Some(import),
            remove: &[],
            offline: &format!("uv sync --frozen --offline && {import}"),
            expect: "requests attrs\n",
            before_hit: None,
        },
        "[[cache]]\nid = \"uv\"\npreset = \"uv\"\n",
    );
}

/// `venv` in a uv project after the lock changed (issue 24): the run restores the previous venv
/// and its restore setup (`uv sync --frozen`, the lockfile's tool) brings it to the new lock —
/// the added package imports — and the promotion stores only what changed.
#[test]
fn venv_preset_restore_follows_uv_lock() {
    if !can_mount() || !have_tool("uv") {
        return;
    }
    let Some(fx) = fixture("uv-app") else {
        return;
    };
    let sb = Sandbox::new();
    sb.copy_into_work(&fx);
    let spec = sb.write_spec(
        "spec.toml",
        "project = \"venv-restore\"\n[[cache]]\nid = \"venv\"\npreset = \"venv\"\n\
         [[cache]]\nid = \"uv\"\npreset = \"uv\"\n",
    );
    let env = [("UV_PYTHON_DOWNLOADS", "never")];
    let first = sb.run_cmd(&["--json"], &spec, &["true"], &env);
    assert_eq!(first.status.code(), Some(0));
    // A new dependency in pyproject.toml and uv.lock (resolved from PyPI), nothing installed.
    let added = Command::new("uv")
        .args(["add", "--no-sync", "six"])
        .current_dir(sb.work())
        .env("UV_PYTHON_DOWNLOADS", "never")
        .output()
        .unwrap();
    assert!(
        added.status.success(),
        "uv add: {}",
        String::from_utf8_lossy(&added.stderr)
    );
    let import = ".venv/bin/python -c 'import six, requests; print(six.__name__)'";
    let second = sb.run_cmd(&["--json"], &spec, &["sh", "-c", import], &env);
    assert_eq!(second.status.code(), Some(0));
    assert!(stdout(&second).contains("six\n"), "{}", stdout(&second));
    let venv = &json_summary(&second)["caches"][0];
    assert_eq!(venv["result"], "restore", "{venv}");
    assert_eq!(venv["published"], true, "{venv}");
    let (new, all) = (
        venv["new_files"].as_u64().unwrap(),
        venv["files"].as_u64().unwrap(),
    );
    assert!(
        new * 2 < all,
        "the restore stored {new} of {all} files anew: {venv}"
    );
    assert!(sb.mounts_below().is_empty(), "{:?}", sb.mounts_below());
}

/// `venv` in a poetry project (issue 24): the venv's setup follows poetry.lock (`poetry install
/// --no-root` into the venv it made); on the hit the venv from the layer imports the versions
/// poetry.lock pins, offline.
#[test]
fn venv_preset_follows_poetry_lock() {
    if !can_mount() || !have_tool("poetry") {
        return;
    }
    let import = ".venv/bin/python -c 'import requests, attrs; print(requests.__version__)'";
    prove(Case {
        preset: "venv",
        fixture: "poetry-app",
        env: vec![],
        first: Some(import),
        remove: &[],
        offline: import,
        // what poetry.lock pins
        expect: "2.32.5\n",
        before_hit: None,
    });
}

/// `maven`: `mvn dependency:go-offline` (the preset's setup) fills the local repository
/// (-Dmaven.repo.local on the mount) from Debian's maven-repo; on the hit `mvn -o package`
/// builds and the app runs on the classpath from the layer.
#[test]
fn maven_preset_builds_offline_from_the_layer() {
    if !can_mount() || !have_tool("mvn") || !have_tool("java") {
        return;
    }
    if !Path::new("/usr/share/maven-repo/org/apache/maven/plugins/maven-dependency-plugin").is_dir()
    {
        skip_or_fail("needs Debian's maven plugins in /usr/share/maven-repo");
        return;
    }
    let build = "mvn -o -B -q package dependency:build-classpath -Dmdep.outputFile=cp.txt \
                 && java -cp \"target/classes:$(cat cp.txt)\" org.example.app.App";
    prove(Case {
        preset: "maven",
        fixture: "maven-app",
        env: vec![],
        first: None,
        remove: &["target", "cp.txt"],
        offline: build,
        expect: "Maven-app tar\n",
        before_hit: None,
    });
}

/// A static HTTP server (`python3 -m http.server`) on 127.0.0.1 over a directory; Drop kills it
/// (by its pid) and reaps it.
struct HttpDir {
    child: Child,
    url: String,
}

impl HttpDir {
    /// Serves `dir` on a free port; ready when the server has printed the port it bound.
    fn serve(dir: &Path) -> HttpDir {
        let mut child = Command::new("python3")
            .args([
                "-u",
                "-m",
                "http.server",
                "--bind",
                "127.0.0.1",
                "0",
                "--directory",
            ])
            .arg(dir)
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .expect("spawn python3 -m http.server");
        let mut line = String::new();
        std::io::BufReader::new(child.stdout.take().unwrap())
            .read_line(&mut line)
            .unwrap();
        // "Serving HTTP on 127.0.0.1 port 41234 (http://127.0.0.1:41234/) ..."
        let port: u16 = line
            .split_whitespace()
            .skip_while(|w| *w != "port")
            .nth(1)
            .and_then(|p| p.parse().ok())
            .unwrap_or_else(|| panic!("http.server printed {line:?}"));
        HttpDir {
            child,
            url: format!("http://127.0.0.1:{port}/"),
        }
    }
}

impl Drop for HttpDir {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// `gradle`: the preset's setup resolves every configuration's files into GRADLE_USER_HOME (the
/// mount) from Debian's maven-repo served on 127.0.0.1; on the hit `gradle --offline run`
/// compiles and runs the app from the layer (the server is gone by then).
#[test]
fn gradle_preset_builds_offline_from_the_layer() {
    if !can_mount() || !have_tool("gradle") {
        return;
    }
    let repo = Path::new("/usr/share/maven-repo/org/apache/commons/commons-lang3/3.12.0");
    if !repo.is_dir() {
        skip_or_fail("needs Debian's libcommons-lang3-java in /usr/share/maven-repo");
        return;
    }
    let server = HttpDir::serve(Path::new("/usr/share/maven-repo"));
    let url = server.url.clone();
    let run = "gradle --no-daemon --offline -q run";
    prove(Case {
        preset: "gradle",
        fixture: "gradle-app",
        env: vec![("LAYERCACHE_MAVEN_REPO", url)],
        first: None,
        remove: &["build", ".gradle"],
        offline: run,
        expect: "Gradle-app tar\n",
        before_hit: Some(Box::new(move || drop(server))),
    });
}
