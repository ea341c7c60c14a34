//! End-to-end tests of `layercache run` through the binary: real FUSE mounts (as root with
//! /dev/fuse; skipped otherwise, a failure when `CI` is set), a temporary store and mount root per test, and a guard that
//! unmounts anything left under the test's directory, even when the test panics.

use std::path::Path;
use std::process::Command;

#[path = "common/run.rs"]
mod run_common;

use run_common::{BIN, Sandbox, assert_not_in_tree, can_mount, have_tool, prep_ms, run_ok};

const DEPS_SPEC: &str = r#"project = "PROJECT"
[[cache]]
id = "deps"
key_files = ["deps.lock"]
env = { DEPS = "{mount}" }
setup = "SETUP"
"#;

fn deps_spec(project: &str, setup: &str) -> String {
    DEPS_SPEC
        .replace("PROJECT", project)
        .replace("SETUP", &setup.replace('\\', "\\\\").replace('"', "\\\""))
}

#[test]
fn no_caches_run_is_the_direct_run() {
    let sb = Sandbox::new();
    let spec = sb.write_spec("spec.toml", "project = \"p\"\n");
    let script = "echo out; echo err >&2; pwd >/dev/null; exit 4";
    let direct = Command::new("sh").args(["-c", script]).output().unwrap();
    let via = Command::new(BIN)
        .arg("--store")
        .arg(sb.path("store"))
        .args(["run", "--spec"])
        .arg(&spec)
        .args(["--", "sh", "-c", script])
        .output()
        .unwrap();
    assert_eq!(via.status.code(), direct.status.code());
    assert_eq!(via.stdout, direct.stdout);
    // One line of its own says nothing is cached; the rest of stderr is COMMAND's.
    let notice = "layercache: the spec of project p declares no caches (add a [[cache]]): \
                  running COMMAND only, nothing is cached\n";
    assert_eq!(
        String::from_utf8_lossy(&via.stderr),
        format!("{notice}{}", String::from_utf8_lossy(&direct.stderr))
    );
    assert!(sb.events().is_empty());
}

#[test]
fn command_starts_with_no_signal_ignored() {
    let sb = Sandbox::new();
    let spec = sb.write_spec("spec.toml", "project = \"p\"\n");
    let via = Command::new(BIN)
        .arg("--store")
        .arg(sb.path("store"))
        .args(["run", "--spec"])
        .arg(&spec)
        .args(["--", "grep", "^SigIgn:", "/proc/self/status"])
        .output()
        .unwrap();
    // Not even glibc's internal signals 32 and 33 (bits 31 and 32), which its posix_spawn
    // leaves ignored in the child. What this test was started with ignoring is inherited, as a
    // `nohup` or a shell's background job (SIGINT and SIGQUIT ignored) expects, except the
    // signals the run handles itself (SIGINT, SIGTERM, SIGHUP: exec resets a handler) and
    // SIGPIPE, which Rust's runtime (this test's and layercache's) ignores and the run resets.
    let own = std::fs::read_to_string("/proc/self/status").unwrap();
    let own = own
        .lines()
        .find_map(|l| l.strip_prefix("SigIgn:"))
        .map(|v| u64::from_str_radix(v.trim(), 16).unwrap())
        .unwrap();
    let bit = |sig: i32| 1u64 << (sig - 1);
    let handled = bit(libc::SIGINT)
        | bit(libc::SIGTERM)
        | bit(libc::SIGHUP)
        | bit(libc::SIGPIPE)
        | bit(32)
        | bit(33);
    assert_eq!(
        String::from_utf8_lossy(&via.stdout).trim(),
        format!("SigIgn:\t{:016x}", own & !handled)
    );
}

