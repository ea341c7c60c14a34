//! `layercache run` on the real fixtures (examples/, or `LAYERCACHE_FIXTURES`) with the
//! real package managers: the acceptance items of issue 5 for the npm, node_modules, venv, pip,
//! cargo-target and cargo presets, and issue 11's restore after a lockfile change (node_modules
//! with npm, pnpm and yarn; venv).
//!
//! Each test copies its fixture into a fresh [`Sandbox`] (own store via `--store`, own
//! `--mount-root`, own workdir) whose Drop unmounts whatever is left, even on a panic. Readiness
//! needs no waiting: `layercache run` returns after its mounts are up and down again, and every
//! check on a mount happens inside the run's COMMAND. Each test does the fewest real installs its
//! checks need (one miss, then hits; the lockfile change costs one more install). Preparation
//! times (mount + setup/maintenance + promote, from events.jsonl) are printed with
//! `--nocapture`.

#[path = "common/run.rs"]
mod run_common;

use std::os::unix::fs::PermissionsExt;
use std::process::Command;

use run_common::{
    Sandbox, can_mount, fixture, have_tool, json_summary as summary, prep_ms, run_ok, stdout,
};

/// The events of one cache, oldest first.
fn events_of(sb: &Sandbox, cache: &str) -> Vec<serde_json::Value> {
    sb.events()
        .into_iter()
        .filter(|e| e["cache"] == cache)
        .collect()
}

/// Asserts miss then hit for `cache` and prints both preparations; with `factor` > 0 also that
/// the hit's preparation was `factor`× faster (only where a hit does no install at all, so the
/// gap is orders of magnitude and load cannot close it; where the hit's maintenance installs
/// offline, 0: its speed is the benchmarks' business, scripts/ready.sh).
fn assert_miss_then_fast_hit(sb: &Sandbox, what: &str, cache: &str, factor: u64) {
    let ev = events_of(sb, cache);
    assert_eq!(ev[0]["result"], "miss", "{what}: {:?}", ev[0]);
    assert_eq!(ev[0]["published"], true, "{what}: {:?}", ev[0]);
    assert_eq!(ev[1]["result"], "hit", "{what}: {:?}", ev[1]);
    assert_eq!(ev[1]["key"], ev[0]["key"]);
    let (miss, hit) = (prep_ms(&ev[0]), prep_ms(&ev[1]));
    eprintln!(
        "PREPARATION {what}: miss {miss} ms (setup {} ms, promote {} ms, {} files), hit {hit} ms \
         (mount {} ms, maintenance {} ms)",
        ev[0]["setup_ms"],
        ev[0]["promote_ms"],
        ev[0]["files"],
        ev[1]["mount_ms"],
        ev[1]["maintenance_ms"]
    );
    assert!(
        factor == 0 || miss >= factor * hit.max(1),
        "{what}: hit preparation {hit} ms is not {factor}x faster than the miss {miss} ms"
    );
}

/// Prints the restore (event 2) against the miss (event 0) and asserts that its promotion
/// stored something, and at most 5 % of the tree's bytes, as new objects (issue 11).
fn assert_restore_stored_little(ev: &[serde_json::Value], what: &str) {
    let (bytes, new_bytes) = (
        ev[2]["bytes"].as_u64().unwrap(),
        ev[2]["new_bytes"].as_u64().unwrap(),
    );
    eprintln!(
        "PREPARATION {what} restore: {} ms (setup {} ms, promote {} ms; new {} of {} files, \
         {new_bytes} of {bytes} bytes) = {:.2} of the miss",
        prep_ms(&ev[2]),
        ev[2]["setup_ms"],
        ev[2]["promote_ms"],
        ev[2]["new_files"],
        ev[2]["files"],
        prep_ms(&ev[2]) as f64 / prep_ms(&ev[0]).max(1) as f64
    );
    assert!(
        new_bytes > 0 && new_bytes * 20 <= bytes,
        "{what}: new objects: {new_bytes} of {bytes} bytes"
    );
}

