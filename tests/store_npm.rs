//! End to end with a real package manager: `npm ci` of examples/npm-app (the bundled fixture) fills the
//! npm cache (miss) and node_modules layers, `commit` publishes them, a second mount hits and
//! `npm ci --offline` installs from the layer alone. Needs root, /dev/fuse, npm and (for the
//! fill) the npm registry; skipped otherwise (a failure when `CI` is set). Mounts are held by guards that unmount on Drop.

use std::fs;
use std::path::Path;
use std::process::Command;

use serde_json::Value;

#[path = "common/mounts.rs"]
mod mounts;

use mounts::{Mounted, can_mount, have_tool, is_mounted, run_ok, skip_or_fail};

const FIXTURE: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/examples/npm-app");

fn lc(store: &Path, args: &[&str]) -> Value {
    let o = run_ok(
        Command::new(mounts::BIN)
            .arg("--store")
            .arg(store)
            .args(args),
    );
    serde_json::from_slice(&o.stdout).unwrap()
}

fn mount(store: &Path, cache: &str, key: &str, mnt: &Path) -> (Mounted, Value) {
    let g = Mounted {
        store: store.to_path_buf(),
        mnt: mnt.to_path_buf(),
    };
    let v = lc(
        store,
        &[
            "mount",
            "--project",
            "npm-app",
            "--cache",
            cache,
            "--key",
            key,
            mnt.to_str().unwrap(),
        ],
    );
    assert!(is_mounted(mnt));
    (g, v)
}

fn copy_fixture(dst: &Path) {
    fs::create_dir_all(dst).unwrap();
    for f in ["package.json", "package-lock.json"] {
        fs::copy(Path::new(FIXTURE).join(f), dst.join(f)).unwrap();
    }
}

/// `npm ci` of the fixture in `workdir` with its cache at `cache`.
fn npm(workdir: &Path, cache: &Path, extra: &[&str]) -> Command {
    let mut c = Command::new("npm");
    c.arg("ci")
        .args(["--no-audit", "--no-fund", "--ignore-scripts", "--cache"])
        .arg(cache)
        .args(extra)
        .current_dir(workdir);
    c
}

#[test]
fn npm_ci_fill_commit_hit_offline() {
    if !can_mount() || !have_tool("npm") {
        return;
    }
    if !Path::new(FIXTURE).exists() {
        skip_or_fail(&format!("needs the npm fixture {FIXTURE}"));
        return;
    }
    let t = tempfile::tempdir().unwrap();
    let store = t.path().join("store");
    let cache_mnt = t.path().join("npm-cache");
    let app1 = t.path().join("app1");
    copy_fixture(&app1);
    let nm1 = app1.join("node_modules");
    fs::create_dir_all(&cache_mnt).unwrap();
    fs::create_dir_all(&nm1).unwrap();

    // Fill: both caches miss; npm ci downloads into the npm cache and extracts node_modules.
    let (gc, v) = mount(&store, "npm", "npm-k1", &cache_mnt);
    assert_eq!(v["result"], "miss");
    let (gn, v) = mount(&store, "node_modules", "nm-k1", &nm1);
    assert_eq!(v["result"], "miss");
    let o = npm(&app1, &cache_mnt, &[]).output().unwrap();
    if !o.status.success() {
        let err = String::from_utf8_lossy(&o.stderr);
        if err.contains("ENOTFOUND") || err.contains("EAI_AGAIN") || err.contains("ECONNREFUSED") {
            skip_or_fail(&format!("no registry access: {err}"));
            return;
        }
        panic!("npm ci failed: {err}");
    }
    assert!(nm1.join("react/package.json").exists());
    let c = lc(&store, &["commit", cache_mnt.to_str().unwrap()]);
    assert_eq!(c["result"], "published", "{c}");
    let c = lc(&store, &["commit", nm1.to_str().unwrap()]);
    assert_eq!(c["result"], "published", "{c}");
    eprintln!(
        "node_modules promote: {} files, {} bytes, promote {} ms, publish {} ms, unmount {} ms, total {} ms",
        c["files"], c["bytes"], c["promote_ms"], c["publish_ms"], c["unmount_ms"], c["total_ms"]
    );
    assert!(c["files"].as_u64().unwrap() > 5000, "{c}");
    drop(gn);
    drop(gc);

    // Reuse: a fresh checkout, the npm cache layer mounted as a hit, install offline.
    let app2 = t.path().join("app2");
    copy_fixture(&app2);
    let (_gc, v) = mount(&store, "npm", "npm-k1", &cache_mnt);
    assert_eq!(v["result"], "hit");
    eprintln!("hit mount of the npm cache: {} ms", v["total_ms"]);
    run_ok(&mut npm(&app2, &cache_mnt, &["--offline"]));
    assert!(app2.join("node_modules/react/package.json").exists());
    assert!(app2.join("node_modules/.bin/tsc").exists());

    // And the node_modules layer is directly usable as a hit.
    let nm3 = t.path().join("app3/node_modules");
    fs::create_dir_all(&nm3).unwrap();
    let (_gn, v) = mount(&store, "node_modules", "nm-k1", &nm3);
    assert_eq!(v["result"], "hit");
    run_ok(
        Command::new("node")
            .args(["-e", "console.log(require('lodash').VERSION)"])
            .current_dir(t.path().join("app3")),
    );
}