/// `layercache presets | head`: a listing whose reader has gone ends on SIGPIPE, as Unix tools
/// do, not with a panic on the failed print (exit 101 and a backtrace hint on stderr).
#[test]
fn a_listing_whose_reader_went_away_ends_quietly_on_sigpipe() {
    use std::os::fd::FromRawFd;
    use std::os::unix::process::ExitStatusExt;
    // A pipe whose read end is closed before the child starts: its first print meets EPIPE
    // whatever the scheduling (dropping the read end after spawn raced the child's print on a
    // loaded machine, which then exited 0).
    let mut fds = [0; 2];
    // SAFETY: pipe2 fills two descriptors this test then owns.
    assert_eq!(unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) }, 0);
    // SAFETY: fds[0] is ours and closed once; fds[1] is moved into the OwnedFd.
    let write_end = unsafe {
        libc::close(fds[0]);
        std::os::fd::OwnedFd::from_raw_fd(fds[1])
    };
    let child = Command::new(BIN)
        .arg("presets")
        .stdout(std::process::Stdio::from(write_end))
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let out = child.wait_with_output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!err.contains("panicked"), "{err}");
    assert_eq!(
        out.status.signal(),
        Some(libc::SIGPIPE),
        "{:?}: {err}",
        out.status
    );
}

#[test]
fn bad_spec_exits_2_naming_the_field() {
    let sb = Sandbox::new();
    let spec = sb.write_spec(
        "spec.toml",
        "project = \"p\"\n[[cache]]\nid = \"x\"\npreset = \"nmp\"\n",
    );
    let out = sb.run(&spec, Some("true"));
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("cache[0].preset"));
    // a missing key file is caught before anything is mounted
    let spec = sb.write_spec(
        "spec2.toml",
        "project = \"p\"\n[[cache]]\nid = \"x\"\npreset = \"npm\"\n",
    );
    let out = sb.run(&spec, Some("true"));
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("key_files"));
}

/// A bad `--lazy`, `LAYERCACHE_LAZY` (with no remote configured, too),
/// `LAYERCACHE_LAZY_TIMEOUT` or `LAYERCACHE_LAZY_PREFETCH` ends the run before anything, exit 2, naming the value and the
/// valid ones: no setup runs, nothing is mounted, no event is logged.
#[test]
fn bad_lazy_values_exit_2_naming_them_and_what_is_valid() {
    let sb = Sandbox::new();
    std::fs::write(sb.work().join("deps.lock"), "a=1\n").unwrap();
    let ran = sb.path("setup-ran");
    let spec = sb.write_spec(
        "spec.toml",
        &format!(
            "project = \"p\"\n[[cache]]\nid = \"deps\"\nkey_files = [\"deps.lock\"]\n\
             setup = \"touch {}\"\n",
            ran.display()
        ),
    );
    let stderr = |o: &std::process::Output| String::from_utf8_lossy(&o.stderr).into_owned();
    let o = sb.run_flags(&spec, &sb.work(), &["--lazy", "maybe"], &["true"]);
    assert_eq!(o.status.code(), Some(2));
    let e = stderr(&o);
    assert!(
        e.contains("'maybe'") && e.contains("--lazy") && e.contains("possible values: true, false"),
        "{e}"
    );
    for (var, value, valid) in [
        ("LAYERCACHE_LAZY", "yes please", "want 1, true or yes"),
        ("LAYERCACHE_LAZY", "maybe", "or 0, false or no"),
        ("LAYERCACHE_LAZY_TIMEOUT", "8 s", "(1500ms, 8s, 1m)"),
        (
            "LAYERCACHE_LAZY_TIMEOUT",
            "1e3",
            "number of seconds (8, 2.5)",
        ),
        ("LAYERCACHE_LAZY_TIMEOUT", "inf", "at most 24h"),
        ("LAYERCACHE_LAZY_TIMEOUT", "0", "at least 1s"),
        ("LAYERCACHE_LAZY_TIMEOUT", "100ms", "at least 1s"),
        ("LAYERCACHE_LAZY_TIMEOUT", "2d", "at most 24h"),
        ("LAYERCACHE_LAZY_PREFETCH", "soon", "(250ms)"),
        ("LAYERCACHE_LAZY_PREFETCH", "2h", "at most 10s"),
        ("LAYERCACHE_LAZY_PREFETCH", "250", "at most 10s"),
    ] {
        let o = sb.run_cmd(&[], &spec, &["true"], &[(var, value)]);
        assert_eq!(o.status.code(), Some(2), "{var}={value}");
        let e = stderr(&o);
        assert!(
            e.contains(&format!("{var}={value:?}")) && e.contains(valid),
            "{var}={value}: {e}"
        );
    }
    assert!(!ran.exists(), "no setup ran");
    assert_eq!(sb.mounts_below(), Vec::<String>::new());
    assert!(!sb.path("store").join("events.jsonl").exists());
}