/// README's npm example, the node_modules and npm caches in one spec: a miss runs `npm ci` once
/// (the node_modules setup, which fills the npm cache through `npm_config_cache`; the npm
/// preset's setup sees that and skips), both layers are published with their content, and a hit
/// runs npm not at all. npm's invocations are counted by a wrapper first on PATH.
#[test]
fn node_modules_and_npm_caches_run_one_npm_ci_on_a_miss() {
    if !can_mount() || !have_tool("npm") {
        return;
    }
    let Some(fx) = fixture("npm-app") else { return };
    let sb = Sandbox::new();
    sb.copy_into_work(&fx);
    let spec = sb.write_spec(
        "spec.toml",
        "project = \"npm-both\"\n[[cache]]\nid = \"node_modules\"\npreset = \"node_modules\"\n\
         [[cache]]\nid = \"npm\"\npreset = \"npm\"\n",
    );
    let real = stdout(&run_ok(Command::new("sh").args(["-c", "command -v npm"])));
    let bin = sb.path("bin");
    std::fs::create_dir_all(&bin).unwrap();
    let log = sb.path("npm-calls.log");
    std::fs::write(
        bin.join("npm"),
        format!(
            "#!/bin/sh\nprintf '%s\\n' \"$*\" >> '{}'\nexec '{}' \"$@\"\n",
            log.display(),
            real.trim()
        ),
    )
    .unwrap();
    std::fs::set_permissions(bin.join("npm"), std::fs::Permissions::from_mode(0o755)).unwrap();
    let path = format!("{}:{}", bin.display(), std::env::var("PATH").unwrap());
    let envs = [("PATH", path.as_str())];
    let calls = || -> Vec<String> {
        let text = std::fs::read_to_string(&log).unwrap_or_default();
        std::fs::remove_file(&log).ok();
        text.lines().map(str::to_string).collect()
    };
    // COMMAND sees both published layers: the tree loads, the download cache is filled.
    let check =
        r#"node -e "require('react')" && test -d "$npm_config_cache/_cacache/index-v5" && echo ok"#;

    let miss = sb.run_cmd(&["--json"], &spec, &["sh", "-c", check], &envs);
    assert_eq!(miss.status.code(), Some(0));
    assert!(stdout(&miss).ends_with("ok\n"), "{}", stdout(&miss));
    let installs = calls();
    assert_eq!(
        installs.iter().filter(|c| c.starts_with("ci")).count(),
        1,
        "one npm ci on a miss: {installs:?}"
    );
    for cache in ["node_modules", "npm"] {
        let e = &events_of(&sb, cache)[0];
        assert_eq!(
            (&e["result"], &e["published"]),
            (&"miss".into(), &true.into()),
            "{e}"
        );
    }

    let hit = sb.run_cmd(&["--json"], &spec, &["sh", "-c", check], &envs);
    assert_eq!(hit.status.code(), Some(0));
    assert!(stdout(&hit).ends_with("ok\n"), "{}", stdout(&hit));
    assert_eq!(calls(), Vec::<String>::new(), "a hit runs no npm");
    for cache in ["node_modules", "npm"] {
        assert_eq!(events_of(&sb, cache)[1]["result"], "hit");
    }

    // One more package (not in the lockfile before): both restore; the node_modules restore install (one npm install) also
    // puts the new package into the restored npm cache, whose setup then installs nothing.
    run_ok(
        Command::new("npm")
            .args(["install", "left-pad@1.3.0", "--package-lock-only"])
            .args(["--no-audit", "--no-fund"])
            .current_dir(sb.work())
            .env("npm_config_cache", sb.path("npm-lock-cache")),
    );
    let check2 = r#"node -e "require('left-pad')" && grep -rqs left-pad-1.3.0.tgz "$npm_config_cache/_cacache/index-v5" && echo ok"#;
    let restore = sb.run_cmd(&["--json"], &spec, &["sh", "-c", check2], &envs);
    assert_eq!(restore.status.code(), Some(0));
    assert!(stdout(&restore).ends_with("ok\n"), "{}", stdout(&restore));
    // The restore's lockfile check (`npm ci --dry-run`) and then one npm install.
    let installs = calls();
    assert_eq!(installs.len(), 2, "check + one npm install: {installs:?}");
    assert!(installs[0].starts_with("ci --dry-run "), "{installs:?}");
    assert!(installs[1].starts_with("install "), "{installs:?}");
    for cache in ["node_modules", "npm"] {
        let e = &events_of(&sb, cache)[2];
        assert_eq!(
            (&e["result"], &e["published"]),
            (&"restore".into(), &true.into()),
            "{e}"
        );
    }
    assert!(sb.mounts_below().is_empty());
}

