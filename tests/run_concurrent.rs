//! Concurrent runs on one host (issue 10): each run's caches are private mounts bound at their
//! view paths in the run's own mount namespace; per-run workspaces share relocatable layers;
//! nothing outlives its run (kill -9 of the run or of a daemon, SIGTERM with grandchildren);
//! mountpoints, workdirs and templates are safe by construction.
//!
//! Real FUSE mounts as root (skipped otherwise, a failure when `CI` is set); every test's
//! mounts sit below a [`Sandbox`] whose Drop unmounts them, even on panic. Readiness is checked
//! (fifos, pidfds), never slept for.

#[path = "common/run.rs"]
mod run_common;

use std::os::fd::{FromRawFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};

use run_common::{BIN, Sandbox, can_mount, have_tool, npm_workdir, show, unshared_run};

/// node_modules of the npm fixture (relocatable: keyed by the lockfile alone) plus a small
/// `/cache/<id>`-style cache of our own.
const NPM_SPEC: &str = r#"project = "conc"
[[cache]]
id = "node_modules"
preset = "node_modules"

[[cache]]
id = "scratch"
key_files = ["package-lock.json"]
relocatable = true
setup = "echo filled > {mount}/filled"
"#;

/// `layercache --store S --json run --spec SPEC --workdir W --mount-root R [EXTRA…] -- ARGV`.
fn run_cmd(sb: &Sandbox, work: &Path, spec: &Path, extra: &[&str], argv: &[&str]) -> Command {
    sb.command(spec, work, extra, argv)
}

/// The `--json` summary: the first stdout line.
fn summary(o: &Output) -> serde_json::Value {
    let text = String::from_utf8_lossy(&o.stdout);
    let first = text.lines().next().unwrap_or_default();
    serde_json::from_str(first).unwrap_or_else(|e| panic!("no JSON summary ({e}): {}", show(o)))
}

/// Run directories left in the store (of any project).
fn run_dirs(sb: &Sandbox) -> Vec<PathBuf> {
    let projects = sb.path("store/v1/projects");
    let mut out = Vec::new();
    for p in std::fs::read_dir(projects).into_iter().flatten().flatten() {
        for r in std::fs::read_dir(p.path().join("runs"))
            .into_iter()
            .flatten()
            .flatten()
        {
            // An idle warm mount's run directory is the store's, not a run's leftover.
            if !r.path().join("idle").exists() {
                out.push(r.path());
            }
        }
    }
    out
}

/// What the host sees in the mount root: nothing of any run.
fn assert_mount_root_shows_nothing(sb: &Sandbox) {
    let root = sb.path("cache");
    let names: Vec<String> = std::fs::read_dir(&root)
        .into_iter()
        .flatten()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    assert!(names.is_empty(), "the host's mount root shows {names:?}");
}