#[test]
fn setup_failure_publishes_nothing_and_second_run_hits_after_success() {
    if !can_mount() {
        return;
    }
    let sb = Sandbox::new();
    std::fs::write(sb.work().join("deps.lock"), "a=1\n").unwrap();
    let failing = sb.write_spec(
        "fail.toml",
        &deps_spec("p", "echo half > \"$DEPS/half\"; exit 3"),
    );
    let out = sb.run(&failing, Some("echo must-not-run"));
    assert_eq!(out.status.code(), Some(3));
    assert!(!String::from_utf8_lossy(&out.stdout).contains("must-not-run"));
    assert!(sb.mounts_below().is_empty(), "left mounted after failure");
    let ev = sb.events();
    assert_eq!(ev.len(), 1);
    assert_eq!(ev[0]["exit_status"], 3);
    assert_eq!(ev[0]["published"], false);

    // the same key again: still a miss (nothing was published), now succeeding
    let ok = sb.write_spec(
        "ok.toml",
        &deps_spec("p", "echo half > \"$DEPS/half\"; exit 3").replace("exit 3", "true"),
    );
    let failing_key = ev[0]["key"].clone();
    let out = sb.run(&ok, Some("cat \"$DEPS/half\""));
    assert_eq!(out.status.code(), Some(0));
    let ev = sb.events();
    assert_eq!(ev[1]["result"], "miss");
    assert_ne!(ev[1]["key"], failing_key, "setup script is part of the key");
    // the failed run's key never got a layer: it does not hit either
    let out = sb.run(&failing, Some("true"));
    assert_eq!(out.status.code(), Some(3));
    assert_ne!(sb.events()[2]["result"], "hit");

    let out = sb.run(&ok, Some("cat \"$DEPS/half\""));
    assert_eq!(out.status.code(), Some(0));
    assert_eq!(String::from_utf8_lossy(&out.stdout), "half\n");
    assert_eq!(sb.events()[3]["result"], "hit");
    assert!(sb.mounts_below().is_empty());
}

#[test]
fn credentials_written_by_setup_stay_out_of_the_layer() {
    if !can_mount() {
        return;
    }
    let sb = Sandbox::new();
    std::fs::write(sb.work().join("deps.lock"), "a=1\n").unwrap();
    let spec = sb.write_spec(
        "spec.toml",
        &deps_spec(
            "p",
            "printf '//registry.npmjs.org/:_authToken=npm_SECRET\\n' > \"$DEPS/.npmrc\" && \
             mkdir -p \"$DEPS/pkg\" && printf x > \"$DEPS/pkg/data\" && \
             printf '//r/:_authToken=npm_SECRET\\n' > \"$DEPS/pkg/.npmrc\"",
        ),
    );
    assert_eq!(sb.run(&spec, None).status.code(), Some(0));
    let out = sb.run(
        &spec,
        Some("cat \"$DEPS/pkg/data\"; ls -A \"$DEPS\" \"$DEPS/pkg\""),
    );
    assert_eq!(out.status.code(), Some(0));
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(stdout.starts_with('x'), "{stdout}");
    assert!(!stdout.contains(".npmrc"), "{stdout}");
    assert_eq!(sb.events()[1]["result"], "hit");
    // and nowhere in the store
    assert_not_in_tree(&sb.path("store"), "npm_SECRET");
}

