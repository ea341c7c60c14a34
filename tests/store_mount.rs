//! Mount-based tests of the layer store through the `layercache` binary: mount (hit, restore,
//! miss) → commit → umount, concurrent fills, gc, clear, verify, isolation, input errors.
//!
//! Every mount is held by a [`Mounted`] guard whose Drop runs `layercache umount` (and
//! `umount -l` as a last resort) before the temporary store is removed. Readiness is checked
//! by stat-ing the mountpoint (a different `st_dev` than its parent), never by sleeping.
//! Skipped (as a pass) when not root or without /dev/fuse; a failure instead when `CI` is set.

use std::fs;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use serde_json::Value;

#[path = "common/mounts.rs"]
mod mounts;

use mounts::{Mounted, can_mount, is_mounted, names, run_ok, write};

/// `layercache --store STORE ARGS…` (LAYERCACHE_STORE unset).
fn lc_command_at(store: &Path, args: &[&str]) -> Command {
    let mut c = Command::new(mounts::BIN);
    c.arg("--store")
        .arg(store)
        .args(args)
        .env_remove("LAYERCACHE_STORE");
    c
}

/// Runs [`lc_command_at`] to completion, whatever its exit status.
fn lc_at(store: &Path, args: &[&str]) -> Output {
    lc_command_at(store, args).output().unwrap()
}

/// A temporary directory for mountpoints and the store. Fields drop in order: the tmpfs (if
/// any) is unmounted before the directory is removed.
struct Env {
    store: PathBuf,
    tmpfs: Option<Tmpfs>,
    t: tempfile::TempDir,
}

impl Env {
    fn new() -> Env {
        let t = tempfile::tempdir().unwrap();
        Env {
            store: t.path().join("store"),
            tmpfs: None,
            t,
        }
    }
    /// An Env whose store lives on a fresh tmpfs of `size` (e.g. "8m") mounted at
    /// [`Env::small`]; mountpoints stay outside it.
    fn on_tmpfs(size: &str) -> Env {
        let mut env = Env::new();
        let small = env.dir("small");
        run_ok(
            Command::new("mount")
                .args(["-t", "tmpfs", "-o", &format!("size={size}"), "tmpfs"])
                .arg(&small),
        );
        env.tmpfs = Some(Tmpfs(small.clone()));
        env.store = small.join("store");
        env
    }
    /// The tmpfs of [`Env::on_tmpfs`].
    fn small(&self) -> &Path {
        &self.tmpfs.as_ref().expect("an Env::on_tmpfs").0
    }
    fn store(&self) -> PathBuf {
        self.store.clone()
    }
    fn dir(&self, name: &str) -> PathBuf {
        let p = self.t.path().join(name);
        fs::create_dir_all(&p).unwrap();
        p
    }
    /// `layercache --store STORE ARGS…`.
    fn lc_command(&self, args: &[&str]) -> Command {
        lc_command_at(&self.store(), args)
    }
    fn lc(&self, args: &[&str]) -> Output {
        self.lc_command(args).output().unwrap()
    }
    #[track_caller]
    fn lc_ok(&self, args: &[&str]) -> String {
        String::from_utf8(run_ok(&mut self.lc_command(args)).stdout).unwrap()
    }
    fn json(&self, args: &[&str]) -> Value {
        let out = self.lc_ok(args);
        serde_json::from_str(out.trim()).unwrap_or_else(|e| panic!("{e}: {out}"))
    }
    /// `layercache mount` → (guard, outcome).
    fn mount(
        &self,
        project: &str,
        cache: &str,
        key: &str,
        restore: &[&str],
        mnt: &Path,
    ) -> (Mounted, Value) {
        let mut args = vec![
            "mount",
            "--project",
            project,
            "--cache",
            cache,
            "--key",
            key,
        ];
        for r in restore {
            args.extend(["--restore-key", r]);
        }
        let m = mnt.to_str().unwrap();
        args.push(m);
        let guard = Mounted {
            store: self.store(),
            mnt: mnt.to_path_buf(),
        };
        let v = self.json(&args);
        assert!(is_mounted(mnt), "mount returned before the mount was ready");
        (guard, v)
    }
    fn commit(&self, mnt: &Path) -> Value {
        self.json(&["commit", mnt.to_str().unwrap()])
    }
    fn umount(&self, mnt: &Path) {
        self.lc_ok(&["umount", mnt.to_str().unwrap()]);
    }
    /// Mounts a new `key` (a miss) at `mnt`, writes `files` (path, content), commits (a
    /// publish) and unmounts; returns the commit's outcome.
    fn publish(
        &self,
        project: &str,
        cache: &str,
        key: &str,
        mnt: &Path,
        files: &[(&str, &str)],
    ) -> Value {
        let (_g, v) = self.mount(project, cache, key, &[], mnt);
        assert_eq!(v["result"], "miss", "{v}");
        for (path, content) in files {
            write(&mnt.join(path), content);
        }
        let c = self.commit(mnt);
        assert_eq!(c["result"], "published", "{c}");
        self.umount(mnt);
        c
    }
    fn layers(&self, project: &str) -> Vec<Value> {
        match self.json(&["--json", "ls", "--project", project]) {
            Value::Array(a) => a,
            v => panic!("{v}"),
        }
    }
}