/// N runs of the npm fixture at once, each in its own workdir; each writes a unique file into
/// its node_modules and its scratch cache and must see only its own.
fn concurrent_npm_runs(extra: &[&str]) {
    if !can_mount() || !have_tool("npm") {
        return;
    }
    if extra.contains(&"bwrap") && !have_tool("bwrap") {
        return;
    }
    let sb = Sandbox::new();
    let spec = sb.write_spec("spec.toml", NPM_SPEC);
    let scratch = sb.path("cache").join("scratch");
    let check = format!(
        "echo $RUN > node_modules/.mine-$RUN && echo $RUN > {s}/mine-$RUN && \
         ls -a node_modules | grep '^\\.mine-' && ls {s} | grep '^mine-' && \
         node -e \"require('react'); require('express')\" && cat {s}/filled",
        s = scratch.display()
    );
    let children: Vec<(usize, Child)> = (0..8)
        .map(|i| {
            let w = npm_workdir(&sb, &format!("ws-{i}"));
            let mut c = run_cmd(&sb, &w, &spec, extra, &["sh", "-c", &check]);
            c.env("RUN", i.to_string())
                .stdout(Stdio::piped())
                .stderr(Stdio::piped());
            (i, c.spawn().unwrap())
        })
        .collect();
    let mut results = Vec::new();
    for (i, c) in children {
        let o = c.wait_with_output().unwrap();
        assert_eq!(o.status.code(), Some(0), "run {i}: {}", show(&o));
        let out = String::from_utf8_lossy(&o.stdout).into_owned();
        let lines: Vec<&str> = out.lines().skip(1).collect();
        assert_eq!(
            lines,
            [
                format!(".mine-{i}").as_str(),
                &format!("mine-{i}"),
                "filled"
            ],
            "run {i} sees only its own files: {}",
            show(&o)
        );
        results.push(summary(&o));
    }
    // One filled each cache, the others waited and hit its layer.
    for cache in ["node_modules", "scratch"] {
        let rs: Vec<&str> = results
            .iter()
            .map(|s| {
                let c = s["caches"].as_array().unwrap();
                let c = c.iter().find(|c| c["cache"] == cache).unwrap();
                c["result"].as_str().unwrap()
            })
            .collect();
        assert_eq!(
            rs.iter().filter(|r| **r == "miss").count(),
            1,
            "{cache}: {rs:?}"
        );
        assert_eq!(
            rs.iter().filter(|r| **r == "hit").count(),
            7,
            "{cache}: {rs:?}"
        );
    }
    let runs: std::collections::BTreeSet<&str> =
        results.iter().map(|s| s["run"].as_str().unwrap()).collect();
    assert_eq!(runs.len(), 8, "every run has its own id");
    assert_eq!(sb.ls().len(), 2, "one layer per cache: {:?}", sb.ls());
    for e in sb.events() {
        assert!(
            runs.contains(e["run"].as_str().unwrap()),
            "event without run id: {e}"
        );
    }
    assert_mount_root_shows_nothing(&sb);
    assert!(sb.mounts_below().is_empty(), "{:?}", sb.mounts_below());
    assert!(run_dirs(&sb).is_empty(), "{:?}", run_dirs(&sb));
    // A 9th run in a fresh workdir path hits both caches.
    let w = npm_workdir(&sb, "another-place/ws-9");
    let o = run_cmd(&sb, &w, &spec, extra, &["sh", "-c", &check])
        .env("RUN", "9")
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(0), "{}", show(&o));
    for c in summary(&o)["caches"].as_array().unwrap() {
        assert_eq!(c["result"], "hit", "{c}");
    }
    assert!(sb.mounts_below().is_empty());
    assert!(run_dirs(&sb).is_empty());
}

#[test]
fn eight_runs_in_own_workdirs_share_one_layer_and_see_only_their_own_files() {
    concurrent_npm_runs(&[]);
}

#[test]
fn eight_runs_with_bwrap_share_one_layer_and_see_only_their_own_files() {
    concurrent_npm_runs(&["--sandbox", "bwrap"]);
}

/// A spec whose setup signals through the fifo `ready` in the workdir, then blocks.
fn blocking_spec(sb: &Sandbox, setup: &str) -> PathBuf {
    std::fs::write(sb.work().join("deps.lock"), "a=1\n").unwrap();
    layercache::sys::mkfifo(&sb.work().join("ready"), 0o600).unwrap();
    sb.write_spec(
        "spec.toml",
        &format!(
            "project = \"p\"\n[[cache]]\nid = \"deps\"\nkey_files = [\"deps.lock\"]\n\
             setup = {setup:?}\n"
        ),
    )
}

/// Blocks until setup has written to the fifo `ready`: its mount is up and it runs.
fn wait_ready(sb: &Sandbox) {
    let got = std::fs::read_to_string(sb.work().join("ready")).unwrap();
    assert_eq!(got, "ready\n");
}

/// Daemon pids recorded in the store's run records.
fn daemon_pids(sb: &Sandbox) -> Vec<i32> {
    run_dirs(sb)
        .iter()
        .filter_map(|d| std::fs::read(d.join("run.json")).ok())
        .filter_map(|t| serde_json::from_slice::<serde_json::Value>(&t).ok())
        .filter_map(|v| v["daemon_pid"].as_i64())
        .map(|p| p as i32)
        .collect()
}

