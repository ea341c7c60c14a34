//! What a new user hit on first use (issue 24), through the binary: `$PWD` under
//! `--workdir-view`, the host view directories a run made, an empty layer's warning and its
//! saving, per-cache stats, `ls`/`gc` sizes and the dry run's list, the `--json` error line's
//! run id, `key` before a store exists, a `--workdir` that is a file, and spec validation that
//! lists every error and refuses a system directory as a mountpoint before anything runs, and a
//! key file symlinked out of the project refused by `key`.
//!
//! Real FUSE mounts as root with /dev/fuse (a skip otherwise, a failure when `CI` is set); every
//! path a run makes is below the test's sandbox, whose Drop unmounts anything left.

use std::process::{Command, Output};

#[path = "common/run.rs"]
mod run_common;

use run_common::{BIN, Sandbox, can_mount, run_ok, show};

/// A cache without a preset whose setup runs `setup`, keyed on deps.lock, at `mountpoint`.
fn spec(project: &str, mountpoint: &str, setup: &str) -> String {
    format!(
        "project = \"{project}\"\n[[cache]]\nid = \"deps\"\nkey_files = [\"deps.lock\"]\n\
         mountpoint = \"{mountpoint}\"\nsetup = '{setup}'\n"
    )
}

fn lc(sb: &Sandbox, args: &[&str]) -> Output {
    let out = Command::new(BIN)
        .arg("--store")
        .arg(sb.path("store"))
        .args(args)
        .output()
        .unwrap();
    eprintln!("layercache {args:?}: {}", show(&out));
    out
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

/// `--workdir-view`: setup and COMMAND see `$PWD` as the view (the shell kept the inherited host
/// path before); the view directory and the workdir's mount directory the run made on the host
/// are gone when it ends, and a directory that was there before stays.
#[test]
fn pwd_is_the_view_and_the_host_dirs_a_run_made_are_removed() {
    if !can_mount() {
        return;
    }
    let sb = Sandbox::new();
    std::fs::write(sb.work().join("deps.lock"), "a=1\n").unwrap();
    let view = sb.path("view");
    let s = sb.write_spec(
        "spec.toml",
        &spec(
            "p",
            "{workdir}/deps",
            "echo \"$PWD\" > \"$LAYERCACHE_MOUNT/setup-pwd\"",
        ),
    );
    let out = sb.run_flags(
        &s,
        &sb.work(),
        &["--workdir-view", view.to_str().unwrap()],
        &["sh", "-c", "echo \"pwd=$PWD\"; cat deps/setup-pwd; pwd -P"],
    );
    assert_eq!(out.status.code(), Some(0), "{}", show(&out));
    let lines: Vec<String> = text(&out.stdout)
        .lines()
        .filter(|l| !l.starts_with('{'))
        .map(String::from)
        .collect();
    let v = view.display().to_string();
    assert_eq!(
        lines,
        [format!("pwd={v}"), v.clone(), v.clone()],
        "{lines:?}"
    );
    // made by the run, empty after it: removed
    assert!(!view.exists(), "the view directory stayed on the host");
    assert!(
        !sb.work().join("deps").exists(),
        "the mount directory stayed"
    );
    assert!(sb.mounts_below().is_empty(), "{:?}", sb.mounts_below());
    // there before the run: stays
    std::fs::create_dir(sb.work().join("deps")).unwrap();
    let out = sb.run_flags(&s, &sb.work(), &[], &["true"]);
    assert_eq!(out.status.code(), Some(0), "{}", show(&out));
    assert!(sb.work().join("deps").is_dir());
}

/// An empty layer: the publish warns naming the cache, and its hits save nothing in `stats`
/// (which lists each cache's miss median apart).
#[test]
fn an_empty_layer_is_said_at_publish_and_saves_nothing() {
    if !can_mount() {
        return;
    }
    let sb = Sandbox::new();
    std::fs::write(sb.work().join("deps.lock"), "a=1\n").unwrap();
    // The setup takes a second and writes nothing to its mount (as a tool writing elsewhere).
    let s = sb.write_spec(
        "spec.toml",
        &spec(
            "p",
            "{mount_root}/deps",
            "sleep 1; echo elsewhere > /dev/null",
        ),
    );
    let first = sb.run(&s, None);
    assert_eq!(first.status.code(), Some(0));
    let err = text(&first.stderr);
    assert!(
        err.contains("warning: cache \"deps\" published an empty layer")
            && err.contains("elsewhere"),
        "{err}"
    );
    let second = sb.run(&s, None);
    assert_eq!(second.status.code(), Some(0));
    assert!(!text(&second.stderr).contains("empty layer"));
    let ev = sb.events();
    assert_eq!(
        (ev[0]["result"].as_str(), ev[1]["result"].as_str()),
        (Some("miss"), Some("hit"))
    );
    let stats: serde_json::Value = serde_json::from_slice(
        &run_ok(
            Command::new(BIN)
                .arg("--store")
                .arg(sb.path("store"))
                .args(["--json", "stats"]),
        )
        .stdout,
    )
    .unwrap();
    assert_eq!(stats["saved_ms"], 0, "{stats}");
    assert_eq!(stats["caches"][0]["cache"], "deps", "{stats}");
    assert_eq!(stats["caches"][0]["hits"], 1, "{stats}");
    assert!(
        stats["caches"][0]["median_miss_ms"].as_u64().unwrap() >= 1000,
        "{stats}"
    );
    let t = text(&lc(&sb, &["stats"]).stdout);
    assert!(t.contains("p/deps") && t.contains("MEDIAN MISS"), "{t}");
}

/// `ls` and `gc` print binary units (`--bytes`: counts), and `gc --dry-run` lists the layers it
/// would evict in text too.
#[test]
fn ls_and_gc_print_sizes_and_the_dry_run_lists_its_layers() {
    if !can_mount() {
        return;
    }
    let sb = Sandbox::new();
    std::fs::write(sb.work().join("deps.lock"), "a=1\n").unwrap();
    let s = sb.write_spec(
        "spec.toml",
        &spec(
            "p",
            "{mount_root}/deps",
            "head -c 3000 /dev/zero > \"$LAYERCACHE_MOUNT/f\"",
        ),
    );
    assert_eq!(sb.run(&s, None).status.code(), Some(0));
    let layer = sb.ls()[0]["layer"].as_str().unwrap().to_string();
    let ls = text(&lc(&sb, &["ls"]).stdout);
    assert!(ls.contains("SIZE") && ls.contains("2.9 KiB"), "{ls}");
    let ls = text(&lc(&sb, &["ls", "--bytes"]).stdout);
    assert!(ls.contains("BYTES") && ls.contains(" 3000 "), "{ls}");
    let gc = text(&lc(&sb, &["gc", "--max-size", "1", "--dry-run"]).stdout);
    assert!(gc.contains(&format!("would evict p/{layer}")), "{gc}");
    assert!(gc.contains("(dry run) would evict 1 layer(s)"), "{gc}");
    let gc = text(&lc(&sb, &["gc", "--max-size", "1", "--dry-run", "--bytes"]).stdout);
    assert!(gc.contains("(3000 bytes)"), "{gc}");
    assert_eq!(sb.ls().len(), 1, "a dry run removed a layer");
}

/// `--json`: a run that failed after it got its id names it in the error line; `key` before
/// a store exists says so; a `--workdir` that is a file says "not a directory".
#[test]
fn errors_people_read() {
    if !can_mount() {
        return;
    }
    let sb = Sandbox::new();
    std::fs::write(sb.work().join("deps.lock"), "a=1\n").unwrap();
    let s = sb.write_spec("fail.toml", &spec("p", "{mount_root}/deps", "exit 3"));

    // `key` before any store: a miss, "no store yet", and still no store.
    std::fs::remove_dir(sb.path("store")).unwrap();
    let key = |json: bool| {
        let mut c = Command::new(BIN);
        c.arg("--store").arg(sb.path("store"));
        if json {
            c.arg("--json");
        }
        c.args(["key", "--spec"])
            .arg(&s)
            .arg("--workdir")
            .arg(sb.work());
        run_ok(&mut c)
    };
    let k = text(&key(false).stdout);
    assert!(k.contains("would match:  miss (no store yet at"), "{k}");
    let k: serde_json::Value = serde_json::from_slice(&key(true).stdout).unwrap();
    assert_eq!(k["caches"][0]["would_match"]["result"], "miss", "{k}");
    assert!(!sb.path("store").exists(), "key created a store");

    let out = sb.run_flags(&s, &sb.work(), &[], &[]);
    assert_eq!(out.status.code(), Some(3));
    let line: serde_json::Value = text(&out.stdout)
        .lines()
        .filter_map(|l| serde_json::from_str(l).ok())
        .find(|v: &serde_json::Value| v.get("error").is_some())
        .expect("an error line");
    assert_eq!(line["exit"], 3, "{line}");
    assert_eq!(line["run"], sb.events()[0]["run"], "{line}");
    assert!(!line["run"].as_str().unwrap().is_empty());

    let file = sb.work().join("deps.lock");
    let out = sb.run_flags(&s, &file, &[], &[]);
    assert_eq!(out.status.code(), Some(2));
    assert!(
        text(&out.stderr).contains("not a directory"),
        "{}",
        show(&out)
    );
    assert!(text(&out.stdout).contains("not a directory"));
}

/// The spec `layercache run` refuses is refused by the validation the API uses too, every bad
/// field listed, before anything is mounted or run.
#[test]
fn run_lists_every_spec_error_and_refuses_a_system_mountpoint() {
    let sb = Sandbox::new();
    std::fs::write(sb.work().join("deps.lock"), "a=1\n").unwrap();
    let s = sb.write_spec(
        "spec.toml",
        "project = \"p\"\n[[cache]]\nid = \"a\"\npreset = \"npm\"\nmountpoint = \"/etc\"\n\
         [[cache]]\nid = \"b\"\nkey_files = [\"/abs\"]\nsetup = \"touch {workdir}/ran\"\n",
    );
    let out = sb.run(&s, Some("touch ran-command"));
    assert_eq!(out.status.code(), Some(2), "{}", show(&out));
    let err = text(&out.stderr);
    assert!(err.contains("2 errors"), "{err}");
    assert!(
        err.contains("cache[0].mountpoint: \"/etc\" is refused"),
        "{err}"
    );
    assert!(err.contains("cache[1].key_files"), "{err}");
    assert!(!sb.work().join("ran").exists() && !sb.work().join("ran-command").exists());
}

/// `key` with a key file that is a symlink out of the project (`lock -> <outside>/shadow`):
/// exit 2 with one line naming the key_files entry, the path and where it leads; no hash of the
/// outside file is printed or stored. A symlink that stays inside is followed.
#[test]
fn a_key_file_symlinked_outside_the_project_is_refused() {
    let sb = Sandbox::new();
    let secret = sb.path("shadow");
    std::fs::write(&secret, "root:secret\n").unwrap();
    std::os::unix::fs::symlink(&secret, sb.work().join("lock")).unwrap();
    let spec_text = |file: &str| {
        format!(
            "project = \"p\"\n[[cache]]\nid = \"deps\"\nkey_files = [\"{file}\"]\n\
             mountpoint = \"{{mount_root}}/deps\"\nsetup = 'true'\n"
        )
    };
    let s = sb.write_spec("out.toml", &spec_text("lock"));
    let key = |spec: &std::path::Path| {
        let mut c = Command::new(BIN);
        c.arg("--store")
            .arg(sb.path("store"))
            .arg("--json")
            .args(["key", "--spec"])
            .arg(spec)
            .arg("--workdir")
            .arg(sb.work());
        let out = c.output().unwrap();
        eprintln!("layercache key: {}", show(&out));
        out
    };
    let out = key(&s);
    assert_eq!(out.status.code(), Some(2), "{}", show(&out));
    let err = text(&out.stderr);
    let real = std::fs::canonicalize(&secret).unwrap();
    assert!(
        err.contains(&format!("key_files \"lock\": lock -> {}", real.display()))
            && err.contains("outside the project"),
        "{err}"
    );
    assert_eq!(err.trim().lines().count(), 1, "{err}");
    assert!(
        !text(&out.stdout).contains("key file lock"),
        "{}",
        show(&out)
    );

    // Inside the project the symlink is followed.
    std::fs::write(sb.work().join("deps.lock"), "a=1\n").unwrap();
    std::fs::remove_file(sb.work().join("lock")).unwrap();
    std::os::unix::fs::symlink("deps.lock", sb.work().join("lock")).unwrap();
    let out = key(&s);
    assert_eq!(out.status.code(), Some(0), "{}", show(&out));
    assert!(
        text(&out.stdout).contains("key file lock"),
        "{}",
        show(&out)
    );
}

/// A user whose default store would be under a `HOME` that does not exist: bad input (exit 2),
/// one line naming the store, the missing HOME and what to pass instead (issue 24's newcomer
/// check). Runs as `nobody` (65534) through setpriv; skipped unless root.
#[test]
fn a_user_store_under_a_missing_home_is_bad_input() {
    if !rustix::process::geteuid().is_root() {
        return;
    }
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::Builder::new()
        .prefix("layercache-home-")
        .tempdir()
        .unwrap();
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    let work = dir.path().join("work");
    std::fs::create_dir(&work).unwrap();
    std::fs::write(work.join("deps.lock"), "a=1\n").unwrap();
    let cache = dir.path().join("cache");
    std::fs::create_dir(&cache).unwrap();
    std::fs::set_permissions(&cache, std::fs::Permissions::from_mode(0o1777)).unwrap();
    let home = dir.path().join("no-such-home");
    let mut child = Command::new("setpriv")
        .args([
            "--reuid",
            "65534",
            "--regid",
            "65534",
            "--clear-groups",
            "--",
        ])
        .arg(BIN)
        .args(["run", "--spec", "-", "--workdir"])
        .arg(&work)
        .arg("--mount-root")
        .arg(&cache)
        .env_remove("XDG_CACHE_HOME")
        .env_remove("LAYERCACHE_STORE")
        .env("HOME", &home)
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    use std::io::Write;
    let mut stdin = child.stdin.take().unwrap();
    stdin
        .write_all(spec("p", "{mount_root}/deps", "true").as_bytes())
        .unwrap();
    drop(stdin);
    let out = child.wait_with_output().unwrap();
    eprintln!("{}", show(&out));
    assert_eq!(out.status.code(), Some(2), "{}", show(&out));
    let err = text(&out.stderr);
    let want = format!(
        "store {}/.cache/layercache: cannot create it: ",
        home.display()
    );
    assert!(err.contains(&want), "{err}");
    assert!(
        err.contains(&format!("(HOME={} does not exist)", home.display()))
            && err.contains("--store DIR"),
        "{err}"
    );
    assert_eq!(err.trim_end().lines().count(), 1, "{err}");
    assert!(!home.exists());
}

/// A relative `--store` names the store below the directory the command runs in, also for the
/// setup, whose writes land in the published layer (the daemon and steps work elsewhere: the
/// store used to be published empty), and the next run hits it with the file in its view.
#[test]
fn a_relative_store_path_keeps_the_setups_writes() {
    if !can_mount() {
        return;
    }
    let sb = Sandbox::new();
    std::fs::write(sb.work().join("deps.lock"), "a=1\n").unwrap();
    let s = sb.write_spec(
        "spec.toml",
        &spec(
            "p",
            "{mount_root}/deps",
            "echo hi > \"$LAYERCACHE_MOUNT/f\"",
        ),
    );
    let run = || {
        let out = Command::new(BIN)
            .current_dir(sb.path(""))
            .args(["--store", "relstore", "--json", "run", "--spec"])
            .arg(&s)
            .arg("--workdir")
            .arg(sb.work())
            .arg("--mount-root")
            .arg(sb.path("cache"))
            .args(["--", "cat"])
            .arg(sb.path("cache").join("deps/f"))
            .output()
            .unwrap();
        eprintln!("run: {}", show(&out));
        out
    };
    for want in ["miss", "hit"] {
        let out = run();
        assert_eq!(out.status.code(), Some(0), "{}", show(&out));
        assert!(
            text(&out.stdout).lines().any(|l| l == "hi"),
            "{want}: {}",
            show(&out)
        );
    }
    assert!(sb.path("relstore").join("v1").is_dir());
}