/// `npm` preset: the npm cache is on the mount; a hit's maintenance `npm ci --offline` installs
/// the whole project from the layer with no network at all (a fresh network namespace).
#[test]
fn npm_preset_hit_installs_offline_from_the_layer() {
    if !can_mount() || !have_tool("npm") {
        return;
    }
    let Some(fx) = fixture("npm-app") else { return };
    let sb = Sandbox::new();
    sb.copy_into_work(&fx);
    let mount = sb.path("cache").join("npm");
    let spec = sb.write_spec(
        "spec.toml",
        r#"project = "npm-fixture"
[[cache]]
id = "npm"
preset = "npm"
maintenance = "npm_config_offline=true unshare --net npm ci --offline --no-audit --no-fund"
"#,
    );
    let show = r#"printf '%s\n' "$npm_config_cache"; grep -q " $npm_config_cache fuse" /proc/mounts && echo mounted; test -d "$npm_config_cache/_cacache" && echo filled"#;
    let first = sb.run(&spec, Some(show));
    assert_eq!(first.status.code(), Some(0));
    assert_eq!(
        stdout(&first),
        format!("{}\nmounted\nfilled\n", mount.display())
    );
    // npm's debug logs of the setup are not cache content: the preset leaves them out.
    let layers = sb.path("store/v1/projects/npm-fixture/layers");
    let trees: Vec<_> = std::fs::read_dir(&layers)
        .unwrap()
        .map(|e| e.unwrap().path().join("tree"))
        .collect();
    assert_eq!(trees.len(), 1, "{trees:?}");
    assert!(trees[0].join("_cacache").is_dir(), "{trees:?}");
    assert!(!trees[0].join("_logs").exists(), "{trees:?}");
    // the install in the workdir is not cached by this preset: start the hit without it
    std::fs::remove_dir_all(sb.work().join("node_modules")).unwrap();

    let second = sb.run(
        &spec,
        Some(&format!(
            "{show}; node -e \"require('react'); require('express'); require('lodash'); \
             console.log(require('react/package.json').version)\""
        )),
    );
    assert_eq!(
        second.status.code(),
        Some(0),
        "npm ci --offline on the hit failed"
    );
    let out = stdout(&second);
    assert!(
        out.starts_with(&format!("{}\nmounted\nfilled\n18.", mount.display())),
        "{out}"
    );
    let ev = sb.events();
    assert_eq!(ev[1]["exit_status"], 0);
    assert!(ev[1]["maintenance_ms"].as_u64().unwrap() > 0);
    assert_miss_then_fast_hit(&sb, "npm (npm preset, hit runs npm ci --offline)", "npm", 0);
    assert!(sb.mounts_below().is_empty());
}

/// One package manager's case of [`changed_lockfile_restores_from_the_old_layer`].
struct NodeCase<'a> {
    /// The fixture (examples/<name>); it depends on react and express.
    fixture: &'a str,
    /// The tool, skipped (or failed under CI) when missing.
    tool: &'a str,
    /// The key files the bump changes (package.json and the lockfile).
    files: &'a [&'a str],
    /// Adds one package that is not in the tree yet (dayjs@1.11.13) to `files`, run in a
    /// scratch copy of them (the registry is reachable).
    bump: &'a [&'a str],
    /// A clean install of `files` in that scratch copy (the tool's own cache is warm).
    clean: &'a [&'a str],
    /// Checks the installed tree against package.json and the lockfile (`sh -c`, workdir).
    ls: &'a str,
    /// `diff -I` patterns: lines that legitimately differ between two installs at two paths
    /// (pnpm's `.bin` shims hold their absolute NODE_PATH, `.modules.yaml` the time it pruned).
    ignore: &'a [&'a str],
}