/// Waits (pidfd + poll) up to `ms` for `pid` to exit; true when it has.
fn wait_exit(pid: i32, ms: i32) -> bool {
    // SAFETY: pidfd_open takes a pid and flags and returns a new fd or -1.
    let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid, 0) } as i32;
    if fd < 0 {
        return true; // already gone
    }
    // SAFETY: a fresh descriptor we own.
    let fd = unsafe { OwnedFd::from_raw_fd(fd) };
    let mut pfd = libc::pollfd {
        fd: std::os::fd::AsRawFd::as_raw_fd(&fd),
        events: libc::POLLIN,
        revents: 0,
    };
    // SAFETY: one valid pollfd.
    unsafe { libc::poll(&mut pfd, 1, ms) == 1 }
}

/// A second run of the blocking spec's project that must simply work (and reap what the first
/// left behind).
fn next_run_works(sb: &Sandbox) {
    let spec = sb.write_spec(
        "after.toml",
        "project = \"p\"\n[[cache]]\nid = \"deps\"\nkey_files = [\"deps.lock\"]\n\
         setup = \"echo ok > {mount}/ok\"\n",
    );
    let o = run_cmd(sb, &sb.work(), &spec, &[], &["true"])
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(0), "{}", show(&o));
    assert!(sb.mounts_below().is_empty(), "{:?}", sb.mounts_below());
    assert!(
        run_dirs(sb).is_empty(),
        "stale runs not reaped: {:?}",
        run_dirs(sb)
    );
}

#[test]
fn kill_9_of_the_run_ends_its_mounts_and_daemons() {
    if !can_mount() {
        return;
    }
    let sb = Sandbox::new();
    let spec = blocking_spec(
        &sb,
        "echo half > {mount}/half; echo ready > ready; exec sleep 120",
    );
    let mut child = run_cmd(&sb, &sb.work(), &spec, &[], &["true"])
        .stdout(Stdio::null())
        .spawn()
        .unwrap();
    wait_ready(&sb);
    let daemons = daemon_pids(&sb);
    assert_eq!(daemons.len(), 1, "{daemons:?}");
    child.kill().unwrap(); // SIGKILL
    child.wait().unwrap();
    assert!(wait_exit(daemons[0], 5000), "the daemon outlived its run");
    assert!(sb.mounts_below().is_empty(), "{:?}", sb.mounts_below());
    next_run_works(&sb);
}

