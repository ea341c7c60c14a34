//! Warm mounts through the binary: a run of an exact hit leaves its mount idle for the next
//! run of the layer, which adopts it (same daemon, same kernel caches); whatever a run wrote,
//! deleted, renamed or chmod-ed is dropped before the mount is handed back, and every run sees
//! the layer as published; a kill -9 of a run on an adopted mount leaves nothing; idle mounts
//! end by time, by `gc`, and with `LAYERCACHE_WARM_IDLE=0` none is kept.
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

/// What a run sees of the cache: every path (the cache's root `.` too) with its type, mode,
/// owner, size, mtime, link count, content digest and xattrs (ACLs too).
const SHOW: &str = "cd $DEPS && find . | sort | while read -r p; do \
    printf '%s %s ' \"$p\" \"$(stat -c '%F %a %u:%g %s %Y %h' \"$p\")\"; \
    if [ -f \"$p\" ] && [ ! -L \"$p\" ]; then md5sum < \"$p\"; else echo; fi; \
    getfattr -h -d -m - \"$p\" 2>/dev/null | sed 1d; done";

fn sandbox() -> (Sandbox, std::path::PathBuf) {
    let sb = Sandbox::new();
    std::fs::write(sb.work().join("deps.lock"), "a=1\n").unwrap();
    let spec = sb.write_spec("spec.toml", SPEC);
    (sb, spec)
}

fn run(sb: &Sandbox, spec: &Path, script: &str, envs: &[(&str, &str)]) -> Output {
    run_flags(sb, spec, &[], script, envs)
}