/// `node_modules` preset: miss, hit, then one package added to the lockfile restores from the
/// old layer, and the preset's restore setup (the tool's own install over the restored tree)
/// brings it to the new lockfile: the tree equals a clean install's file by file, the tool's
/// tree check is clean, and promotion stores at most 5 % of the tree's bytes as new objects
/// (issue 11).
fn changed_lockfile_restores_from_the_old_layer(case: NodeCase<'_>) {
    if !can_mount() || !have_tool("node") || !have_tool(case.tool) {
        return;
    }
    let Some(fx) = fixture(case.fixture) else {
        return;
    };
    let sb = Sandbox::new();
    sb.copy_into_work(&fx);
    let spec = sb.write_spec(
        "spec.toml",
        &format!(
            "project = \"{}-nm\"\n[[cache]]\nid = \"node_modules\"\npreset = \"node_modules\"\n",
            case.fixture
        ),
    );
    let require = "node -e \"require('react'); require('express'); console.log('ok')\"";
    assert_eq!(sb.run(&spec, Some(require)).status.code(), Some(0));
    let second = sb.run(&spec, Some(require));
    assert_eq!(second.status.code(), Some(0));
    assert_eq!(stdout(&second), "ok\n");
    assert_miss_then_fast_hit(&sb, case.fixture, "node_modules", 20);

    // The bump and the clean install of the new key files happen in a scratch copy; the key
    // files then go back into the workdir.
    let clean = sb.path("clean");
    std::fs::create_dir(&clean).unwrap();
    for f in case.files {
        std::fs::copy(sb.work().join(f), clean.join(f)).unwrap();
    }
    let tool = |args: &[&str]| {
        run_ok(
            std::process::Command::new(case.tool)
                .args(args)
                .current_dir(&clean),
        );
    };
    tool(case.bump);
    for f in case.files {
        let new = std::fs::read(clean.join(f)).unwrap();
        assert_ne!(
            new,
            std::fs::read(sb.work().join(f)).unwrap(),
            "{f} unchanged"
        );
        std::fs::write(sb.work().join(f), new).unwrap();
    }
    let _ = std::fs::remove_dir_all(clean.join("node_modules"));
    tool(case.clean);

    let ignore: String = case.ignore.iter().map(|i| format!("-I '{i}' ")).collect();
    let check = format!(
        "{} >/dev/null && diff -r --no-dereference {ignore}node_modules {} && \
         node -e \"require('react'); console.log(require('dayjs')('2020-01-02').year())\"",
        case.ls,
        clean.join("node_modules").display()
    );
    let third = sb.run_cmd(&["--json"], &spec, &["sh", "-c", &check], &[]);
    assert_eq!(
        third.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&third.stderr)
    );
    // With --json the summary is stdout's first line; COMMAND's output follows it.
    assert_eq!(stdout(&third).lines().skip(1).collect::<Vec<_>>(), ["2020"]);
    let ev = events_of(&sb, "node_modules");
    let first_key = ev[0]["key"].as_str().unwrap();
    for e in [&ev[2], &summary(&third)["caches"][0]] {
        assert_eq!(e["result"], "restore", "{e}");
        assert_eq!(e["matched_key"], first_key, "{e}");
        assert_ne!(e["key"], first_key, "a changed lockfile is a new key");
        assert!(e["setup_ms"].as_u64().unwrap() > 0, "setup ran: {e}");
        assert_eq!(e["published"], true, "{e}");
    }
    assert_restore_stored_little(&ev, case.fixture);
    let layers = sb.ls();
    let keys: Vec<&str> = layers
        .iter()
        .filter(|l| l["cache"] == "node_modules")
        .flat_map(|l| l["keys"].as_array().unwrap())
        .map(|k| k.as_str().unwrap())
        .collect();
    assert_eq!(layers.len(), 2, "{layers:?}");
    assert!(keys.contains(&first_key), "{keys:?}");
    assert!(keys.contains(&ev[2]["key"].as_str().unwrap()), "{keys:?}");
    assert!(sb.mounts_below().is_empty());
}