#[test]
fn kill_9_of_a_daemon_fails_the_run_naming_the_cache() {
    if !can_mount() {
        return;
    }
    let sb = Sandbox::new();
    let go = sb.work().join("go");
    layercache::sys::mkfifo(&go, 0o600).unwrap();
    let spec = blocking_spec(
        &sb,
        "echo ready > ready; cat go; echo late > {mount}/late; true",
    );
    let child = run_cmd(&sb, &sb.work(), &spec, &[], &["true"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    wait_ready(&sb);
    let daemons = daemon_pids(&sb);
    assert_eq!(daemons.len(), 1, "{daemons:?}");
    // SAFETY: kill(2) of the daemon we found in the run record.
    unsafe { libc::kill(daemons[0], libc::SIGKILL) };
    assert!(wait_exit(daemons[0], 5000));
    std::fs::write(&go, "go\n").unwrap();
    let o = child.wait_with_output().unwrap();
    assert_eq!(o.status.code(), Some(1), "{}", show(&o));
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(err.contains("cache deps") && err.contains("died"), "{err}");
    assert!(sb.mounts_below().is_empty(), "{:?}", sb.mounts_below());
    assert!(sb.ls().is_empty(), "nothing is published from a dead mount");
    next_run_works(&sb);
}

/// A started run that is killed (SIGKILL) if the test panics before it is waited for.
struct KillOnDrop(Option<Child>);

impl KillOnDrop {
    fn take(mut self) -> Child {
        self.0.take().unwrap()
    }
}

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        if let Some(c) = &mut self.0 {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// Pids of processes whose command line is exactly `argv`.
fn pids_with_cmdline(argv: &[&str]) -> Vec<i32> {
    let want: Vec<u8> = argv
        .iter()
        .flat_map(|a| [a.as_bytes(), b"\0"].concat())
        .collect();
    std::fs::read_dir("/proc")
        .unwrap()
        .flatten()
        .filter_map(|e| {
            let pid: i32 = e.file_name().to_str()?.parse().ok()?;
            (std::fs::read(e.path().join("cmdline")).ok()? == want).then_some(pid)
        })
        .collect()
}

#[test]
fn sigterm_reaches_setup_grandchildren_and_nothing_is_left() {
    if !can_mount() {
        return;
    }
    let sb = Sandbox::new();
    let spec = blocking_spec(
        &sb,
        "sleep 3141 & sleep 3142 & (sleep 3143; true) & echo ready > ready; wait",
    );
    let child = run_cmd(&sb, &sb.work(), &spec, &[], &["true"])
        .stdout(Stdio::null())
        .spawn()
        .unwrap();
    let child = KillOnDrop(Some(child));
    wait_ready(&sb);
    // The subshell's sleep may start a moment after `ready` (a loaded machine): look again for
    // a bounded time.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    let sleepers = loop {
        let found: Vec<i32> = ["3141", "3142", "3143"]
            .iter()
            .flat_map(|n| pids_with_cmdline(&["sleep", n]))
            .collect();
        if found.len() == 3 || std::time::Instant::now() > deadline {
            break found;
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    };
    assert_eq!(sleepers.len(), 3, "{sleepers:?}");
    let child = child.take();
    // SAFETY: kill(2) of the run we started.
    unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
    let o = child.wait_with_output().unwrap();
    assert_eq!(o.status.code(), Some(128 + 15));
    for pid in sleepers {
        assert!(
            wait_exit(pid, 5000),
            "setup's grandchild {pid} outlived the run"
        );
    }
    assert!(sb.mounts_below().is_empty(), "{:?}", sb.mounts_below());
    next_run_works(&sb);
}

/// `unshare -m` around a run that could cover a host path if the code were wrong.
fn in_private_namespace(cmd: &Command) -> Command {
    let mut u = Command::new("unshare");
    u.args(["-m", "--propagation", "private", "--"])
        .arg(cmd.get_program())
        .args(cmd.get_args());
    u
}

#[test]
fn bad_mountpoints_odd_workdirs_and_unknown_templates() {
    if !can_mount() || !have_tool("unshare") {
        return;
    }
    let sb = Sandbox::new();
    std::fs::write(sb.work().join("deps.lock"), "a=1\n").unwrap();
    // A mountpoint outside the mount root and the workdir is refused, naming the cache and the
    // field: a system directory when the spec is read (`cache[0].mountpoint`, the check the
    // API shares), any other path when the run's paths are known (`cache "x"`).
    for mp in ["/etc", "/", "/usr/share", "/proc/self", "/elsewhere"] {
        let spec = sb.write_spec(
            "bad.toml",
            &format!(
                "project = \"p\"\n[[cache]]\nid = \"x\"\nkey_files = [\"deps.lock\"]\n\
                 setup = \"true\"\nmountpoint = {mp:?}\n"
            ),
        );
        let o = in_private_namespace(&run_cmd(&sb, &sb.work(), &spec, &[], &["true"]))
            .output()
            .unwrap();
        assert_eq!(o.status.code(), Some(2), "{mp}: {}", show(&o));
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(
            (err.contains("cache \"x\"") || err.contains("cache[0].mountpoint"))
                && err.contains("mountpoint"),
            "{mp}: {err}"
        );
        let j: serde_json::Value =
            serde_json::from_slice(&o.stdout).unwrap_or_else(|e| panic!("{e}: {}", show(&o)));
        assert_eq!(j["exit"], 2, "errors as JSON: {j}");
    }
    // (`--mount-root /etc` is refused in symlinks_cannot_lead_view_paths_out_of_the_workdir_or_
    // mount_root, through run_at: run_cmd already passes a --mount-root of its own.)
    // An unknown template names the field and the template.
    let spec = sb.write_spec(
        "tpl.toml",
        "project = \"p\"\n[[cache]]\nid = \"x\"\nkey_files = [\"deps.lock\"]\n\
         setup = \"cp -r src {mnt}\"\n",
    );
    let o = run_cmd(&sb, &sb.work(), &spec, &[], &["true"])
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(2), "{}", show(&o));
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        err.contains("cache[0].setup") && err.contains("{mnt}"),
        "{err}"
    );
    // A workdir with spaces and `$(touch x)` in its name: setup writes where it should and
    // nothing runs.
    let odd = sb.path("w a $(touch pwned)");
    std::fs::create_dir_all(&odd).unwrap();
    std::fs::write(odd.join("deps.lock"), "a=1\n").unwrap();
    let spec = sb.write_spec(
        "odd.toml",
        "project = \"p\"\n[[cache]]\nid = \"nm\"\nkey_files = [\"deps.lock\"]\n\
         mountpoint = \"{workdir}/deps\"\n\
         setup = \"echo built > {mount}/out && echo {workdir} > {mount}/where\"\n",
    );
    let o = run_cmd(&sb, &odd, &spec, &[], &["sh", "-c", "cat deps/out"])
        .current_dir(sb.path(""))
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(0), "{}", show(&o));
    assert!(
        String::from_utf8_lossy(&o.stdout).ends_with("built\n"),
        "{}",
        show(&o)
    );
    assert!(
        !sb.path("pwned").exists() && !odd.join("pwned").exists(),
        "a $(…) ran"
    );
    let layers = sb.ls();
    assert_eq!(layers.len(), 1);
    assert!(layers[0]["files"].as_u64().unwrap() == 2, "{layers:?}");
    assert!(sb.mounts_below().is_empty());
}