#[test]
fn two_projects_never_share_a_layer() {
    if !can_mount() {
        return;
    }
    let sb = Sandbox::new();
    std::fs::write(sb.work().join("deps.lock"), "a=1\n").unwrap();
    let setup = "echo \"$PROJ\" > \"$DEPS/owner\"";
    let a = sb.write_spec("a.toml", &deps_spec("alpha", setup));
    let b = sb.write_spec("b.toml", &deps_spec("beta", setup));
    assert_eq!(sb.run(&a, None).status.code(), Some(0));
    assert_eq!(sb.run(&b, None).status.code(), Some(0));
    let ev = sb.events();
    assert_ne!(
        ev[0]["key"], ev[1]["key"],
        "identical inputs, but each project keys with its own salt"
    );
    assert_eq!(ev[0]["result"], "miss");
    assert_eq!(ev[1]["result"], "miss", "beta must not see alpha's layer");
    assert_eq!(sb.run(&a, None).status.code(), Some(0));
    assert_eq!(sb.events()[2]["result"], "hit");
}

/// Every path below `dir`, relative to it, with its mode, size and ns mtime/ctime, sorted: a
/// file written, appended to, chmod'ed or replaced changes its entry.
fn tree(dir: &Path) -> Vec<String> {
    fn walk(root: &Path, dir: &Path, out: &mut Vec<String>) {
        use std::os::unix::fs::MetadataExt;
        for e in std::fs::read_dir(dir).unwrap() {
            let p = e.unwrap().path();
            let m = std::fs::symlink_metadata(&p).unwrap();
            out.push(format!(
                "{} mode={:o} size={} mtime={}.{} ctime={}.{}",
                p.strip_prefix(root).unwrap().display(),
                m.mode(),
                m.size(),
                m.mtime(),
                m.mtime_nsec(),
                m.ctime(),
                m.ctime_nsec()
            ));
            if m.is_dir() {
                walk(root, &p, out);
            }
        }
    }
    let mut out = Vec::new();
    walk(dir, dir, &mut out);
    out.sort();
    out
}

/// `layercache key` only reads the store: it reports a hit for a project the store has and a
/// miss for one it has never seen, and creates no file or directory for either.
#[test]
fn key_reads_the_store_and_creates_nothing() {
    if !can_mount() {
        return;
    }
    let sb = Sandbox::new();
    std::fs::write(sb.work().join("deps.lock"), "a=1\n").unwrap();
    let a = sb.write_spec("a.toml", &deps_spec("alpha", "true"));
    let b = sb.write_spec("b.toml", &deps_spec("beta", "true"));
    assert_eq!(sb.run(&a, None).status.code(), Some(0));
    let before = tree(&sb.path("store"));
    for (spec, want) in [(&a, "hit"), (&b, "miss")] {
        let out = run_ok(
            Command::new(BIN)
                .arg("--store")
                .arg(sb.path("store"))
                .args(["--json", "key", "--spec"])
                .arg(spec)
                .arg("--workdir")
                .arg(sb.work())
                .arg("--mount-root")
                .arg(sb.path("cache")),
        );
        let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        assert_eq!(v["caches"][0]["would_match"]["result"], want, "{v}");
    }
    assert_eq!(tree(&sb.path("store")), before, "key changed the store");
}