/// npm: the restore setup is `npm install` over the restored tree (`npm ci` would delete it).
#[test]
fn node_modules_changed_lockfile_restores_from_the_old_layer() {
    changed_lockfile_restores_from_the_old_layer(NodeCase {
        fixture: "npm-app",
        tool: "npm",
        files: &["package.json", "package-lock.json"],
        bump: &[
            "install",
            "dayjs@1.11.13",
            "--package-lock-only",
            "--no-audit",
            "--no-fund",
        ],
        clean: &["ci", "--prefer-offline", "--no-audit", "--no-fund"],
        ls: "npm ls --all",
        ignore: &[],
    });
}

/// pnpm: the restore setup is `pnpm install` over the restored tree, which installs only what
/// the lockfile has and `node_modules/.pnpm/lock.yaml` (the installed one) lacks.
#[test]
fn pnpm_changed_lockfile_restores_from_the_old_layer() {
    changed_lockfile_restores_from_the_old_layer(NodeCase {
        fixture: "pnpm-app",
        tool: "pnpm",
        files: &["package.json", "pnpm-lock.yaml"],
        bump: &[
            "add",
            "dayjs@1.11.13",
            "--lockfile-only",
            "--reporter",
            "silent",
        ],
        clean: &[
            "install",
            "--frozen-lockfile",
            "--prefer-offline",
            "--reporter",
            "silent",
        ],
        ls: "pnpm ls --depth Infinity",
        ignore: &["NODE_PATH=", "^prunedAt: "],
    });
}

/// yarn (classic): the restore setup is `yarn install` over the restored tree, which links
/// only what differs from the lockfile.
#[test]
fn yarn_changed_lockfile_restores_from_the_old_layer() {
    changed_lockfile_restores_from_the_old_layer(NodeCase {
        fixture: "yarn-app",
        tool: "yarn",
        files: &["package.json", "yarn.lock"],
        bump: &["add", "dayjs@1.11.13", "--silent", "--ignore-scripts"],
        clean: &[
            "install",
            "--frozen-lockfile",
            "--prefer-offline",
            "--silent",
        ],
        ls: "yarn check --verify-tree",
        ignore: &[],
    });
}