/// One cache at its default view path `<mount-root>/x`, keyed by `deps.lock`.
const PLAIN_SPEC: &str = "project = \"p\"\n[[cache]]\nid = \"x\"\nkey_files = [\"deps.lock\"]\n\
                          setup = \"true\"\n";

/// `layercache --store S --json run --spec SPEC --workdir W --mount-root R [EXTRA…] -- true`
/// in a private mount namespace (so a wrong mount can never cover a host path).
fn run_at(sb: &Sandbox, spec: &Path, work: &Path, root: &Path, extra: &[&str]) -> Output {
    unshared_run(&sb.path("store"), spec, work, root)
        .args(extra)
        .args(["--", "true"])
        .output()
        .unwrap()
}

/// Asserts `o` is a one-line exit 2 whose message holds every needle; nothing stays mounted.
fn assert_refused(sb: &Sandbox, o: &Output, needles: &[&str]) {
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(2), "{needles:?}: {}", show(o));
    assert_eq!(err.trim().lines().count(), 1, "one line: {err}");
    for n in needles {
        assert!(err.contains(n), "{n:?} in: {err}");
    }
    assert!(sb.mounts_below().is_empty());
}

/// A symlink in the workdir or a symlinked --mount-root / --workdir-view cannot lead a view
/// path out of the workdir / mount root: `sub -> OUTSIDE` (a temp dir standing in for /etc)
/// with `mountpoint = "{workdir}/sub/x"` would create OUTSIDE/x on the host, with
/// `"{workdir}/sub"` would mount over OUTSIDE; `--mount-root LNK` / `--workdir-view LNK` with
/// `LNK -> /etc` would mount below /etc. Each is a one-line exit 2 naming the cache or the
/// flag, the path and where its symlink leads, and nothing is created outside.
#[test]
fn symlinks_cannot_lead_view_paths_out_of_the_workdir_or_mount_root() {
    if !can_mount() || !have_tool("unshare") {
        return;
    }
    let sb = Sandbox::new();
    std::fs::write(sb.work().join("deps.lock"), "a=1\n").unwrap();
    let outside = sb.path("outside");
    std::fs::create_dir_all(&outside).unwrap();
    std::os::unix::fs::symlink(&outside, sb.work().join("sub")).unwrap();
    let (out, root) = (outside.to_str().unwrap(), sb.path("cache"));
    for (mp, leads) in [
        ("{workdir}/sub/x", format!("{out}/x")),
        ("{workdir}/sub", out.to_string()),
        ("{workdir}/sub/x/y", format!("{out}/x/y")),
    ] {
        let spec = sb.write_spec(
            "lnk.toml",
            &format!(
                "project = \"p\"\n[[cache]]\nid = \"x\"\nkey_files = [\"deps.lock\"]\n\
                 setup = \"true\"\nmountpoint = {mp:?}\n"
            ),
        );
        let o = run_at(&sb, &spec, &sb.work(), &root, &[]);
        assert_refused(&sb, &o, &["cache \"x\"", "mountpoint", &leads]);
        assert!(
            !outside.join("x").exists(),
            "{mp}: created outside the workdir"
        );
        // The same through the workdir's view: resolved below the workdir on the host.
        let view = sb.path("view");
        let o = run_at(
            &sb,
            &spec,
            &sb.work(),
            &root,
            &["--workdir-view", view.to_str().unwrap()],
        );
        assert_refused(&sb, &o, &["cache \"x\"", "mountpoint", &leads]);
        assert!(
            !outside.join("x").exists(),
            "{mp}: created outside the workdir"
        );
    }
    // A symlink inside the workdir that stays inside it is fine.
    std::fs::create_dir_all(sb.work().join("real")).unwrap();
    std::os::unix::fs::symlink(sb.work().join("real"), sb.work().join("in")).unwrap();
    let spec = sb.write_spec(
        "in.toml",
        "project = \"p\"\n[[cache]]\nid = \"x\"\nkey_files = [\"deps.lock\"]\n\
         setup = \"true\"\nmountpoint = \"{workdir}/in/x\"\n",
    );
    let o = run_at(&sb, &spec, &sb.work(), &root, &[]);
    assert_eq!(o.status.code(), Some(0), "{}", show(&o));
    // --mount-root / --workdir-view: a symlink to /etc (or below it) is refused before any
    // mount, naming the flag and where the symlink leads; /etc itself too.
    let etc = sb.path("etc-lnk");
    std::os::unix::fs::symlink("/etc", &etc).unwrap();
    let spec = sb.write_spec("plain.toml", PLAIN_SPEC);
    for lnk in [etc.clone(), etc.join("sub")] {
        let l = lnk.to_str().unwrap();
        let o = run_at(&sb, &spec, &sb.work(), &lnk, &[]);
        assert_refused(&sb, &o, &["--mount-root", l, "a symlink to /etc"]);
        let o = run_at(&sb, &spec, &sb.work(), &root, &["--workdir-view", l]);
        assert_refused(&sb, &o, &["--workdir-view", l, "a symlink to /etc"]);
    }
    let o = run_at(&sb, &spec, &sb.work(), Path::new("/etc"), &[]);
    assert_refused(&sb, &o, &["--mount-root /etc", "refused"]);
    assert!(!Path::new("/etc/sub").exists());
}