#[test]
fn miss_commit_hit_roundtrip() {
    if !can_mount() {
        return;
    }
    let env = Env::new();
    let mnt = env.dir("mnt");
    let (guard, v) = env.mount("p1", "npm", "k1", &[], &mnt);
    assert_eq!(v["result"], "miss");
    assert_eq!(v["fill_lock"], true);
    write(&mnt.join("pkg/index.js"), "module.exports = 1;\n");
    write(&mnt.join(".npmrc"), "//registry/:_authToken=SECRET\n");
    write(&mnt.join("pkg/.env"), "TOKEN=SECRET\n");
    std::os::unix::fs::symlink("/etc/hostname", mnt.join("outside")).unwrap();
    let c = env.commit(&mnt);
    assert_eq!(c["result"], "published", "{c}");
    assert_eq!(c["files"], 1);
    let dropped: Vec<&str> = c["dropped"]
        .as_array()
        .unwrap()
        .iter()
        .map(|d| d.as_str().unwrap())
        .collect();
    assert_eq!(dropped, vec![".npmrc", "pkg/.env"]);
    // The caller keeps a working mount: now a hit on the new layer, with a fresh upper.
    assert_eq!(c["remount"]["result"], "hit");
    assert!(is_mounted(&mnt));
    assert_eq!(
        fs::read_to_string(mnt.join("pkg/index.js")).unwrap(),
        "module.exports = 1;\n"
    );
    assert!(!mnt.join(".npmrc").exists());
    assert_eq!(
        fs::read_link(mnt.join("outside")).unwrap(),
        Path::new("/etc/hostname")
    );
    write(&mnt.join("scratch"), "private to this run");
    // Commit after a hit is a no-op.
    assert_eq!(env.commit(&mnt)["result"], "noop");
    env.umount(&mnt);
    assert!(!is_mounted(&mnt));
    drop(guard);

    let (_g, v) = env.mount("p1", "npm", "k1", &[], &mnt);
    assert_eq!(v["result"], "hit");
    assert_eq!(v["matched_key"], "k1");
    assert!(
        !mnt.join("scratch").exists(),
        "a hit's writes were discarded"
    );
    assert!(v["mount_ms"].as_u64().unwrap() < 1000);
    let layers = env.layers("p1");
    assert_eq!(layers.len(), 1);
    assert_eq!(layers[0]["in_use"], true);
    // No secret reached the store.
    mounts::assert_not_in_tree(&env.store(), "SECRET");
}

/// A layer shows the links its filled tree had, not the object links that store it: files
/// linked in the fill are one st_ino with their nlink, identical files that were not linked
/// stay files of their own (nlink 1); after a restore on top, a name copied up breaks from its
/// group (kernel overlayfs's behaviour) and the next layer records what the merged view had.
#[test]
fn layers_show_the_links_of_the_filled_tree() {
    if !can_mount() {
        return;
    }
    let env = Env::new();
    let mnt = env.dir("mnt");
    let (_g, v) = env.mount("p1", "conda", "k1", &[], &mnt);
    assert_eq!(v["result"], "miss", "{v}");
    write(&mnt.join("pkgs/lib.so"), "same bytes");
    fs::create_dir_all(mnt.join("env/lib")).unwrap();
    fs::hard_link(mnt.join("pkgs/lib.so"), mnt.join("env/lib/lib.so")).unwrap();
    write(&mnt.join("copy.so"), "same bytes");
    assert_eq!(env.commit(&mnt)["result"], "published");
    let md = |p: &str| fs::symlink_metadata(mnt.join(p)).unwrap();
    let check = |what: &str| {
        let (a, b, c) = (md("pkgs/lib.so"), md("env/lib/lib.so"), md("copy.so"));
        assert_eq!(a.ino(), b.ino(), "{what}: linked in the fill");
        assert_eq!((a.nlink(), b.nlink(), c.nlink()), (2, 2, 1), "{what}");
        assert_ne!(c.ino(), a.ino(), "{what}: identical but not linked");
    };
    check("remounted as a hit");
    drop(_g);
    let (_g, v) = env.mount("p1", "conda", "k2", &["k1"], &mnt);
    assert_eq!(v["result"], "restore", "{v}");
    check("restored");
    write(&mnt.join("copy.so"), "changed");
    fs::hard_link(mnt.join("copy.so"), mnt.join("copy2.so")).unwrap();
    // A chmod copies the name up.
    fs::set_permissions(
        mnt.join("env/lib/lib.so"),
        std::os::unix::fs::PermissionsExt::from_mode(0o600),
    )
    .unwrap();
    let (a, b) = (md("pkgs/lib.so"), md("env/lib/lib.so"));
    assert_ne!(a.ino(), b.ino(), "the copied-up name broke from its group");
    assert_eq!((a.nlink(), b.nlink()), (2, 1));
    assert_eq!(env.commit(&mnt)["result"], "published");
    let (a, b, c, d) = (
        md("pkgs/lib.so"),
        md("env/lib/lib.so"),
        md("copy.so"),
        md("copy2.so"),
    );
    assert_ne!(a.ino(), b.ino());
    assert_eq!(
        (a.nlink(), b.nlink()),
        (1, 1),
        "the new layer has no group of them"
    );
    assert_eq!(c.ino(), d.ino(), "linked in the merged view");
    assert_eq!((c.nlink(), d.nlink()), (2, 2));
}