/// `venv` preset (+ `pip`): the second run hits ≥ 5× faster, the hit's `.venv/bin/python`
/// imports the requirements, and pip's cache directory is the `pip` mount, which hits too.
#[test]
fn venv_hit_is_5x_faster_and_imports_and_pip_cache_is_on_the_mount() {
    if !can_mount() || !have_tool("python3") {
        return;
    }
    let Some(fx) = fixture("pip-app") else { return };
    let sb = Sandbox::new();
    sb.copy_into_work(&fx);
    // The venv's setup (the preset's: python3 -m venv .venv && .venv/bin/pip install -r
    // requirements.txt) runs with PIP_CACHE_DIR on the pip mount: every script sees every
    // cache's environment. The pip cache's own setup here only reports where pip caches (the
    // preset's default downloads the requirements once more).
    let spec = sb.write_spec(
        "spec.toml",
        r#"project = "pip-fixture"
[[cache]]
id = "venv"
preset = "venv"
[[cache]]
id = "pip"
preset = "pip"
setup = "pip cache dir"
maintenance = "pip cache dir"
"#,
    );
    let check = "pip cache dir; printf '%s\\n' \"$VIRTUAL_ENV\"; \
                 .venv/bin/python -c 'import flask, requests, pydantic, rich, pytest; print(flask.__name__)'";
    let first = sb.run(&spec, Some(check));
    assert_eq!(first.status.code(), Some(0));
    let second = sb.run(&spec, Some(check));
    assert_eq!(second.status.code(), Some(0));
    let expect = format!(
        "{}\n{}\nflask\n",
        sb.path("cache").join("pip").display(),
        sb.work().join(".venv").display()
    );
    assert_eq!(stdout(&first), expect);
    assert_eq!(stdout(&second), expect);
    assert_miss_then_fast_hit(&sb, "venv (pip fixture)", "venv", 5);
    let pip = events_of(&sb, "pip");
    assert_eq!(pip[0]["result"], "miss");
    assert_eq!(pip[0]["published"], true);
    assert_eq!(pip[1]["result"], "hit");
    eprintln!(
        "pip cache layer: {} files, {} bytes",
        pip[0]["files"], pip[0]["bytes"]
    );

    // issue 11: drop one requirement and add one; the restore's `pip install -r` + prune brings
    // the restored venv to exactly what a clean venv of the new requirements holds.
    let req = sb.work().join("requirements.txt");
    let text = std::fs::read_to_string(&req).unwrap();
    let text: String = text
        .lines()
        .filter(|l| !l.starts_with("rich=="))
        .map(|l| format!("{l}\n"))
        .collect();
    std::fs::write(&req, text + "six==1.16.0\n").unwrap();
    let (clean, out) = (sb.path("clean"), sb.path("out"));
    let check = format!(
        "set -e; python3 -m venv {clean}; {clean}/bin/pip install -q -r requirements.txt; \
         mkdir {out}; .venv/bin/pip freeze > {out}/restored; {clean}/bin/pip freeze > {out}/clean; \
         (cd .venv/lib && find . | sort) > {out}/restored.files; \
         (cd {clean}/lib && find . | sort) > {out}/clean.files; \
         diff {out}/restored {out}/clean; diff {out}/restored.files {out}/clean.files; \
         .venv/bin/python -c 'import six, flask; print(six.__name__)'",
        clean = clean.display(),
        out = out.display()
    );
    let third = sb.run(&spec, Some(&check));
    assert_eq!(
        third.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&third.stderr)
    );
    assert_eq!(stdout(&third), "six\n");
    let restored = std::fs::read_to_string(out.join("restored")).unwrap();
    assert!(
        restored.contains("six==1.16.0") && !restored.contains("rich=="),
        "{restored}"
    );
    let ev = events_of(&sb, "venv");
    assert_eq!(ev[2]["result"], "restore", "{:?}", ev[2]);
    assert_restore_stored_little(&ev, "venv");
    assert!(sb.mounts_below().is_empty());
}

/// A public CA bundle in an installed tree (certifi's `cacert.pem`, which `requests` loads at
/// import time) survives promotion: the store's credential rule for `*.pem` drops only files
/// holding a private key (it used to drop every `*.pem`, so `import requests` failed on a venv
/// hit). No real install needed to show it.
#[test]
fn public_ca_bundle_in_an_installed_tree_survives_promotion() {
    if !can_mount() {
        return;
    }
    let sb = Sandbox::new();
    std::fs::write(sb.work().join("requirements.txt"), "certifi\n").unwrap();
    let spec = sb.write_spec(
        "spec.toml",
        r#"project = "pem"
[[cache]]
id = "venv"
key_files = ["requirements.txt"]
env = { V = "{mount}" }
setup = "mkdir -p \"$V/certifi\" && printf -- '-----BEGIN CERTIFICATE-----\\nMIIB\\n-----END CERTIFICATE-----\\n' > \"$V/certifi/cacert.pem\""
"#,
    );
    assert_eq!(sb.run(&spec, None).status.code(), Some(0));
    let hit = sb.run(&spec, Some("head -1 \"$V/certifi/cacert.pem\""));
    assert_eq!(sb.events()[1]["result"], "hit");
    assert_eq!(stdout(&hit), "-----BEGIN CERTIFICATE-----\n");
}