/// A mount root that is the workdir, inside it or holding it (also through a symlink), and a
/// workdir view that is the mount root, inside it or holding it, are refused before any mount:
/// one line, exit 2, naming both flags and paths.
#[test]
fn mount_root_workdir_and_view_may_not_overlap() {
    if !can_mount() || !have_tool("unshare") {
        return;
    }
    let sb = Sandbox::new();
    let (work, root) = (sb.work(), sb.path("cache"));
    std::fs::write(work.join("deps.lock"), "a=1\n").unwrap();
    let spec = sb.write_spec("plain.toml", PLAIN_SPEC);
    let lnk = sb.path("work-lnk");
    std::os::unix::fs::symlink(&work, &lnk).unwrap();
    for r in [work.clone(), work.join("inner"), sb.path(""), lnk.clone()] {
        let o = run_at(&sb, &spec, &work, &r, &[]);
        let w = work.to_str().unwrap();
        assert_refused(
            &sb,
            &o,
            &["--mount-root", r.to_str().unwrap(), "--workdir", w],
        );
        assert!(
            !work.join("inner").exists(),
            "nothing created in the workdir"
        );
    }
    for v in [root.clone(), root.join("inner"), sb.path("")] {
        let o = run_at(
            &sb,
            &spec,
            &work,
            &root,
            &["--workdir-view", v.to_str().unwrap()],
        );
        let r = root.to_str().unwrap();
        assert_refused(
            &sb,
            &o,
            &["--workdir-view", v.to_str().unwrap(), "--mount-root", r],
        );
    }
}

