//! Warm mounts through the binary: a run of an exact hit that changed nothing in its cache
//! leaves its mount idle for the next run of the layer, which adopts it (same daemon, same
//! kernel caches); a run that wrote, deleted, renamed or chmod-ed anything is never handed
//! back, and the next run sees the layer as published; a kill -9 of a run on an adopted mount
//! leaves nothing; idle mounts end by time, by `gc` and with `LAYERCACHE_WARM_IDLE=0` none is
//! kept.
//!
//! Real FUSE mounts as root with /dev/fuse (a skip otherwise, a failure when `CI` is set);
//! everything is below the test's sandbox, whose Drop unmounts anything left.

use std::path::Path;
use std::process::{Command, Output};
use std::time::{Duration, Instant};

#[path = "common/run.rs"]
mod run_common;

use run_common::{BIN, Sandbox, can_mount, run_ok, show};

/// A cache whose setup writes a small tree (files in two directories, a symlink).
const SPEC: &str = r#"project = "p"
[[cache]]
id = "deps"
key_files = ["deps.lock"]
env = { DEPS = "{mount}" }
setup = "mkdir -p $DEPS/a/b && for i in 1 2 3; do echo v$i > $DEPS/a/f$i; done && echo deep > $DEPS/a/b/d && ln -s f1 $DEPS/a/link && chmod 640 $DEPS/a/f3"
"#;

/// What a run sees of the cache: every path with its type, mode, size and content digest.
const SHOW: &str = "cd $DEPS && find . | sort | while read -r p; do \
    printf '%s %s ' \"$p\" \"$(stat -c '%F %a %s' \"$p\")\"; \
    if [ -f \"$p\" ] && [ ! -L \"$p\" ]; then md5sum < \"$p\"; else echo; fi; done";

fn sandbox() -> (Sandbox, std::path::PathBuf) {
    let sb = Sandbox::new();
    std::fs::write(sb.work().join("deps.lock"), "a=1\n").unwrap();
    let spec = sb.write_spec("spec.toml", SPEC);
    (sb, spec)
}

fn run(sb: &Sandbox, spec: &Path, script: &str, envs: &[(&str, &str)]) -> Output {
    let mut cmd = sb.command(spec, &sb.work(), &[], &["sh", "-c", script]);
    cmd.envs(envs.iter().copied());
    let out = cmd.output().unwrap();
    eprintln!("run {script:?}: {}", show(&out));
    assert_eq!(out.status.code(), Some(0), "{}", show(&out));
    out
}

/// The `--json` line of a run: its cache's event.
fn event(out: &Output) -> serde_json::Value {
    let line = String::from_utf8_lossy(&out.stdout)
        .lines()
        .next()
        .unwrap_or_default()
        .to_string();
    let v: serde_json::Value =
        serde_json::from_str(&line).unwrap_or_else(|e| panic!("{e}: {line}"));
    v["caches"][0].clone()
}

/// COMMAND's stdout (after the `--json` line).
fn stdout(out: &Output) -> String {
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .skip(1)
        .collect::<Vec<_>>()
        .join("\n")
}

/// The pid of the daemon serving idle warm mount `mnt` (`runs/<run>/mnt`), from its record.
fn daemon_of(mnt: &str) -> u32 {
    let rec = Path::new(mnt).with_file_name("run.json");
    let v: serde_json::Value = serde_json::from_slice(&std::fs::read(rec).unwrap()).unwrap();
    v["daemon_pid"].as_u64().unwrap() as u32
}

fn alive(pid: u32) -> bool {
    Path::new(&format!("/proc/{pid}")).exists()
        && !std::fs::read_to_string(format!("/proc/{pid}/stat"))
            .unwrap_or_default()
            .contains(") Z ")
}