#[test]
fn npm_fixture_node_modules_second_run_hits() {
    if !can_mount() || !have_tool("npm") {
        return;
    }
    let sb = Sandbox::new();
    let example = Path::new(env!("CARGO_MANIFEST_DIR")).join("examples/npm-app");
    for f in ["package.json", "package-lock.json", "layercache.toml"] {
        std::fs::copy(example.join(f), sb.work().join(f)).unwrap();
    }
    let spec = sb.work().join("layercache.toml");
    let check = "node -e \"require('react'); require('express'); require('lodash'); \
                 console.log(require('react/package.json').version)\"";
    let first = sb.run(&spec, Some(check));
    assert_eq!(first.status.code(), Some(0));
    let second = sb.run(&spec, Some(check));
    assert_eq!(second.status.code(), Some(0));
    assert!(String::from_utf8_lossy(&second.stdout).starts_with("18."));
    let ev = sb.events();
    assert_eq!(ev[0]["result"], "miss");
    assert_eq!(ev[0]["published"], true);
    assert_eq!(ev[1]["result"], "hit");
    let (miss, hit) = (prep_ms(&ev[0]), prep_ms(&ev[1]));
    eprintln!("preparation: miss {miss} ms, hit {hit} ms");
    assert!(
        miss >= 20 * hit.max(1),
        "hit preparation {hit} ms is not 20x faster than the miss {miss} ms"
    );
    assert!(sb.mounts_below().is_empty());
}

#[test]
fn sigterm_during_setup_unmounts_and_publishes_nothing() {
    if !can_mount() {
        return;
    }
    let sb = Sandbox::new();
    std::fs::write(sb.work().join("deps.lock"), "a=1\n").unwrap();
    let fifo = sb.work().join("ready");
    layercache::sys::mkfifo(&fifo, 0o600).unwrap();
    let spec = sb.write_spec(
        "spec.toml",
        &deps_spec(
            "p",
            "echo half > \"$DEPS/half\"; echo ready > ready; exec sleep 120",
        ),
    );
    let mut child = Command::new(BIN)
        .arg("--store")
        .arg(sb.path("store"))
        .arg("run")
        .arg("--spec")
        .arg(&spec)
        .arg("--workdir")
        .arg(sb.work())
        .arg("--mount-root")
        .arg(sb.path("cache"))
        .args(["--", "echo", "must-not-run"])
        .stdout(std::process::Stdio::null())
        .spawn()
        .unwrap();
    // Blocks until setup has written to the fifo: the mount is up and setup is running.
    let ready = std::fs::read_to_string(&fifo).unwrap();
    assert_eq!(ready, "ready\n");
    assert!(!sb.mounts_below().is_empty(), "setup runs on a mount");
    layercache::sys::kill(child.id() as i32, libc::SIGTERM).unwrap();
    let status = child.wait().unwrap();
    assert_eq!(status.code(), Some(128 + 15));
    assert!(sb.mounts_below().is_empty(), "left mounted after SIGTERM");
    // nothing was published: no layer in the store at all
    let ev = sb.events();
    assert_eq!(ev.last().unwrap()["published"], false);
    assert!(
        sb.ls().is_empty(),
        "the interrupted setup published {:?}",
        sb.ls()
    );
}

#[test]
fn gc_removes_the_empty_view_dirs_a_killed_run_made_and_nothing_else() {
    if !can_mount() {
        return;
    }
    let sb = Sandbox::new();
    let work = sb.work();
    std::fs::write(work.join("deps.lock"), "a=1\n").unwrap();
    std::fs::create_dir(work.join("pre")).unwrap();
    let fifo = work.join("ready");
    layercache::sys::mkfifo(&fifo, 0o600).unwrap();
    // Views the run makes on the host: the mount root `root/deep` (two levels) and
    // `{workdir}/nm/inner` (two levels); `{workdir}/pre` is there before it.
    let spec = sb.write_spec(
        "spec.toml",
        r#"project = "p"
[[cache]]
id = "nm"
key_files = ["deps.lock"]
mountpoint = "{workdir}/nm/inner"
setup = "true"
[[cache]]
id = "pre"
key_files = ["deps.lock"]
mountpoint = "{workdir}/pre"
setup = "true"
[[cache]]
id = "deps"
key_files = ["deps.lock"]
setup = "echo ready > ready; exec sleep 120"
"#,
    );
    let root = sb.path("root/deep");
    let mut child = Command::new(BIN)
        .arg("--store")
        .arg(sb.path("store"))
        .args(["run", "--spec"])
        .arg(&spec)
        .arg("--workdir")
        .arg(&work)
        .arg("--mount-root")
        .arg(&root)
        .stdout(std::process::Stdio::null())
        .spawn()
        .unwrap();
    // Blocks until the last cache's setup runs: every view directory is made.
    assert_eq!(std::fs::read_to_string(&fifo).unwrap(), "ready\n");
    child.kill().unwrap(); // SIGKILL: no cleanup of its own runs
    child.wait().unwrap();
    assert!(
        root.is_dir() && work.join("nm/inner").is_dir(),
        "left behind"
    );
    // Something of the user's lands in one of them: that one (and its parent) stays.
    std::fs::write(work.join("nm/inner/mine"), "x").unwrap();
    let out = Command::new(BIN)
        .arg("--store")
        .arg(sb.path("store"))
        .args(["--json", "gc"])
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", run_common::show(&out));
    let report: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(report["removed_view_dirs"], 2, "{report}");
    assert!(
        !sb.path("root").exists(),
        "the made mount root and its parent are removed"
    );
    assert!(work.join("nm/inner/mine").exists());
    assert!(
        work.join("pre").is_dir(),
        "a directory the run did not make stays"
    );
    assert!(sb.mounts_below().is_empty());
}