#[test]
fn commit_and_umount_take_a_run_id() {
    if !can_mount() {
        return;
    }
    let sb = Sandbox::new();
    let mnt = sb.path("m");
    std::fs::create_dir_all(&mnt).unwrap();
    let lc = |args: &[&str]| {
        Command::new(BIN)
            .arg("--store")
            .arg(sb.path("store"))
            .args(args)
            .output()
            .unwrap()
    };
    let m = lc(&[
        "mount",
        "--project",
        "p",
        "--cache",
        "c",
        "--key",
        "k",
        mnt.to_str().unwrap(),
    ]);
    assert!(m.status.success(), "{}", show(&m));
    let out: serde_json::Value = serde_json::from_slice(&m.stdout).unwrap();
    let run = out["run"].as_str().unwrap().to_string();
    std::fs::write(mnt.join("f"), "x").unwrap();
    let c = lc(&["commit", &run]);
    assert!(c.status.success(), "{}", show(&c));
    let out: serde_json::Value = serde_json::from_slice(&c.stdout).unwrap();
    assert_eq!(out["result"], "published");
    let again = out["remount"]["run"].as_str().unwrap().to_string();
    let u = lc(&["umount", &again]);
    assert!(u.status.success(), "{}", show(&u));
    assert!(sb.mounts_below().is_empty());
    assert!(run_dirs(&sb).is_empty());
    let bad = lc(&["umount", "no-such-run"]);
    assert_eq!(bad.status.code(), Some(2), "{}", show(&bad));
}

/// A long run's children hold copies of the host's mounts in their namespace (copied when
/// they started, including another run's): that must not keep the other run from unmounting.
#[test]
fn a_long_run_does_not_hold_a_short_runs_mounts() {
    if !can_mount() {
        return;
    }
    let sb = Sandbox::new();
    let short_go = sb.work().join("go");
    layercache::sys::mkfifo(&short_go, 0o600).unwrap();
    let spec = blocking_spec(&sb, "echo ready > ready; cat go; echo done > {mount}/done");
    let short = run_cmd(&sb, &sb.work(), &spec, &[], &["true"])
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    wait_ready(&sb); // the short run's mount exists now
    // The long run starts while it does: its COMMAND's namespace holds a copy of it.
    let long_work = sb.path("long");
    std::fs::create_dir_all(&long_work).unwrap();
    std::fs::write(long_work.join("deps.lock"), "b=1\n").unwrap();
    for f in ["started", "release"] {
        layercache::sys::mkfifo(&long_work.join(f), 0o600).unwrap();
    }
    let long_spec = sb.write_spec(
        "long.toml",
        "project = \"q\"\n[[cache]]\nid = \"l\"\nkey_files = [\"deps.lock\"]\nsetup = \"true\"\n",
    );
    let long = run_cmd(
        &sb,
        &long_work,
        &long_spec,
        &[],
        &["sh", "-c", "echo up > started; cat release"],
    )
    .stdout(Stdio::null())
    .spawn()
    .unwrap();
    assert_eq!(
        std::fs::read_to_string(long_work.join("started")).unwrap(),
        "up\n"
    );
    // The short run commits (unmounts its miss mount) and ends while the long one runs.
    std::fs::write(&short_go, "go\n").unwrap();
    let o = short.wait_with_output().unwrap();
    // Release the long run before judging, so a failure leaves no process behind.
    std::fs::write(long_work.join("release"), "x\n").unwrap();
    let lo = long.wait_with_output().unwrap();
    assert_eq!(o.status.code(), Some(0), "the short run: {}", show(&o));
    assert_eq!(lo.status.code(), Some(0), "the long run: {}", show(&lo));
    assert!(sb.mounts_below().is_empty(), "{:?}", sb.mounts_below());
    assert!(run_dirs(&sb).is_empty(), "{:?}", run_dirs(&sb));
}