fn wait_until(what: &str, limit: Duration, mut f: impl FnMut() -> bool) {
    let end = Instant::now() + limit;
    while !f() {
        assert!(Instant::now() < end, "timed out waiting until {what}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Run 2 adopts the mount run 1 left (the same daemon); a run that wrote, deleted, renamed,
/// chmod-ed, made a directory and a symlink, or created and removed a file at the cache's root
/// is not handed back, and the next run sees the layer byte for byte as published (the same
/// listing as a fresh mount's).
#[test]
fn a_run_that_changed_nothing_leaves_its_mount_warm_and_one_that_wrote_does_not() {
    if !can_mount() {
        return;
    }
    let (sb, spec) = sandbox();
    // Run 1: miss, setup, promote, COMMAND on the promoted layer.
    let first = run(&sb, &spec, SHOW, &[]);
    assert_eq!(event(&first)["result"], "miss");
    let published = stdout(&first);
    assert!(
        published.contains("./a/f3 regular file 640 3 "),
        "{published}"
    );
    assert!(sb.mounts_below().is_empty(), "{:?}", sb.mounts_below());
    let warm = sb.warm_mounts();
    assert_eq!(warm.len(), 1, "run 1's hit mount kept warm");
    let daemon = daemon_of(&warm[0]);
    let ls = sb.ls();
    assert_eq!(ls[0]["warm"], 1, "{ls:?}");
    let text = String::from_utf8_lossy(
        &run_ok(
            Command::new(BIN)
                .arg("--store")
                .arg(sb.path("store"))
                .arg("ls"),
        )
        .stdout,
    )
    .into_owned();
    assert!(text.contains(" warm "), "{text}");

    // Run 2 adopts it: the same daemon serves it, and the event says so.
    let second = run(&sb, &spec, SHOW, &[]);
    let ev = event(&second);
    assert_eq!(ev["result"], "hit");
    assert_eq!(ev["warm"], true, "{ev}");
    assert_eq!(stdout(&second), published);
    assert_eq!(sb.warm_mounts(), warm);
    assert_eq!(daemon_of(&warm[0]), daemon);

    // Each of these changes ends the mount with its run; the next run adopts nothing and
    // sees the published layer.
    let changes = [
        "echo changed > $DEPS/a/f1",
        "rm $DEPS/a/f2",
        "mv $DEPS/a/f3 $DEPS/a/g3",
        "chmod 600 $DEPS/a/f1",
        "mkdir $DEPS/a/new",
        "ln -s f2 $DEPS/a/l2",
        "touch $DEPS/top && rm $DEPS/top",
        "rmdir $DEPS/a/b 2>/dev/null || rm -r $DEPS/a/b",
        "ln $DEPS/a/f1 $DEPS/a/hard",
        "truncate -s 0 $DEPS/a/b/d",
    ];
    for change in changes {
        let warm = sb.warm_mounts();
        assert_eq!(warm.len(), 1, "before {change:?}");
        let daemon = daemon_of(&warm[0]);
        let out = run(&sb, &spec, change, &[]);
        assert_eq!(
            event(&out)["warm"],
            true,
            "{change:?} ran on the warm mount"
        );
        wait_until(
            "the changed mount's daemon exits",
            Duration::from_secs(10),
            || !alive(daemon),
        );
        assert!(sb.warm_mounts().is_empty(), "kept after {change:?}");
        assert!(sb.mounts_below().is_empty(), "{:?}", sb.mounts_below());
        let after = run(&sb, &spec, SHOW, &[]);
        let ev = event(&after);
        assert_eq!(ev["warm"], false, "adopted after {change:?}: {ev}");
        assert_eq!(stdout(&after), published, "after {change:?}");
    }
}

/// A kill -9 of a run on an adopted mount ends the mount with it (the daemon follows its new
/// owner), and the next run mounts the layer afresh.
#[test]
fn a_killed_run_on_an_adopted_mount_leaves_nothing() {
    if !can_mount() {
        return;
    }
    let (sb, spec) = sandbox();
    run(&sb, &spec, "true", &[]);
    let warm = sb.warm_mounts();
    assert_eq!(warm.len(), 1);
    let daemon = daemon_of(&warm[0]);
    let mut child = sb
        .command(
            &spec,
            &sb.work(),
            &[],
            &["sh", "-c", "cat $DEPS/a/f1 > /dev/null; sleep 60"],
        )
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    // Adopted: the idle marker is gone and the same daemon still runs.
    wait_until("the warm mount is adopted", Duration::from_secs(10), || {
        sb.warm_mounts().is_empty()
    });
    assert!(alive(daemon));
    std::thread::sleep(Duration::from_millis(300));
    child.kill().unwrap();
    child.wait().unwrap();
    wait_until(
        "the adopted mount's daemon exits",
        Duration::from_secs(10),
        || !alive(daemon),
    );
    wait_until("no mount is left", Duration::from_secs(10), || {
        sb.all_mounts_below().is_empty()
    });
    let out = run(&sb, &spec, "cat $DEPS/a/f1", &[]);
    assert_eq!(event(&out)["warm"], false);
    assert_eq!(stdout(&out), "v1");
}

/// An idle mount ends by itself after `LAYERCACHE_WARM_IDLE`, `gc` ends the idle ones (and can
/// then evict their layer), and `LAYERCACHE_WARM_IDLE=0` keeps none.
#[test]
fn idle_mounts_end_by_time_by_gc_and_not_at_all_when_off() {
    if !can_mount() {
        return;
    }
    let (sb, spec) = sandbox();
    run(&sb, &spec, "true", &[("LAYERCACHE_WARM_IDLE", "0")]);
    assert!(
        sb.all_mounts_below().is_empty(),
        "{:?}",
        sb.all_mounts_below()
    );

    run(&sb, &spec, "true", &[("LAYERCACHE_WARM_IDLE", "1s")]);
    let warm = sb.warm_mounts();
    assert_eq!(warm.len(), 1);
    let daemon = daemon_of(&warm[0]);
    wait_until(
        "the idle mount ends by itself",
        Duration::from_secs(15),
        || !alive(daemon) && sb.all_mounts_below().is_empty(),
    );
    // Its run directory goes with the next run's reaping (owner and daemon gone).
    run(&sb, &spec, "true", &[]);
    let warm = sb.warm_mounts();
    assert_eq!(warm.len(), 1);
    let daemon = daemon_of(&warm[0]);
    let gc = run_ok(
        Command::new(BIN)
            .arg("--store")
            .arg(sb.path("store"))
            .args(["--json", "gc", "--max-size", "1"]),
    );
    let gc: serde_json::Value = serde_json::from_slice(&gc.stdout).unwrap();
    assert_eq!(gc["ended_warm"], 1, "{gc}");
    assert_eq!(gc["evicted"].as_array().map(Vec::len), Some(1), "{gc}");
    assert!(!alive(daemon));
    assert!(
        sb.all_mounts_below().is_empty(),
        "{:?}",
        sb.all_mounts_below()
    );
    let runs = std::fs::read_dir(sb.path("store").join("v1/projects/p/runs"))
        .map(|d| d.count())
        .unwrap_or(0);
    assert_eq!(runs, 0, "the ended mounts' run directories are removed");
}