#[test]
fn bwrap_sandbox_sees_the_mounts_and_nothing_else_writable() {
    if !can_mount() || !have_tool("bwrap") {
        return;
    }
    // Outside /tmp: bubblewrap covers /tmp with a tmpfs of its own, which would hide a store
    // there whatever the run does.
    let sb = Sandbox::new_in(Path::new("/var/tmp"));
    std::fs::write(sb.work().join("deps.lock"), "a=1\n").unwrap();
    // The store (its serve token, key salts, other projects' layers) is an empty directory
    // to the steps, the setup as COMMAND.
    let store = sb.path("store");
    let setup = format!(
        "echo sandboxed > \"$DEPS/f\"; ls -A {} | wc -l > \"$DEPS/store-entries\"",
        store.display()
    );
    let spec = sb.write_spec("spec.toml", &deps_spec("p", &setup));
    let mut cmd = Command::new(BIN);
    cmd.arg("--store")
        .arg(sb.path("store"))
        .args(["run", "--sandbox", "bwrap", "--spec"])
        .arg(&spec)
        .arg("--workdir")
        .arg(sb.work())
        .arg("--mount-root")
        .arg(sb.path("cache"))
        .args([
            "--",
            "sh",
            "-c",
            &format!(
                "cat \"$DEPS/f\" \"$DEPS/store-entries\"; pwd; touch /usr/layercache-probe \
                 2>/dev/null && echo escaped; echo w > out.txt; ls -A {} | wc -l; \
                 touch {0}/x 2>/dev/null && echo store writable; \
                 umount {0} 2>/dev/null && echo store uncovered; \
                 mount -o remount,bind,rw / 2>/dev/null && echo root writable || true",
                store.display()
            ),
        ]);
    let out = run_ok(&mut cmd);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(
        stdout,
        format!("sandboxed\n0\n{}\n0\n", sb.work().display())
    );
    assert!(
        std::fs::read_dir(&store).unwrap().count() > 0,
        "the host's store is still there"
    );
    assert!(sb.work().join("out.txt").exists(), "workdir is writable");
    assert!(!Path::new("/usr/layercache-probe").exists());
    assert!(sb.mounts_below().is_empty());
}