/// `cargo-target` (+ `cargo`): the registry is fetched into CARGO_HOME on the `cargo` mount,
/// `cargo build` fills the target mount; the second run hits both ≥ 5× faster, and a `cargo
/// build` on the hit compiles nothing.
#[test]
fn cargo_target_hit_is_5x_faster_and_rebuild_compiles_nothing() {
    if !can_mount() || !have_tool("cargo") {
        return;
    }
    let Some(fx) = fixture("cargo-app") else {
        return;
    };
    let sb = Sandbox::new();
    sb.copy_into_work(&fx);
    let spec = sb.write_spec(
        "spec.toml",
        r#"project = "cargo-fixture"
[[cache]]
id = "cargo"
preset = "cargo"
[[cache]]
id = "target"
preset = "cargo-target"
"#,
    );
    let show = r#"printf '%s\n%s\n' "$CARGO_HOME" "$CARGO_TARGET_DIR"; ls "$CARGO_HOME/registry"; test -x "$CARGO_TARGET_DIR/debug/cargo-app" && echo built"#;
    let first = sb.run(&spec, Some(show));
    assert_eq!(first.status.code(), Some(0));
    let second = sb.run(
        &spec,
        Some(&format!(
            "{show}; cargo build --locked 2> build.log; echo build=$?"
        )),
    );
    assert_eq!(second.status.code(), Some(0));
    let home = sb.path("cache").join("cargo");
    let target = sb.path("cache").join("target");
    let out = stdout(&second);
    assert!(
        out.starts_with(&format!("{}\n{}\n", home.display(), target.display())),
        "{out}"
    );
    assert!(
        out.contains("cache\n"),
        "no registry cache on the mount: {out}"
    );
    assert!(out.contains("built\nbuild=0\n"), "{out}");
    let log = std::fs::read_to_string(sb.work().join("build.log")).unwrap();
    eprintln!("cargo build on the hit:\n{log}");
    let compiled: Vec<&str> = log
        .lines()
        .map(str::trim_start)
        .filter(|l| l.starts_with("Compiling "))
        .collect();
    assert!(
        !compiled
            .iter()
            .any(|l| !l.starts_with("Compiling cargo-app ")),
        "dependencies rebuilt on a hit: {compiled:?}"
    );
    assert!(
        compiled.is_empty(),
        "the project itself was rebuilt: {compiled:?}"
    );
    assert_miss_then_fast_hit(&sb, "cargo-target (cargo build)", "target", 5);
    assert_miss_then_fast_hit(&sb, "cargo (CARGO_HOME, cargo fetch)", "cargo", 0);
    assert!(sb.mounts_below().is_empty());
}

/// A workspace of the `file:`-dependency project below (no registry needed): `dep/` is a
/// local package, package.json depends on it with `extra` fields spliced in, and the lockfile
/// is the one `npm install` writes for it (npm 9-11, lockfileVersion 3).
fn file_dep_workspace(sb: &Sandbox, name: &str, extra: &str) -> std::path::PathBuf {
    let w = sb.path(name);
    std::fs::create_dir_all(w.join("dep")).unwrap();
    std::fs::write(
        w.join("dep/package.json"),
        r#"{"name":"dep","version":"1.0.0"}"#,
    )
    .unwrap();
    std::fs::write(w.join("dep/index.js"), "module.exports = 'orig';\n").unwrap();
    std::fs::write(
        w.join("package.json"),
        format!(r#"{{"name":"app","version":"1.0.0",{extra}"dependencies":{{"dep":"file:dep"}}}}"#),
    )
    .unwrap();
    std::fs::write(
        w.join("package-lock.json"),
        r#"{"name":"app","version":"1.0.0","lockfileVersion":3,"requires":true,"packages":{
"":{"name":"app","version":"1.0.0","dependencies":{"dep":"file:dep"}},
"dep":{"version":"1.0.0"},"node_modules/dep":{"resolved":"dep","link":true}}}"#,
    )
    .unwrap();
    w
}