#[test]
fn restore_keys_pick_the_newest_match_in_scope() {
    if !can_mount() {
        return;
    }
    let env = Env::new();
    let mnt = env.dir("mnt");
    let publish = |project: &str, cache: &str, key: &str, content: &str| {
        env.publish(project, cache, key, &mnt, &[("which", content)]);
    };
    publish("p1", "npm", "npm-linux-aaa", "older");
    publish("p1", "npm", "npm-linux-bbb", "newer");
    publish("p1", "other", "npm-linux-zzz", "other cache");
    publish("p2", "npm", "npm-linux-yyy", "other project");

    let (_g, v) = env.mount("p1", "npm", "npm-linux-ccc", &["npm-linux-"], &mnt);
    assert_eq!(
        (v["result"].as_str(), v["matched_key"].as_str()),
        (Some("restore"), Some("npm-linux-bbb"))
    );
    assert_eq!(fs::read_to_string(mnt.join("which")).unwrap(), "newer");
    // Incremental fill on top of the restore: change one file, delete one, add one.
    write(&mnt.join("which"), "restored+changed");
    write(&mnt.join("added"), "new");
    let c = env.commit(&mnt);
    assert_eq!(c["result"], "published");
    assert_eq!(c["new_objects"], 2);
    assert!(c["parent"].is_string());
    drop(_g);

    // Prefixes are tried in order; a non-matching first prefix falls through.
    let (_g, v) = env.mount("p1", "npm", "x", &["nomatch-", "npm-linux-a"], &mnt);
    assert_eq!(v["matched_key"], "npm-linux-aaa");
    drop(_g);
    let (_g, v) = env.mount("p2", "npm", "x", &["npm-linux-"], &mnt);
    assert_eq!(v["matched_key"], "npm-linux-yyy");
    drop(_g);
    let (_g, v) = env.mount("p3", "npm", "x", &["npm-linux-"], &mnt);
    assert_eq!(v["result"], "miss");
}