/// issue 11: a miss or restore says which input differs from the nearest layer — in the
/// summary, `--json`, events.jsonl and `layercache key`.
#[test]
fn a_restore_says_which_input_differs_from_the_nearest_layer() {
    if !can_mount() {
        return;
    }
    let sb = Sandbox::new();
    std::fs::write(sb.work().join("deps.lock"), "a=1\n").unwrap();
    let spec = sb.write_spec("spec.toml", &deps_spec("why", "echo filled > \"$DEPS/x\""));
    let first = sb.run(&spec, None);
    assert_eq!(first.status.code(), Some(0));
    let err = String::from_utf8_lossy(&first.stderr);
    assert!(err.contains("why: no earlier layer of this cache"), "{err}");

    std::fs::write(sb.work().join("deps.lock"), "a=2\n").unwrap();
    let key = run_ok(
        Command::new(BIN)
            .arg("--store")
            .arg(sb.path("store"))
            .args(["--json", "key", "--spec"])
            .arg(&spec)
            .arg("--workdir")
            .arg(sb.work())
            .arg("--mount-root")
            .arg(sb.path("cache")),
    );
    let v: serde_json::Value = serde_json::from_slice(&key.stdout).unwrap();
    let m = &v["caches"][0]["would_match"];
    assert_eq!(m["result"], "restore", "{v}");
    assert_eq!(m["why"][1], "deps.lock changed", "{v}");
    assert_eq!(
        v["caches"][0]["inputs"]["key file deps.lock"]
            .as_str()
            .unwrap()
            .len(),
        16
    );

    let second = sb.run(&spec, None);
    assert_eq!(second.status.code(), Some(0));
    let err = String::from_utf8_lossy(&second.stderr);
    assert!(
        err.contains("restore") && err.contains("why: deps.lock changed"),
        "{err}"
    );
    let ev = sb.events();
    let first_key = ev[0]["key"].as_str().unwrap();
    assert_eq!(
        ev[1]["why"][0],
        format!("nearest layer {first_key}"),
        "{:?}",
        ev[1]
    );
    assert_eq!(ev[1]["why"][1], "deps.lock changed");
    // A hit has nothing to explain.
    let third = sb.run(&spec, None);
    assert!(!String::from_utf8_lossy(&third.stderr).contains("why"));
    assert!(sb.events()[2].get("why").is_none());
}

/// Issue 29 item 3, with the real binary: `env = { TOKEN = "{env:MY_TOKEN}" }` and
/// `MY_TOKEN=hunter2`. The recorded inputs (which travel to the remote tier) hold a digest
/// keyed with the project's salt: not plain blake3("hunter2")'s prefix `55dcd1221c6686fb`,
/// another in another project; the salt is the project's own (0600), and the same project
/// keeps its key across runs (the second run hits).
#[test]
fn recorded_variable_digests_are_keyed_per_project() {
    if !can_mount() {
        return;
    }
    use std::os::unix::fs::PermissionsExt;
    let sb = Sandbox::new();
    std::fs::write(sb.work().join("deps.lock"), "a=1\n").unwrap();
    let spec = |project: &str| {
        sb.write_spec(
            &format!("{project}.toml"),
            &format!(
                "project = \"{project}\"\n[[cache]]\nid = \"deps\"\nkey_files = [\"deps.lock\"]\n\
                 setup = \"true\"\nenv = {{ TOKEN = \"{{env:MY_TOKEN}}\" }}\n"
            ),
        )
    };
    // A run of `project`'s spec with `envs`: its exit status and its cache's summary.
    let run_env = |project: &str, envs: &[(&str, &str)]| {
        let o = sb.run_cmd(&["--json"], &spec(project), &["true"], envs);
        let first = String::from_utf8_lossy(&o.stdout)
            .lines()
            .next()
            .map(str::to_string)
            .unwrap_or_default();
        let v: serde_json::Value = serde_json::from_str(&first).unwrap_or_default();
        (o, v["caches"][0].clone())
    };
    let run = |project: &str| {
        let (o, cache) = run_env(project, &[("MY_TOKEN", "hunter2")]);
        assert_eq!(o.status.code(), Some(0));
        cache
    };
    let project_dir = |p: &str| sb.path("store").join("v1/projects").join(p);
    let recorded = |p: &str, key: &serde_json::Value| {
        let f = project_dir(p).join(format!("caches/deps/inputs/{}.json", key.as_str().unwrap()));
        std::fs::read_to_string(f).unwrap()
    };
    let a = run("alpha");
    assert_eq!(a["result"], "miss");
    let text = recorded("alpha", &a["key"]);
    let inputs: serde_json::Value = serde_json::from_str(&text).unwrap();
    let digest = inputs["variable MY_TOKEN"].as_str().unwrap().to_string();
    assert_eq!(digest.len(), 16, "{text}");
    assert_ne!(digest, "55dcd1221c6686fb");
    assert!(
        !text.contains("55dcd1221c6686fb") && !text.contains("hunter2"),
        "{text}"
    );
    let salt = project_dir("alpha").join("key-salt");
    let mode = std::fs::metadata(&salt).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode, 0o600);
    let b = run("beta");
    let other: serde_json::Value = serde_json::from_str(&recorded("beta", &b["key"])).unwrap();
    assert_ne!(other["variable MY_TOKEN"], inputs["variable MY_TOKEN"]);
    assert_ne!(
        b["key"].as_str().unwrap()[4..],
        a["key"].as_str().unwrap()[4..]
    );
    let again = run("alpha");
    assert_eq!(again["result"], "hit", "{again}");
    assert_eq!(again["key"], a["key"]);

    // A salt provisioned outside the store (LAYERCACHE_KEY_SALT): used as given, none kept.
    let hex = "ab".repeat(32);
    let (o, g) = run_env(
        "gamma",
        &[("MY_TOKEN", "hunter2"), ("LAYERCACHE_KEY_SALT", &hex)],
    );
    assert_eq!(o.status.code(), Some(0));
    let got: serde_json::Value = serde_json::from_str(&recorded("gamma", &g["key"])).unwrap();
    let want = blake3::keyed_hash(&[0xab; 32], b"hunter2").to_hex()[..16].to_string();
    assert_eq!(got["variable MY_TOKEN"], want.as_str());
    assert!(!project_dir("gamma").join("key-salt").exists());
    let (o, _) = run_env("gamma", &[("LAYERCACHE_KEY_SALT", "nope")]);
    assert_eq!(o.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&o.stderr).contains("LAYERCACHE_KEY_SALT: not a key salt"));
}