/// Issue 29 item 2, with the real binary and npm: two workspaces of one project with the same
/// lockfile. A's package.json has a `postinstall` that writes into node_modules; after A's
/// miss and publish, B (no postinstall) must not get A's tree — neither a hit of A's key nor
/// a restore from A's layer (an incremental `npm install` would keep the planted file): B
/// misses, says why (`config package.json changed`), and its tree has no trace of A's script.
/// A third workspace with A's package.json hits A's layer.
#[test]
fn a_postinstall_is_part_of_the_node_modules_key() {
    if !can_mount() || !have_tool("npm") {
        return;
    }
    let sb = Sandbox::new();
    let evil = r#""scripts":{"postinstall":"echo evil > node_modules/planted.js"},"#;
    let a = file_dep_workspace(&sb, "wa", evil);
    let b = file_dep_workspace(&sb, "wb", r#""description":"no scripts","#);
    let c = file_dep_workspace(&sb, "wc", evil);
    let spec = sb.write_spec(
        "spec.toml",
        "project = \"p29\"\n[[cache]]\nid = \"node_modules\"\npreset = \"node_modules\"\n",
    );
    let look = [
        "sh",
        "-c",
        "cat node_modules/dep/index.js; cat node_modules/planted.js 2>/dev/null || echo clean",
    ];
    let run = |w: &std::path::Path| {
        let o = sb.run_flags(&spec, w, &["--sandbox", "none"], &look);
        assert_eq!(o.status.code(), Some(0));
        let s = summary(&o);
        (s["caches"][0].clone(), stdout(&o))
    };
    let (ca, out) = run(&a);
    assert_eq!(ca["result"], "miss", "{ca}");
    assert!(out.contains("orig") && out.contains("evil"), "{out}");
    let (cb, out) = run(&b);
    assert_eq!(
        cb["result"], "miss",
        "B neither hits nor restores A's layer: {cb}"
    );
    assert_ne!(cb["key"], ca["key"]);
    assert!(
        cb["why"]
            .to_string()
            .contains("config package.json changed"),
        "{cb}"
    );
    assert!(out.contains("orig") && out.contains("clean"), "{out}");
    let (cc, out) = run(&c);
    assert_eq!(cc["result"], "hit", "{cc}");
    assert_eq!(cc["key"], ca["key"]);
    assert!(out.contains("evil"), "{out}");
}

/// A restore is no laxer than a miss: a package.json that names a dependency its lockfile
/// lacks makes the clean `npm ci` of a miss refuse, and so the node_modules restore refuses
/// too (exit 1, nothing published) instead of `npm install`-ing it from package.json.
#[test]
fn a_restore_refuses_a_lockfile_out_of_sync_as_a_miss_does() {
    if !can_mount() || !have_tool("npm") {
        return;
    }
    let sb = Sandbox::new();
    let w = file_dep_workspace(&sb, "w", "");
    let spec = sb.write_spec(
        "spec.toml",
        "project = \"psync\"\n[[cache]]\nid = \"node_modules\"\npreset = \"node_modules\"\n",
    );
    let first = sb.run_flags(&spec, &w, &["--sandbox", "none"], &["true"]);
    assert_eq!(first.status.code(), Some(0));
    assert_eq!(summary(&first)["caches"][0]["result"], "miss");
    std::fs::create_dir_all(w.join("dep2")).unwrap();
    std::fs::write(
        w.join("dep2/package.json"),
        r#"{"name":"dep2","version":"1.0.0"}"#,
    )
    .unwrap();
    std::fs::write(
        w.join("package.json"),
        r#"{"name":"app","version":"1.0.0","dependencies":{"dep":"file:dep","dep2":"file:dep2"}}"#,
    )
    .unwrap();
    let out = sb.run_flags(&spec, &w, &["--sandbox", "none"], &["true"]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(err.contains("restore from the layer of key"), "{err}");
    assert!(err.contains("in sync"), "npm's own reason: {err}");
    assert!(err.contains("nothing published"), "{err}");
}