#[test]
fn eight_concurrent_fills_publish_one_layer() {
    if !can_mount() {
        return;
    }
    let env = Env::new();
    let results: Vec<(String, String)> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..8)
            .map(|i| {
                let env = &env;
                s.spawn(move || {
                    let mnt = env.dir(&format!("mnt{i}"));
                    let (_g, v) = env.mount("p", "deps", "same-key", &[], &mnt);
                    let result = v["result"].as_str().unwrap().to_string();
                    let commit = if result == "miss" {
                        for f in 0..300 {
                            write(&mnt.join(format!("d{}/f{f}", f % 10)), format!("file {f}"));
                        }
                        env.commit(&mnt)["result"].as_str().unwrap().to_string()
                    } else {
                        assert_eq!(fs::read_to_string(mnt.join("d3/f123")).unwrap(), "file 123");
                        "-".to_string()
                    };
                    (result, commit)
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    let published = results.iter().filter(|r| r.1 == "published").count();
    assert_eq!(published, 1, "{results:?}");
    // With the fill lock, the other seven waited and hit.
    let hits = results.iter().filter(|r| r.0 == "hit").count();
    assert_eq!(hits, 7, "{results:?}");
    let layers = env.layers("p");
    assert_eq!(layers.len(), 1, "{layers:?}");
    assert_eq!(layers[0]["files"], 300);
}

#[test]
fn gc_evicts_lru_never_a_mounted_layer() {
    if !can_mount() {
        return;
    }
    let env = Env::new();
    let mnt = env.dir("mnt");
    for k in ["a", "b", "c"] {
        env.publish("p", "c", k, &mnt, &[("data", &k.repeat(1000))]);
    }
    // Use "a" again: it becomes the most recently used.
    drop(env.mount("p", "c", "a", &[], &mnt));
    let r = env.json(&["--json", "gc", "--max-size", "1500", "--dry-run"]);
    assert_eq!(r["evicted"].as_array().unwrap().len(), 2, "{r}");
    assert_eq!(env.layers("p").len(), 3, "dry run changed nothing");
    let r = env.json(&["--json", "gc", "--max-size", "1500"]);
    assert_eq!(r["after"]["bytes"], 1000, "{r}");
    let left = env.layers("p");
    assert_eq!(left.len(), 1);
    assert_eq!(left[0]["keys"][0], "a");
    assert_eq!(r["removed_objects"], 2);

    // A mounted layer survives any limit; once unmounted it goes.
    let (g, v) = env.mount("p", "c", "a", &[], &mnt);
    assert_eq!(v["result"], "hit");
    let r = env.json(&["--json", "gc", "--max-size", "1"]);
    assert_eq!(
        (r["evicted"].as_array().unwrap().len(), r["in_use"].as_u64()),
        (0, Some(1))
    );
    assert_eq!(
        fs::read_to_string(mnt.join("data")).unwrap(),
        "a".repeat(1000)
    );
    drop(g);
    let r = env.json(&["--json", "gc", "--max-size", "1"]);
    assert_eq!(r["evicted"].as_array().unwrap().len(), 1);
    assert_eq!(env.layers("p").len(), 0);
    let (_g, v) = env.mount("p", "c", "a", &[], &mnt);
    assert_eq!(v["result"], "miss");
    env.umount(&mnt);
}

#[test]
fn clear_refuses_layers_in_use() {
    if !can_mount() {
        return;
    }
    let env = Env::new();
    let mnt = env.dir("mnt");
    let (g, _) = env.mount("p", "c", "k", &[], &mnt);
    write(&mnt.join("f"), "x");
    env.commit(&mnt);
    let o = env.lc(&["clear", "--project", "p"]);
    assert_eq!(o.status.code(), Some(1));
    assert!(
        String::from_utf8_lossy(&o.stderr).contains("in use"),
        "{o:?}"
    );
    assert_eq!(env.layers("p").len(), 1);
    drop(g);
    env.lc_ok(&["clear", "--project", "p", "--cache", "c"]);
    assert_eq!(env.layers("p").len(), 0);
    let o = env.lc(&["clear", "--project", "nope"]);
    assert_eq!(o.status.code(), Some(2));
}

#[test]
fn busy_commit_changes_nothing() {
    if !can_mount() {
        return;
    }
    let env = Env::new();
    let mnt = env.dir("mnt");
    let (_g, _) = env.mount("p", "c", "k", &[], &mnt);
    write(&mnt.join("f"), "x");
    let open = fs::File::open(mnt.join("f")).unwrap();
    let o = env.lc(&["commit", mnt.to_str().unwrap()]);
    assert!(!o.status.success());
    assert!(String::from_utf8_lossy(&o.stderr).contains(mnt.to_str().unwrap()));
    assert!(env.layers("p").is_empty());
    assert!(is_mounted(&mnt));
    drop(open);
    assert_eq!(fs::read_to_string(mnt.join("f")).unwrap(), "x");
    assert_eq!(env.commit(&mnt)["result"], "published");
}

#[test]
fn planted_symlinks_cannot_reach_another_project() {
    if !can_mount() {
        return;
    }
    let env = Env::new();
    let mnt = env.dir("mnt");
    // p2 has a layer with a secret.
    env.publish("p2", "c", "k", &mnt, &[("secret", "p2 data")]);
    let p2 = env.store().join("v1/projects/p2");
    let mode = fs::metadata(&p2).unwrap().mode() & 0o777;
    assert_eq!(mode, 0o700);
    // p1's run plants symlinks into p2's tree and store.
    let (g, _) = env.mount("p1", "c", "k", &[], &mnt);
    std::os::unix::fs::symlink(&p2, mnt.join("to-p2")).unwrap();
    std::os::unix::fs::symlink(p2.join("objects"), mnt.join("objs")).unwrap();
    std::os::unix::fs::symlink("../../../../p2/layers", mnt.join("rel")).unwrap();
    let c = env.commit(&mnt);
    assert_eq!(
        (c["files"].as_u64(), c["new_objects"].as_u64()),
        (Some(0), Some(0)),
        "{c}"
    );
    drop(g);
    let p1_tree = env.layers("p1")[0]["layer"].as_str().unwrap().to_string();
    let tree = env
        .store()
        .join("v1/projects/p1/layers")
        .join(p1_tree)
        .join("tree");
    for n in ["to-p2", "objs", "rel"] {
        assert!(
            fs::symlink_metadata(tree.join(n))
                .unwrap()
                .file_type()
                .is_symlink()
        );
    }
    // p2 is untouched: one layer, one object with exactly its own links.
    assert_eq!(env.layers("p2").len(), 1);
    let r = env.json(&["--json", "verify", "--project", "p2"]);
    assert_eq!(r["objects_checked"], 1);
}

#[test]
fn verify_quarantines_corrupt_layers() {
    if !can_mount() {
        return;
    }
    let env = Env::new();
    let mnt = env.dir("mnt");
    let c = env.publish("p", "c", "k", &mnt, &[("f", "good bytes")]);
    let layer = c["layer"].as_str().unwrap();
    let f = env
        .store()
        .join("v1/projects/p/layers")
        .join(layer)
        .join("tree/f");
    fs::write(&f, "evil bytes").unwrap(); // same inode as the object
    let o = env.lc(&["--json", "verify"]);
    assert_eq!(o.status.code(), Some(1));
    let r: Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(r["quarantined"].as_array().unwrap().len(), 1, "{r}");
    assert!(env.layers("p").is_empty());
    let (_g, v) = env.mount("p", "c", "k", &[], &mnt);
    assert_eq!(v["result"], "miss");
}

#[test]
fn bad_input_is_exit_2_and_names_it() {
    let env = Env::new();
    let mnt = env.dir("mnt");
    let m = mnt.to_str().unwrap();
    for (args, needle) in [
        (
            vec![
                "mount",
                "--project",
                "../x",
                "--cache",
                "c",
                "--key",
                "k",
                m,
            ],
            "../x",
        ),
        (
            vec!["mount", "--project", "p", "--cache", "a/b", "--key", "k", m],
            "a/b",
        ),
        (
            vec![
                "mount",
                "--project",
                "p",
                "--cache",
                "c",
                "--key",
                "k\u{1}",
                m,
            ],
            "cache key",
        ),
        (
            vec![
                "mount",
                "--project",
                "p",
                "--cache",
                "c",
                "--key",
                "k",
                "/nonexistent/mnt",
            ],
            "/nonexistent/mnt",
        ),
        (vec!["commit", m], "not a layercache store mount"),
        (vec!["gc", "--max-size", "lots"], "lots"),
    ] {
        let o = env.lc(&args);
        let err = String::from_utf8_lossy(&o.stderr);
        assert_eq!(o.status.code(), Some(2), "{args:?}: {err}");
        assert!(err.contains(needle), "{args:?}: {err}");
    }
}

/// `layercache mount` refuses `/`, a system directory, and a symlink leading to one (or below
/// one) with a one-line exit 2 naming the mountpoint and where the symlink leads, before
/// anything is mounted or created: no store appears. Run in a private mount namespace so a
/// wrong mount could never cover the host's /etc.
#[test]
fn mount_refuses_system_directories_before_mounting() {
    if !can_mount() || !mounts::have_tool("unshare") {
        return;
    }
    let env = Env::new();
    let lnk = env.t.path().join("lnk");
    std::os::unix::fs::symlink("/etc", &lnk).unwrap();
    let via = lnk.join("newdir");
    for (mp, needle) in [
        ("/etc", None),
        ("/", None),
        ("/usr/share", None),
        (lnk.to_str().unwrap(), Some("a symlink to /etc")),
        (via.to_str().unwrap(), Some("a symlink to /etc/newdir")),
    ] {
        let lc = lc_command_at(
            &env.store(),
            &["mount", "--project", "p", "--cache", "c", "--key", "k", mp],
        );
        let o = Command::new("unshare")
            .args(["-m", "--propagation", "private", "--"])
            .arg(lc.get_program())
            .args(lc.get_args())
            .env_remove("LAYERCACHE_STORE")
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&o.stderr);
        assert_eq!(o.status.code(), Some(2), "{mp}: {err}");
        assert_eq!(err.trim().lines().count(), 1, "{mp}: one line: {err}");
        assert!(
            err.contains(&format!("mountpoint {mp}")) && err.contains("refused"),
            "{mp}: {err}"
        );
        if let Some(n) = needle {
            assert!(err.contains(n), "{mp}: {err}");
        }
        assert!(o.stdout.is_empty(), "{mp}: nothing mounted");
        assert!(
            !env.store().exists(),
            "{mp}: refused before the store is created"
        );
    }
    assert!(!Path::new("/etc/newdir").exists());
}

/// `umount` never creates a store: with `--store` at a missing directory, at a path that
/// cannot be created (under /proc) or at a regular file, a plain `layercache overlay` mount is
/// still unmounted (its upperdir kept) and no store appears; a path with nothing mounted is
/// exit 2 naming it, and changes nothing on disk.
#[test]
fn umount_without_a_store_unmounts_a_plain_overlay_and_creates_nothing() {
    if !can_mount() {
        return;
    }
    let env = Env::new();
    let missing = env.store();
    let file = env.t.path().join("a-file");
    write(&file, "not a store");
    let (lower, upper, work, mnt) = (
        env.dir("lower"),
        env.dir("upper"),
        env.dir("work"),
        env.dir("mnt"),
    );
    // A store that exists but is not readable (a format.json of another shape).
    let broken = env.dir("broken");
    fs::create_dir_all(broken.join("v1")).unwrap();
    write(&broken.join("v1/format.json"), "{ not json");
    let m = mnt.to_str().unwrap();
    for store in [
        missing.as_path(),
        Path::new("/proc/nope"),
        file.as_path(),
        broken.as_path(),
    ] {
        run_ok(
            Command::new(mounts::BIN)
                .arg("overlay")
                .arg("-o")
                .arg(format!(
                    "lowerdir={},upperdir={},workdir={}",
                    lower.display(),
                    upper.display(),
                    work.display()
                ))
                .arg(&mnt),
        );
        let _g = Mounted {
            store: store.to_path_buf(),
            mnt: mnt.clone(),
        };
        assert!(is_mounted(&mnt));
        write(&mnt.join("kept"), "x");
        let o = lc_at(store, &["umount", m]);
        assert!(
            o.status.success(),
            "--store {}: {}",
            store.display(),
            String::from_utf8_lossy(&o.stderr)
        );
        assert!(
            !is_mounted(&mnt),
            "--store {}: still mounted",
            store.display()
        );
        assert_eq!(fs::read_to_string(upper.join("kept")).unwrap(), "x");
        if store == broken {
            let err = String::from_utf8_lossy(&o.stderr);
            assert!(err.contains("cannot read the store"), "{err}");
            assert_eq!(
                fs::read_to_string(broken.join("v1/format.json")).unwrap(),
                "{ not json"
            );
        }
    }
    assert!(
        !missing.exists(),
        "umount created a store at {}",
        missing.display()
    );
    assert_eq!(fs::read_to_string(&file).unwrap(), "not a store");

    let before = names(env.t.path());
    let nowhere = env.t.path().join("nonexistent");
    for target in [nowhere.as_path(), mnt.as_path()] {
        let o = lc_at(&missing, &["umount", target.to_str().unwrap()]);
        let err = String::from_utf8_lossy(&o.stderr);
        assert_eq!(o.status.code(), Some(2), "{}: {err}", target.display());
        assert!(err.contains(target.to_str().unwrap()), "{err}");
    }
    assert!(
        !missing.exists(),
        "umount created a store at {}",
        missing.display()
    );
    assert_eq!(names(env.t.path()), before);
}

/// A store mount unmounted or committed with another `--store` than its own: commit refuses
/// and umount unmounts, both naming the mount's own store; nothing is created in the other
/// store, and the run directory stays until its own store's umount.
#[test]
fn commit_and_umount_with_another_store_name_the_mounts_own_store() {
    if !can_mount() {
        return;
    }
    let env = Env::new();
    let mnt = env.dir("mnt");
    let (_g, v) = env.mount("p", "c", "k", &[], &mnt);
    assert_eq!(v["result"], "miss", "{v}");
    let runs = env.store().join("v1/projects/p/runs");
    assert_eq!(names(&runs).len(), 1, "one run directory");
    // The right mount, the wrong store (e.g. a different LAYERCACHE_STORE in this shell).
    let other = env.dir("other-store");
    let missing = env.t.path().join("no-store");
    // commit refuses, names the mount's own store, and creates nothing.
    for store in [&other, &missing] {
        let o = lc_at(store, &["commit", mnt.to_str().unwrap()]);
        let err = String::from_utf8_lossy(&o.stderr);
        assert_eq!(o.status.code(), Some(2), "{err}");
        assert!(
            err.contains(&format!("store at {}", env.store().display())),
            "commit names the mount's own store: {err}"
        );
        assert!(is_mounted(&mnt), "a refused commit leaves the mount");
    }
    assert!(
        !missing.exists(),
        "commit created a store at {}",
        missing.display()
    );
    let o = lc_at(&other, &["umount", mnt.to_str().unwrap()]);
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(o.status.success(), "{err}");
    assert!(!is_mounted(&mnt));
    assert!(
        err.contains(&format!("store at {}", env.store().display())),
        "the message names the mount's own store: {err}"
    );
    assert_eq!(
        names(&runs).len(),
        1,
        "the run directory stays for its store"
    );
    assert!(
        names(&other).is_empty(),
        "nothing created in the other store"
    );
    // Its own store then cleans the run up.
    env.umount(&mnt);
    assert!(names(&runs).is_empty(), "run directory removed");
}

/// Read-only and trimming commands agree on bad names: without a store `ls`, `stats`, `gc`,
/// `verify` and `clear` are exit 2 naming the path and create nothing; an unknown `--project`
/// (ls, stats, verify, clear) or `--cache` (clear) is exit 2 naming it and listing what the
/// store has, and changes nothing. A negative number is the option's own message whether
/// written `--opt -1` or `--opt=-1`.
#[test]
fn unknown_names_and_a_missing_store_are_exit_2_listing_what_exists() {
    if !can_mount() {
        return;
    }
    let env = Env::new();
    let mnt = env.dir("mnt");
    let m = mnt.to_str().unwrap();
    let exit_2 = |args: &[&str], needles: &[&str]| {
        let o = env.lc(args);
        let err = String::from_utf8_lossy(&o.stderr);
        assert_eq!(o.status.code(), Some(2), "{args:?}: {err}");
        for n in needles {
            assert!(err.contains(n), "{args:?}: want {n:?} in {err}");
        }
    };
    let store = env.store();
    let no_store = format!("no layercache store at {}", store.display());
    for args in [
        &["ls"][..],
        &["stats"],
        &["gc"],
        &["verify"],
        &["clear", "--project", "p1"],
    ] {
        exit_2(args, &[&no_store]);
    }
    for (args, value) in [
        (
            &["gc", "--max-inodes", "-1"][..],
            "\"-1\" is not a whole number",
        ),
        (&["gc", "--max-inodes=-1"], "\"-1\" is not a whole number"),
        (&["gc", "--max-size", "-1G"], "invalid size \"-1G\""),
        (&["gc", "--max-age", "-5d"], "invalid duration \"-5d\""),
        (
            &[
                "mount",
                "--project",
                "p1",
                "--cache",
                "c1",
                "--key",
                "k",
                "--fill-wait",
                "-1",
                m,
            ],
            "\"-1\" is not a whole number",
        ),
    ] {
        exit_2(args, &[value]);
    }
    assert!(!store.exists(), "a read-only command created the store");

    env.publish("p1", "c1", "k1", &mnt, &[("f", "x")]);
    for args in [
        &["ls", "--project", "nope"][..],
        &["stats", "--project", "nope"],
        &["verify", "--project", "nope"],
        &["clear", "--project", "nope"],
    ] {
        exit_2(args, &["project nope", "projects: p1"]);
    }
    exit_2(
        &["clear", "--project", "p1", "--cache", "nope"],
        &["cache nope", "caches: c1"],
    );
    assert_eq!(env.layers("p1").len(), 1, "a refused clear removed a layer");
    assert!(!store.join("v1/projects/nope").exists());
    env.lc_ok(&["stats", "--project", "p1"]);
}

/// Unmounts a tmpfs on drop (after the mounts that live on it are gone).
struct Tmpfs(PathBuf);

impl Drop for Tmpfs {
    fn drop(&mut self) {
        mounts::lazy_umount(&self.0);
    }
}

/// Fills the filesystem holding `path` until writes fail with ENOSPC.
fn fill_up(path: &Path) {
    use std::io::Write;
    let mut f = fs::File::create(path).unwrap();
    for chunk in [65536usize, 4096, 1] {
        let buf = vec![0xa5u8; chunk];
        loop {
            match f.write(&buf) {
                Ok(n) if n > 0 => {}
                Ok(_) => break,
                Err(e) => {
                    assert_eq!(e.raw_os_error(), Some(libc::ENOSPC), "{e}");
                    break;
                }
            }
        }
    }
}

/// A full disk (ENOSPC) while filling gives the writer ENOSPC (not EIO). A commit while the
/// disk is full has one outcome, asserted here: it fails with a clear error (exit 1, naming
/// ENOSPC), publishes nothing and leaves no half-built layer, the published layer stays intact,
/// and the run's files are kept, so the same `commit` publishes them once there is space.
///
/// The failed commit cannot put the mount back: remounting writes the run's record again, and
/// the disk is still completely full at that moment (the test frees space only after the commit
/// returns; the store's tmpfs holds nothing that is freed meanwhile). So the error also says the
/// mountpoint could not be mounted again, and the files stay in the run directory. (With a
/// little space left at that point the mount is put back instead; no test setup reaches that
/// point deterministically from outside the commit.)
#[test]
fn enospc_while_filling_and_promoting_loses_nothing() {
    if !can_mount() {
        return;
    }
    let env = Env::on_tmpfs("8m");
    // A published layer that must survive everything below.
    let (m1, m2) = (env.dir("m1"), env.dir("m2"));
    env.publish("p", "c", "k1", &m1, &[("keep", "published data")]);

    let (_g2, _) = env.mount("p", "c", "k2", &[], &m2);
    // Filling: the writer sees ENOSPC.
    let big = vec![7u8; 16 << 20];
    let err = fs::write(m2.join("big"), &big).unwrap_err();
    assert_eq!(err.raw_os_error(), Some(libc::ENOSPC), "{err}");
    // Truncate before unlinking: the overlay keeps an unlinked file's data until the kernel
    // forgets the inode, which happens asynchronously; truncation frees it now.
    fs::OpenOptions::new()
        .write(true)
        .open(m2.join("big"))
        .and_then(|f| f.set_len(0))
        .unwrap();
    fs::remove_file(m2.join("big")).unwrap();
    for i in 0..20 {
        write(&m2.join(format!("d{i}/f")), format!("file {i}"));
    }
    // Promoting with no space left, and none freed until the commit has returned.
    let filler = env.small().join("filler");
    fill_up(&filler);
    let o = env.lc(&["commit", m2.to_str().unwrap()]);
    let stderr = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(1), "commit on a full disk: {stderr}");
    let last = stderr.lines().last().unwrap_or_default();
    assert!(
        last.contains("No space left on device"),
        "the commit's error names ENOSPC: {stderr}"
    );
    assert!(
        stderr.contains("could not be mounted again") && stderr.contains("stay in the run"),
        "{stderr}"
    );
    assert!(!is_mounted(&m2), "{stderr}");
    // Nothing published and nothing half-built: one layer, one key, an empty staging dir.
    let project = env.store().join("v1/projects/p");
    assert_eq!(env.layers("p").len(), 1);
    assert_eq!(names(&project.join("caches/c/keys")), ["k1"]);
    assert_eq!(names(&project.join("staging")), Vec::<String>::new());
    // The run's files are kept (the run directory is the only one).
    let runs = names(&project.join("runs"));
    assert_eq!(runs.len(), 1, "{runs:?}");
    let upper = project.join("runs").join(&runs[0]).join("upper");
    assert_eq!(fs::read_to_string(upper.join("d3/f")).unwrap(), "file 3");

    // With space again, the same commit publishes them and mounts the new layer as a hit.
    fs::remove_file(&filler).unwrap();
    let c = env.commit(&m2);
    assert_eq!(
        (c["result"].as_str(), c["files"].as_u64()),
        (Some("published"), Some(20)),
        "{c}"
    );
    assert_eq!(c["remount"]["result"], "hit", "{c}");
    assert_eq!(fs::read_to_string(m2.join("d3/f")).unwrap(), "file 3");
    env.umount(&m2);
    // The published layer is intact and the store still works.
    let (_g1, _) = env.mount("p", "c", "k1", &[], &m1);
    assert_eq!(
        fs::read_to_string(m1.join("keep")).unwrap(),
        "published data"
    );
    env.umount(&m1);
    env.publish("p", "c", "k3", &m2, &[("x", "x")]);
    env.lc_ok(&["verify", "--project", "p"]);
}

/// The fill locks (`caches/<c>/fills/<key>.lock`) of the store's project `p`, cache `c`.
fn fill_locks(env: &Env) -> Vec<String> {
    names(&env.store().join("v1/projects/p/caches/c/fills"))
}

/// issue 11: a fill's lock file goes when the fill ends: published, or discarded by umount.
#[test]
fn fill_locks_are_removed_when_the_fill_ends() {
    if !can_mount() {
        return;
    }
    let env = Env::new();
    let mnt = env.dir("mnt");
    env.publish("p", "c", "k1", &mnt, &[("f", "one")]);
    assert_eq!(fill_locks(&env), Vec::<String>::new(), "after a publish");
    let (_g, v) = env.mount("p", "c", "k2", &["k"], &mnt);
    assert_eq!(v["result"], "restore", "{v}");
    assert_eq!(
        fill_locks(&env),
        vec!["k2.lock".to_string()],
        "while filling"
    );
    env.umount(&mnt);
    assert_eq!(
        fill_locks(&env),
        Vec::<String>::new(),
        "after a discarded fill"
    );
    // The key can be filled again at once.
    env.publish("p", "c", "k2", &mnt, &[("f", "two")]);
    assert_eq!(fill_locks(&env), Vec::<String>::new());
}

/// issue 11: `gc --dry-run` reports the objects the real gc then removes (it used to say 0,
/// since the evicted layers still linked them).
#[test]
fn gc_dry_run_reports_what_gc_removes() {
    if !can_mount() {
        return;
    }
    let env = Env::new();
    let mnt = env.dir("mnt");
    for k in ["a", "b", "c"] {
        env.publish(
            "p",
            "c",
            k,
            &mnt,
            &[("data", &k.repeat(1000)), ("same", "shared")],
        );
    }
    // Two layers go: their `data` and their `same` (equal bytes, but each its own mtime, so
    // its own object) — 4 objects, 2012 bytes.
    let dry = env.json(&["--json", "gc", "--max-size", "1500", "--dry-run"]);
    let real = env.json(&["--json", "gc", "--max-size", "1500"]);
    for f in [
        "evicted",
        "removed_objects",
        "freed_bytes",
        "before",
        "after",
    ] {
        assert_eq!(dry[f], real[f], "{f}: dry {dry} vs real {real}");
    }
    assert_eq!(
        (
            real["removed_objects"].as_u64(),
            real["freed_bytes"].as_u64()
        ),
        (Some(4), Some(2012))
    );
}

/// A killed pull or promotion leaves a staging tree that may be the only link to its objects:
/// `gc --dry-run` counts them as the real gc then removes them.
#[test]
fn gc_dry_run_counts_objects_only_a_staging_tree_links() {
    if !can_mount() {
        return;
    }
    let env = Env::new();
    let mnt = env.dir("mnt");
    env.publish(
        "p",
        "c",
        "a",
        &mnt,
        &[("data", &"x".repeat(1000)), ("more", "y")],
    );
    // Turn the published layer into a killed build's staging tree: no key, no layer dir.
    let pd = env.store().join("v1/projects/p");
    let layer = fs::read_dir(pd.join("layers"))
        .unwrap()
        .next()
        .unwrap()
        .unwrap()
        .path();
    fs::create_dir_all(pd.join("staging/killed")).unwrap();
    fs::rename(layer.join("tree"), pd.join("staging/killed/tree")).unwrap();
    fs::remove_dir_all(&layer).unwrap();
    fs::remove_dir_all(pd.join("caches/c/keys")).unwrap();
    let dry = env.json(&["--json", "gc", "--dry-run"]);
    let real = env.json(&["--json", "gc"]);
    for f in ["removed_objects", "freed_bytes", "removed_staging"] {
        assert_eq!(dry[f], real[f], "{f}: dry {dry} vs real {real}");
    }
    assert_eq!(real["removed_objects"].as_u64(), Some(2), "{real}");
}

/// issue 11: quarantined layers and objects count against the limits, and go with gc's age
/// limit and with `clear`.
#[test]
fn quarantine_is_counted_and_purged_by_gc_and_clear() {
    if !can_mount() {
        return;
    }
    let env = Env::new();
    let mnt = env.dir("mnt");
    let quarantine = env.store().join("v1/projects/p/quarantine");
    let corrupt = |key: &str| {
        let c = env.publish("p", "c", key, &mnt, &[("f", &format!("good {key}"))]);
        let layer = c["layer"].as_str().unwrap();
        let tree = env
            .store()
            .join("v1/projects/p/layers")
            .join(layer)
            .join("tree");
        fs::write(tree.join("f"), "evil bytes").unwrap(); // same inode as the object
        assert_eq!(env.lc(&["verify"]).status.code(), Some(1));
        assert!(!names(&quarantine).is_empty());
    };
    corrupt("k1");
    assert!(env.layers("p").is_empty());
    let r = env.json(&["--json", "gc", "--dry-run"]);
    assert!(
        r["before"]["bytes"].as_u64().unwrap() >= 10,
        "the quarantined layer and object count: {r}"
    );
    // Over the byte limit, or older than the age limit: it goes.
    let r = env.json(&["--json", "gc", "--max-age", "1ms"]);
    assert_eq!(
        r["evicted"].as_array().unwrap().len(),
        2,
        "layer + objects: {r}"
    );
    assert_eq!(r["after"]["bytes"], 0, "{r}");
    assert!(names(&quarantine).is_empty());
    assert_eq!(
        env.json(&["--json", "gc", "--dry-run"])["before"]["bytes"],
        0
    );

    corrupt("k2");
    env.lc_ok(&["clear", "--project", "p"]);
    assert!(!quarantine.exists(), "clear purges the quarantine");
}

/// issue 11: a cleared project's directory goes, and error hints stop listing it.
#[test]
fn a_cleared_project_leaves_nothing() {
    if !can_mount() {
        return;
    }
    let env = Env::new();
    let mnt = env.dir("mnt");
    env.publish("gone", "c", "k", &mnt, &[("f", "x")]);
    env.publish("kept", "c", "k", &mnt, &[("f", "y")]);
    env.lc_ok(&["clear", "--project", "gone"]);
    assert_eq!(
        names(&env.store().join("v1/projects")),
        vec!["kept".to_string()]
    );
    let o = env.lc(&["ls", "--project", "nope"]);
    assert_eq!(o.status.code(), Some(2));
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(err.contains("kept") && !err.contains("gone"), "{err}");
    assert_eq!(env.layers("kept").len(), 1);
}

/// A partial layer (what a lazy mount fetched so far) counts against `max_size` and is
/// evicted like a layer when no run holds it; one whose lease a run holds stays.
#[test]
fn gc_counts_and_evicts_partial_layers_no_run_holds() {
    if !can_mount() {
        return;
    }
    let env = Env::new();
    let mnt = env.dir("mnt");
    env.publish("p", "c", "a", &mnt, &[("data", "x")]);
    let partial = env.store.join("v1/projects/p/partial");
    for (name, kib) in [
        ("01a2aaaaaaaa-aaaaaaaaaaaaaaaa", 64),
        ("01a2bbbbbbbb-bbbbbbbbbbbbbbbb", 32),
    ] {
        let held = partial.join(name).join("held");
        fs::create_dir_all(&held).unwrap();
        fs::write(held.join("obj"), vec![7u8; kib << 10]).unwrap();
        fs::write(partial.join(name).join("lease"), "").unwrap();
    }
    // A run holds the second one.
    let lease = fs::File::open(partial.join("01a2bbbbbbbb-bbbbbbbbbbbbbbbb/lease")).unwrap();
    // SAFETY: flock(2) on a descriptor this test owns.
    assert_eq!(
        unsafe { libc::flock(std::os::fd::AsRawFd::as_raw_fd(&lease), libc::LOCK_SH) },
        0
    );
    let r = env.json(&["--json", "gc", "--max-size", "1K", "--dry-run"]);
    assert!(r["before"]["bytes"].as_u64().unwrap() >= 96 << 10, "{r}");
    let r = env.json(&["--json", "gc", "--max-size", "1K"]);
    let evicted: Vec<&str> = (r["evicted"].as_array().unwrap().iter())
        .map(|v| v.as_str().unwrap())
        .collect();
    assert!(
        evicted.contains(&"p/partial/01a2aaaaaaaa-aaaaaaaaaaaaaaaa"),
        "{r}"
    );
    assert!(!partial.join("01a2aaaaaaaa-aaaaaaaaaaaaaaaa").exists());
    assert!(
        partial
            .join("01a2bbbbbbbb-bbbbbbbbbbbbbbbb/held/obj")
            .exists(),
        "held by a run"
    );
    drop(lease);
}