/// A store named by a relative path through `..`, or through a symlink, is the same store as
/// its canonical path: setup writes into the run's overlay (not the plain directory under its
/// mount point), the layer holds what setup wrote, and a hit through the other spelling shows
/// it. (A run tells its own mounts from others' by their paths in mountinfo, which shows them
/// canonical: an uncanonical store path once made a run detach its own mount.)
#[test]
fn a_store_named_relatively_or_through_a_symlink_is_the_same_store() {
    if !can_mount() {
        return;
    }
    let sb = Sandbox::new();
    std::fs::write(sb.work().join("deps.lock"), "a=1\n").unwrap();
    let spec = sb.write_spec("rel.toml", &deps_spec("rel", "echo made > \"$DEPS/file\""));
    let link = sb.path("store-link");
    std::os::unix::fs::symlink(sb.path("store"), &link).unwrap();
    let run = |store: &str, script: &str| {
        let mut cmd = Command::new(BIN);
        cmd.current_dir(sb.work())
            .args(["--store", store, "run", "--spec"])
            .arg(&spec)
            .arg("--mount-root")
            .arg(sb.path("cache"))
            .args(["--", "sh", "-c", script]);
        let out = cmd.output().unwrap();
        assert_eq!(out.status.code(), Some(0), "{out:?}");
        String::from_utf8_lossy(&out.stdout)
            .lines()
            .next()
            .unwrap_or("")
            .to_string()
    };
    assert_eq!(run("../store", "cat \"$DEPS/file\""), "made");
    assert_eq!(sb.events()[0]["result"], "miss");
    assert_eq!(sb.events()[0]["files"], 1, "{:?}", sb.events());
    let linked = link.to_str().unwrap().to_string();
    assert_eq!(run(&linked, "cat \"$DEPS/file\""), "made");
    assert_eq!(sb.events()[1]["result"], "hit");
    assert!(sb.mounts_below().is_empty());
}
