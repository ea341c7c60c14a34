//! Real programs and multi-process/multi-user use inside a mount: SQLite in WAL mode, git,
//! concurrent appenders, a Go-module-cache-like read-only tree, other uids through allow_other
//! with default_permissions (issue 2).

#[macro_use]
mod common;

use std::collections::BTreeMap;
use std::fs;
use std::os::unix::fs::MetadataExt;
use std::path::Path;
use std::process::{Command, Stdio};

use common::*;

fn sqlite(db: &Path, sql: &str) -> String {
    // A busy timeout, as real applications set: a writer that meets the concurrent reader's
    // lock (or WAL recovery by another connection) waits instead of failing with SQLITE_BUSY.
    let out = run_ok(
        Command::new("sqlite3")
            .arg("-batch")
            .args(["-cmd", ".timeout 10000"])
            .arg(db)
            .arg(sql),
    );
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

#[test]
fn sqlite_wal_integrity_after_updates() {
    require_root!();
    let mut fx = Fixture::new(|l| {
        let db = l.join("app.db");
        sqlite(
            &db,
            "pragma journal_mode=wal;
             create table t(id integer primary key, v text, b blob);
             with recursive n(i) as (select 1 union all select i+1 from n where i < 3000)
             insert into t(v, b) select 'row ' || i, randomblob(200) from n;
             create index tv on t(v);",
        );
    });
    let db = fx.p("app.db");
    assert_eq!(sqlite(&db, "pragma journal_mode;"), "wal");
    // Several writers in sequence plus a reader running alongside one of them.
    sqlite(&db, "update t set v = v || ' x' where id % 3 = 0;");
    let reader = Command::new("sqlite3")
        .args(["-cmd", ".timeout 10000"])
        .arg(&db)
        .arg("select count(*) from t; select count(*) from t where v like '%x';")
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    sqlite(
        &db,
        "begin;
         with recursive n(i) as (select 1 union all select i+1 from n where i < 2000)
         insert into t(v, b) select 'new ' || i, randomblob(300) from n;
         delete from t where id % 7 = 0;
         commit;",
    );
    let out = reader.wait_with_output().unwrap();
    assert!(out.status.success(), "concurrent reader failed");
    sqlite(
        &db,
        "update t set b = randomblob(500) where id % 11 = 0; pragma wal_checkpoint(truncate);",
    );
    sqlite(&db, "update t set v = 'last' where id = 1;");
    let want_rows = 5000 - (1..=5000).filter(|i| i % 7 == 0).count();
    for round in ["live", "after remount"] {
        assert_eq!(sqlite(&db, "pragma integrity_check;"), "ok", "{round}");
        assert_eq!(
            sqlite(&db, "select count(*) from t;"),
            want_rows.to_string(),
            "{round}"
        );
        assert_eq!(
            sqlite(&db, "select v from t where id = 1;"),
            "last",
            "{round}"
        );
        if round == "live" {
            fx.remount();
        }
    }
}

fn git(dir: &Path, home: &Path, args: &[&str]) -> String {
    let out = run_ok(
        Command::new("git")
            .args(args)
            .current_dir(dir)
            .env("HOME", home)
            .env("GIT_CONFIG_NOSYSTEM", "1")
            .env("GIT_AUTHOR_NAME", "t")
            .env("GIT_AUTHOR_EMAIL", "t@example.com")
            .env("GIT_COMMITTER_NAME", "t")
            .env("GIT_COMMITTER_EMAIL", "t@example.com"),
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

#[test]
fn git_init_commit_gc_status() {
    require_root!();
    let home = tempfile::tempdir().unwrap();
    let h = home.path().to_path_buf();
    let mut fx = Fixture::new(|l| {
        // A repository that already exists in the lower layer.
        let r = l.join("old");
        fs::create_dir(&r).unwrap();
        git(&r, &h, &["init", "-q", "-b", "main"]);
        for i in 0..30 {
            write(&r.join(format!("src/f{i}.txt")), format!("file {i}\n"));
        }
        git(&r, &h, &["add", "."]);
        git(&r, &h, &["commit", "-q", "-m", "lower commit"]);
    });
    // A fresh repository inside the mount.
    let r = fx.p("fresh");
    fs::create_dir(&r).unwrap();
    git(&r, &h, &["init", "-q", "-b", "main"]);
    for i in 0..40 {
        write(
            &r.join(format!("dir{}/f{i}.txt", i % 4)),
            format!("content {i}\n"),
        );
    }
    git(&r, &h, &["add", "."]);
    git(&r, &h, &["commit", "-q", "-m", "one"]);
    for i in 0..10 {
        write(&r.join(format!("dir0/f{i}.txt")), format!("changed {i}\n"));
    }
    fs::remove_file(r.join("dir1/f1.txt")).unwrap();
    git(&r, &h, &["add", "-A"]);
    git(&r, &h, &["commit", "-q", "-m", "two"]);
    git(&r, &h, &["gc", "-q", "--aggressive", "--prune=now"]);
    // The lower repository: commit on top of it, then gc (repacks and deletes lower objects).
    let o = fx.p("old");
    write(&o.join("src/f0.txt"), "edited in the mount\n");
    write(&o.join("added.txt"), "added\n");
    git(&o, &h, &["add", "-A"]);
    git(&o, &h, &["commit", "-q", "-m", "upper commit"]);
    git(&o, &h, &["gc", "-q", "--prune=now"]);
    for round in ["live", "after remount"] {
        for (repo, commits) in [(&r, 2), (&o, 2)] {
            assert_eq!(
                git(repo, &h, &["status", "--porcelain"]),
                "",
                "{round}: clean tree"
            );
            git(repo, &h, &["fsck", "--full", "--strict"]);
            let log = git(repo, &h, &["log", "--oneline"]);
            assert_eq!(log.lines().count(), commits, "{round}: {log}");
        }
        if round == "live" {
            fx.remount();
        }
    }
}

#[test]
fn four_processes_append_to_one_lower_file() {
    require_root!();
    const LINES: usize = 400;
    let fx = Fixture::new(|l| {
        let base: String = (0..10).map(|i| format!("base {i}\n")).collect();
        write(&l.join("log"), base);
    });
    // Two writers keep one O_APPEND fd; two reopen the file for every line.
    let script = |n: usize| {
        if n.is_multiple_of(2) {
            format!(
                "exec 3>>log; i=0; while [ $i -lt {LINES} ]; do printf 'p{n} line %s\\n' $i >&3; i=$((i+1)); done"
            )
        } else {
            format!(
                "i=0; while [ $i -lt {LINES} ]; do printf 'p{n} line %s\\n' $i >>log; i=$((i+1)); done"
            )
        }
    };
    let children: Vec<_> = (0..4)
        .map(|n| {
            Command::new("sh")
                .arg("-c")
                .arg(script(n))
                .current_dir(&fx.mnt)
                .spawn()
                .unwrap()
        })
        .collect();
    for mut c in children {
        assert!(c.wait().unwrap().success());
    }
    let text = read(&fx.p("log"));
    let lines: Vec<&str> = text.lines().collect();
    let base: Vec<String> = (0..10).map(|i| format!("base {i}")).collect();
    assert_eq!(
        lines[..10],
        base[..],
        "the lower content stays first and intact"
    );
    let mut count: BTreeMap<&str, usize> = BTreeMap::new();
    for l in &lines[10..] {
        *count.entry(l).or_default() += 1;
    }
    for n in 0..4 {
        for i in 0..LINES {
            let want = format!("p{n} line {i}");
            assert_eq!(count.get(want.as_str()), Some(&1), "line {want:?}");
        }
    }
    assert_eq!(lines.len(), 10 + 4 * LINES, "no extra or torn lines");
}

#[test]
fn read_only_lower_files_and_0555_dirs_chmod_and_remove_by_root() {
    require_root!();
    let mut fx = Fixture::new(|l| {
        for tree in ["mod_a@v1.0.0", "mod_b@v2.0.0"] {
            for f in ["go.mod", "a.go", "internal/x/x.go"] {
                write(&l.join(tree).join(f), "package x\n");
            }
        }
        // Go module cache: files 0444, directories 0555, children before parents.
        sh(
            l,
            "find . -type f -exec chmod 0444 {} + && find . -depth -mindepth 1 -type d -exec chmod 0555 {} +",
        );
    });
    // chmod'ing a read-only file and writing it.
    chmod(&fx.p("mod_a@v1.0.0/go.mod"), 0o644);
    assert_eq!(
        fs::metadata(fx.p("mod_a@v1.0.0/go.mod")).unwrap().mode() & 0o777,
        0o644
    );
    write(&fx.p("mod_a@v1.0.0/go.mod"), "module a\n");
    // Root writes a 0444 file and creates in a 0555 dir without chmod.
    write(&fx.p("mod_a@v1.0.0/a.go"), "package a\n");
    write(&fx.p("mod_a@v1.0.0/internal/new.go"), "new\n");
    assert_eq!(
        fs::metadata(fx.p("mod_a@v1.0.0/internal")).unwrap().mode() & 0o777,
        0o555
    );
    // `go clean -modcache`: make directories writable, then remove.
    sh(&fx.mnt, "chmod -R u+w mod_a@v1.0.0 && rm -rf mod_a@v1.0.0");
    // Root removes a read-only tree as it is.
    sh(&fx.mnt, "rm -rf mod_b@v2.0.0");
    for _ in 0..2 {
        assert_eq!(names(&fx.mnt), Vec::<String>::new());
        fx.remount();
    }
}

/// `setpriv` running `sh -c script` in `dir` as uid/gid 65534 with no groups.
fn as_nobody(dir: &Path, script: &str) -> Command {
    let mut c = Command::new("setpriv");
    c.args([
        "--reuid=65534",
        "--regid=65534",
        "--clear-groups",
        "sh",
        "-c",
        script,
    ])
    .current_dir(dir);
    c
}

#[test]
fn other_uid_with_allow_other_and_default_permissions() {
    require_root!();
    let mut fx = Fixture::new(|l| {
        write(&l.join("public"), "public\n");
        write(&l.join("secret"), "secret\n");
        chmod(&l.join("secret"), 0o600);
        write(&l.join("theirs"), "theirs\n");
        chmod(&l.join("theirs"), 0o600);
        chown(&l.join("theirs"), 65534, 65534);
        fs::create_dir(l.join("home")).unwrap();
        chown(&l.join("home"), 65534, 65534);
    });
    write(&fx.p("upper_secret"), "upper secret\n");
    chmod(&fx.p("upper_secret"), 0o600);
    // A file and a directory created by another uid through the mount.
    let out = run_ok(&mut as_nobody(
        &fx.mnt,
        "set -e; cat public; echo mine > home/mine; mkdir home/d; echo deep > home/d/f; \
         cat home/mine home/d/f; echo more >> theirs; cat theirs",
    ));
    assert_eq!(
        String::from_utf8_lossy(&out.stdout),
        "public\nmine\ndeep\ntheirs\nmore\n"
    );
    for p in ["home/mine", "home/d", "home/d/f", "theirs"] {
        let m = fs::symlink_metadata(fx.p(p)).unwrap();
        assert_eq!((m.uid(), m.gid()), (65534, 65534), "owner of {p}");
        let u = fs::symlink_metadata(fx.upper.join(p)).unwrap();
        assert_eq!((u.uid(), u.gid()), (65534, 65534), "owner of upper/{p}");
    }
    // default_permissions: the kernel enforces modes for other uids.
    for (script, what) in [
        ("cat secret", "read a 0600 root lower file"),
        ("cat upper_secret", "read a 0600 root upper file"),
        ("echo x >> public", "write a 0644 root file"),
        ("echo x > newfile", "create in a 0755 root dir"),
        ("rm public", "unlink in a 0755 root dir"),
    ] {
        let out = as_nobody(&fx.mnt, script).output().expect("setpriv");
        assert!(!out.status.success(), "uid 65534 could {what}");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains("Permission denied"), "{what}: {err}");
    }
    assert!(
        !fx.upper.join("public").exists(),
        "a denied write must not copy up"
    );
    assert!(!fx.upper.join("secret").exists());
    fx.remount();
    assert_eq!(read(&fx.p("home/d/f")), "deep\n");
    assert_eq!(read(&fx.p("public")), "public\n");
}