/// [`run`] with run flags (`--passthrough off`).
fn run_flags(
    sb: &Sandbox,
    spec: &Path,
    flags: &[&str],
    script: &str,
    envs: &[(&str, &str)],
) -> Output {
    let mut cmd = sb.command(spec, &sb.work(), flags, &["sh", "-c", script]);
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

/// Run 2 adopts the mount run 1 left (the same daemon). A run that wrote, deleted, renamed,
/// chmod-ed, made a directory, a symlink or a hard link, truncated, made a directory opaque,
/// or created and removed a file at the cache's root has its changes dropped by the daemon
/// (`overlay/fs/reset.rs`) and its mount is handed back: the next run adopts the same mount
/// and sees the layer byte for byte as published (the listing a fresh mount showed).
#[test]
fn every_run_adopts_the_same_mount_and_sees_none_of_the_last_runs_changes() {
    if !can_mount() {
        return;
    }
    let (sb, spec) = sandbox();
    // Run 1: miss, setup, promote, COMMAND on the promoted layer.
    let first = run(&sb, &spec, SHOW, &[]);
    assert_eq!(event(&first)["result"], "miss");
    let published = stdout(&first);
    assert!(
        published.contains("./a/f3 regular file 640 0:0 3 "),
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

    // Each of these changes is dropped when its run ends; the next run adopts the same mount
    // and sees the published layer.
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
        "rm -r $DEPS/a && mkdir -p $DEPS/a/b && echo other > $DEPS/a/f1",
        "mv $DEPS/a $DEPS/z",
        "echo new > $DEPS/a/f4 && cat $DEPS/a/f4 && ls $DEPS/a",
        "setfattr -n user.x -v 1 $DEPS/a/f1 2>/dev/null || chmod 444 $DEPS/a/f1",
        "touch -d @0 $DEPS/a $DEPS/a/f2",
        "cat $DEPS/a/f1 $DEPS/a/b/d > /dev/null",
        // The cache's root directory itself: the view shows the upper root's attributes.
        "chmod 700 $DEPS && chown 5:6 $DEPS",
        "setfattr -n user.leak -v secret $DEPS && setfacl -m u:7:rwx $DEPS",
        "chmod 000 $DEPS",
        "setfattr -n user.x -v 1 $DEPS/a && setfacl -m u:7:r $DEPS/a/f1",
    ];
    for change in changes {
        let warm = sb.warm_mounts();
        assert_eq!(warm.len(), 1, "before {change:?}");
        // What this run sees first: the published layer, even in a mount the run before
        // changed.
        let look = format!("{SHOW}; echo ---; {change}");
        let out = run(&sb, &spec, &look, &[]);
        assert_eq!(
            event(&out)["warm"],
            true,
            "{change:?} ran on the warm mount"
        );
        let seen = stdout(&out);
        let before = seen.split("\n---").next().unwrap_or_default();
        assert_eq!(before, published, "before {change:?}");
        assert_eq!(sb.warm_mounts(), warm, "not kept after {change:?}");
        assert_eq!(
            daemon_of(&warm[0]),
            daemon,
            "another daemon after {change:?}"
        );
        assert!(sb.mounts_below().is_empty(), "{:?}", sb.mounts_below());
    }
    let after = run(&sb, &spec, SHOW, &[]);
    assert_eq!(event(&after)["warm"], true);
    assert_eq!(stdout(&after), published, "after every change");

    // A root directory that grew (hundreds of names made at the cache's root: its size stays
    // larger once they are gone) cannot be set back: that mount ends with its run.
    let out = run(
        &sb,
        &spec,
        "for i in $(seq 1 400); do : > $DEPS/n$i; done",
        &[],
    );
    assert_eq!(event(&out)["warm"], true);
    wait_until(
        "the grown mount's daemon exits",
        Duration::from_secs(10),
        || !alive(daemon),
    );
    let fresh = run(&sb, &spec, SHOW, &[]);
    assert_eq!(event(&fresh)["warm"], false);
    // (A fresh mount's root shows the time its own upper root was made.)
    let below_root = |s: &str| s.lines().skip(1).collect::<Vec<_>>().join("\n");
    assert_eq!(
        below_root(&stdout(&fresh)),
        below_root(&published),
        "after the root grew"
    );
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

/// A run killed after it claimed an idle mount (renamed `idle` to `adopting-<pid>`) and before
/// it adopted it, or a `gc` killed after it claimed one to end it (`ending-<pid>`), leaves a
/// claim whose process is gone: the next run adopts that mount anyway, and `gc` ends it.
#[test]
fn a_claim_whose_claimer_died_is_handed_back() {
    if !can_mount() {
        return;
    }
    let (sb, spec) = sandbox();
    // A pid that is surely gone: a child that exited and was waited for.
    let mut gone = Command::new("true").spawn().unwrap();
    let dead = gone.id();
    gone.wait().unwrap();
    let abandon = |claim: &str| -> u32 {
        let warm = sb.warm_mounts();
        assert_eq!(warm.len(), 1, "{warm:?}");
        let run_dir = Path::new(&warm[0]).parent().unwrap().to_path_buf();
        std::fs::rename(
            run_dir.join("idle"),
            run_dir.join(format!("{claim}-{dead}")),
        )
        .unwrap();
        assert!(sb.warm_mounts().is_empty(), "no longer idle by its marker");
        daemon_of(&warm[0])
    };
    run(&sb, &spec, "true", &[]);
    let daemon = abandon("adopting");
    let out = run(&sb, &spec, "cat $DEPS/a/f1", &[]);
    assert_eq!(event(&out)["warm"], true, "adopted after all");
    assert_eq!(daemon_of(&sb.warm_mounts()[0]), daemon, "the same daemon");
    let daemon = abandon("ending");
    let gc = run_ok(
        Command::new(BIN)
            .arg("--store")
            .arg(sb.path("store"))
            .args(["--json", "gc"]),
    );
    let gc: serde_json::Value = serde_json::from_slice(&gc.stdout).unwrap();
    assert_eq!(gc["ended_warm"], 1, "{gc}");
    assert!(!alive(daemon));
    assert!(
        sb.all_mounts_below().is_empty(),
        "{:?}",
        sb.all_mounts_below()
    );
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

/// A cache of five directories of files of 10 B to 300 KiB (page cache beyond one page),
/// symlinks and hard links, for the random changes below.
const BIG_SPEC: &str = r#"project = "r"
[[cache]]
id = "deps"
key_files = ["deps.lock"]
env = { DEPS = "{mount}" }
setup = "for d in 0 1 2 3 4; do mkdir -p $DEPS/d$d/sub; for f in 0 1 2 3 4 5; do head -c $(( (d * 7 + f * 13) * 2311 + 10 )) /dev/urandom > $DEPS/d$d/f$f; done; echo s > $DEPS/d$d/sub/s; ln -s f0 $DEPS/d$d/link; done; ln $DEPS/d0/f1 $DEPS/d1/hard; chmod 600 $DEPS/d2/f2"
"#;

/// A small deterministic generator (xorshift), so a failure names the seed that made it.
struct Rng(u64);

impl Rng {
    fn below(&mut self, n: usize) -> usize {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        (self.0 % n as u64) as usize
    }
}

/// One random change to the cache, as a shell command (it may fail: a path an earlier change
/// of the same run removed; `|| true` keeps the run going).
fn random_change(r: &mut Rng) -> String {
    let d = format!("$DEPS/d{}", r.below(5));
    let f = format!("{d}/f{}", r.below(6));
    let g = format!("$DEPS/d{}/f{}", r.below(5), r.below(6));
    let cmd = match r.below(14) {
        0 => format!("cat {f} > /dev/null; echo more >> {f}"),
        1 => format!(
            "head -c 70000 {f} > /dev/null; dd if=/dev/zero of={f} bs=1k count=3 seek=1 conv=notrunc status=none"
        ),
        2 => format!("truncate -s {} {f}", r.below(200_000)),
        3 => format!("rm -f {f}"),
        4 => format!("mv {f} {g}"),
        5 => format!("chmod {} {f}", ["600", "755", "444", "700"][r.below(4)]),
        6 => format!("mkdir -p {d}/new/deeper && echo x > {d}/new/deeper/x"),
        7 => format!("rm -rf {d}/sub"),
        8 => format!("rm -rf {d} && mkdir {d} && echo fresh > {d}/f0"),
        9 => format!("ln -sf /etc/passwd {d}/link"),
        10 => format!("ln {f} {d}/hl{}", r.below(100)),
        11 => format!("touch -d @{} {f} {d}; chmod 700 {d}", r.below(1 << 30)),
        12 if r.below(2) == 0 => format!(
            "chmod 711 $DEPS; setfattr -n user.r -v {} $DEPS",
            r.below(9)
        ),
        12 => format!("mv {d} $DEPS/moved{}", r.below(100)),
        _ => format!(
            "echo created > $DEPS/top{} && cat {f} > /dev/null",
            r.below(3)
        ),
    };
    format!("( {cmd} ) 2>/dev/null || true")
}

/// Many runs on one warm mount, each first checking it sees the layer as published (every
/// path's type, mode, size and content, through the kernel's caches), then making random
/// changes after reading the files it changes (so stale pages or attributes would show):
/// every run adopts the same mount and none sees a byte of another's changes.
#[test]
fn random_changes_never_reach_the_next_run_of_a_warm_mount() {
    if !can_mount() {
        return;
    }
    // Passthrough (what `run` picks for this layer as root) and no-open mode, where the
    // kernel keeps the mount's own page cache of every file read.
    for mode in ["auto", "off"] {
        random_rounds(&["--passthrough", mode]);
    }
}

fn random_rounds(flags: &[&str]) {
    let sb = Sandbox::new();
    std::fs::write(sb.work().join("deps.lock"), "a=1\n").unwrap();
    let spec = sb.write_spec("spec.toml", BIG_SPEC);
    let published = stdout(&run_flags(&sb, &spec, flags, SHOW, &[]));
    assert!(published.lines().count() > 40, "{published}");
    let warm = sb.warm_mounts();
    assert_eq!(warm.len(), 1);
    let daemon = daemon_of(&warm[0]);
    let seed = std::env::var("WARM_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(0x9e37_79b9_7f4a_7c15_u64);
    let mut r = Rng(seed);
    for round in 0..25 {
        let changes: Vec<String> = (0..1 + r.below(6)).map(|_| random_change(&mut r)).collect();
        let script = format!(
            "{SHOW}; echo ---; {}; {SHOW} > /dev/null",
            changes.join("; ")
        );
        let out = run_flags(&sb, &spec, flags, &script, &[]);
        assert_eq!(
            event(&out)["warm"],
            true,
            "{flags:?} round {round} (seed {seed}) not warm"
        );
        let seen = stdout(&out);
        let before = seen.split("\n---").next().unwrap_or_default();
        assert_eq!(
            before, published,
            "{flags:?} round {round} (seed {seed}) saw the last round's changes"
        );
        assert_eq!(
            sb.warm_mounts(),
            warm,
            "round {round} (seed {seed}): {changes:?}"
        );
        assert_eq!(daemon_of(&warm[0]), daemon, "round {round}");
    }
}

/// A mount lives in the mount namespace it was made in: a run under `unshare -m` leaves its
/// warm mount there, and a run of another namespace neither adopts it (it would bind an empty
/// directory) nor keeps it: it mounts the layer itself and ends the one it cannot see.
#[test]
fn a_warm_mount_of_another_mount_namespace_is_not_adopted() {
    if !can_mount() {
        return;
    }
    let (sb, spec) = sandbox();
    let unshared = |script: &str| {
        let mut c = Command::new("unshare");
        c.args(["-m", "--propagation", "private", "--"])
            .arg(BIN)
            .arg("--store")
            .arg(sb.path("store"))
            .args(["--json", "run", "--spec"])
            .arg(&spec)
            .arg("--workdir")
            .arg(sb.work())
            .arg("--mount-root")
            .arg(sb.path("cache"))
            .args(["--", "sh", "-c", script]);
        let out = c.output().unwrap();
        eprintln!("unshared run: {}", show(&out));
        assert_eq!(out.status.code(), Some(0), "{}", show(&out));
        out
    };
    unshared("true");
    let idle: Vec<_> = std::fs::read_dir(sb.path("store/v1/projects/p/runs"))
        .unwrap()
        .flatten()
        .filter(|e| e.path().join("idle").exists())
        .collect();
    assert_eq!(
        idle.len(),
        1,
        "the first run's mount is kept (in its namespace)"
    );
    let daemon = daemon_of(&idle[0].path().join("mnt").to_string_lossy());
    let out = unshared("cat $DEPS/a/f1");
    assert_eq!(event(&out)["warm"], false);
    assert_eq!(stdout(&out), "v1");
    wait_until(
        "the unseen idle mount ends",
        Duration::from_secs(10),
        || !alive(daemon),
    );
}

/// Runs of one layer that end together, each having changed its cache (so each is reset
/// first), keep at most 4 idle mounts.
#[test]
fn runs_ending_together_keep_at_most_four_idle_mounts() {
    if !can_mount() {
        return;
    }
    let (sb, spec) = sandbox();
    run(&sb, &spec, "true", &[]);
    let children: Vec<_> = (0..8)
        .map(|i| {
            sb.command(
                &spec,
                &sb.work(),
                &[],
                &[
                    "sh",
                    "-c",
                    &format!("sleep 1; for j in 1 2 3; do echo {i} > $DEPS/a/x$j; done"),
                ],
            )
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .unwrap()
        })
        .collect();
    for mut c in children {
        assert!(c.wait().unwrap().success());
    }
    let warm = sb.warm_mounts();
    assert!(
        (1..=4).contains(&warm.len()),
        "{} idle mounts: {warm:?}",
        warm.len()
    );
    assert!(sb.mounts_below().is_empty(), "{:?}", sb.mounts_below());
}
